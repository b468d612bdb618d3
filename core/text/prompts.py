"""Workflow prompts (paper appendix B.2, D.5.3): baseline, cot, optimal and flawed, in our text protocol.

A prompt holds the task, the protocol (``<tool_search>``, ``<tool_info>``, ``<tool_call>`` with optional
JSON arguments, one call per turn, "task completed" to finish, the turn limit) and, for the optimal and
flawed variants, a plan in one of two styles: ``numbered`` (``Workflow.to_plan`` lines with arguments)
or ``mcp_task`` (the paper's structured ``<mcp_task>`` form with per-step reasons, dependencies,
alternatives and the predicted success probability). ``parse_plan`` reads either style back, also out of a
whole prompt. The optimal plan is the optimal policy's ``reference_workflow`` with arguments filled in;
the flawed plan is that plan after ``inject_flaw``, shown exactly like an optimal one.
"""

from __future__ import annotations

__all__ = [
    "PROMPT_VARIANTS", "PLAN_STYLES", "PLAN_HEADING", "N_ALTERNATIVES", "ROLE_STEPS", "Prompt",
    "with_arguments", "render_plan", "parse_plan", "task_statement", "PromptSettings", "shown_plan",
    "build_prompt",
]

import json
import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from resilibench.errors import ConfigError
from resilibench.settings import Settings, setting

from ..arguments import task_hints, valid_arguments
from ..bounds import reference_workflow
from ..config import WorldConfig
from ..plan_follower import workflow_success
from ..registry import RETURN_VALUES, ToolRegistry, default_registry
from ..tasks.library import Task
from ..workflow import Node, Workflow
from .flaws import FLAW_TYPES, MATCHERS, FlawInjection, inject_flaw, similar_tools
from .toolbox import PROTOCOLS, WORDINGS

PROMPT_VARIANTS = ("baseline", "cot", "optimal", "flawed")

PLAN_STYLES = ("numbered", "mcp_task")
PLAN_HEADING = "## Workflow Execution Plan"
N_ALTERNATIVES = 2
# The kind of step a tool's role makes (the first part of an mcp_task step's reason).
ROLE_STEPS = {"source": "data loading", "processor": "processing", "aggregator": "aggregation", "output": "output",
              "utility": "support", None: "processing"}


@dataclass(frozen=True)
class Prompt:
    """A prompt's text and what it was built from (the plan shown, the flaw injected)."""

    text: str
    variant: str
    plan: Workflow | None
    injection: FlawInjection | None
    plan_style: str


# --- arguments ---------------------------------------------------------------------------------------------


def with_arguments(task: Task, workflow: Workflow, registry: ToolRegistry | None = None) -> Workflow:
    """``workflow`` with every tool step's missing required arguments (and the task's options where the
    tool takes them) filled with values valid under the tool's schema; arguments already there are kept."""
    registry = registry or default_registry()
    hints = task_hints(task)
    nodes = []
    for node in workflow.nodes:
        if node.tool is None or node.tool not in registry:
            nodes.append(node)
            continue
        arguments = {**valid_arguments(registry[node.tool], hints), **node.arguments}
        nodes.append(Node.make(node.tool, node.text, arguments))
    return Workflow(tuple(nodes), workflow.edges)


_PLANS_WITH_ARGUMENTS: dict[tuple, tuple] = {}  # (id(task), id(registry), workflow) -> (task, registry, plan)
_PLANS_WITH_ARGUMENTS_MAX = 4096


def _plan_with_arguments(task: Task, workflow: Workflow, registry: ToolRegistry) -> Workflow:
    """``with_arguments``, memoised: it is a pure function of the task, the workflow's value (a Workflow is
    immutable and hashable) and the registry, and every reset of a prompt with a plan asks for it."""
    key = (id(task), id(registry), workflow)
    entry = _PLANS_WITH_ARGUMENTS.get(key)
    if entry is None or entry[0] is not task or entry[1] is not registry:
        if len(_PLANS_WITH_ARGUMENTS) >= _PLANS_WITH_ARGUMENTS_MAX:
            _PLANS_WITH_ARGUMENTS.clear()
        entry = _PLANS_WITH_ARGUMENTS[key] = (task, registry, with_arguments(task, workflow, registry))
    return entry[2]


