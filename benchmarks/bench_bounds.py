"""Time bound (iii) for the whole task library on one core, against a Monte Carlo anchor.

The anchor, measured in the same run, is what one would do without the DP: estimate the same policy's
success by simulation, 1,000 episodes per distinct problem (standard error about 1.5 points).

    python benchmarks/bench_bounds.py [--episodes 1000]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from resilibench.envs.simulator import Episode
from resilibench.envs.tasks import load_tasks
from resilibench.policies.bounds import OptimalPlanner, exact_bound, optimal_success


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=1000, help="Monte Carlo episodes per problem (anchor)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core

    tasks = load_tasks(split=None)
    start = time.perf_counter()
    values = [optimal_success(t) for t in tasks]
    dp_seconds = time.perf_counter() - start
    problems = {t.required_tools: t for t in tasks}
    states = sum(exact_bound(t).states_explored for t in problems.values())
    print(f"bound (iii) for {len(tasks)} tasks ({len(problems)} distinct problems, {states:,} DP states): "
          f"{dp_seconds:.1f} s on one core; mean {np.mean(values):.4f}, min {min(values):.4f}")

    start = time.perf_counter()
    errors = [abs(monte_carlo(t, args.episodes) - optimal_success(t)) for t in problems.values()]
    mc_seconds = time.perf_counter() - start
    print(f"anchor: Monte Carlo of the optimal policy, {args.episodes} episodes x {len(problems)} problems: "
          f"{mc_seconds:.1f} s; max |MC - exact| = {max(errors):.4f}")
    print(f"ratio exact DP / Monte Carlo time: {dp_seconds / mc_seconds:.2f}")


if __name__ == "__main__":
    main()
