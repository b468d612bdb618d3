"""Robustness of a workflow generator over semantic clusters (RobustFlow section 3.3, Table 2 in shape).

The generator answers every variant of every cluster greedily. Per cluster, its workflow for the
original instruction is the reference w^g (eq. 1 compares the generator with itself); each perturbed
variant's workflow w^p is compared with it by node-chain F1 (``node``, eq. 5) and reachability F1
(``graph``, eq. 7). An answer that is not a workflow, or a cluster whose original answer is not one,
scores 0. Beside robustness, the table gives what the workflows are worth: ``exec``, the mean exact
expected full success of following the variant's workflow on the task (``generator.execution_score``),
its ratio to the optimal workflow's, the share of valid answers and the share equal to the task's
reference (optimal) workflow.

Answers are written to a JSONL file as they come and reused on a rerun.

Two trivial baselines answer without a model, so that a generator's rows can be read against them:
``name_copy_answers`` writes the tools an instruction names (any spelling) as a chain, which rebuilt
every world-v0 workflow and finds nothing in world v1's descriptions; ``lookup_answers`` answers every
instruction of a task type with the type's most frequent training workflow, whatever the text says.
"""

from __future__ import annotations

__all__ = [
    "COLUMNS", "RobustnessTable", "generate_answers", "named_chain", "name_copy_answers", "lookup_answers",
    "baseline_tables", "robustness_table", "format_tables",
]

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean
from typing import Any

from resilibench.llm import Backend, GenerationConfig
from resilibench.rundir import RunDirectory

from ..core.workflow import Node, Workflow
from .clusters import ClusterRecord
from .generator import (
    GeneratorFormat,
    GeneratorOutputError,
    canonical_form,
    execution_score,
    parse_workflow,
    workflow_text,
)

COLUMNS = ("node", "graph", "exec", "exec_ratio", "valid", "optimal")


@dataclass(frozen=True)
class RobustnessTable:
    """Per perturbation type (and "original"): the means of ``COLUMNS``, with the answer counts."""

    rows: dict[str, dict[str, float]]
    counts: dict[str, int]

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "counts": self.counts}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RobustnessTable:
        return cls(data["rows"], data["counts"])


def generate_answers(backend: Backend, records: Sequence[ClusterRecord], fmt: GeneratorFormat,
                     run: RunDirectory, *, max_new_tokens: int = 256, clusters_per_batch: int = 16,
                     progress: bool = True) -> dict[str, dict[str, str]]:
    """Greedy answers to every variant of ``records``: ``{cluster_id: {variant_id: text}}``, appended
    to ``run``'s results (one row per cluster; its session held) per batch of clusters and read back from
    it on a rerun."""
    from tqdm.auto import tqdm

    from resilibench.results import run_metadata

    answers = {row["cluster_id"]: row["answers"] for row in run.existing.rows}
    pending = [r for r in records if r.cluster_id not in answers]
    config = GenerationConfig(max_new_tokens=max_new_tokens, temperature=0.0)
    run.open_results(run_metadata(run.identity, None))
    with tqdm(total=len(records), initial=len(records) - len(pending), desc="generating workflows",
              unit="cluster", disable=not progress, leave=False) as bar:
        for start in range(0, len(pending), clusters_per_batch):
            batch = pending[start:start + clusters_per_batch]
            jobs = [(r.cluster_id, v.variant_id, fmt.messages(v.text)) for r in batch for v in r.variants]
            texts = backend.generate([messages for _, _, messages in jobs], config)
            for record in batch:
                answers[record.cluster_id] = {}
            for (cluster_id, variant_id, _), text in zip(jobs, texts, strict=True):
                answers[cluster_id][variant_id] = text
            for record in batch:
                run.write({"cluster_id": record.cluster_id, "answers": answers[record.cluster_id]})
            bar.update(len(batch))
    return answers


def named_chain(text: str) -> Workflow | None:
    """The tools ``text`` names (names or aliases, any case, with spaces or hyphens for underscores) as a
    chain in the order named; None when it names none."""
    from ..core.registry import default_registry, named_tools

    registry = default_registry()
    tools = [registry.names[registry.id_of(re.sub(r"[\s-]+", "_", name.lower()))] for name in named_tools(text)]
    if not tools:
        return None
    return Workflow(tuple(Node(t) for t in tools), tuple((i, i + 1) for i in range(len(tools) - 1)))


