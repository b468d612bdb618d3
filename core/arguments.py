"""Arguments a tool call sends when nobody wrote them: values a task supplies, checked by the tool's schema.

Plan following, workflow prompts, flaw injection and live APIs fill a call's arguments the same way.
"""

from __future__ import annotations

__all__ = ["DEFAULT_VALUES", "TYPE_DEFAULTS", "valid_arguments", "task_hints"]

from pathlib import PurePosixPath
from typing import Any

from .registry import Tool
from .tasks.library import Task

# Values for required parameters that no hint supplies, by parameter name, then by JSON type.
DEFAULT_VALUES: dict[str, Any] = {
    "source": "data/input.json",
    "input_format": "json",
    "output_format": "csv",
    "data": {"format": "json"},
    "destination": "output/results.json",
}
TYPE_DEFAULTS: dict[str, Any] = {"string": "value", "object": {}, "number": 1.0, "integer": 1, "boolean": True}


def valid_arguments(tool: Tool, hints: dict[str, Any] | None = None) -> dict[str, Any]:
    """Arguments for ``tool`` that pass its input schema: every required parameter, from ``hints`` where
    the hinted value fits the parameter, else a sensible default; optional parameters only where a hint
    fits them (e.g. the task's ``options``)."""
    hints = hints or {}
    base = {p.name: DEFAULT_VALUES.get(p.name, TYPE_DEFAULTS[p.type]) for p in tool.parameters if p.required}
    arguments = dict(base)
    for p in tool.parameters:
        if p.name in hints and tool.check_arguments({**base, p.name: hints[p.name]}) is None:
            arguments[p.name] = hints[p.name]
    problem = tool.check_arguments(arguments)
    if problem is not None:  # the defaults above fit every tool of the registry; a new tool may not
        raise ValueError(f"no valid default arguments for {problem}")
    return arguments


def task_hints(task: Task) -> dict[str, Any]:
    """Argument values a task supplies: its inputs, formats from its source and expected output, and a
    destination named after its source."""
    inputs = task.inputs
    metadata = task.expected_outputs.get("metadata", {}) if isinstance(task.expected_outputs, dict) else {}
    source = inputs.get("source")
    path = PurePosixPath(str(source)) if source else None
    extension = path.suffix.lstrip(".") if path else ""
    output_format = inputs.get("output_format") or metadata.get("output_format") or extension or "json"
    input_format = inputs.get("input_format") or extension or output_format
    stem = path.stem if path else task.instance_id
    hints = {
        "source": source or f"data/{task.instance_id}.{input_format}",
        "input_format": input_format,
        "output_format": output_format,
        "data": inputs.get("data") or {"format": input_format},
        "destination": f"output/{stem}_results.{output_format}",
    }
    if "options" in inputs:
        hints["options"] = inputs["options"]
    return hints
