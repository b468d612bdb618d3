"""Planners side by side by their exact full-success probability per task (no episode sampling), beside
bound (iii): means with 95 % intervals over the tasks, shares of the bound, and paired differences
against a reference planner (docs/policies/ppo.md, "Failure-process worlds")."""

from __future__ import annotations

__all__ = ["mean_interval", "exact_rows", "summarize_exact"]

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.bounds import exact_policy_success, monte_carlo_success, optimal_success
from ..core.config import WorldConfig
from ..core.planner import Planner
from ..core.tasks.library import Task

Z95 = 1.959963984540054


def mean_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(mean, low, high): the mean and its normal-approximation 95 % interval over ``values``."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, mean, mean
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    half = Z95 * sd / math.sqrt(n)
    return mean, mean - half, mean + half


def exact_rows(planners: Mapping[str, Callable[[], Planner]], tasks: Sequence[Task], config: WorldConfig,
               on_task: Callable[[dict[str, Any]], object] | None = None, bound: bool = True,
               episodes: int = 0) -> list[dict[str, Any]]:
    """One row per task: bound (iii) (unless ``bound`` is False) and each planner's exact full-success
    probability (a fresh planner per task from its factory), or with ``episodes`` its Monte Carlo estimate
    (the full-success rate over that many episodes, on the streams of run seeds 0..episodes-1, the same
    for every planner: differences are paired). ``on_task`` sees each row as it is made."""
    rows = []
    for task in tasks:
        row: dict[str, Any] = {"task_id": task.instance_id, "task_type": task.task_type}
        if bound:
            row["bound_iii"] = optimal_success(task, config)
        for name, make in planners.items():
            row[name] = (monte_carlo_success(make(), [task], config, episodes)[0] if episodes
                         else exact_policy_success(make(), task, config))
        rows.append(row)
        if on_task is not None:
            on_task(row)
    return rows


def summarize_exact(rows: Sequence[Mapping[str, Any]], planners: Sequence[str], reference: str | None = None
                    ) -> dict[str, dict[str, Any]]:
    """Per planner (and ``bound_iii``): mean exact success with its 95 % interval over the tasks, the share
    of bound (iii) (the ratio of the means; its interval by the delta method, paired with the bound per
    task), and with ``reference`` the paired difference to it with its 95 % interval."""
    bound = sum(r["bound_iii"] for r in rows) / len(rows)
    out: dict[str, dict[str, Any]] = {}
    for name in ("bound_iii", *planners):
        mean, low, high = mean_interval([r[name] for r in rows])
        share = mean / bound
        _, e_low, e_high = mean_interval([(r[name] - share * r["bound_iii"]) / bound for r in rows])
        entry: dict[str, Any] = {"tasks": len(rows), "mean": mean, "ci95": [low, high], "share_of_iii": share,
                                 "share_ci95": [share + e_low, share + e_high]}
        if reference is not None and name not in ("bound_iii", reference):
            d, d_low, d_high = mean_interval([r[name] - r[reference] for r in rows])
            entry[f"minus_{reference}"] = {"mean": d, "ci95": [d_low, d_high]}
        out[name] = entry
    return out
