"""WorkflowPerturb calibration of the workflow metrics on ResiliBench's golden workflows.

Each task's golden workflow (``metrics.perturb.golden_workflows``) gets nine variants: missing steps,
compressed steps and description changes at 10, 30 and 50 percent. Every metric scores every
(variant, golden) pair; a calibrated metric would follow the expected score 1 - p (1 for description
changes, which keep the workflow's meaning). Per metric, perturbation and rate the summary gives the mean
and standard deviation, the residual (score - expected), and per metric and perturbation the
sensitivity (WorkflowPerturb app. C.1): the mean slope over 10 -> 30 -> 50 percent,

    Delta = 1/2 [ (s(10%) - s(30%)) / 0.2 + (s(30%) - s(50%)) / 0.2 ].

Tasks share golden workflows, and tasks sharing a golden often draw the same variant, so a pair is
scored once and counted once per task that drew it: the ``tasks`` view weighs pairs by those counts
(the paper's "golden workflows x 9 variants"), the ``distinct`` view counts each distinct pair once.

Rule-based variants are drawn per task (seeded by task id). LLM variants are drawn once per distinct
golden workflow, perturbation and rate (an LLM call per task would repeat the same request), and count
for every task of that golden.
"""

from __future__ import annotations

__all__ = [
    "STRUCTURAL", "LEXICAL", "METRICS", "DEFAULT_METRICS", "METHODS", "METRIC_DEFINITIONS",
    "CalibrationSettings", "WorkflowScorer", "CalibrationItem", "CalibrationPlan", "plan_calibration",
    "score_items", "sensitivity", "summarize", "plot_scores", "plot_sensitivity", "iter_chunks", "run_items",
]

import hashlib
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from resilibench.results import new_figure, save_figure
from resilibench.settings import Settings, setting

from ..core.workflow import Workflow
from .perturb import (
    PERTURBATIONS,
    RATES,
    Golden,
    GoldenSet,
    LLMPerturber,
    Perturbation,
    PerturbRequest,
    expected_score,
    perturb,
    perturbation_rng,
)

STRUCTURAL = ("chain_f1", "mcis_f1", "reachability_f1", "kendall_tau")
LEXICAL = ("bleu", "gleu")
METRICS = (*STRUCTURAL, *LEXICAL, "bertscore", "judge")
DEFAULT_METRICS = METRICS[:-1]  # the judge needs a backend
METHODS = ("rules", "llm")
# Bumped when a metric's definition changes, so a calibration never mixes rows scored under two of them
# (2: reachability over reflexive closures, Kendall tau without a degenerate 1, one empty convention).
METRIC_DEFINITIONS = 2


@dataclass(frozen=True)
class CalibrationSettings(Settings):
    """What a calibration run does; recorded as its identity, so a resume with other settings is refused."""

    metrics: tuple[str, ...] = setting(DEFAULT_METRICS, choices=METRICS, help="the metrics scored")
    seed: int = setting(0, bounds=(0, None), help="perturbation seed")
    min_nodes: int = setting(5, bounds=(1, None), metavar="N",
                             help="skip golden workflows with fewer steps (as WorkflowPerturb)")
    text_only: bool = setting(False, help="drop tool names: steps are compared by their texts alone "
                                          "(WorkflowPerturb's setting)")
    perturber: str = setting("rules", choices=METHODS,
                             help="rules (seeded banks) or llm (--backend, validated with retries)")
    backend: str | None = setting(None, help="the LLM of the judge and of the llm perturber (a backend spec)")
    attempts: int = setting(3, bounds=(1, None), help="answers asked of the LLM per item")
    max_new_tokens: int | None = setting(None, bounds=(1, None), help="longest LLM answer (null: 768 for the "
                                                                      "judge, 1024 for the llm perturber)")
    mcis_budget: int = setting(100_000, bounds=(1, None), help="search calls per MCIS before bounds")
    definitions: int = setting(METRIC_DEFINITIONS, bounds=(1, None), help="version of the metric definitions")


# --- scoring ------------------------------------------------------------------------------------------


