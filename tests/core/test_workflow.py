"""The shared Workflow type: conversions, validation and the canonical form."""

import networkx as nx
import pytest

from resilibench.core.workflow import Node, Workflow


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


def test_strict_construction_still_refuses_malformed_graphs():
    nodes = (Node("a"), Node("b"))
    for edges, message in ((((0, 1), (1, 0)), "cycle"), (((0, 0),), "self-loop"), (((0, 1), (0, 1)), "duplicate")):
        with pytest.raises(ValueError, match=message):
            Workflow(nodes, edges)


def test_lenient_reading_repairs_and_records():
    """Duplicates and self-loops dropped; inside a cycle, the edges pointing back against the listing."""
    nodes = tuple(Node(t) for t in "abcd")
    w = Workflow.lenient(nodes, [(0, 1), (1, 2), (2, 1), (2, 3), (3, 0), (0, 1), (3, 3)])
    assert w.edges == ((0, 1), (1, 2), (2, 3))
    assert (w.repairs.duplicates, w.repairs.self_loops) == (((0, 1),), ((3, 3),))
    assert set(w.repairs.cycle_edges) == {(2, 1), (3, 0)} and w.repairs.cyclic
    assert w == Workflow(nodes, ((0, 1), (1, 2), (2, 3)))  # repairs do not enter equality
    assert w.repairs.to_dict() == {"duplicates": [[0, 1]], "self_loops": [[3, 3]], "cycle_edges": [[2, 1], [3, 0]]}
    clean = Workflow.lenient(nodes, [(3, 0), (0, 1)])  # backward in the listing but acyclic: kept
    assert clean.edges == ((3, 0), (0, 1)) and not clean.repairs
    assert Workflow.from_dict({"nodes": ["a", "b"], "edges": [[0, 1], [0, 1]]}, lenient=True).repairs.duplicates
    with pytest.raises(ValueError, match="outside"):
        Workflow.lenient(nodes, [(0, 9)])


WORFBENCH_ANSWER = ("Node:\n1: execute bash code to find all .txt files containing \"Linux\"\n"
                    "2: count occurrences in the first file\n3: count occurrences in the second file\n"
                    "4: take answer action\nEdge: (START,1) (1,2) (1,3) (2,4) (3,4) (4,END)")


def test_worfbench_answers_read_and_written():
    w = Workflow.from_worfbench(WORFBENCH_ANSWER)
    assert [n.text for n in w.nodes][1:3] == ["count occurrences in the first file", "count occurrences in the second file"]
    assert all(n.tool is None for n in w.nodes) and w.edges == ((0, 1), (0, 2), (1, 3), (2, 3))
    assert w.to_worfbench() == WORFBENCH_ANSWER
    assert Workflow.from_worfbench(w.to_worfbench()) == w
    # "1." numbering, "Edges:" and a duplicated edge (two released golds have one) read leniently.
    dup = Workflow.from_worfbench("Node:\n1. a\n2. b\nEdges:\n(START,1)\n(1,2)\n(1,2)\n(2,END)")
    assert dup.edges == ((0, 1),) and dup.repairs.duplicates == ((0, 1),)
    assert Workflow.from_worfbench("Node:\n1: a\n2: b\nEdge: (1,2) (2,1)").repairs.cyclic
    # Real answers add prose with numbered lines of its own after the steps (7 of WorFBench's golds do).
    prose = ("Node:\n1: Be aware of the law.\n2: Watch the animal.\nFor this task we proceed as follows:\n\n"
             "1. **Start** by reading.\n2. **Observe** it.\n\nEdge: (START,1) -> (1,2) -> (2,END)")
    w = Workflow.from_worfbench(prose)
    assert [n.text for n in w.nodes] == ["Be aware of the law.", "Watch the animal."] and w.edges == ((0, 1),)
    for bad, message in (("1: a\nEdge: (1,2)", "Node:"), ("Node:\n2: a\n3: b", "numbered from 1"),
                         ("Node:\n1: a\nEdge: (1,2)", "outside")):
        with pytest.raises(ValueError, match=message):
            Workflow.from_worfbench(bad)


def test_robustflow_graphs_drop_start_and_end():
    graph = {"nodes": ["START", "Custom agent to parse the problem", "Custom agent to solve it", "END"],
             "edges": [[0, 1], [1, 2], [2, 3]]}
    w = Workflow.from_graph(graph)
    assert w == Workflow((Node(text="Custom agent to parse the problem"), Node(text="Custom agent to solve it")),
                         ((0, 1),))
    with pytest.raises(ValueError, match="outside"):
        Workflow.from_graph({"nodes": ["a"], "edges": [[0, 4]]})


def test_plan_prefixes_are_tools_only_when_they_look_like_tools():
    """Regression: ``1. Calculate: the total`` was read as a call of a tool named Calculate."""
    w = Workflow.from_plan("1. Calculate: the total\n2. file_operations_reader: read it (after 1)")
    assert w.nodes[0] == Node(text="Calculate: the total")
    assert w.nodes[1] == Node("file_operations_reader", "read it")
    assert Workflow.from_plan("1. calc: sum", tools={"calc"}).nodes[0] == Node("calc", "sum")
    assert Workflow.from_plan("1. calc: sum").nodes[0] == Node(text="calc: sum")


def test_plain_string_steps_are_read_as_asked():
    data = {"nodes": ["read the file", "parse it"], "edges": [[0, 1]]}
    assert Workflow.from_dict(data).nodes[0] == Node(tool="read the file")  # the library's default
    assert Workflow.from_dict(data, string_steps="text").nodes[0] == Node(text="read the file")
    with pytest.raises(ValueError, match="plain string"):
        Workflow.from_dict(data, string_steps=None)
    with pytest.raises(ValueError, match="string_steps"):
        Workflow.from_dict(data, string_steps="word")
