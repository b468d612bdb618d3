"""Tables and figures of an evaluation run (rows from ``agents.harness``), in the shape of the paper.

* ``by_prompt``: full / partial / failure rates per model and prompt variant (paper Table 2, with the
  flawed variant as a fourth column group), each beside bound (iii) of the same tasks and seeds;
* ``optimal_vs_flawed``: the optimal against the flawed plan prompts (paper Table 3);
* ``by_task_type``: full success per task type (paper Table 13) and ``by_flaw_type`` (paper Fig. 3a);
* robustness beyond the paper, per model and prompt condition:

  - ``pass^k`` (tau-bench): the probability that k independent runs of a task all reach full success,
    estimated without bias from n seeds with c successes as C(c, k) / C(n, k), averaged over tasks;
    the reference is bound (iii) to the power k (an optimal agent's runs are independent trials);
  - recovery: a failed call is *recovered* when a later call of the same tool in the episode succeeds;
    recovery rate = recovered failed calls / failed calls. ``full_after_failure`` is the full-success
    rate of the episodes that had at least one failed call;
  - wasted calls per episode: calls that could not help, each counted once, first matching reason
    first: a replay of a tool that had already succeeded, a call over the retry limit, arguments
    rejected by the tool's schema (INVALID_INPUT without a draw), or a tool that is neither required
    nor a dependency of a required tool.

Rates come from ``resilibench.results.level_stats`` (95% Wilson intervals, mean bound (iii) and
full / bound (iii)).
"""

from __future__ import annotations

__all__ = [
    "PROMPT_ORDER", "INVALID_INPUT", "RETRY_LIMIT", "WASTE_REASONS", "condition", "pass_hat_k", "pass_k",
    "recovery", "waste_reason", "useful_tools", "wasted_calls", "summarize_eval", "format_tables",
    "plot_summary",
]

from collections import defaultdict
from collections.abc import Sequence
from math import comb
from pathlib import Path
from typing import Any

from resilibench.results import INFRA_ERROR, LEVEL_NAMES, level_stats

PROMPT_ORDER = ("baseline", "cot", "optimal", "flawed")
INVALID_INPUT = "INVALID_INPUT"
RETRY_LIMIT = "RETRY_LIMIT_EXCEEDED"
WASTE_REASONS = ("replay", "retry_limit", "invalid_input", "not_required")


def condition(row: dict[str, Any]) -> str:
    """The prompt condition of a row: the variant, with the flaw type for flawed prompts."""
    return f"flawed/{row['flaw_type']}" if row["prompt"] == "flawed" else row["prompt"]


def _ordered(values: Sequence[str], order: Sequence[str] = ()) -> list[str]:
    """Distinct ``values``: those in ``order`` first (in that order), then the rest as they appear."""
    seen = list(dict.fromkeys(values))
    return [v for v in order if v in seen] + [v for v in seen if v not in order]


def _grouped(rows: Sequence[dict[str, Any]], *fields: str) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[f] for f in fields)].append(row)
    return groups


# --- robustness metrics -------------------------------------------------------------------------------


def pass_hat_k(successes: int, n: int, k: int) -> float:
    """Unbiased estimate of the probability that k runs out of a task's n all succeed: C(c, k) / C(n, k)."""
    if not 1 <= k <= n:
        raise ValueError(f"k must be in [1, n={n}], got {k}")
    return comb(successes, k) / comb(n, k)


def pass_k(rows: Sequence[dict[str, Any]], max_k: int = 4) -> dict[str, Any]:
    """pass^k for k = 1..min(max_k, fewest seeds of a task), averaged over the tasks of ``rows``, with
    the bound-(iii) reference mean(bound**k). Rows of one task are its runs (seeds)."""
    per_task = _grouped(rows, "task_id")
    if not per_task:
        return {"tasks": 0, "pass_k": {}, "bound_iii": {}}
    n_min = min(len(r) for r in per_task.values())
    out: dict[str, Any] = {"tasks": len(per_task), "pass_k": {}, "bound_iii": {}}
    for k in range(1, min(max_k, n_min) + 1):
        values = [pass_hat_k(sum(r["level"] == "full_success" for r in runs), len(runs), k)
                  for runs in per_task.values()]
        out["pass_k"][str(k)] = sum(values) / len(values)
        bounds = [runs[0].get("bound_iii") for runs in per_task.values()]
        known = [b for b in bounds if b is not None]
        if len(known) == len(bounds):
            out["bound_iii"][str(k)] = sum(b**k for b in known) / len(known)
    return out


