"""The seven flaw types: every method does what it says, reproducibly, with severity and clear errors."""

import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from resilibench.core.arguments import task_hints
from resilibench.core.bounds import reference_workflow
from resilibench.core.matching import make_matcher, tool_text
from resilibench.core.plan_follower import workflow_success
from resilibench.core.registry import OPERATION_PHRASES, ToolRegistry, default_registry
from resilibench.core.text.flaws import (
    FLAW_METHODS,
    FLAW_TYPES,
    UNNEEDED_OPERATIONS,
    FlawNotApplicable,
    applicable_positions,
    flaw_applies,
    inject_flaw,
    similar_tools,
    tool_similarity,
)
from resilibench.core.text.prompts import with_arguments
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks

REGISTRY = default_registry()
# The task of the library with the longest reference workflow: every method applies to its plan.
TASK = max((t for t in load_tasks(split="test") if t.task_type == "advanced_computation_pipeline"),
           key=lambda t: (len(reference_workflow(t).nodes), t.instance_id))
PLAN = with_arguments(TASK, reference_workflow(TASK))
METHODS = [(flaw, method) for flaw in FLAW_TYPES for method in FLAW_METHODS[flaw]]
# Methods the plan follower does not feel: it skips a tool that already succeeded, reads tool names (not
# step texts), and the argument schema accepts any listed format.
SAME_SUCCESS = {"duplicate_step", "format_mismatch", "description_drift"}


def inject(flaw, method, **kwargs):
    return inject_flaw(PLAN, flaw, method=method, matcher="lexical", **kwargs)


def tools(workflow):
    return list(workflow.tools)


@pytest.mark.parametrize(("flaw", "method"), METHODS, ids=[m for _, m in METHODS])
def test_every_method_changes_the_plan_and_records_it(flaw, method):
    injection = inject(flaw, method, severity=0.5, seed=3)
    assert injection.flaw_type == flaw and injection.method == method
    assert injection.original == PLAN and injection.workflow != PLAN
    assert injection.changes
    for change in injection.changes:
        assert set(change) == {"position", "before", "after", "reason"} and change["reason"]
    assert json.loads(json.dumps(injection.to_dict()))["changes"] == [dict(c) for c in injection.changes]
    before, after = tools(PLAN), tools(injection.workflow)
    success = workflow_success(TASK, injection.workflow)
    if method in SAME_SUCCESS:
        assert success == workflow_success(TASK, PLAN)
    else:
        assert success < workflow_success(TASK, PLAN)
    check = METHOD_CHECKS[method]
    check(injection, before, after)


def _reordered(injection, before, after):
    assert Counter(before) == Counter(after) and before != after


def _violates_dependency(injection, before, after):
    _reordered(injection, before, after)
    moved = injection.changes[0]["after"]["tool"]
    deps = set(REGISTRY[moved].dependencies)
    assert any(after.index(d) > after.index(moved) for d in deps if d in after)


def _similar(injection, before, after):
    for change in injection.changes:
        old, new = change["before"]["tool"], change["after"]["tool"]
        assert new not in before
        ranked = [REGISTRY.names[t] for t in similar_tools(REGISTRY.id_of(old), matcher="lexical")]
        assert new in ranked[:3 + len(before)]  # among the nearest once the plan's own tools are left out


def _other_category(injection, before, after):
    for change in injection.changes:
        assert REGISTRY[change["after"]["tool"]].category != REGISTRY[change["before"]["tool"]].category


def _invalid_arguments(injection, before, after):
    assert before == after
    for change in injection.changes:
        node = injection.workflow.nodes[change["position"]]
        assert node.params and REGISTRY[node.tool].check_arguments(node.arguments) is not None


def _middle_removed(injection, before, after):
    assert after[0] == before[0] and after[-1] == before[-1] and len(after) == len(before) - len(injection.changes)


def _validation_removed(injection, before, after):
    assert all(REGISTRY[c["before"]["tool"]].operation == "validator" for c in injection.changes)
    assert len(after) == len(before) - len(injection.changes)


