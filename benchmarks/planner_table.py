"""Planners in one world by their exact full-success probability on held-out tasks, beside bound (iii).

For the first ``--limit`` tasks of ``--split`` (task types in turn, as ``resilibench run --limit``): bound
(iii), the optimal policy, the heuristics and any trained policies (``--policy NAME=CHECKPOINT``), each with
its mean exact full success, 95 % interval over the tasks and share of the bound, and its paired difference
to the process-aware heuristic (``resilibench.policies.compare``). Exact values integrate out the episodes'
randomness, so the intervals reflect only which tasks were drawn.

Run: ``python benchmarks/planner_table.py --config examples/processes/outages.yaml --limit 150
--policy bc=runs/ppo-outages/checkpoints/iter_000000`` (``--output FILE`` writes the per-task rows and the
summary as JSON; each task's row is printed as it is scored). ``--no-baselines`` scores only the policies,
and ``--rows FILE`` (repeatable) merges the rows of earlier ``--output`` files on the same tasks, so
baselines and policies can be scored apart. ``--episodes N`` replaces the planners' exact values by Monte
Carlo estimates over N episodes per task (where enumerating a planner's states costs too much; bound (iii)
stays exact).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from resilibench.core.config import load_config
from resilibench.core.tasks.library import interleave_task_types
from resilibench.core.world import load_tasks
from resilibench.policies.compare import exact_rows, summarize_exact
from resilibench.policies.heuristics import HEURISTICS
from resilibench.policies.optimal import OptimalPlanner

REFERENCE = "process_aware"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", help="WorldConfig file (default: world v1's)")
    parser.add_argument("--split", default="test")
    parser.add_argument("--limit", type=int, default=150)
    parser.add_argument("--policy", action="append", default=[], metavar="NAME=CHECKPOINT")
    parser.add_argument("--output", help="JSON file for the rows and the summary")
    parser.add_argument("--no-baselines", dest="baselines", action="store_false",
                        help="score only the --policy planners (no bound, heuristics or optimal policy)")
    parser.add_argument("--episodes", type=int, default=0, help="score the planners by Monte Carlo over this many "
                        "episodes per task (run seeds 0..N-1), not exactly; bound (iii) stays exact")
    parser.add_argument("--rows", action="append", default=[], metavar="FILE", help="merge the rows of an "
                        "earlier --output file (same tasks)")
    args = parser.parse_args()
    config = load_config(args.config)
    tasks = interleave_task_types(load_tasks(None, args.split, None))[:args.limit]
    planners = {}
    if args.baselines:
        planners = {name: HEURISTICS[name] for name in ("in_order", "dependency_aware", REFERENCE)}
        planners["optimal"] = lambda: OptimalPlanner(config)
    if args.policy:
        from resilibench.policies.ppo.evaluation import PPOPlanner, load_module

        for spec in args.policy:
            name, _, path = spec.partition("=")
            module = load_module(path)
            planners[name] = lambda path=path, module=module: PPOPlanner(path, module)
    started = time.process_time()
    rows = exact_rows(planners, tasks, config, bound=args.baselines, episodes=args.episodes,
                      on_task=lambda row: print(json.dumps(row), flush=True))  # each task's row as it is scored
    for path in args.rows:
        earlier = {r["task_id"]: r for r in json.loads(Path(path).read_text())["rows"]}
        for row in rows:
            row.update({k: v for k, v in earlier[row["task_id"]].items() if k not in row})
    scored = f"Monte Carlo, {args.episodes} episodes per task" if args.episodes else "exact"
    print(f"{args.config or 'v1'}: {len(tasks)} {args.split} tasks ({scored}), {time.process_time() - started:.0f} CPU s")
    output = {"config": args.config, "split": args.split, "episodes": args.episodes, "rows": rows}
    if "bound_iii" in rows[0]:
        names = [k for k in rows[0] if k not in ("task_id", "task_type", "bound_iii")]
        output["summary"] = summarize(rows, names)
    else:
        print("no bound (iii) in the rows: merge them with an earlier --output file of the baselines (--rows)")
    if args.output:
        Path(args.output).write_text(json.dumps(output, indent=1))


def summarize(rows: list[dict], names: list[str]) -> dict:
    """Print and return the summary of ``rows`` (``summarize_exact``) for the planners ``names``."""
    summary = summarize_exact(rows, names, REFERENCE if REFERENCE in names else None)
    print(f"{'planner':<18} {'full':>10} {'95% CI':>17} {'share of iii':>12} {'share 95% CI':>15}"
          f"  {'minus ' + REFERENCE + ' [95% CI]'}")
    for name, s in summary.items():
        diff = s.get(f"minus_{REFERENCE}")
        paired = f"{diff['mean']:+.3f} [{diff['ci95'][0]:+.3f}, {diff['ci95'][1]:+.3f}]" if diff else ""
        print(f"{name:<18} {s['mean']:>10.3f} [{s['ci95'][0]:.3f}, {s['ci95'][1]:.3f}] {s['share_of_iii']:>12.3f} "
              f"[{s['share_ci95'][0]:.3f}, {s['share_ci95'][1]:.3f}]  {paired}")
    return summary

if __name__ == "__main__":
    main()
