"""World v1's task generator (paper C.2, with the variety the paper describes).

* ``basic_file_processing``: an input tool, then 1-2 tools drawn from the rest of the library.
* ``simple_data_transformation``: one single-tool task per tool of every category, then pairs of two
  random tools.
* ``complex_validation_pipeline`` / ``complex_network_integration``: one tool per operation of the
  type's sequence, each drawn from several candidates with similarity weights, plus an optional
  supporting step (authenticate, monitor, log, cache, notify, ...).
* ``advanced_computation_pipeline``: one tool per operation, then the dependency path of the compute step
  (its direct prerequisites join the task), so tasks follow paths of the dependency graph.

Every list is sorted by dependencies and, where possible, its set of tools differs from every one drawn
before it (in any task type).
Descriptions come from the phrase banks of ``task_phrases`` and name no tool. Splits are held out by
structure: tasks are grouped by their set of required tools and whole groups go to one split, so no
required-tool list of the test split occurs in train or validation. Same seed and matcher, same bytes.
"""

from __future__ import annotations

__all__ = [
    "GENERATOR_VERSION", "OPERATION_POOLS", "OPERATION_QUERIES", "SUPPORT_STEPS", "SUPPORT_PROBABILITY",
    "SIMILARITY_FLOOR", "DRAW_ATTEMPTS", "candidate_weights", "draw_tool_list", "describe",
    "description_slots", "structural_splits", "generate_tasks_v1",
]

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..matching import make_matcher, tool_text
from ..registry import ToolRegistry, default_registry
from . import phrases as phrases
from .library import (
    DEFAULT_SEED,
    SPLIT_FRACTIONS,
    TASK_TYPES,
    Task,
    TaskType,
    dependency_sort,
)

GENERATOR_VERSION = "v1.0"

# Candidate tools of every operation; the matcher's similarity to OPERATION_QUERIES weighs the draw.
OPERATION_POOLS: dict[str, tuple[str, ...]] = {
    "read": ("file_operations_reader", "file_operations_scanner", "network_fetcher", "integration_connector"),
    "fetch": ("network_fetcher", "integration_connector", "network_router"),
    "parse": ("data_processing_parser", "file_operations_converter", "integration_mapper"),
    "validate": ("data_processing_validator", "network_validator", "data_processing_filter"),
    "transform": ("data_processing_transformer", "file_operations_converter", "integration_mapper",
                  "data_processing_filter", "file_operations_compressor"),
    "aggregate": ("data_processing_aggregator", "computation_analyzer"),
    "compute": ("computation_calculator", "computation_analyzer", "computation_optimizer",
                "computation_simulator", "computation_predictor"),
    "write": ("file_operations_writer", "utility_notifier", "file_operations_compressor", "integration_queue"),
    "post": ("network_poster", "utility_notifier", "network_router", "integration_queue"),
}
OPERATION_QUERIES: dict[str, str] = {
    "read": "read and load input data from a file or another source",
    "fetch": "fetch data from a remote network API endpoint",
    "parse": "parse raw data into a structured format",
    "validate": "validate the data against a schema and check it",
    "transform": "transform data into another format or shape",
    "aggregate": "aggregate and combine records into a summary",
    "compute": "compute numeric results, statistics, forecasts and analysis",
    "write": "write and export the results to an output destination",
    "post": "post and send the results to a remote network endpoint",
}
# Optional supporting steps of the medium types, with where they go in the list.
SUPPORT_STEPS: dict[str, tuple[str, ...]] = {
    "start": ("integration_authenticator", "network_monitor", "integration_scheduler", "integration_connector"),
    "middle": ("utility_cache", "utility_tracker", "utility_helper", "utility_logger"),
    "end": ("utility_notifier", "integration_queue", "utility_logger", "utility_tracker"),
}
SUPPORT_PROBABILITY = 0.6
SIMILARITY_FLOOR = 0.05  # every candidate keeps a chance, however low its similarity
DRAW_ATTEMPTS = 1000  # redraws of a tool set that repeats an earlier one before a repeat is accepted
_TIMEOUTS = (60, 120, 300, 600)