class WorkflowScorer:
    """Scores (pred, ref) workflow pairs with the chosen metrics, sharing one node embedder (default: the
    shared one of ``metrics.alignment``), one BERTScore model and one judge across all pairs. Models load
    on first use."""

    def __init__(self, metrics: Sequence[str] = DEFAULT_METRICS, *, judge: Any = None, beta: float | None = None,
                 embedder: Any = None, bert: Any = None,
                 mcis_budget: int | None | Literal["default"] = "default"):
        unknown = [m for m in metrics if m not in METRICS]
        if unknown:
            raise ValueError(f"unknown metric(s) {unknown}; accepted: {', '.join(METRICS)}")
        if "judge" in metrics and judge is None:
            raise ValueError("the judge metric needs a Judge (an LLM backend)")
        from .alignment import DEFAULT_BETA

        self.metrics = tuple(dict.fromkeys(metrics))
        self.judge = judge
        from .structural import DEFAULT_MCIS_BUDGET

        self.beta = DEFAULT_BETA if beta is None else beta
        self.mcis_budget = DEFAULT_MCIS_BUDGET if mcis_budget == "default" else mcis_budget
        self._embedder, self._bert = embedder, bert

    @property
    def bert(self):
        if self._bert is None:
            from .semantic import default_scorer

            self._bert = default_scorer()
        return self._bert

    @property
    def settings(self) -> dict[str, Any]:
        """What determines the scores, for results metadata; models not loaded yet are described by what
        will be loaded (reading this never loads a model)."""
        out: dict[str, Any] = {"metrics": list(self.metrics)}
        if any(m in STRUCTURAL for m in self.metrics):
            from .alignment import default_embedder

            embedder = self._embedder
            if embedder is None and default_embedder.cache_info().currsize:
                embedder = default_embedder()
            out["alignment"] = {"beta": self.beta,
                                "embedder": embedder.backend if embedder else "auto (not needed so far)"}
            if "mcis_f1" in self.metrics:
                out["mcis_budget"] = self.mcis_budget
        if "bertscore" in self.metrics:
            out["bertscore"] = self._bert.settings if self._bert is not None else {
                "model": "all-MiniLM-L6-v2 (not loaded yet)", "layer": "last", "idf": False, "rescaled": False}
        if "judge" in self.metrics:
            out["judge"] = self.judge.settings
        return out

    def score(self, pairs: Sequence[tuple[Workflow, Workflow]], tasks: Sequence[str | None] | None = None
              ) -> list[dict[str, Any]]:
        """For each (pred, ref): ``{"scores": {metric: value or None}, "details": {...}}``; details hold
        the precision and recall behind F1 scores, ``exact: false`` and ``f1_bounds`` for an MCIS past its
        budget, the judge's full verdict, and ``repairs``: what a lenient reading removed from the
        prediction (a cyclic prediction scores 0 on the structural metrics)."""
        from .lexical import lexical_scores
        from .structural import Score, structural_details

        out: list[dict[str, Any]] = [{"scores": {}, "details": {}} for _ in pairs]
        if any(m in STRUCTURAL for m in self.metrics):
            from .alignment import align

            for row, (pred, ref) in zip(out, pairs, strict=True):
                # The shared embedder loads only when a step without a tool needs a text comparison.
                alignment = align(pred, ref, beta=self.beta, embedder=self._embedder) if pred.nodes and ref.nodes else None
                details = structural_details(pred, ref, alignment, mcis_budget=self.mcis_budget)
                for name in STRUCTURAL:
                    if name not in self.metrics:
                        continue
                    value = details[name.removesuffix("_f1")]
                    if not isinstance(value, Score):  # kendall_tau
                        row["scores"][name] = value
                        continue
                    row["scores"][name] = value.f1
                    row["details"][name] = {"precision": value.precision, "recall": value.recall}
                    if not value.exact:
                        row["details"][name] |= {"exact": False, "f1_bounds": list(value.f1_bounds)}
        for row, (pred, _) in zip(out, pairs, strict=True):
            if pred.repairs:
                row["details"]["repairs"] = pred.repairs.to_dict()
        if any(m in LEXICAL for m in self.metrics):
            for row, (pred, ref) in zip(out, pairs, strict=True):
                scores = lexical_scores(pred, ref)
                row["scores"] |= {m: scores[m] for m in LEXICAL if m in self.metrics}
        if "bertscore" in self.metrics:
            results = self.bert.score([p for p, _ in pairs], [r for _, r in pairs])
            for row, result in zip(out, results, strict=True):
                row["scores"]["bertscore"] = result.f1
                row["details"]["bertscore"] = {"precision": result.precision, "recall": result.recall}
        if "judge" in self.metrics:
            verdicts = self.judge.judge(list(pairs), tasks)
            for row, verdict in zip(out, verdicts, strict=True):
                row["scores"]["judge"] = verdict.normalized
                row["details"]["judge"] = verdict.to_dict()
        for row in out:  # metric order as requested
            row["scores"] = {m: row["scores"][m] for m in self.metrics}
        return out


