"""The evaluator (SPEC 4): an execution trace plus the completion signal -> full / partial / failure.

One evaluator serves every front end. ``classify`` holds the level rule and works on scalars and numpy
arrays, so the batched vector env applies exactly the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from resilibench.envs.config import EvaluatorConfig
from resilibench.envs.registry import ToolRegistry, default_registry

if TYPE_CHECKING:
    from resilibench.envs.tasks import Task

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


def classify(full_coverage, coverage_met, sequence_correct, output, completed, failed_termination,
             conditions_needed: int = 2):
    """Level code (0 failure, 1 partial, 2 full) from the conditions; scalars or arrays."""
    full = full_coverage & sequence_correct & output & completed
    partial_count = (np.asarray(coverage_met, dtype=np.int8) + np.asarray(output, dtype=np.int8)
                     + np.asarray(completed, dtype=np.int8) + np.asarray(sequence_correct, dtype=np.int8))
    level = np.where(full, FULL, np.where(partial_count >= conditions_needed, PARTIAL, FAILURE))
    return np.where(failed_termination, FAILURE, level)


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
    required tool for tasks without one), completion. Full = all four with full coverage; partial = at
    least ``partial_conditions_needed`` of {coverage >= the type's minimum, output, completion,
    sequence}; failure otherwise and always after a failure termination.
    """
    config = config or EvaluatorConfig()
    registry = registry or default_registry()
    required = task.required_ids(registry)
    position = {t: i for i, t in enumerate(required)}
    first_successes: list[int] = []
    succeeded: set[int] = set()
    for record in trace:
        if not record.success:
            continue
        tool = registry.id_of(record.tool)
        if tool not in succeeded:
            succeeded.add(tool)
            if tool in position:
                first_successes.append(position[tool])
    coverage = len(first_successes) / len(required) if required else 1.0
    sequence_correct = bool(first_successes) and all(a < b for a, b in zip(first_successes, first_successes[1:]))
    outputs = output_tool_ids(required, registry)
    output_generated = any(t in succeeded for t in outputs) if outputs else True
    try:
        min_coverage = config.min_coverage[task.task_type]
    except KeyError:
        raise ValueError(
            f"no min_coverage for task type {task.task_type!r}; configured: {sorted(config.min_coverage)}"
        ) from None
    coverage_met = coverage >= min_coverage
    code = classify(coverage >= 1.0, coverage_met, sequence_correct, output_generated, bool(completed),
                    end_reason in FAILURE_TERMINATIONS, config.partial_conditions_needed)
    return Evaluation(LEVELS[int(code)], coverage, coverage_met, sequence_correct, output_generated,
                      bool(completed), end_reason)