def candidate_weights(matcher, registry: ToolRegistry) -> dict[str, np.ndarray]:
    """Per operation, the draw weights of its candidates: similarity (2 decimals, floored), normalised."""
    ops = list(OPERATION_POOLS)
    names = sorted({t for pool in OPERATION_POOLS.values() for t in pool})
    sims = matcher.similarity([OPERATION_QUERIES[o] for o in ops], [tool_text(registry[n]) for n in names])
    column = {n: j for j, n in enumerate(names)}
    weights = {}
    for i, op in enumerate(ops):
        w = np.array([max(round(float(sims[i, column[t]]), 2), SIMILARITY_FLOOR) for t in OPERATION_POOLS[op]])
        weights[op] = w / w.sum()
    return weights


def _draw(pool: Sequence[str], weights: np.ndarray | None, exclude: set[str], rng: np.random.Generator) -> str | None:
    options = [i for i, t in enumerate(pool) if t not in exclude]
    if not options:
        return None
    p = np.ones(len(options)) if weights is None else weights[options]
    return pool[options[int(rng.choice(len(options), p=p / p.sum()))]]


def _sequence_tools(ops: Sequence[str], weights, rng: np.random.Generator) -> list[tuple[str, str]]:
    """(operation, tool) per operation of the sequence; no tool twice."""
    steps: list[tuple[str, str]] = []
    for op in ops:
        tool = _draw(OPERATION_POOLS[op], weights[op], {t for _, t in steps}, rng)
        if tool is not None:
            steps.append((op, tool))
    return steps


def _with_support(tools: list[str], rng: np.random.Generator) -> list[str]:
    if rng.random() >= SUPPORT_PROBABILITY:
        return tools
    where = ("start", "middle", "end")[int(rng.integers(3))]
    extra = _draw(SUPPORT_STEPS[where], None, set(tools), rng)
    if extra is None:
        return tools
    position = {"start": 0, "middle": 1 + int(rng.integers(len(tools) - 1)), "end": len(tools)}[where]
    return tools[:position] + [extra] + tools[position:]


def _with_dependency_path(steps: list[tuple[str, str]], registry: ToolRegistry) -> list[str]:
    """The compute step's direct prerequisites join the task, just before it, so the pipeline follows a
    path of the dependency graph."""
    chosen = {t for _, t in steps}
    out: list[str] = []
    for op, tool in steps:
        if op == "compute":
            out += [d for d in registry[tool].dependencies if d not in out and d not in chosen]
        out.append(tool)
    return out


def draw_tool_list(task_type: TaskType, weights, rng: np.random.Generator, registry: ToolRegistry,
                   single: str | None = None) -> tuple[str, ...]:
    """One required-tool list of ``task_type``, sorted by dependencies (``single``: a one-tool task)."""
    name = task_type.name
    if single is not None:
        tools = [single]
    elif name == "basic_file_processing":
        first = _draw(OPERATION_POOLS["read"], weights["read"], set(), rng)
        assert first is not None  # nothing is excluded from the pool
        rest = [t for t in registry.names if t not in OPERATION_POOLS["read"]]
        k = int(rng.integers(1, 3))
        tools = [first] + [rest[i] for i in rng.choice(len(rest), size=k, replace=False)]
    elif name == "simple_data_transformation":
        tools = [registry.names[i] for i in rng.choice(len(registry), size=2, replace=False)]
    elif name == "advanced_computation_pipeline":
        tools = _with_dependency_path(_sequence_tools(task_type.operations, weights, rng), registry)
    else:
        tools = _with_support([t for _, t in _sequence_tools(task_type.operations, weights, rng)], rng)
    return tuple(dependency_sort(tools, registry))


# --- descriptions -------------------------------------------------------------------------------------


def _pick(options: Sequence[str], rng: np.random.Generator) -> str:
    return options[int(rng.integers(len(options)))]