def shown_plan(task: Task, workflow: Workflow | None, config: WorldConfig, registry: ToolRegistry) -> Workflow:
    """The plan an optimal prompt shows and a flawed one injects its flaw into: ``workflow`` (default: the
    optimal policy's ``reference_workflow``) with arguments filled in."""
    return _plan_with_arguments(task, workflow if workflow is not None else reference_workflow(task, config),
                                registry)


# --- rendering and parsing plans ------------------------------------------------------------------------------


def render_plan(
    workflow: Workflow,
    style: str = "numbered",
    *,
    task: Task | None = None,
    registry: ToolRegistry | None = None,
    success_probability: float | None = None,
    config: WorldConfig | None = None,
    matcher: str = "auto",
) -> str:
    """The plan as text. ``numbered``: a heading and ``Workflow.to_plan`` lines. ``mcp_task``: the
    structured form; its predicted success probability is ``success_probability`` or, given ``task``,
    the exact success of following the plan (``workflow_success``); alternatives are the most similar
    tools under ``matcher`` (see ``core.text.flaws.tool_similarity``)."""
    _check_choice("style", style, PLAN_STYLES)
    if style == "numbered":
        return PLAN_HEADING + "\n\n" + (workflow.to_plan() or "(no steps)")
    registry = registry or default_registry()
    config = config or WorldConfig()
    if success_probability is None and task is not None:
        success_probability = workflow_success(task, workflow, config)
    lines = ["<mcp_task>", "<workflow_intelligence>"]
    if success_probability is not None:
        lines.append(f"Predicted success probability: {success_probability:.4f}")
    lines.append(f"Steps: {len(workflow.nodes)}")
    lines += ["</workflow_intelligence>", "<execution_plan>"]
    lines += _mcp_steps(workflow, registry, config, matcher)
    lines += [
        "</execution_plan>",
        "<failure_handling>",
        "1. Call the step's primary tool first.",
        "2. If it fails, retry it or use the step's alternatives, in the order listed.",
        "3. If every option fails, report the problem and stop.",
        "</failure_handling>",
        "<execution_tracking>",
        "For every step, report the tool you chose and why, any deviation from the plan, and your confidence "
        "in its outcome.",
        "</execution_tracking>",
        "</mcp_task>",
    ]
    return "\n".join(lines)


def _mcp_steps(workflow: Workflow, registry: ToolRegistry, config: WorldConfig, matcher: str) -> list[str]:
    """One block per step: purpose, reason, arguments, prerequisites, alternatives, expected outcome and
    confidence. Every annotation comes from the plan as shown and the step's tool, never from checking the
    plan against the task or the tools' dependencies, so a flawed plan is annotated as its author would
    annotate it, exactly like an optimal one (docs/core/prompts.md, "Flawed prompts")."""
    preds: dict[int, list[int]] = {i: [] for i in range(len(workflow.nodes))}
    succs: dict[int, list[int]] = {i: [] for i in range(len(workflow.nodes))}
    for a, b in workflow.edges:
        preds[b].append(a)
        succs[a].append(b)
    tools = [n.tool if n.tool is not None and n.tool in registry else None for n in workflow.nodes]
    in_plan = {registry.id_of(t) for t in tools if t is not None}
    lines = []
    for i, (node, known) in enumerate(zip(workflow.nodes, tools, strict=True)):
        lines.append(f"{i + 1}. Execute {node.tool}" if node.tool else f"{i + 1}. Step")
        if node.text:
            lines.append(f"   - Purpose: {node.text}")
        if known is not None:
            lines.append(f"   - Reason: {_reason(i, known, workflow, sorted(succs[i]), registry)}")
        if node.params:
            lines.append(f"   - Arguments: {json.dumps(node.arguments, sort_keys=True)}")
        lines.append(f"   - Requires: {_steps_named(workflow, sorted(preds[i])) or 'none'}")
        if known is not None:
            tool = registry.id_of(known)
            alternatives = similar_tools(tool, in_plan, registry, matcher)[:N_ALTERNATIVES]
            lines.append(f"   - Alternatives: {', '.join(registry.names[t] for t in alternatives)}")
            name, _, description = RETURN_VALUES[registry.tools[tool].operation]
            lines.append(f"   - Expected: {name} ({description.lower()})")
            lines.append(f"   - Confidence: {config.failure.base_success:.2f}")
    return lines


