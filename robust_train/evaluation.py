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

Four baselines answer without a language model, so that a generator's rows can be read against them:
``name_copy_answers`` writes the tools an instruction names (any spelling) as a chain, which rebuilt
every world-v0 workflow and finds nothing in world v1's descriptions; ``lookup_answers`` answers every
instruction of a task type with the type's most frequent training workflow, whatever the text says; the
bag-of-words generator (``robust_train.bow``, TF-IDF and logistic regression) is the simplest learned
generator and the floor a trained one must clear; ``search_answers`` learns nothing: it searches the
tools with each clause of the instruction, as the text env's ``scripted:search`` agent does, so it
reads a wording no training set holds (the floor where the test wording is held out).

``exec_interval`` and ``paired_interval`` give 95% intervals over clusters of the mean execution score
under a set of perturbations (one value per cluster: the mean over its variants of those types).
"""

from __future__ import annotations

__all__ = [
    "COLUMNS", "NOISE_TYPES", "RobustnessTable", "generate_answers", "named_chain", "name_copy_answers",
    "lookup_answers", "SEARCH_BASELINE", "search_answers", "baseline_tables", "robustness_table", "Interval",
    "exec_interval", "paired_interval", "format_tables",
]

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from statistics import fmean, stdev
from typing import Any

from resilibench.llm import Backend, GenerationConfig
from resilibench.rundir import RunDirectory

from ..core.text.toolbox import SearchSettings, ToolHit, search_tools, search_tools_many
from ..core.workflow import Node, Workflow
from .clusters import ClusterRecord
from .generator import (
    GeneratorFormat,
    GeneratorOutputError,
    canonical_form,
    execution_score,
    tools_workflow,
    workflow_text,
)

COLUMNS = ("node", "graph", "exec", "exec_ratio", "valid", "optimal")
NOISE_TYPES = ("noise_light", "noise_moderate", "noise_heavy")


@dataclass(frozen=True)
class RobustnessTable:
    """Per perturbation type (and "original"): the means of ``COLUMNS``, with the answer counts;
    ``cluster_exec``: per cluster, per perturbation type, the mean execution score of its variants."""

    rows: dict[str, dict[str, float]]
    counts: dict[str, int]
    cluster_exec: dict[str, dict[str, float]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "counts": self.counts, "cluster_exec": self.cluster_exec}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RobustnessTable:
        return cls(data["rows"], data["counts"], data.get("cluster_exec", {}))


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
    fmt.prepare(v.text for r in pending for v in r.variants)
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


SEARCH_BASELINE = SearchSettings(k=3)  # the GRPO demo's search surface: three hits a search


def search_answers(records: Sequence[ClusterRecord], search: SearchSettings = SEARCH_BASELINE,
                   retriever: str | None = None) -> dict[str, dict[str, str]]:
    """The search baseline's answers: for every variant, the tools ``scripted:search`` would choose (per
    clause of the text, its first sentence aside, the best of ``search.k`` hits not chosen yet with
    relevance at least 0.1 as the text env shows it, to two places; ``agents.text_baselines``),
    completed into the task's optimal workflow for them (``tools_workflow``); "" when none is relevant.
    ``retriever``: a tuned retriever's directory (``robust_train.retriever``) that searches in place of the
    shipped model."""
    from ..agents.text_baselines import SearchTextAgent  # the text env's agents: loaded when asked

    agent = SearchTextAgent()
    tuned: dict[str, list[ToolHit]] = {}
    if retriever is not None:
        from .retriever import retriever_encoder

        queries = list(dict.fromkeys(q for r in records for v in r.variants for q in agent.searches(v.text)))
        tuned = dict(zip(queries, search_tools_many(queries, search.k, encoder=retriever_encoder(str(retriever))),
                         strict=True))
    answers: dict[str, dict[str, str]] = {}
    for record in records:
        answers[record.cluster_id] = {}
        for variant in record.variants:
            results = [[(hit.name, round(hit.score, 2))
                        for hit in (tuned[query] if tuned else search_tools(query, search.k, method=search.method))]
                       for query in agent.searches(variant.text)]  # relevance as the agent reads it
            tools = agent.choose(results)
            answers[record.cluster_id][variant.variant_id] = workflow_text(tools_workflow(record.task, tools)) if tools else ""
    return answers


def baseline_tables(train: Sequence[ClusterRecord], records: Sequence[ClusterRecord], *, seed: int = 0,
                    retriever: str | None = None) -> dict[str, RobustnessTable]:
    """The robustness tables of the four baselines on ``records``: "names", "lookup", "bow" (the
    bag-of-words generator trained on every variant of ``train``) and "search" (``search_answers``); with
    ``retriever`` (a retriever tuned on ``train``), a fifth, "search_tuned": the search baseline searching
    with it."""
    from .bow import bow_answers

    tables = {"names": robustness_table(records, name_copy_answers(records)),
              "lookup": robustness_table(records, lookup_answers(train, records)),
              "bow": robustness_table(records, bow_answers(train, records, seed=seed)),
              "search": robustness_table(records, search_answers(records))}
    if retriever is not None:
        tables["search_tuned"] = robustness_table(records, search_answers(records, retriever=retriever))
    return tables


def robustness_table(records: Sequence[ClusterRecord], answers: dict[str, dict[str, str]],
                     fmt: GeneratorFormat | None = None) -> RobustnessTable:
    """The table of the module docstring from the generator's answers (in ``fmt``'s answer form, JSON
    by default)."""
    from ..metrics.structural import chain_f1, reachability_f1

    fmt = fmt or GeneratorFormat()
    values: dict[str, dict[str, list[float]]] = {}
    per_cluster: dict[str, dict[str, list[float]]] = {}
    for record in records:
        parsed = {}
        for v in record.variants:
            try:
                parsed[v.variant_id] = fmt.parse(answers[record.cluster_id][v.variant_id])
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
            per_cluster.setdefault(record.cluster_id, {}).setdefault(v.perturbation, []).append(score)
            row["exec_ratio"].append(score / optimal if optimal > 0 else 1.0)
            row["valid"].append(float(workflow is not None))
            row["optimal"].append(float(workflow is not None and canonical_form(workflow) == reference_key))
    return RobustnessTable({kind: {c: fmean(v) for c, v in cols.items() if v} for kind, cols in values.items()},
                           {kind: len(cols["exec"]) for kind, cols in values.items()},
                           {cid: {kind: fmean(v) for kind, v in kinds.items()} for cid, kinds in per_cluster.items()})


@dataclass(frozen=True)
class Interval:
    """A mean over clusters with its 95% interval (normal approximation, mean +- 1.96 standard errors)."""

    mean: float
    low: float
    high: float
    clusters: int

    def __str__(self) -> str:
        return f"{self.mean:.3f} [{self.low:.3f}, {self.high:.3f}]"


def _interval(values: Sequence[float]) -> Interval:
    if not values:
        raise ValueError("no cluster to take an interval over")
    mean = fmean(values)
    half = 1.96 * stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
    return Interval(mean, mean - half, mean + half, len(values))


def _cluster_means(table: RobustnessTable, kinds: Sequence[str]) -> dict[str, float]:
    if not table.cluster_exec:
        raise ValueError("the table has no per-cluster scores (it was written before they were kept)")
    return {cid: fmean(row[k] for k in kinds if k in row) for cid, row in table.cluster_exec.items()
            if any(k in row for k in kinds)}


def exec_interval(table: RobustnessTable, kinds: Sequence[str] = NOISE_TYPES) -> Interval:
    """The mean over clusters of each cluster's mean execution score under ``kinds``, with its 95%
    interval."""
    return _interval(list(_cluster_means(table, kinds).values()))


def paired_interval(after: RobustnessTable, before: RobustnessTable, kinds: Sequence[str] = NOISE_TYPES
                    ) -> Interval:
    """The mean over clusters of ``after``'s minus ``before``'s per-cluster execution score under
    ``kinds`` (the same clusters), with its 95% interval."""
    a, b = _cluster_means(after, kinds), _cluster_means(before, kinds)
    if a.keys() != b.keys():
        raise ValueError("the two tables cover different clusters")
    return _interval([a[c] - b[c] for c in a])


def format_tables(tables: dict[str, RobustnessTable], kinds: Sequence[str],
                  columns: Sequence[str] = ("node", "graph", "exec")) -> str:
    """Stages side by side (RobustFlow Table 2's layout): one row per perturbation type, ``columns`` (of
    ``COLUMNS``) per stage; the original instructions' row has no robustness columns."""
    from resilibench.console import format_table

    headers = ["perturbation"]
    for stage in tables:
        headers += [f"{stage} {c}" for c in columns]
    rows = []
    for kind in kinds:
        if not any(kind in t.rows for t in tables.values()):
            continue
        row = [kind]
        for table in tables.values():
            cells = table.rows.get(kind, {})
            row += [f"{cells[c]:.3f}" if c in cells else "-" for c in columns]
        rows.append(row)
    return format_table(headers, rows)
