"""Task libraries: the Task type and its five task types, reading and writing JSONL task files, selecting
tasks by split and type, and what a library holds (``library_stats``).

The shipped libraries (``data/tasks_v1.jsonl.gz``, ``data/tasks_v0.jsonl.gz``) belong to their worlds
(``resilibench.core.world``); their generators are ``generator_v1`` and ``generator_v0``.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_SEED", "SPLITS", "SPLIT_FRACTIONS", "TaskType", "TASK_TYPES", "TASK_TYPE_NAMES", "COMPLEXITIES",
    "Task", "read_tasks", "write_tasks", "filter_tasks", "find_task", "interleave_task_types",
    "library_stats", "dependency_sort",
]

import gzip
import io
import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..registry import (
    ToolRegistry,
    default_registry,
    named_tools,
    topological_order,
)

DEFAULT_SEED = 2024
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)


@dataclass(frozen=True)
class TaskType:
    """One task type of the generator (paper app. C.2)."""

    name: str
    operations: tuple[str, ...]
    complexity: str
    count: int
    tools_per_task: tuple[int, int]  # inclusive range of required tools


TASK_TYPES: tuple[TaskType, ...] = (
    TaskType("basic_file_processing", ("input", "process"), "easy", 1200, (2, 3)),
    TaskType("simple_data_transformation", ("read", "process", "output"), "easy", 320, (1, 2)),
    TaskType("complex_validation_pipeline", ("read", "validate", "transform", "aggregate", "write"), "medium", 1520,
             (5, 5)),
    TaskType("complex_network_integration", ("fetch", "parse", "validate", "transform", "post"), "medium", 1360,
             (5, 5)),
    TaskType("advanced_computation_pipeline", ("read", "validate", "transform", "compute", "aggregate", "write"),
             "hard", 640, (6, 6)),
)
TASK_TYPE_NAMES = tuple(t.name for t in TASK_TYPES)
COMPLEXITIES = ("easy", "medium", "hard")

_FIELD_TYPES: dict[str, type] = {
    "instance_id": str, "task_type": str, "description": str, "inputs": dict, "expected_outputs": dict,
    "required_tools": list, "constraints": dict, "complexity": str, "metadata": dict, "original_description": str,
    "split": str,
}
_KIND_NAMES = {str: "string", dict: "JSON object", list: "list"}


@dataclass(frozen=True)
class Task:
    """One task of the library; the fields of paper app. C.2 plus its split."""

    instance_id: str
    task_type: str
    description: str
    inputs: dict[str, Any]
    expected_outputs: dict[str, Any]
    required_tools: tuple[str, ...]
    constraints: dict[str, Any]
    complexity: str
    metadata: dict[str, Any] = field(default_factory=dict)
    original_description: str = ""
    split: str = "train"

    @property
    def max_retries(self) -> int:
        return int(self.constraints.get("max_retries", 3))

    def required_ids(self, registry: ToolRegistry | None = None) -> tuple[int, ...]:
        registry = registry or default_registry()
        return tuple(registry.id_of(t) for t in self.required_tools)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["required_tools"] = list(self.required_tools)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any], registry: ToolRegistry | None = None) -> Task:
        """Build a task from JSON data, with clear errors for missing or bad fields."""
        if not isinstance(data, dict):
            raise ValueError(f"a task must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("instance_id", "task_type", "required_tools") if k not in data]
        if missing:
            raise ValueError(f"task is missing field(s) {missing}: {str(data)[:200]}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"task {data['instance_id']!r} has unknown field(s) {unknown}; accepted: {sorted(known)}")
        for name, kind in _FIELD_TYPES.items():
            if name in data and not isinstance(data[name], kind):
                raise ValueError(f"task {str(data['instance_id'])[:80]!r}: {name} must be a {_KIND_NAMES[kind]}, got "
                                 f"{type(data[name]).__name__}")
        if data["task_type"] not in TASK_TYPE_NAMES:
            raise ValueError(f"task {data['instance_id']!r}: task_type {data['task_type']!r} not in {TASK_TYPE_NAMES}")
        registry = registry or default_registry()
        for tool in data["required_tools"]:
            if not isinstance(tool, str) or tool not in registry:
                raise ValueError(f"task {data['instance_id']!r}: unknown required tool {tool!r}")
        retries = data.get("constraints", {}).get("max_retries", 3)
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
            raise ValueError(f"task {data['instance_id']!r}: constraints.max_retries must be an integer >= 0, "
                             f"got {retries!r}")
        kwargs = {
            "description": "",
            "inputs": {},
            "expected_outputs": {},
            "constraints": {"timeout": 300, "max_retries": 3},
            "complexity": "easy",
            **data,
        }
        kwargs["required_tools"] = tuple(data["required_tools"])
        return cls(**kwargs)


# --- loading and writing ------------------------------------------------------------------------------


def _open_text(path: Path, mode: str):
    if path.suffix == ".gz":
        if "w" in mode:
            return io.TextIOWrapper(gzip.GzipFile(path, mode="wb", mtime=0), encoding="utf-8", newline="\n")
        return gzip.open(path, "rt", encoding="utf-8")
    return path.open(mode, encoding="utf-8", newline="\n")


def read_tasks(path: str | Path) -> list[Task]:
    """Read a JSONL (optionally .gz) task file; errors name the line."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"task file {path} does not exist (generate one with `resilibench tasks generate`)")
    tasks = []
    with _open_text(path, "r") as fh:
        for line_no, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                tasks.append(Task.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ValueError) as exc:
                raise ValueError(f"{path}:{line_no}: {exc}") from None
    return tasks


