"""Workflow prompts: arguments that pass the schema, plans that render and parse back, the four variants."""

import re
from dataclasses import replace

import pytest

from resilibench.core.bounds import reference_workflow
from resilibench.core.config import WorldConfig
from resilibench.core.plan_follower import workflow_success
from resilibench.core.registry import default_registry
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.flaws import FLAW_TYPES
from resilibench.core.text.prompts import (
    PLAN_HEADING,
    PLAN_STYLES,
    PROMPT_VARIANTS,
    PromptSettings,
    build_prompt,
    parse_plan,
    render_plan,
    with_arguments,
)
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks

REGISTRY = default_registry()
BY_SIGNATURE = {}
for _task in load_tasks(split=None):
    BY_SIGNATURE.setdefault(_task.required_tools, _task)
TASKS = [next(t for t in BY_SIGNATURE.values() if t.task_type == ty) for ty in TASK_TYPE_NAMES]
TASK = TASKS[2]


def sorted_edges(workflow):
    return Workflow(workflow.nodes, tuple(sorted(workflow.edges)))


def test_with_arguments_makes_plans_pass_the_schema():
    every_tool = Workflow(tuple(Node(name) for name in REGISTRY.names))
    for task in TASKS:
        for node in with_arguments(task, every_tool).nodes:
            tool = REGISTRY[node.tool]
            assert tool.check_arguments(node.arguments) is None
            assert {p.name for p in tool.parameters if p.required} <= set(node.arguments)
            for name in ("source", "input_format", "options"):  # the task's own values where they fit
                if name in node.arguments and name in task.inputs:
                    assert node.arguments[name] == task.inputs[name]
        reference = reference_workflow(task)
        plan = with_arguments(task, reference)
        assert plan.tools == reference.tools and plan.edges == reference.edges
        assert all(REGISTRY[n.tool].check_arguments(n.arguments) is None for n in plan.nodes)
    kept = Workflow((Node.make("file_operations_reader", arguments={"source": 7}),))
    assert with_arguments(TASK, kept).nodes[0].arguments["source"] == 7  # given arguments are never rewritten


@pytest.mark.parametrize("style", PLAN_STYLES)
def test_plans_render_and_parse_back(style):
    plan = with_arguments(TASK, reference_workflow(TASK))
    odd = Workflow((Node(text="check the inputs by hand"), Node.make("network_fetcher", "get it", {"source": "u"}),
                    Node("utility_logger")), ((0, 2), (1, 2)))
    for workflow in (plan, reference_workflow(TASK), odd, Workflow(())):
        text = render_plan(workflow, style, task=TASK, matcher="lexical")
        assert parse_plan(text) == sorted_edges(workflow)
    with pytest.raises(ValueError, match="numbered"):
        render_plan(plan, "yaml")


def test_mcp_task_form_carries_reasons_dependencies_alternatives_and_the_exact_probability():
    """Reasons and confidences come from the plan as shown, so a flawed plan reads like an optimal one."""
    plan = with_arguments(TASK, reference_workflow(TASK))
    text = render_plan(plan, "mcp_task", task=TASK, matcher="lexical")
    for tag in ("mcp_task", "workflow_intelligence", "execution_plan", "failure_handling", "execution_tracking"):
        assert f"<{tag}>" in text and f"</{tag}>" in text
    probability = float(re.search(r"Predicted success probability: ([\d.]+)", text).group(1))
    assert probability == pytest.approx(workflow_success(TASK, plan), abs=5e-5)
    assert text.count("   - Reason: ") == text.count("   - Alternatives: ") == len(plan.nodes)
    for i, tool in enumerate(plan.tools):
        block = text.split(f"\n{i + 1}. Execute {tool}\n", 1)[1].split("\n", 8)[:8]
        alternatives = next(x for x in block if "Alternatives:" in x).split(": ", 1)[1].split(", ")
        assert tool not in alternatives and not set(alternatives) & set(plan.tools)
        reason = next(x for x in block if "Reason:" in x)  # the plan's own edges, not the task's tools
        dependents = [f"step {b + 1} ({plan.tools[b]})" for a, b in plan.edges if a == i]
        assert reason.endswith("prerequisite of " + ", ".join(dependents) if dependents else "ends the plan")
        assert "   - Confidence: 0.80" in block  # a call's chance once its prerequisites succeeded


