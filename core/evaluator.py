"""The evaluator (paper app. B.4): an execution trace plus the completion signal -> full / partial / failure.

One evaluator serves every front end. ``classify`` holds the level rule and works on scalars and numpy
arrays, so the batched vector env applies exactly the same rule.
"""

from __future__ import annotations

__all__ = [
    "LEVELS", "FAILURE", "PARTIAL", "FULL", "FAILURE_TERMINATIONS", "Evaluation", "PARTIAL_RULES", "classify",
    "grade", "signals_completion", "output_tool_ids", "task_tables", "evaluate",
]

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from .config import EvaluatorConfig
from .registry import ToolRegistry, default_registry

if TYPE_CHECKING:
    from .tasks.library import Task


LEVELS = ("failure", "partial_success", "full_success")
FAILURE, PARTIAL, FULL = 0, 1, 2
FAILURE_TERMINATIONS = frozenset({"consecutive_failures", "repetition_loop"})


@dataclass(frozen=True)
class Evaluation:
    """The level and the conditions it was derived from."""

    level: str
    coverage: float
    coverage_met: bool
    sequence_correct: bool
    output_generated: bool
    completed: bool
    end_reason: str | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


PARTIAL_RULES = ("v0", "v1")


def classify(full_coverage, coverage_met, sequence_correct, output, completed, failed_termination,
             conditions_needed: int = 2, order_counts=True, progress_needed: bool = True):
    """Level code (0 failure, 1 partial, 2 full) from the conditions; Python bools or numpy bool arrays.

    ``order_counts``: whether the order condition may count toward partial success (world v1: only once
    two required tools succeeded). ``progress_needed``: partial success also needs coverage at the
    minimum or an output (world v1). Written with bool arithmetic only, so scalars stay cheap Python ints
    and arrays stay arrays.
    """
    full = full_coverage & sequence_correct & output & completed
    partial_count = coverage_met * 1 + output * 1 + completed * 1 + (sequence_correct & order_counts) * 1
    partial = (partial_count >= conditions_needed) & ((coverage_met | output) | (not progress_needed))
    level = full * FULL + (partial > full) * PARTIAL  # ``partial > full``: partial and not full
    return level * (1 - failed_termination * 1)


def grade(n_covered, n_required, sequence_correct, output_generated, completed, failed_termination,
          min_coverage, conditions_needed: int = 2, partial_rule: str = "v1"):
    """(coverage, coverage_met, level code) from counts; scalars or numpy arrays.

    The one place coverage is computed and graded: ``evaluate`` (from a trace) and the batched vector env
    (from counters) both call it. Coverage is 1.0 for a task without required tools. ``partial_rule``:
    "v1" (partial success needs real progress, see ``evaluate``) or "v0" (any two conditions).
    """
    if partial_rule not in PARTIAL_RULES:
        raise ValueError(f"evaluator.partial_rule must be one of {PARTIAL_RULES}, got {partial_rule!r}")
    empty = n_required == 0
    coverage = (n_covered + empty) / (n_required + empty)
    coverage_met = coverage >= min_coverage
    v1 = partial_rule == "v1"
    code = classify(coverage >= 1.0, coverage_met, sequence_correct, output_generated, completed,
                    failed_termination, conditions_needed, order_counts=(n_covered >= 2) | (not v1),
                    progress_needed=v1)
    return coverage, coverage_met, code


def signals_completion(message: str, config: EvaluatorConfig | None = None) -> bool:
    """Whether an agent message says the task is complete (case-insensitive phrase match)."""
    phrases = (config or EvaluatorConfig()).completion_phrases
    text = re.sub(r"\s+", " ", message.lower())
    return any(p in text for p in phrases)


def output_tool_ids(required: Sequence[int], registry: ToolRegistry) -> tuple[int, ...]:
    """Tools whose success counts as output: required output-role tools, else the last required tool."""
    outputs = tuple(t for t in required if t in registry.output_ids)
    if outputs or not required:
        return outputs
    return (required[-1],)


_TASK_TABLES: dict[tuple[int, int], tuple] = {}
_TASK_TABLES_MAX = 1 << 16


def task_tables(task: Task, registry: ToolRegistry
                ) -> tuple[tuple[int, ...], dict[int, int], tuple[int, ...], int]:
    """(required tool ids, position of each, output tool ids, calls allowed per tool) of ``task``, cached
    per task object (the evaluator and every episode read them). The position dict is shared: copy it
    before changing it."""
    key = (id(task), id(registry))
    entry = _TASK_TABLES.get(key)
    if entry is None or entry[0] is not task or entry[1] is not registry:
        if len(_TASK_TABLES) >= _TASK_TABLES_MAX:
            _TASK_TABLES.clear()
        required = task.required_ids(registry)
        entry = (task, registry, required, {t: i for i, t in enumerate(required)},
                 output_tool_ids(required, registry), 1 + task.max_retries)
        _TASK_TABLES[key] = entry
    return entry[2:]


def evaluate(
    task: Task,
    trace: Iterable,
    completed: bool,
    end_reason: str | None = None,
    config: EvaluatorConfig | None = None,
    registry: ToolRegistry | None = None,
) -> Evaluation:
    """Grade a trace (records with ``tool`` and ``success``) for ``task``.

    Conditions: coverage (share of required tools that succeeded), sequence (first successes of required
    tools in required order, at least one success), output (an output-role tool succeeded, or the last
    required tool for tasks without one), completion. Full = all four with full coverage. Partial (rule
    v1, the default) = real progress (coverage >= the type's minimum, or an output) and at least
    ``partial_conditions_needed`` of {coverage >= minimum, output, completion, sequence}, where the
    sequence counts only once two required tools succeeded; rule v0 (world v0) drops both provisos.
    Failure otherwise, and always after a failure termination.
    """
    config = config or EvaluatorConfig()
    registry = registry or default_registry()
    required, position, outputs, _ = task_tables(task, registry)
    first_successes: list[int] = []
    succeeded: set[int] = set()
    id_of = registry.id_of
    for record in trace:
        if record.success:
            tool = id_of(record.tool)
            if tool not in succeeded:
                succeeded.add(tool)
                if tool in position:
                    first_successes.append(position[tool])
    # Strictly increasing positions (a tool appears once and distinct tools have distinct positions).
    sequence_correct = bool(first_successes) and first_successes == sorted(first_successes)
    output_generated = any(t in succeeded for t in outputs) if outputs else True
    try:
        min_coverage = config.min_coverage[task.task_type]
    except KeyError:
        raise ValueError(
            f"no min_coverage for task type {task.task_type!r}; configured: {sorted(config.min_coverage)}"
        ) from None
    coverage, coverage_met, code = grade(len(first_successes), len(required), sequence_correct, output_generated,
                                         bool(completed), end_reason in FAILURE_TERMINATIONS, min_coverage,
                                         config.partial_conditions_needed, config.partial_rule)
    return Evaluation(LEVELS[int(code)], coverage, coverage_met, sequence_correct, output_generated,
                      bool(completed), end_reason)