def _duplicated(injection, before, after):
    assert set(after) == set(before) and len(after) == len(before) + len(injection.changes)


def _unneeded(injection, before, after):
    inserted = [c["after"]["tool"] for c in injection.changes]
    assert all(REGISTRY[t].operation in UNNEEDED_OPERATIONS for t in inserted)
    assert Counter(after) - Counter(inserted) == Counter(before)


def _format_mismatch(injection, before, after):
    for change in injection.changes:
        i = change["position"]
        node = injection.workflow.nodes[i]
        previous = injection.workflow.nodes[i - 1].arguments.get("output_format")
        assert node.arguments["input_format"] not in (previous, change["before"]["arguments"]["input_format"])
        assert REGISTRY[node.tool].check_arguments(node.arguments) is None  # schema-valid, semantically wrong


def _unrelated(injection, before, after):
    categories = {REGISTRY[t].category for t in before}
    graph = injection.workflow.to_networkx()
    for change in injection.changes:
        assert REGISTRY[change["after"]["tool"]].category not in categories
    i = injection.changes[-1]["position"]  # the last insertion broke the direct link around it
    assert graph.has_edge(i - 1, i) and graph.has_edge(i, i + 1) and not graph.has_edge(i - 1, i + 1)


def _drifted_tools(injection, before, after):
    previous = None
    for change in injection.changes:  # each replacement is the nearest free tool to the previous one
        anchor = change["before"]["tool"] if previous is None else previous
        assert change["after"]["tool"] != change["before"]["tool"] and change["after"]["tool"] not in before
        assert anchor in change["reason"]
        previous = change["after"]["tool"]


def _drifted_texts(injection, before, after):
    assert before == after
    assert all(c["before"]["text"] != c["after"]["text"] for c in injection.changes)


METHOD_CHECKS = {
    "adjacent_swap": _reordered, "dependency_violation": _violates_dependency, "similar_tool": _similar,
    "category_mismatch": _other_category, "missing_required": _invalid_arguments, "wrong_type": _invalid_arguments,
    "middle_removal": _middle_removed, "validation_removal": _validation_removed, "duplicate_step": _duplicated,
    "unneeded_insertion": _unneeded, "format_mismatch": _format_mismatch, "unrelated_insertion": _unrelated,
    "progressive_replacement": _drifted_tools, "description_drift": _drifted_texts,
}


@pytest.mark.parametrize(("flaw", "method"), METHODS, ids=[m for _, m in METHODS])
def test_severity_is_monotone_and_seeds_reproduce(flaw, method):
    runs = [inject(flaw, method, severity=s, seed=11) for s in (0.1, 0.3, 0.6, 1.0)]
    sizes = [len(r.changes) for r in runs]
    assert sizes == sorted(sizes) and sizes[0] >= 1
    for low, high in zip(runs, runs[1:], strict=False):  # a higher severity extends a lower one's changes
        assert high.changes[: len(low.changes)] == low.changes
    assert inject(flaw, method, severity=0.6, seed=11) == runs[2]
    if len(applicable_positions(PLAN, flaw, method, matcher="lexical")) > 1:
        assert len({inject(flaw, method, severity=0.1, seed=s).workflow for s in range(8)}) > 1


def test_position_pins_the_first_change_and_method_none_picks_an_applicable_one():
    for flaw, method in METHODS:
        for position in applicable_positions(PLAN, flaw, method, matcher="lexical")[:3]:
            first = inject(flaw, method, severity=0.1, seed=0, position=position).changes[0]
            if method == "dependency_violation":  # the step lands on its prerequisite's place
                assert first["position"] < position and first["after"] == PLAN.to_dict()["nodes"][position] | {
                    "arguments": PLAN.nodes[position].arguments}
            elif method == "duplicate_step":  # the copy follows the step
                assert first["position"] == position + 1
            else:
                assert first["position"] == position
    with pytest.raises(FlawNotApplicable, match="applicable positions"):
        inject("order", "adjacent_swap", position=99)
    no_validator = Workflow(tuple(n for n in PLAN.nodes if "validator" not in n.tool))
    picked = {inject_flaw(no_validator, "missing_step", seed=s, matcher="lexical").method for s in range(6)}
    assert picked == {"middle_removal"}
    assert {inject_flaw(PLAN, "missing_step", seed=s, matcher="lexical").method for s in range(12)} == set(
        FLAW_METHODS["missing_step"])