# --- the calibration set ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CalibrationItem:
    """One (golden, variant) pair to score. ``tasks``: how many tasks drew it; ``perturbation`` is known
    in advance for rule-based variants and drawn at run time (None here) for LLM variants."""

    item_id: str
    golden: Golden
    kind: str
    rate: float
    tasks: int
    perturbation: Perturbation | None = None

    def request(self, seed: int) -> PerturbRequest:
        return PerturbRequest(self.golden.workflow, self.kind, self.rate,
                              perturbation_rng(seed, self.golden.golden_id, self.kind, self.rate))


@dataclass(frozen=True)
class CalibrationPlan:
    goldens: GoldenSet
    items: tuple[CalibrationItem, ...]
    method: str
    seed: int
    kinds: tuple[str, ...]
    rates: tuple[float, ...]

    def counts(self) -> dict[str, int]:
        """Sizes of the set: tasks, distinct goldens, variants per task and distinct pairs."""
        return {"tasks_examined": self.goldens.examined, "tasks_too_small": self.goldens.too_small,
                "tasks": len(self.goldens.task_ids), "distinct_goldens": len(self.goldens.goldens),
                "task_variants": len(self.goldens.task_ids) * len(self.kinds) * len(self.rates),
                "distinct_pairs": len(self.items)}


def _item_id(golden: Golden, kind: str, rate: float, variant: Workflow) -> str:
    text = f"{golden.golden_id}|{kind}|{rate}|{variant.to_json()}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def plan_calibration(goldens: GoldenSet, *, seed: int = 0, method: str = "rules",
                     kinds: Sequence[str] = PERTURBATIONS, rates: Sequence[float] = RATES) -> CalibrationPlan:
    """The pairs to score. Rule-based: every task draws its nine variants (seeded by task id), identical
    (golden, variant) pairs merged; LLM: one item per golden, perturbation and rate."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
    items: dict[str, CalibrationItem] = {}
    if method == "llm":
        for golden in goldens.goldens:
            for kind in kinds:
                for rate in rates:
                    key = f"{golden.golden_id}:{kind}:{rate}"
                    items[key] = CalibrationItem(key, golden, kind, rate, len(golden.task_ids))
    else:
        golden_of = goldens.golden_of()
        for task_id in goldens.task_ids:
            golden = golden_of[task_id]
            for kind in kinds:
                for rate in rates:
                    variant = perturb(golden.workflow, kind, rate, perturbation_rng(seed, task_id, kind, rate))
                    assert variant.workflow is not None  # the rules always draw a variant
                    key = _item_id(golden, kind, rate, variant.workflow)
                    if key in items:
                        item = items[key]
                        items[key] = CalibrationItem(key, golden, kind, rate, item.tasks + 1, item.perturbation)
                    else:
                        items[key] = CalibrationItem(key, golden, kind, rate, 1, variant)
    return CalibrationPlan(goldens, tuple(items.values()), method, seed, tuple(kinds), tuple(rates))


def score_items(items: Sequence[CalibrationItem], scorer: WorkflowScorer, *, seed: int = 0,
                perturber: LLMPerturber | None = None) -> list[dict[str, Any]]:
    """Result rows for ``items``: LLM variants are drawn first (one backend call per attempt for all
    of them), then every valid pair is scored in one batch. An invalid variant gives a row without
    scores that keeps the LLM's answers."""
    missing = [i for i, item in enumerate(items) if item.perturbation is None]
    drawn: dict[int, Perturbation] = {}
    if missing:
        if perturber is None:
            raise ValueError("LLM items need an LLMPerturber")
        drawn = dict(zip(missing, perturber.perturb([items[i].request(seed) for i in missing]), strict=True))
    perturbations = [drawn[i] if item.perturbation is None else item.perturbation for i, item in enumerate(items)]
    valid = {i: p.workflow for i, p in enumerate(perturbations) if p.workflow is not None}
    scored = scorer.score([(workflow, items[i].golden.workflow) for i, workflow in valid.items()])
    by_index = dict(zip(valid, scored, strict=True))
    rows = []
    for i, (item, p) in enumerate(zip(items, perturbations, strict=True)):
        row = {"item_id": item.item_id, "golden_id": item.golden.golden_id, "kind": item.kind, "rate": item.rate,
               "expected": expected_score(item.kind, item.rate), "golden_nodes": len(item.golden.workflow.nodes),
               "variant_nodes": len(p.workflow.nodes) if p.workflow is not None else None, "valid": p.valid,
               "perturbation": p.to_dict()}
        row |= by_index.get(i, {"scores": {}, "details": {}})
        rows.append(row)
    return rows


