"""World v0's task generator: each task type's operation sequence mapped to tools by semantic matching.

The operations of a task type are matched to tools by similarity (sentence-transformers when installed, a
deterministic lexical matcher otherwise), and the chosen tools are sorted by their dependencies. Same seed
and matcher -> byte-identical JSONL.
"""

from __future__ import annotations

__all__ = [
    "GENERATOR_VERSION", "OPERATION_QUERIES", "CANDIDATES_PER_OPERATION", "CANDIDATE_MIN_RATIO",
    "CANDIDATE_WEIGHTS", "operation_candidates", "generate_tasks_v0",
]

from typing import Any

import numpy as np

from ..matching import make_matcher, tool_text
from ..registry import OPERATION_PHRASES, ToolRegistry, default_registry
from .library import (
    DEFAULT_SEED,
    SPLIT_FRACTIONS,
    TASK_TYPES,
    Task,
    TaskType,
    dependency_sort,
)

GENERATOR_VERSION = "1"
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


def generate_tasks_v0(seed: int = DEFAULT_SEED, matcher=None, registry: ToolRegistry | None = None) -> list[Task]:
    """Generate world v0's 5,040-task library deterministically from ``seed`` and ``matcher``."""
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