def test_flaws_that_need_something_absent_say_so():
    bare = reference_workflow(TASK)  # no arguments
    with pytest.raises(FlawNotApplicable, match="with_arguments"):
        inject_flaw(bare, "parameter", matcher="lexical")
    with pytest.raises(FlawNotApplicable, match="validation_removal"):
        inject_flaw(Workflow((Node("file_operations_reader"),)), "missing_step", method="validation_removal")
    with pytest.raises(FlawNotApplicable):
        inject_flaw(Workflow(()), "order")


def test_bad_arguments_name_the_accepted_values():
    with pytest.raises(ValueError, match="semantic_drift"):
        inject_flaw(PLAN, "typo")
    with pytest.raises(ValueError, match="adjacent_swap"):
        inject_flaw(PLAN, "order", method="similar_tool")
    for severity in (0, -0.1, 1.5, True, "high"):
        with pytest.raises(ValueError, match="severity"):
            inject_flaw(PLAN, "order", severity=severity)
    with pytest.raises(ValueError, match="lexical"):
        inject_flaw(PLAN, "tool_misuse", matcher="bag-of-words")
    with pytest.raises(ValueError, match="flaw_type"):
        applicable_positions(PLAN, "typo", "adjacent_swap")


def test_semantic_similarity_comes_from_the_local_embedding_model():
    semantic, lexical = tool_similarity("semantic"), tool_similarity("lexical")
    n = len(REGISTRY)
    assert semantic.shape == lexical.shape == (n, n)
    assert abs(semantic - semantic.T).max() < 1e-3 and abs(semantic.diagonal() - 1).max() < 1e-3
    assert (semantic != lexical).any()
    reader = REGISTRY.id_of("file_operations_reader")
    assert REGISTRY.names[similar_tools(reader, matcher="semantic")[0]] == "file_operations_scanner"
    injection = inject_flaw(PLAN, "semantic_drift", method="progressive_replacement", seed=0, matcher="semantic")
    assert injection == inject_flaw(PLAN, "semantic_drift", method="progressive_replacement", seed=0,
                                    matcher="semantic")


@pytest.mark.slow
def test_shipped_similarity_is_the_models():
    """The shipped table is what the embedding model computes for the shared registry's tool texts (if the
    model or the tools change, regenerate core/text/data/tool_similarity.json from ``computed``)."""
    pytest.importorskip("sentence_transformers")
    texts = [tool_text(t) for t in REGISTRY.tools]
    computed = np.round(make_matcher("semantic").similarity(texts, texts), 4)
    np.testing.assert_array_equal(tool_similarity("semantic"), computed)
    some = [i for i, t in enumerate(REGISTRY.tools) if not t.dependencies][:5]
    other = ToolRegistry(tuple(REGISTRY.tools[i] for i in some))  # another registry: computed, not read
    np.testing.assert_array_equal(tool_similarity("semantic", other), computed[np.ix_(some, some)])