# --- summary ------------------------------------------------------------------------------------------


def _weighted(values: Sequence[float], weights: Sequence[float]) -> tuple[float, float]:
    total = sum(weights)
    mean = sum(v * w for v, w in zip(values, weights, strict=True)) / total
    variance = sum(w * (v - mean) ** 2 for v, w in zip(values, weights, strict=True)) / total
    return mean, math.sqrt(max(0.0, variance))


def sensitivity(means: Sequence[float | None], rates: Sequence[float]) -> float | None:
    """Mean slope of the score's fall between consecutive rates (app. C.1; for 10/30/50 percent,
    1/2 [(s10 - s30)/0.2 + (s30 - s50)/0.2]); None when a mean is missing or there is one rate."""
    known = [m for m in means if m is not None]
    if len(rates) < 2 or len(known) < len(means):
        return None
    slopes = [(known[i] - known[i + 1]) / (rates[i + 1] - rates[i]) for i in range(len(rates) - 1)]
    return sum(slopes) / len(slopes)


def summarize(plan: CalibrationPlan, rows: Iterable[dict[str, Any]], metrics: Sequence[str]) -> dict[str, Any]:
    """Per view (``tasks``, ``distinct``), metric, perturbation and rate: n, mean, std, expected score,
    mean residual, mean absolute residual; per view, metric and perturbation: the sensitivity. Also the
    number of invalid variants and of invalid scores (a judge that gave no valid verdict)."""
    by_id = {row["item_id"]: row for row in rows}
    groups: dict[tuple[str, float], list[CalibrationItem]] = {}
    for item in plan.items:
        if item.item_id in by_id:
            groups.setdefault((item.kind, item.rate), []).append(item)
    views: dict[str, Any] = {}
    for view in ("tasks", "distinct"):
        table: dict[str, Any] = {}
        for metric in metrics:
            table[metric] = {}
            for kind in plan.kinds:
                per_rate, means = {}, []
                for rate in plan.rates:
                    expected = expected_score(kind, rate)
                    values, weights, invalid = [], [], 0
                    for item in groups.get((kind, rate), []):
                        value = by_id[item.item_id].get("scores", {}).get(metric)
                        weight = item.tasks if view == "tasks" else 1
                        if value is None:
                            invalid += weight
                            continue
                        values.append(value)
                        weights.append(weight)
                    cell: dict[str, Any] = {"n": sum(weights), "invalid": invalid, "expected": expected,
                                            "mean": None, "std": None, "residual": None, "abs_residual": None}
                    if values:
                        mean, std = _weighted(values, weights)
                        abs_res, _ = _weighted([abs(v - expected) for v in values], weights)
                        cell |= {"mean": mean, "std": std, "residual": mean - expected, "abs_residual": abs_res}
                    per_rate[str(rate)] = cell
                    means.append(cell["mean"])
                table[metric][kind] = {"rates": per_rate, "sensitivity": sensitivity(means, plan.rates)}
        views[view] = table
    scored = [by_id[i.item_id] for i in plan.items if i.item_id in by_id]
    return {"counts": plan.counts() | {"scored_pairs": len(scored),
                                        "invalid_variants": sum(1 for r in scored if not r["valid"])},
            "views": views}