def recovery(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Failed calls, those recovered by a later success of the same tool, the recovery rate, and the
    full-success rate of episodes with at least one failed call."""
    failed = recovered = episodes_with_failure = full_after_failure = 0
    for row in rows:
        trace = row["trace"]
        had_failure = False
        for i, call in enumerate(trace):
            if call["success"]:
                continue
            had_failure = True
            failed += 1
            if any(later["success"] and later["tool"] == call["tool"] for later in trace[i + 1:]):
                recovered += 1
        if had_failure:
            episodes_with_failure += 1
            full_after_failure += row["level"] == "full_success"
    return {
        "failed_calls": failed,
        "recovered": recovered,
        "recovery_rate": recovered / failed if failed else None,
        "episodes_with_failure": episodes_with_failure,
        "full_after_failure": full_after_failure / episodes_with_failure if episodes_with_failure else None,
    }


def waste_reason(call: dict[str, Any], useful: frozenset[str]) -> str | None:
    """Why a call was wasted (one of ``WASTE_REASONS``), or None for a useful call."""
    if call.get("replayed"):
        return "replay"
    if call["error_code"] == RETRY_LIMIT:
        return "retry_limit"
    if call["error_code"] == INVALID_INPUT and call.get("probability") is None:
        return "invalid_input"
    if call["tool"] not in useful:
        return "not_required"
    return None


def useful_tools(required: Sequence[str], registry: Any = None) -> frozenset[str]:
    """A task's required tools and every tool they depend on, directly or not."""
    from ..core.registry import default_registry

    registry = registry or default_registry()
    ids = {registry.id_of(t) for t in required}
    for t in list(ids):
        ids |= registry.ancestors(t)
    return frozenset(registry.names[t] for t in ids)


def wasted_calls(rows: Sequence[dict[str, Any]], registry: Any = None) -> dict[str, Any]:
    """Mean wasted calls per episode, in all and by reason, and the share of calls that were wasted."""
    counts: dict[str, int] = dict.fromkeys(WASTE_REASONS, 0)
    calls = 0
    useful_of: dict[tuple[str, ...], frozenset[str]] = {}
    for row in rows:
        required = tuple(row["required_tools"])
        useful = useful_of.get(required)
        if useful is None:
            useful = useful_of[required] = useful_tools(required, registry)
        for call in row["trace"]:
            calls += 1
            reason = waste_reason(call, useful)
            if reason is not None:
                counts[reason] += 1
    n = len(rows)
    total = sum(counts.values())
    return {
        "per_episode": total / n if n else None,
        "by_reason": {reason: c / n if n else None for reason, c in counts.items()},
        "share_of_calls": total / calls if calls else None,
    }


# --- the summary --------------------------------------------------------------------------------------


def summarize_eval(rows: Sequence[dict[str, Any]], max_k: int = 4, registry: Any = None) -> dict[str, Any]:
    """Every table of the module docstring as JSON-ready data, keyed by model first. Rows of
    infrastructure errors are left out of every rate and counted per model in ``infra_errors``."""
    from ..core.tasks.library import TASK_TYPE_NAMES
    from ..core.text.flaws import FLAW_TYPES

    infra = [r for r in rows if r["level"] == INFRA_ERROR]
    rows = [r for r in rows if r["level"] != INFRA_ERROR]

    models = _ordered([r["model"] for r in rows])
    prompts = _ordered([r["prompt"] for r in rows], PROMPT_ORDER)
    conditions = _ordered([condition(r) for r in rows],
                          [p for p in PROMPT_ORDER if p != "flawed"] + [f"flawed/{f}" for f in FLAW_TYPES])
    task_types = _ordered([r["task_type"] for r in rows], TASK_TYPE_NAMES)
    by_model_prompt = _grouped(rows, "model", "prompt")
    summary: dict[str, Any] = {"models": models, "prompts": prompts, "conditions": conditions,
                               "task_types": task_types}
    summary["by_prompt"] = {m: {p: level_stats(by_model_prompt[m, p]) for p in prompts if (m, p) in by_model_prompt}
                            for m in models}
    summary["by_task_type"] = {}
    for m in models:
        mine = [r for r in rows if r["model"] == m]
        groups = _grouped(mine, "task_type")
        summary["by_task_type"][m] = {"all": level_stats(mine)} | {t: level_stats(groups[t,]) for t in task_types
                                                                   if (t,) in groups}
    flawed = _grouped([r for r in rows if r["prompt"] == "flawed"], "model", "flaw_type")
    summary["by_flaw_type"] = {m: {f: level_stats(flawed[m, f]) for f in FLAW_TYPES if (m, f) in flawed}
                               for m in models}
    robustness: dict[str, Any] = {}
    by_condition = _grouped([{**r, "condition": condition(r)} for r in rows], "model", "condition")
    for m in models:
        robustness[m] = {}
        for c in conditions:
            mine = by_condition.get((m, c))
            if mine:
                robustness[m][c] = {"episodes": len(mine), "pass_k": pass_k(mine, max_k),
                                    "recovery": recovery(mine), "wasted_calls": wasted_calls(mine, registry)}
    summary["robustness"] = robustness
    summary["infra_errors"] = {m: sum(r["model"] == m for r in infra) for m in _ordered([r["model"] for r in infra])}
    return summary


# --- printed tables -----------------------------------------------------------------------------------


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def _levels(stats: dict[str, Any] | None) -> list[str]:
    return ["-"] * 3 if stats is None else [_pct(stats[level]) for level in LEVEL_NAMES]


def format_tables(summary: dict[str, Any]) -> str:
    """The tables of a summary as plain text (rates in percent)."""
    from resilibench.console import format_table

    models, prompts = summary["models"], summary["prompts"]
    out = []
    headers = ["model"] + [f"{p} {level}" for p in prompts for level in ("full", "partial", "fail")]
    rows = [[m, *(cell for p in prompts for cell in _levels(summary["by_prompt"][m].get(p)))] for m in models]
    out += ["Success levels by prompt type (%; Table 2 shape)", format_table(headers, rows), ""]

    headers = ["model", "prompt", "episodes", "full", "full 95% CI", "bound_iii", "full/iii"]
    rows = []
    for m in models:
        for p, st in summary["by_prompt"][m].items():
            lo, hi = st["full_success_ci95"]
            rows.append([m, p, st["episodes"], _pct(st["full_success"]), f"[{_pct(lo)}, {_pct(hi)}]",
                         _pct(st["bound_iii"]), st["full_over_bound_iii"]])
    out += ["Full success beside bound (iii) of the same tasks and seeds", format_table(headers, rows), ""]

    if {"optimal", "flawed"} <= set(prompts):
        headers = ["model", "optimal full", "optimal partial", "optimal fail", "flawed full", "flawed partial",
                   "flawed fail", "drop (pp)"]
        rows = []
        for m in models:
            opt, fl = summary["by_prompt"][m].get("optimal"), summary["by_prompt"][m].get("flawed")
            drop = (100 * (opt["full_success"] - fl["full_success"])) if opt and fl else None
            rows.append([m, *_levels(opt), *_levels(fl), "-" if drop is None else f"{drop:.1f}"])
        out += ["Optimal vs flawed workflow prompts (%; Table 3 shape)", format_table(headers, rows), ""]

    headers = ["task_type", *models]
    rows = [[t, *(_pct(summary["by_task_type"][m].get(t, {}).get("full_success")) for m in models)]
            for t in [*summary["task_types"], "all"]]
    out += ["Full success by task type (%; Table 13 shape)", format_table(headers, rows), ""]

    flaw_types = list(dict.fromkeys(f for m in models for f in summary["by_flaw_type"][m]))
    if flaw_types:
        headers = ["flaw_type", *(f"{m} full" for m in models), *(f"{m} n" for m in models)]
        rows = [[f, *(_pct(summary["by_flaw_type"][m].get(f, {}).get("full_success")) for m in models),
                 *(summary["by_flaw_type"][m].get(f, {}).get("episodes", 0) for m in models)] for f in flaw_types]
        out += ["Full success by flaw type (%)", format_table(headers, rows), ""]

    ks = sorted({k for m in models for r in summary["robustness"][m].values() for k in r["pass_k"]["pass_k"]},
                key=int)
    headers = ["model", "condition", "episodes", *(f"pass^{k}" for k in ks), *(f"iii^{k}" for k in ks),
               "recovery", "full after fail", "wasted/ep", *(f"{r}/ep" for r in WASTE_REASONS)]
    rows = []
    for m in models:
        for c, r in summary["robustness"][m].items():
            pk, rec, waste = r["pass_k"], r["recovery"], r["wasted_calls"]
            rows.append([m, c, r["episodes"], *(_pct(pk["pass_k"].get(k)) for k in ks),
                         *(_pct(pk["bound_iii"].get(k)) for k in ks), _pct(rec["recovery_rate"]),
                         _pct(rec["full_after_failure"]), waste["per_episode"],
                         *(waste["by_reason"][reason] for reason in WASTE_REASONS)])
    out += ["Robustness under faults (pass^k and recovery in %, wasted calls per episode)",
            format_table(headers, rows)]
    for m, n in summary.get("infra_errors", {}).items():
        out.append(f"{m}: {n} episode(s) ended by an infrastructure error (timeout, context overflow), left out above")
    return "\n".join(out)


def plot_summary(rows: Sequence[dict[str, Any]], path: str | Path, title: str) -> Path:
    """One PNG: full success (95% intervals) per prompt condition and model, bound (iii) marked."""
    from resilibench.results import plot_full_success, summarize_levels

    from ..core.text.flaws import FLAW_TYPES

    marked = [{**r, "condition": condition(r)} for r in rows if r["level"] != INFRA_ERROR]
    order = _ordered([r["condition"] for r in marked],
                     [p for p in PROMPT_ORDER if p != "flawed"] + [f"flawed/{f}" for f in FLAW_TYPES])
    levels = summarize_levels(marked, "model", "condition", subgroups=order)
    return plot_full_success(levels["overall"], levels["by_condition"], path, title=title)
