"""The generator's contract: the answer format, parsing, canonical forms and the execution score."""

from __future__ import annotations

import json

import pytest

from resilibench.core.bounds import optimal_success, reference_workflow
from resilibench.core.plan_follower import workflow_success
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks
from resilibench.robust_train.generator import (
    GeneratorFormat,
    GeneratorOutputError,
    canonical_form,
    execution_score,
    parse_workflow,
    reduced,
    workflow_text,
)


@pytest.fixture(scope="module")
def tasks():
    return load_tasks(split="train")[::150]


def test_reference_answers_round_trip_with_the_same_score(tasks):
    for task in tasks:
        reference = reference_workflow(task)
        text = workflow_text(reference)
        parsed = parse_workflow(text)
        assert json.loads(text)["nodes"] == list(reference.tools)
        assert canonical_form(parsed) == canonical_form(reference)
        # The reduced edges keep every order constraint, so the follower's success is unchanged.
        assert execution_score(task, parsed) == pytest.approx(workflow_success(task, reference))
        assert execution_score(task, parsed) <= optimal_success(task) + 1e-12


def test_reduction_keeps_reachability_and_drops_implied_edges():
    chain = Workflow((Node("a"), Node("b"), Node("c")), ((0, 1), (1, 2), (0, 2)))
    assert reduced(chain).edges == ((0, 1), (1, 2))
    assert canonical_form(chain) == canonical_form(Workflow.chain(["a", "b", "c"]))


def test_canonical_form_ignores_node_numbering_and_text():
    a = Workflow((Node("file_operations_reader", "read"), Node("data_processing_parser")), ((0, 1),))
    b = Workflow((Node("data_processing_parser"), Node("file_operations_reader")), ((1, 0),))
    assert canonical_form(a) == canonical_form(b)
    assert canonical_form(a) != canonical_form(Workflow(a.nodes, ()))


@pytest.mark.parametrize(("answer", "reason"), [
    ("", "no JSON object"),
    ("the plan is {nodes}", "not a workflow"),
    ('{"steps": []}', "not a workflow"),
    ('{"nodes": []}', "no nodes"),
    ('{"nodes": ["teleporter"]}', "unknown tool 'teleporter'"),
    ('{"nodes": ["file_operations_reader"], "edges": [[0, 3]]}', "outside"),
    ('{"nodes": ["file_operations_reader", "data_processing_parser"], "edges": [[0, 1], [1, 0]]}', "cycle"),
])
def test_malformed_answers_say_why(answer, reason):
    with pytest.raises(GeneratorOutputError, match=reason):
        parse_workflow(answer)


def test_answers_with_text_around_the_json_parse(tasks):
    task = tasks[0]
    text = workflow_text(reference_workflow(task))
    assert canonical_form(parse_workflow(f"Here you go: {text} -- done")) == canonical_form(reference_workflow(task))
    assert execution_score(task, None) == 0.0


def test_messages_carry_the_format_and_optionally_the_tools():
    plain = GeneratorFormat().messages("Load data/a.csv with file_operations_reader.")
    assert [m["role"] for m in plain] == ["system", "user"] and '"nodes"' in plain[0]["content"]
    with_tools = GeneratorFormat(tool_list=True).messages("x")
    assert "file_operations_reader" in with_tools[0]["content"] and "file_operations_reader" not in plain[0]["content"]