def write_tasks(tasks: Iterable[Task], path: str | Path) -> Path:
    """Write tasks as JSONL (gzip when the name ends in .gz) atomically; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp" + path.suffix)
    try:
        with _open_text(tmp, "w") as fh:
            for task in tasks:
                fh.write(json.dumps(task.to_dict(), sort_keys=True, separators=(",", ":")) + "\n")
        os.replace(tmp, path)
    except BaseException:  # a full disk, an interrupt: leave no partial temporary file behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def filter_tasks(tasks: Iterable[Task], split: str | None = None,
                 task_types: Sequence[str] | str | None = None) -> list[Task]:
    """The tasks of ``split`` (None: all) and of ``task_types`` (None: all); ValueError naming a bad one."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    if isinstance(task_types, str):
        task_types = (task_types,)
    for t in task_types or ():
        if t not in TASK_TYPE_NAMES:
            raise ValueError(f"unknown task type {t!r}; accepted: {TASK_TYPE_NAMES}")
    return [t for t in tasks if (split is None or t.split == split) and (not task_types or t.task_type in task_types)]


def find_task(task_id: str, tasks: Iterable[Task], where: str) -> Task:
    """The task of ``tasks`` with id ``task_id``; KeyError naming ``where`` it was looked for otherwise."""
    task = next((t for t in tasks if t.instance_id == task_id), None)
    if task is None:
        raise KeyError(f"no task with instance_id {task_id!r} in {where} (see `resilibench tasks list` for ids)")
    return task


def interleave_task_types(tasks: Sequence[Task]) -> list[Task]:
    """Tasks in turn by task type (the first of each type, then the second, ...), so that the first few
    cover every type."""
    queues: dict[str, list[Task]] = {}
    for t in tasks:
        queues.setdefault(t.task_type, []).append(t)
    depth = max((len(q) for q in queues.values()), default=0)
    return [q[i] for i in range(depth) for q in queues.values() if i < len(q)]


def library_stats(tasks: Sequence[Task], registry: ToolRegistry | None = None) -> dict[str, Any]:
    """What a library holds: counts by type, complexity and split; distinct required-tool lists; how
    many tasks require each tool; descriptions naming a tool; test lists also found in train/validation."""
    registry = registry or default_registry()

    def count(key) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in tasks:
            out[key(t)] = out.get(key(t), 0) + 1
        return dict(sorted(out.items()))

    per_tool = {name: 0 for name in registry.names}
    for t in tasks:
        for tool in set(t.required_tools):
            per_tool[tool] += 1
    test_lists = {t.required_tools for t in tasks if t.split == "test"}
    other_lists = {t.required_tools for t in tasks if t.split != "test"}
    return {
        "tasks": len(tasks),
        "by_task_type": count(lambda t: t.task_type),
        "by_complexity": count(lambda t: t.complexity),
        "by_split": count(lambda t: t.split),
        "by_length": count(lambda t: str(len(t.required_tools))),
        "distinct_tool_lists": len({t.required_tools for t in tasks}),
        "distinct_descriptions": len({t.description for t in tasks}),
        "tasks_per_tool": per_tool,
        "tools_required_by_fewer_than_20": sorted(n for n, c in per_tool.items() if c < 20),
        "descriptions_naming_a_tool": sum(bool(named_tools(t.description, registry)) for t in tasks),
        "test_lists_seen_in_train_or_validation": len(test_lists & other_lists),
    }


# --- generation ---------------------------------------------------------------------------------------


def dependency_sort(tools: Sequence[str], registry: ToolRegistry | None = None) -> list[str]:
    """Stable topological order: a tool comes after every selected tool it (transitively) depends on."""
    registry = registry or default_registry()
    ids = [registry.id_of(t) for t in tools]
    edges = [(a, b) for b, tool in enumerate(ids) for a, other in enumerate(ids) if other in registry.ancestors(tool)]
    return [tools[i] for i in topological_order(len(ids), edges)]