@pytest.mark.parametrize("style", PLAN_STYLES)
def test_the_four_variants(style):
    settings = PromptSettings(plan_style=style, matcher="lexical")
    baseline = build_prompt(TASK, settings)
    cot = build_prompt(TASK, replace(settings, variant="cot"))
    optimal = build_prompt(TASK, replace(settings, variant="optimal"))
    flawed = build_prompt(TASK, replace(settings, variant="flawed", flaw_type="order"), seed=1)
    for prompt in (baseline, cot, optimal, flawed):
        for needle in ("<tool_search>", "<tool_info>", "<tool_call>", '"task completed"', "10 turns",
                       TASK.description, "one tool call per message"):
            assert needle in prompt.text
    assert baseline.plan is None and baseline.injection is None and PLAN_HEADING not in baseline.text
    assert "<mcp_task>" not in baseline.text and "Reasoning:" in cot.text and "Reasoning:" not in baseline.text
    assert optimal.plan == with_arguments(TASK, reference_workflow(TASK))
    assert parse_plan(optimal.text) == sorted_edges(optimal.plan)
    assert flawed.injection.original == optimal.plan and flawed.plan == flawed.injection.workflow
    assert parse_plan(flawed.text) == sorted_edges(flawed.plan) != sorted_edges(optimal.plan)
    assert "flaw" not in flawed.text.lower()
    if style == "mcp_task":  # the flawed plan claims the optimal plan's success probability
        claim = re.compile(r"Predicted success probability: [\d.]+")
        assert claim.search(flawed.text).group(0) == claim.search(optimal.text).group(0)
    assert build_prompt(TASK, replace(settings, variant="flawed", flaw_type="order"), seed=1) == flawed


def test_every_flaw_type_builds_a_prompt_and_a_caller_plan_is_used():
    for flaw in FLAW_TYPES:
        prompt = build_prompt(TASK, PromptSettings(variant="flawed", flaw_type=flaw, matcher="lexical"))
        assert prompt.injection.flaw_type == flaw and parse_plan(prompt.text) == sorted_edges(prompt.plan)
    mine = Workflow.chain(["file_operations_reader", "data_processing_parser"])
    prompt = build_prompt(TASK, PromptSettings(variant="optimal"), workflow=mine)
    assert prompt.plan.tools == mine.tools and all(n.params for n in prompt.plan.nodes)
    twelve = build_prompt(TASK, PromptSettings(variant="baseline"),
                          config=WorldConfig().replace(rules={"turn_limit": 12}))
    assert "12 turns" in twelve.text


def test_bad_requests_are_refused_clearly():
    with pytest.raises(ValueError, match="flaw_type"):
        build_prompt(TASK, PromptSettings(variant="flawed"))
    with pytest.raises(ValueError, match="only accepted with variant 'flawed'"):
        build_prompt(TASK, PromptSettings(variant="optimal", flaw_type="order"))
    with pytest.raises(ValueError, match="baseline"):
        build_prompt(TASK, PromptSettings(variant="fancy"))
    with pytest.raises(ValueError, match="mcp_task"):
        build_prompt(TASK, PromptSettings(variant="optimal", plan_style="xml"))
    with pytest.raises(ValueError, match="plan line"):
        parse_plan("1. tool: ok\nnot a step")
    assert set(PROMPT_VARIANTS) == {"baseline", "cot", "optimal", "flawed"}


def test_a_flawed_plan_claims_the_confidence_of_an_optimal_one_under_any_rules():
    """Unmet dependencies once showed as 'Confidence: 0.40' (0.00 with strict dependencies), which no
    optimal plan shows: every step now states the failure model's base rate."""
    strict = WorldConfig().replace(rules={"strict_dependencies": True})
    for config in (WorldConfig(), strict):
        for flaw in ("order", "tool_misuse", "missing_step", "semantic_drift"):
            settings = PromptSettings(variant="flawed", flaw_type=flaw, severity=1.0, plan_style="mcp_task",
                                      matcher="lexical")
            prompt = build_prompt(TASK, settings, config=config)
            assert set(re.findall(r"Confidence: (\S+)", prompt.text)) == {"0.80"}
    cautious = WorldConfig().replace(failure={"base_success": 0.65})
    assert "Confidence: 0.65" in build_prompt(TASK, PromptSettings(variant="optimal", plan_style="mcp_task"),
                                              config=cautious).text


def test_optimal_plans_are_computed_once_and_stay_what_they_were():
    """Every reset shows the task's optimal plan with arguments: the happy path is kept per bound problem
    and the plan with arguments per (task, workflow, registry). The kept values are the computed ones, a
    config of equal rules (each env has its own config object) finds them, and another plan or world
    does not get them."""
    from resilibench.core.bounds import exact_bound, path_workflow

    config, twin = WorldConfig(), WorldConfig()
    expected = path_workflow(TASK, exact_bound(TASK, config).happy_path(), REGISTRY)
    assert reference_workflow(TASK, config) == expected == reference_workflow(TASK, twin)
    first = build_prompt(TASK, PromptSettings(variant="optimal"), config=config)
    again = build_prompt(TASK, PromptSettings(variant="optimal"), config=twin)
    assert first.plan is again.plan and first.plan == with_arguments(TASK, expected, REGISTRY)
    shorter = Workflow(expected.nodes[:1])
    assert build_prompt(TASK, PromptSettings(variant="optimal"), workflow=shorter).plan == with_arguments(
        TASK, shorter, REGISTRY)
    lenient = WorldConfig().replace(rules={"turn_limit": 4})
    assert reference_workflow(TASK, lenient) == path_workflow(TASK, exact_bound(TASK, lenient).happy_path(),
                                                              REGISTRY)