# --- plots --------------------------------------------------------------------------------------------


def plot_scores(summary: dict[str, Any], path: str | Path, view: str = "tasks") -> Path:
    """One panel per perturbation: each metric's mean (± std) against the rate, and the expected score
    as a dashed black line (WorkflowPerturb figs. 3-5)."""
    table = summary["views"][view]
    metrics = list(table)
    kinds = list(next(iter(table.values()))) if table else []
    fig, axes = new_figure(1, max(1, len(kinds)), figsize=(5.2 * max(1, len(kinds)), 4.4), sharey=True,
                             squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=False):
        rates = [float(r) for r in table[metrics[0]][kind]["rates"]]
        xs = [100 * r for r in rates]
        ax.plot(xs, [table[metrics[0]][kind]["rates"][str(r)]["expected"] for r in rates], "k--", lw=2,
                label="expected")
        for j, metric in enumerate(metrics):
            cells = [table[metric][kind]["rates"][str(r)] for r in rates]
            pts = [(x + (j - len(metrics) / 2) * 0.35, c["mean"], c["std"]) for x, c in zip(xs, cells, strict=True)
                   if c["mean"] is not None]
            if pts:
                ax.errorbar(*zip(*[(x, m) for x, m, _ in pts], strict=True), yerr=[s for _, _, s in pts],
                            marker="o", ms=4, capsize=2, lw=1.2, label=metric)
        ax.set_title(kind.replace("_", " "))
        ax.set_xticks(xs, [f"{x:.0f}%" for x in xs])
        ax.set_xlabel("perturbation rate")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"metric score (mean ± std, {view} view)")
    axes[0][-1].legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    return save_figure(fig, Path(path))


def plot_sensitivity(summary: dict[str, Any], path: str | Path, view: str = "tasks") -> Path:
    """Grouped bars: each metric's sensitivity per perturbation (WorkflowPerturb fig. 6)."""
    table = summary["views"][view]
    metrics = list(table)
    kinds = list(next(iter(table.values()))) if table else []
    width = 0.8 / max(1, len(kinds))
    fig, ax = new_figure(figsize=(max(7.0, 1.1 * len(metrics)), 4.2))
    for j, kind in enumerate(kinds):
        values = [table[m][kind]["sensitivity"] for m in metrics]
        xs = [i - 0.4 + width * (j + 0.5) for i in range(len(metrics))]
        ax.bar(xs, [v if v is not None else 0.0 for v in values], width, label=kind.replace("_", " "))
    ax.axhline(1.0, color="black", lw=1, ls="--", label="1 - p (missing, compressed)")
    ax.set_xticks(range(len(metrics)), metrics, fontsize=8, rotation=20)
    ax.set_ylabel("sensitivity (mean slope 10→30→50%)")
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return save_figure(fig, Path(path))


def iter_chunks(items: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    """Consecutive slices of ``items`` of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start:start + size]


def run_items(items: Sequence[CalibrationItem], scorer: WorkflowScorer,
              on_row: Callable[[dict[str, Any]], object], *, seed: int = 0, perturber: LLMPerturber | None = None,
              chunk_size: int = 64) -> None:
    """Score ``items`` chunk by chunk (one judge / LLM call per attempt per chunk), handing each row to
    ``on_row`` as soon as its chunk is done (the caller writes it out, so an interruption loses at most
    one chunk)."""
    for chunk in iter_chunks(items, chunk_size):
        for row in score_items(chunk, scorer, seed=seed, perturber=perturber):
            on_row(row)