def description_slots(dataset: str, fmt: str, out_fmt: str, source: str, destinations: dict[str, str],
                      rng: np.random.Generator) -> dict[str, str]:
    """The values of a description's slots: the task's data, then the decorative ones drawn from ``rng``."""
    return {
        "dataset": dataset, "fmt": fmt.upper(), "out_fmt": out_fmt.upper(), "source": source, **destinations,
        "schema": _pick(phrases.SCHEMAS, rng), "group": _pick(phrases.GROUPS, rng),
        "condition": _pick(phrases.CONDITIONS, rng), "metric": _pick(phrases.METRICS, rng),
        "team": _pick(phrases.TEAMS, rng), "horizon": _pick(phrases.HORIZONS, rng),
        "period": _pick(phrases.PERIODS, rng), "precision": _pick(phrases.PRECISIONS, rng),
    }


def _steps_text(clauses: list[str], rng: np.random.Generator) -> str:
    if len(clauses) == 1:
        return clauses[0][0].upper() + clauses[0][1:] + "."
    style = int(rng.integers(3))
    if style == 0:
        words = [_pick(phrases.FIRST_WORDS, rng)] + [
            _pick(phrases.SENTENCE_CONNECTORS, rng) for _ in clauses[1:-1]] + [_pick(phrases.LAST_WORDS, rng)]
        return " ".join(f"{w} {c}." for w, c in zip(words, clauses, strict=True))
    if style == 1:
        return "The job must " + "; then ".join(clauses[:-1]) + "; and finally " + clauses[-1] + "."
    return "Steps:\n" + "\n".join(f"{i}. {c[0].upper()}{c[1:]}." for i, c in enumerate(clauses, 1))


def describe(task_type: str, tools: Sequence[str], slots: dict[str, str], rng: np.random.Generator,
             clauses: Mapping[str, Sequence[int]] | None = None) -> str:
    """A description of the task in natural language: an opening, the steps in order, a closing.
    ``clauses``: per tool, the indices of its bank clauses that may be used (None: all of them)."""
    clauses_text = [_pick(phrases.STEP_CLAUSES[t] if clauses is None else
                          [phrases.STEP_CLAUSES[t][i] for i in clauses[t]], rng).format(**slots) for t in tools]
    steps = _steps_text(clauses_text, rng)
    text = _pick(phrases.OPENINGS[task_type], rng).format(**slots)
    if slots["source"] not in steps:
        text += " " + _pick(phrases.SOURCE_SENTENCES, rng).format(**slots)
    text += ("\n" if steps.startswith("Steps:") else " ") + steps
    closing = _pick(phrases.CLOSINGS, rng)
    return text + ("\n" if steps.startswith("Steps:") else " ") + closing if closing else text


# --- inputs, outputs, splits --------------------------------------------------------------------------


def _io(tools: Sequence[str], dataset: str, fmt: str, out_fmt: str, index: int, registry: ToolRegistry,
        rng: np.random.Generator) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, str]]:
    """Inputs, expected outputs, the source and the destinations (a file and an endpoint) of a task."""
    stem = dataset.replace(" ", "_")
    remote_in = registry[tools[0]].category in ("network", "integration")
    source = f"https://api.example.com/v1/{stem}/{index:04d}.{fmt}" if remote_in else f"data/{stem}_{index:04d}.{fmt}"
    destinations = {"dest": f"output/{stem}_{index:04d}.{out_fmt}",
                    "dest_url": f"https://hooks.example.org/{stem}/{index:04d}"}
    outputs = [registry[t] for t in tools if registry[t].role == "output"] or [registry[tools[-1]]]
    final = destinations["dest_url"] if outputs[-1].category == "network" else destinations["dest"]
    inputs: dict[str, Any] = {"source": source, "format": fmt,
                              "options": {"encoding": "utf-8", "batch_size": int(rng.choice([50, 100, 500]))}}
    if any(registry[t].operation in ("transformer", "converter", "mapper") for t in tools):
        inputs["output_format"] = out_fmt
    expected = {"success": True, "destination": final, "metadata": {"output_format": out_fmt}}
    return inputs, expected, source, destinations