def test_flaw_injection_loads_no_embedding_model():
    code = ("import sys\nfrom resilibench.core.bounds import reference_workflow\n"
            "from resilibench.core.text.flaws import inject_flaw, tool_similarity\n"
            "from resilibench.core.world import load_tasks\n"
            "task = load_tasks(split='test')[0]\n"
            "inject_flaw(reference_workflow(task), 'semantic_drift', seed=0)\n"
            "assert tool_similarity('semantic').shape == (30, 30)\n"
            "print(sorted(m for m in ('torch', 'sentence_transformers') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split("\n")[-2] == "[]"


def test_insertions_keep_a_plan_numbered_against_its_edges_acyclic():
    backwards = Workflow((Node("file_operations_reader"), Node("data_processing_parser"), Node("file_operations_writer")),
                         ((2, 0), (1, 2)))
    for flaw, method in (("redundant", "duplicate_step"), ("redundant", "unneeded_insertion"),
                         ("logic_discontinuity", "unrelated_insertion")):
        for seed in range(4):
            flawed = inject_flaw(backwards, flaw, method=method, severity=1.0, seed=seed, matcher="lexical").workflow
            assert len(flawed.nodes) > len(backwards.nodes)  # Workflow() itself rejects cycles


ADDING = [("tool_misuse", "similar_tool"), ("tool_misuse", "category_mismatch"), ("redundant", "unneeded_insertion"),
          ("logic_discontinuity", "unrelated_insertion"), ("semantic_drift", "progressive_replacement")]


@pytest.mark.parametrize(("flaw", "method"), ADDING, ids=[m for _, m in ADDING])
def test_steps_a_flaw_adds_look_like_genuine_steps_of_their_tool(flaw, method):
    """Given the task's values as hints, a step swapped or inserted carries exactly the text and arguments a
    genuine step of its tool carries (``with_arguments``), so it cannot be told apart by form."""
    hints = task_hints(TASK)
    for seed in range(4):
        for change in inject(flaw, method, severity=1.0, seed=seed, hints=hints).changes:
            after = change["after"]
            genuine = with_arguments(TASK, Workflow((Node(after["tool"], OPERATION_PHRASES[
                REGISTRY[after["tool"]].operation]),))).nodes[0]
            assert after == {"tool": genuine.tool, "text": genuine.text, "arguments": genuine.arguments}


def test_a_wrong_type_argument_is_a_value_the_plan_or_task_uses_elsewhere():
    hints = task_hints(TASK)
    vocabulary = {json.dumps(v, sort_keys=True) for v in hints.values()}
    vocabulary |= {p for node in PLAN.nodes for _, p in node.params}
    changed = 0
    for seed in range(6):
        for change in inject("parameter", "wrong_type", severity=1.0, seed=seed, hints=hints).changes:
            before, after = change["before"]["arguments"], change["after"]["arguments"]
            (name,) = [k for k in after if after[k] != before[k]]
            assert json.dumps(after[name], sort_keys=True) in vocabulary
            assert REGISTRY[change["after"]["tool"]].check_arguments(after) is not None
            changed += 1
    assert changed >= 6


@pytest.mark.parametrize("method", ["similar_tool", "category_mismatch"])
def test_a_replacement_is_never_a_tool_the_plan_had(method):
    """Several replacements in one plan: a later one must not bring back a tool an earlier one took out
    (the plan would then hold a genuine step out of place, not a misused tool)."""
    for task in list({t.required_tools: t for t in load_tasks(split=None)}.values())[:120]:
        plan = with_arguments(task, reference_workflow(task))
        for seed in range(3):
            injection = inject_flaw(plan, "tool_misuse", method=method, severity=1.0, seed=seed, matcher="lexical")
            assert not {c["after"]["tool"] for c in injection.changes} & set(plan.tools), (task.instance_id, seed)


def test_flaw_applies_says_what_inject_flaw_does():
    """On short plans (where some flaw types do not apply) and on plans without arguments."""
    plans = [PLAN, reference_workflow(TASK), Workflow.chain(list(PLAN.tools)[:2]), Workflow.chain(list(PLAN.tools)[:1])]
    outcomes = set()
    for plan in plans:
        for flaw in FLAW_TYPES:
            try:
                inject_flaw(plan, flaw, seed=5, matcher="lexical")
                injected = True
            except FlawNotApplicable:
                injected = False
            assert flaw_applies(plan, flaw, matcher="lexical") == injected, (plan.tools, flaw)
            outcomes.add(injected)
    assert outcomes == {True, False}