def _steps_named(workflow: Workflow, indices: list[int]) -> str:
    return ", ".join(f"step {j + 1} ({workflow.nodes[j].tool or workflow.nodes[j].text})" for j in indices)


def _reason(i: int, tool: str, workflow: Workflow, dependents: list[int], registry: ToolRegistry) -> str:
    """Why step ``i`` (of ``tool``) is there, in three parts whatever the plan: the kind of step its tool's
    role makes it, its operation, and the later steps of the plan that require it (or that it ends the plan)."""
    spec = registry[tool]
    then = "prerequisite of " + _steps_named(workflow, dependents) if dependents else "ends the plan"
    return f"{ROLE_STEPS[spec.role].capitalize()} step; performs the {spec.operation} operation; {then}"


_NUMBERED_LINE = re.compile(r"^\s*\d+\.\s")
_MCP_STEP = re.compile(r"^\s*(\d+)\.\s+(?:Execute\s+([A-Za-z_]\w*)|Step)\s*$")
_MCP_FIELD = re.compile(r"^\s*-\s*(Purpose|Arguments|Requires|Reason|Alternatives|Expected|Confidence):\s?(.*)$")


def parse_plan(text: str, tools: Collection[str] | None = None) -> Workflow:
    """The plan in ``text``: an ``<mcp_task>`` block, the numbered lines under the plan heading, or (when
    neither marker is present) the whole text as a numbered plan. ``tools``: the names a ``name:`` step
    prefix may take (a live API's ``getFact``); default snake_case names (``Workflow.from_plan``)."""
    block = re.search(r"<execution_plan>\n?(.*?)</execution_plan>", text, re.S)
    if block is not None:
        return _parse_mcp(block.group(1))
    if PLAN_HEADING in text:
        lines = text.split(PLAN_HEADING, 1)[1].strip("\n").splitlines()
        plan = []
        for line in lines:
            if not _NUMBERED_LINE.match(line):
                break
            plan.append(line)
        return _sorted_edges(Workflow.from_plan("\n".join(plan), tools)) if plan else Workflow(())
    return _sorted_edges(Workflow.from_plan(text, tools))


def _sorted_edges(workflow: Workflow) -> Workflow:
    return Workflow(workflow.nodes, tuple(sorted(workflow.edges)))


def _parse_mcp(block: str) -> Workflow:
    steps: list[dict[str, Any]] = []
    for line in block.splitlines():
        if not line.strip():
            continue
        m = _MCP_STEP.match(line)
        if m:
            if int(m.group(1)) != len(steps) + 1:
                raise ValueError(f"mcp_task steps must be numbered 1, 2, ...; got {m.group(1)} at step {len(steps) + 1}")
            steps.append({"tool": m.group(2), "text": "", "arguments": {}, "after": []})
            continue
        m = _MCP_FIELD.match(line)
        if not m or not steps:
            raise ValueError(f"mcp_task plan line not understood: {line!r}")
        name, value = m.group(1), m.group(2)
        if name == "Purpose":
            steps[-1]["text"] = value
        elif name == "Arguments":
            try:
                steps[-1]["arguments"] = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"step {len(steps)}: arguments are not valid JSON: {exc}") from None
        elif name == "Requires":
            steps[-1]["after"] = [int(x) - 1 for x in re.findall(r"step (\d+)", value)]
    nodes = tuple(Node.make(s["tool"], s["text"], s["arguments"]) for s in steps)
    edges = tuple(sorted((a, b) for b, s in enumerate(steps) for a in s["after"]))
    return Workflow(nodes, edges)


