"""The shared Workflow type: conversions, validation and the canonical form."""

import networkx as nx
import pytest

from resilibench.metrics.workflow import Node, Workflow


def diamond():
    return Workflow(
        (Node("file_operations_reader", "read"), Node("data_processing_parser", "parse"),
         Node("data_processing_validator", "validate"), Node("file_operations_writer", "write")),
        ((0, 1), (0, 2), (1, 3), (2, 3)),
    )


def test_round_trips():
    w = diamond()
    assert Workflow.from_json(w.to_json()) == w
    assert Workflow.from_dict(w.to_dict()) == w
    assert Workflow.from_plan(w.to_plan()) == w
    assert Workflow.from_networkx(w.to_networkx()) == w
    assert "4. file_operations_writer: write (after 2, 3)" in w.to_plan()


def test_canonical_form_ignores_numbering():
    w = diamond()
    perm = [3, 1, 0, 2]  # new index of old node i
    nodes = [None] * 4
    for old, new in enumerate(perm):
        nodes[new] = w.nodes[old]
    renumbered = Workflow(tuple(nodes), tuple((perm[a], perm[b]) for a, b in w.edges))
    assert renumbered != w
    assert renumbered.canonical() == w.canonical()
    assert renumbered.canonical_key() == w.canonical_key()
    other = Workflow(w.nodes, ((0, 1), (0, 2), (1, 3)))
    assert other.canonical_key() != w.canonical_key()


def test_chain_and_topological_order():
    w = Workflow.chain(["a_b", "c_d", "e_f"])
    assert w.edges == ((0, 1), (1, 2))
    assert w.topological_order() == [0, 1, 2]
    assert nx.is_directed_acyclic_graph(w.to_networkx())


def test_invalid_workflows_are_rejected():
    with pytest.raises(ValueError, match="cycle"):
        Workflow((Node("a"), Node("b")), ((0, 1), (1, 0)))
    with pytest.raises(ValueError, match="outside"):
        Workflow((Node("a"),), ((0, 1),))
    with pytest.raises(ValueError, match="tool name or a text"):
        Node()
    with pytest.raises(ValueError, match="not valid JSON"):
        Workflow.from_json("{nope")
    with pytest.raises(ValueError, match="numbered"):
        Workflow.from_plan("1. a\n3. b")



def test_node_arguments_round_trip_through_every_format():
    node = Node.make("file_operations_reader", "read the input", {"source": "in.csv", "options": {"a": [1]}})
    assert node.arguments == {"options": {"a": [1]}, "source": "in.csv"}
    workflow = Workflow((node, Node("data_processing_parser", "parse")), ((0, 1),))
    assert Workflow.from_json(workflow.to_json()) == workflow
    assert Workflow.from_plan(workflow.to_plan()) == workflow
    assert Workflow.from_networkx(workflow.to_networkx()) == workflow
    assert "arguments" not in Workflow.chain(["a"]).to_dict()["nodes"][0]
    # Arguments are part of a step's identity: differing arguments give differing canonical keys.
    other = Workflow((Node.make("file_operations_reader", "read the input", {"source": "x"}),
                      Node("data_processing_parser", "parse")), ((0, 1),))
    assert other.canonical_key() != workflow.canonical_key()


def test_node_arguments_must_be_json():
    assert Node.make("a", arguments={"x": {"b": [1, 2]}}).arguments == {"x": {"b": [1, 2]}}
    with pytest.raises(ValueError, match="JSON-serialisable"):
        Node.make("a", arguments={"x": object()})
    with pytest.raises(ValueError, match="arguments"):
        Workflow.from_dict({"nodes": [{"tool": "a", "arguments": [1]}]})
