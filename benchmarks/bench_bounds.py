"""Time the exact bounds on one core, in CPU time, against a Monte Carlo anchor measured in the same run.

Library: ``--tasks PATH``, else the shipped v1 library when this version has one, else a synthetic varied
library (``varied_tasks``: 5,040 tasks with distinct random lists of 1-6 required tools); the output says
which. Measured (``time.process_time``, the process pinned to one core):

* bound (iii) of every task, from a cold cache;
* bound (ii) of the test split (synthetic library: its first 756 tasks) x ``--seeds`` run seeds;
* the anchor: what one would do without the DP, simulate the optimal policy, ``--episodes`` episodes on
  each of ``--anchor-problems`` problems spread over the library (standard error about 1.5 points);
* with ``--check``: bound (iii) with every tool an action at every state (the reference for the pruned
  action set), its time and the largest difference from the pruned DP.

    python benchmarks/bench_bounds.py [--tasks PATH] [--seeds 3] [--episodes 1000] [--check]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from resilibench.core.bounds import (
    PlainBound,
    Problem,
    clairvoyant_success,
    exact_bound,
    optimal_success,
    varied_tasks,
)
from resilibench.core.config import WorldConfig
from resilibench.core.simulator import Episode
from resilibench.core.tasks.library import read_tasks
from resilibench.core.world import WORLDS
from resilibench.policies.optimal import OptimalPlanner

TEST_SPLIT_SIZE = 756


def load_library(path: str | None) -> tuple[list, str]:
    """(tasks, description): ``path``, else the shipped v1 library if any, else the synthetic one."""
    if path:
        return read_tasks(path), f"tasks from {path}"
    if "v1" in WORLDS:
        return WORLDS["v1"].tasks(), "shipped v1 library"
    return varied_tasks(5040), "synthetic varied library (this version ships no v1 library): varied_tasks(5040)"


def monte_carlo(task, episodes: int) -> float:
    planner = OptimalPlanner()
    wins = 0
    for seed in range(episodes):
        episode = Episode.start(task, seed)
        planner.reset(task, np.random.default_rng(seed))
        while not episode.done:
            action = planner.act(episode, None)
            episode.finish() if action == len(episode.registry) else episode.call(action)
        wins += episode.evaluation.level == "full_success"
    return wins / episodes


def cpu_seconds(work):
    """(result, CPU seconds) of ``work()``."""
    start = time.process_time()
    result = work()
    return result, time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", help="a task library (JSONL) instead of the shipped or synthetic one")
    parser.add_argument("--seeds", type=int, default=3, help="run seeds per test task for bound (ii)")
    parser.add_argument("--episodes", type=int, default=1000, help="Monte Carlo episodes per problem (anchor)")
    parser.add_argument("--anchor-problems", type=int, default=20, help="problems the anchor simulates")
    parser.add_argument("--check", action="store_true", help="also solve with every tool an action and compare")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    tasks, source = load_library(args.tasks)
    problems = {(t.required_tools, t.max_retries): t for t in tasks}
    print(f"library: {source}; {len(tasks)} tasks, {len(problems)} distinct problems")

    values, dp_seconds = cpu_seconds(lambda: [optimal_success(t) for t in tasks])
    states = exact_bound(tasks[0]).states_explored
    per_problem = dp_seconds / len(problems)
    print(f"bound (iii), all {len(tasks)} tasks: {dp_seconds:.2f} s CPU on one core ({states:,} shared DP states, "
          f"{1000 * per_problem:.2f} ms per problem); mean {np.mean(values):.4f}, min {min(values):.4f}")

    test = [t for t in tasks if t.split == "test"] or tasks[:TEST_SPLIT_SIZE]
    hits, ii_seconds = cpu_seconds(lambda: [clairvoyant_success(t, range(args.seeds)) for t in test])
    print(f"bound (ii), {len(test)} test tasks x {args.seeds} seeds: {ii_seconds:.2f} s CPU "
          f"({1000 * ii_seconds / (len(test) * args.seeds):.2f} ms per stream); mean {np.mean(hits):.4f}")

    sample = list(problems.values())[:: max(1, len(problems) // args.anchor_problems)][: args.anchor_problems]
    errors, mc_seconds = cpu_seconds(lambda: [abs(monte_carlo(t, args.episodes) - optimal_success(t)) for t in sample])
    mc_per_problem = mc_seconds / len(sample)
    print(f"anchor: Monte Carlo of the optimal policy, {args.episodes} episodes x {len(sample)} problems: "
          f"{mc_seconds:.2f} s CPU ({mc_per_problem:.3f} s per problem); max |MC - exact| = {max(errors):.4f}")
    print(f"ratio bound (iii) / Monte Carlo, per problem: {per_problem / mc_per_problem:.4f}")

    if args.check:
        config = WorldConfig()

        def all_actions():
            bounds = [PlainBound(Problem(t.required_ids(), 1 + t.max_retries, config.rules, config.failure),
                                 all_actions=True) for t in problems.values()]
            return [(b.optimal_success, b.happy_path()) for b in bounds]

        reference, check_seconds = cpu_seconds(all_actions)
        pruned = [(exact_bound(t).optimal_success, exact_bound(t).happy_path()) for t in problems.values()]
        worst = max(abs(a[0] - b[0]) for a, b in zip(reference, pruned, strict=True))
        paths = sum(a[1] != b[1] for a, b in zip(reference, pruned, strict=True))
        print(f"check: every tool an action, {len(problems)} problems: {check_seconds:.2f} s CPU; "
              f"max |pruned - all actions| = {worst:.1e}; optimal happy paths that differ: {paths}")


if __name__ == "__main__":
    main()