def name_copy_answers(records: Sequence[ClusterRecord]) -> dict[str, dict[str, str]]:
    """The name-copying baseline's answers (``named_chain`` of every variant; "" when none is named)."""
    return {r.cluster_id: {v.variant_id: workflow_text(w) if (w := named_chain(v.text)) else "" for v in r.variants}
            for r in records}


def lookup_answers(train: Sequence[ClusterRecord], records: Sequence[ClusterRecord]) -> dict[str, dict[str, str]]:
    """The lookup baseline's answers: for every variant, the most frequent reference workflow (by
    ``canonical_form``; the first seen wins a tie) of the record's task type among ``train``."""
    counts: dict[str, Counter[str]] = {}
    workflows: dict[str, Workflow] = {}
    for r in train:
        key = canonical_form(r.reference)
        counts.setdefault(r.task.task_type, Counter())[key] += 1
        workflows.setdefault(key, r.reference)
    best = {kind: workflow_text(workflows[c.most_common(1)[0][0]]) for kind, c in counts.items()}
    missing = sorted({r.task.task_type for r in records} - set(best))
    if missing:
        raise ValueError(f"train: no task of type(s) {missing} to look a workflow up from")
    return {r.cluster_id: {v.variant_id: best[r.task.task_type] for v in r.variants} for r in records}


def baseline_tables(train: Sequence[ClusterRecord], records: Sequence[ClusterRecord]) -> dict[str, RobustnessTable]:
    """The robustness tables of the two baselines on ``records``: "names" and "lookup"."""
    return {"names": robustness_table(records, name_copy_answers(records)),
            "lookup": robustness_table(records, lookup_answers(train, records))}


def robustness_table(records: Sequence[ClusterRecord], answers: dict[str, dict[str, str]]) -> RobustnessTable:
    """The table of the module docstring from the generator's answers."""
    from ..metrics.structural import chain_f1, reachability_f1

    values: dict[str, dict[str, list[float]]] = {}
    for record in records:
        parsed = {}
        for v in record.variants:
            try:
                parsed[v.variant_id] = parse_workflow(answers[record.cluster_id][v.variant_id])
            except GeneratorOutputError:
                parsed[v.variant_id] = None
        original = parsed[record.variants[0].variant_id]
        optimal = execution_score(record.task, record.reference)
        reference_key = canonical_form(record.reference)
        for v in record.variants:
            workflow = parsed[v.variant_id]
            row = values.setdefault(v.perturbation, {c: [] for c in COLUMNS})
            if v.perturbation != "original":
                if workflow is not None and original is not None:
                    row["node"].append(chain_f1(workflow, original).f1)
                    row["graph"].append(reachability_f1(workflow, original).f1)
                else:
                    row["node"].append(0.0)
                    row["graph"].append(0.0)
            score = execution_score(record.task, workflow)
            row["exec"].append(score)
            row["exec_ratio"].append(score / optimal if optimal > 0 else 1.0)
            row["valid"].append(float(workflow is not None))
            row["optimal"].append(float(workflow is not None and canonical_form(workflow) == reference_key))
    return RobustnessTable({kind: {c: fmean(v) for c, v in cols.items() if v} for kind, cols in values.items()},
                           {kind: len(cols["exec"]) for kind, cols in values.items()})


def format_tables(tables: dict[str, RobustnessTable], kinds: Sequence[str]) -> str:
    """Stages side by side (RobustFlow Table 2's layout): one row per perturbation type, node / graph /
    exec columns per stage; the original instructions' row has no robustness columns."""
    from resilibench.console import format_table

    headers = ["perturbation"]
    for stage in tables:
        headers += [f"{stage} node", f"{stage} graph", f"{stage} exec"]
    rows = []
    for kind in kinds:
        if not any(kind in t.rows for t in tables.values()):
            continue
        row = [kind]
        for table in tables.values():
            cells = table.rows.get(kind, {})
            row += [f"{cells[c]:.3f}" if c in cells else "-" for c in ("node", "graph", "exec")]
        rows.append(row)
    return format_table(headers, rows)
