"""Held out by wording: world v1's tasks with test descriptions worded in clauses no train task uses.

World v1 holds its test split out by structure (no test required-tool set occurs in train), but every
description draws its step clauses from one bank of three clauses per tool, so a learned generator meets
every test phrasing in training. ``held_out_wording`` rewrites the library's descriptions so that one
clause per tool (``held_out_clauses``, drawn from a seed) is kept for the test split: a test task's
steps are worded with its tools' held-out clauses only, a train or validation task's with the others
only. Everything else of a task stays (tools, inputs, outputs, split: the same structural split); the
description is written afresh by the v1 generator's ``describe`` (an opening, the steps in one of the
three styles, a closing) with the task's own data in the slots. Each task records the option and its
allowed clauses in ``metadata["wording"]``, which the paraphrase rules read (a paraphrase of a test
instruction rewords a step only with test clauses, one of a train instruction only with train clauses).

The shipped library and its default wording (``WORDINGS[0]``, "shared") do not change.
"""

from __future__ import annotations

__all__ = ["WORDINGS", "held_out_clauses", "allowed_clauses", "held_out_wording", "apply_wording"]

import re
import zlib
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from . import phrases
from .generator_v1 import describe, description_slots
from .library import Task

WORDINGS = ("shared", "held_out")
_SOURCE = re.compile(r"(?:data/|https://api\.example\.com/v1/)(?P<stem>[a-z_]+?)[_/](?P<index>\d{4})\.\w+$")


def held_out_clauses(seed: int = 0) -> dict[str, int]:
    """Per tool, the index of its one bank clause kept for the test split."""
    rng = np.random.default_rng([seed, 23])
    return {tool: int(rng.integers(len(clauses))) for tool, clauses in phrases.STEP_CLAUSES.items()}


def allowed_clauses(split: str, seed: int = 0) -> dict[str, list[int]]:
    """Per tool, the clause indices a task of ``split`` may be worded with."""
    held = held_out_clauses(seed)
    return {tool: [i for i in range(len(clauses)) if (i == held[tool]) == (split == "test")]
            for tool, clauses in phrases.STEP_CLAUSES.items()}


def _reworded(task: Task, seed: int) -> Task:
    source = str(task.inputs["source"])
    match = _SOURCE.search(source)
    if match is None or task.metadata.get("world") != "v1":
        raise ValueError(f"task {task.instance_id}: held-out wording applies to world v1 tasks only")
    stem, index = match["stem"], match["index"]
    out_fmt = str(task.expected_outputs["metadata"]["output_format"])
    destinations = {"dest": f"output/{stem}_{index}.{out_fmt}", "dest_url": f"https://hooks.example.org/{stem}/{index}"}
    rng = np.random.default_rng([seed, zlib.crc32(task.instance_id.encode())])
    slots = description_slots(stem.replace("_", " "), str(task.inputs["format"]), out_fmt, source, destinations, rng)
    allowed = allowed_clauses(task.split, seed)
    description = describe(task.task_type, task.required_tools, slots, rng, allowed)
    wording = {"option": "held_out", "seed": seed, "clauses": {t: allowed[t] for t in task.required_tools}}
    return replace(task, description=description, original_description=description,
                   metadata={**task.metadata, "wording": wording})


def held_out_wording(tasks: Sequence[Task], seed: int = 0) -> list[Task]:
    """``tasks`` (world v1) with their descriptions reworded as the module docstring says; deterministic
    for a seed, and a task's new description depends on that task only."""
    return [_reworded(task, seed) for task in tasks]


def apply_wording(tasks: Sequence[Task], wording: str, seed: int = 0) -> list[Task]:
    """``tasks`` under a wording option: "shared" leaves them as they are, "held_out" is
    ``held_out_wording``; another name is a ValueError listing the options."""
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {', '.join(WORDINGS)}, got {wording!r}")
    return list(tasks) if wording == "shared" else held_out_wording(tasks, seed)