# --- prompts --------------------------------------------------------------------------------------------------

_SEARCH_EXAMPLES = ("file reader writer", "data validation parser", "network api fetch")
_COT = (
    "Think step by step about which tools to use and why.\n\n"
    "Please:\n"
    "1. First explain your reasoning about which tools to use\n"
    "2. Then execute the tools in the order you determined, one tool call per message\n"
    "3. {format}\n\n"
    'Begin with "Reasoning:" followed by your thought process.'
)
_COT_FORMAT = {"paper": "Format tool calls as: <tool_call>tool_name</tool_call>",
               "plain": "Format tool calls as: <tool_call>...</tool_call> with the tool's name in place of the dots",
               "tools": "Call each tool as a function"}
_STRATEGY = (
    "### Execution Strategy:\n"
    "1. Follow the recommended sequence for optimal results\n"
    "2. Use alternatives if primary tools fail\n"
    "3. Check each tool's result before moving to the next step"
)


def _check_choice(name: str, value: Any, accepted: tuple[str, ...]) -> None:
    if value not in accepted:
        raise ValueError(f"{name} must be one of {accepted}, got {value!r}")


def _items(data: dict[str, Any]) -> str:
    return "\n".join(f"- {k}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(data.items())) or "- (none)"


def _protocol_text(registry: ToolRegistry, protocol: str, wording: str) -> str:
    """How to search, read and call tools: tags written as in the paper, tags with placeholder dots
    (an echoed example then runs nothing), or native function calls."""
    library = (f"You have access to a library of {len(registry)} tools for data processing, files, network, "
               "computation, integration and utilities.\n\n")
    examples = ", ".join(_SEARCH_EXAMPLES)
    if protocol == "tools":
        return ("Tools Available:\n\n" + library
                + "Call them as functions: tool_search with a query finds relevant tools (for example: "
                f"{examples}), tool_info with a tool's name shows its parameters, returns and errors, and a "
                "tool called by its name with its arguments executes it.")
    if wording == "paper":
        searches = "\n".join(f"- <tool_search>{q}</tool_search>" for q in _SEARCH_EXAMPLES)
        return ("Tool Search Available:\n\n" + library
                + "To find relevant tools, use the search command: <tool_search>your search query</tool_search>\n\n"
                f"Examples of tool searches:\n{searches}\n\n"
                "To see a tool's parameters, returns and errors: <tool_info>tool_name</tool_info>\n\n"
                "After finding the tools you need, execute them using:\n\n"
                "<tool_call>tool_name</tool_call>\n\n"
                'or, with arguments as a JSON object: <tool_call>tool_name {"argument": "value"}</tool_call>')
    return ("Tool Search Available:\n\n" + library
            + "Write each request as a tag, putting your own text in place of the dots:\n"
            f"- search for tools: <tool_search>...</tool_search> (what you need, for example: {examples})\n"
            "- read a tool's parameters, returns and errors: <tool_info>...</tool_info> (the tool's name)\n"
            "- execute a tool: <tool_call>...</tool_call> (the tool's name, then optionally its arguments as a "
            "JSON object)")


def task_statement(task: Task) -> str:
    """What every prompt of a task opens with: its type, description, inputs and expected outputs."""
    return (
        f"Execute {'an' if task.complexity[0] in 'aeiou' else 'a'} {task.complexity} {task.task_type.replace('_', ' ')} task.\n\n"
        f"Task: {task.description}\n\n"
        f"Input Data:\n{_items(task.inputs)}\n\n"
        f"Expected Output:\n{_items(task.expected_outputs)}"
    )


def _baseline(task: Task, config: WorldConfig, registry: ToolRegistry, protocol: str, wording: str) -> str:
    finish = ('- When the task is done, say "task completed".' if wording == "paper" else
              '- When every step has succeeded, and not before, say "task completed".')
    return (
        f"{task_statement(task)}\n\n"
        f"{_protocol_text(registry, protocol, wording)}\n\n"
        "Rules:\n"
        "- Make at most one tool call per message.\n"
        f"- You have {config.rules.turn_limit} turns: every message you send uses one, searches and info "
        "requests included.\n"
        "- Tools can fail (timeouts, invalid input, unmet dependencies). A failed tool may be retried, up to "
        f"{1 + task.max_retries} calls per tool.\n"
        f"{finish}\n\n"
        "Instructions:\n"
        "1. Analyze the task requirements\n"
        "2. Search for appropriate tools based on what you need to do\n"
        "3. Execute the tools in the correct order\n"
        "4. Complete the task and indicate when finished"
    )


@dataclass(frozen=True)
class PromptSettings(Settings):
    """How a task is put to an agent: the prompt variant, the flaw of a flawed plan, how a plan is written,
    and how the agent uses tools. Checked when built (``ConfigError`` naming the field)."""

    variant: str = setting("baseline", choices=PROMPT_VARIANTS, help="the prompt variant (paper B.2)")
    flaw_type: str | None = setting(None, choices=FLAW_TYPES, help="the flaw a flawed prompt's plan carries "
                                    "(the 'flawed' variant only)")
    severity: float = setting(0.5, above=0, bounds=(None, 1), help="share of the plan's eligible steps a flaw "
                              "changes")
    plan_style: str = setting("numbered", choices=PLAN_STYLES, help="how a plan is written")
    protocol: str = setting("tags", choices=PROTOCOLS, help="how tools are used: tags in the text or native "
                            "function calls")
    wording: str = setting("plain", choices=WORDINGS, help="how the tag protocol is worded: plain (no live "
                           "example tag) or the paper's")
    matcher: str = setting("auto", choices=MATCHERS, help="tool similarity of flaws and plan alternatives "
                           "(pin it to reproduce flaws on any install)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.variant == "flawed" and self.flaw_type is None:
            raise ConfigError("flaw_type", "variant 'flawed' needs a flaw_type (one of "
                                           "core.text.flaws.FLAW_TYPES)")
        if self.variant != "flawed" and self.flaw_type is not None:
            raise ConfigError("flaw_type", f"flaw_type is only accepted with variant 'flawed', got variant "
                              f"{self.variant!r}")


def build_prompt(task: Task, settings: PromptSettings | None = None, *, seed: int = 0,
                 workflow: Workflow | None = None, config: WorldConfig | None = None,
                 registry: ToolRegistry | None = None) -> Prompt:
    """The prompt for ``task`` under ``settings`` (default: the baseline prompt). The plan source is
    ``workflow`` (default: the optimal policy's ``reference_workflow``), with arguments filled in; a
    flawed prompt injects its flaw into it (``seed``) and shows the result as if it were optimal, with the
    predicted success probability of the unflawed plan."""
    settings = settings or PromptSettings()
    variant, plan_style, matcher = settings.variant, settings.plan_style, settings.matcher
    config = config or WorldConfig()
    registry = registry or default_registry()
    parts = [_baseline(task, config, registry, settings.protocol, settings.wording)]
    plan = injection = None
    if variant == "cot":
        wording = "tools" if settings.protocol == "tools" else settings.wording
        parts.append(_COT.format(format=_COT_FORMAT[wording]))
    elif variant in ("optimal", "flawed"):
        plan = source = shown_plan(task, workflow, config, registry)
        if variant == "flawed":
            assert settings.flaw_type is not None  # PromptSettings requires one with variant 'flawed'
            injection = inject_flaw(source, settings.flaw_type, severity=settings.severity, seed=seed,
                                    registry=registry, matcher=matcher, hints=task_hints(task))
            plan = injection.workflow
        probability = workflow_success(task, source, config) if plan_style == "mcp_task" else None
        parts.append(render_plan(plan, plan_style, task=task, registry=registry, success_probability=probability,
                                 config=config, matcher=matcher))
        parts.append(_STRATEGY)
    parts.append("Use appropriate tools to complete the task.")
    return Prompt("\n\n".join(parts), variant, plan, injection, plan_style)