def structural_splits(tool_lists: Sequence[tuple[str, ...]], rng: np.random.Generator) -> list[str]:
    """Split labels for one task type: tasks grouped by their set of required tools, groups shuffled and
    dealt to test and validation until each holds its share of tasks, the rest to train."""
    groups: dict[frozenset[str], list[int]] = {}
    for i, tools in enumerate(tool_lists):
        groups.setdefault(frozenset(tools), []).append(i)
    keys = list(groups)
    order = rng.permutation(len(keys))
    targets = {"test": round(len(tool_lists) * SPLIT_FRACTIONS[2]),
               "validation": round(len(tool_lists) * SPLIT_FRACTIONS[1])}
    labels = ["train"] * len(tool_lists)
    filled = dict.fromkeys(targets, 0)
    for g in order:
        members = groups[keys[g]]
        split = next((s for s in targets if filled[s] + len(members) <= targets[s]), "train")
        if split != "train":
            filled[split] += len(members)
        for i in members:
            labels[i] = split
    return labels


def generate_tasks_v1(seed: int = DEFAULT_SEED, matcher=None, registry: ToolRegistry | None = None) -> list[Task]:
    """The 5,040 tasks of world v1, deterministically from ``seed`` and ``matcher``."""
    registry = registry or default_registry()
    matcher = matcher if matcher is not None else make_matcher("auto")
    weights = candidate_weights(matcher, registry)
    rng = np.random.default_rng([seed, 1])
    seen: set[frozenset[str]] = set()  # tool sets drawn so far (a set, so no order of it repeats either)
    used_ids: set[str] = set()
    tasks: list[Task] = []
    for task_type in TASK_TYPES:
        singles = list(registry.names) if task_type.name == "simple_data_transformation" else []
        tool_lists = []
        for i in range(task_type.count):
            single = singles[i] if i < len(singles) else None
            tools = draw_tool_list(task_type, weights, rng, registry, single)
            for _ in range(DRAW_ATTEMPTS - 1):
                if frozenset(tools) not in seen:
                    break
                tools = draw_tool_list(task_type, weights, rng, registry, single)
            seen.add(frozenset(tools))
            tool_lists.append(tools)
        labels = structural_splits(tool_lists, rng)
        for i, tools in enumerate(tool_lists):
            tasks.append(_task(task_type, tools, labels[i], i, seed, matcher.name, weights, registry, rng, used_ids))
    return tasks


def _task(task_type: TaskType, tools: tuple[str, ...], split: str, index: int, seed: int, matcher_name: str,
          weights, registry: ToolRegistry, rng: np.random.Generator, used_ids: set[str]) -> Task:
    dataset = _pick(phrases.DATASETS, rng)
    fmt = _pick(phrases.FORMATS, rng)
    out_fmt = _pick([f for f in phrases.FORMATS if f != fmt], rng)
    inputs, expected, source, destinations = _io(tools, dataset, fmt, out_fmt, index, registry, rng)
    description = describe(task_type.name, tools, description_slots(dataset, fmt, out_fmt, source, destinations, rng),
                           rng)
    while True:
        instance_id = f"task_{int(rng.integers(1 << 32)):08x}"
        if instance_id not in used_ids:
            used_ids.add(instance_id)
            break
    return Task(
        instance_id=instance_id,
        task_type=task_type.name,
        description=description,
        inputs=inputs,
        expected_outputs=expected,
        required_tools=tools,
        constraints={"timeout": int(rng.choice(_TIMEOUTS)), "max_retries": 3},
        complexity=task_type.complexity,
        metadata={"generator_version": GENERATOR_VERSION, "world": "v1", "seed": seed, "matcher": matcher_name,
                  "llm_generated": False},
        original_description=description,
        split=split,
    )
