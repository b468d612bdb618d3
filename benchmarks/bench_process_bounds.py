"""Time bound (iii) under failure processes on the test split, per world, against the default world's bound
measured in the same run.

Each world runs in a fresh child process (cold DP memo, its own peak memory), pinned to one core: the
default world (no processes, the anchor) and each world of ``examples/processes/``. Per world it prints the
CPU seconds (``time.process_time``) of ``optimal_success`` over the selected test tasks, the DP states, the
peak resident memory of the child (``ru_maxrss``) and what the DP added to it beyond the loaded library,
and the ratio of CPU seconds to the anchor's. ``--repeats`` interleaves the worlds (anchor, worlds, anchor,
...) and reports medians.

``--every K`` keeps every K-th test task (a quick sub-sample; the memo is shared between tasks, so the cost
does not scale linearly). ``--values PATH`` writes every world's values (``repr`` of the float, so equal
text is equal bits) to a JSON file; ``--compare PATH`` checks them against such a file, bit for bit.

    python benchmarks/bench_process_bounds.py [--every 1] [--repeats 1] [--worlds bases latency ...]
        [--values out.json] [--compare before.json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCESS_WORLDS = ("bases", "latency", "outages", "rate_limits")
ANCHOR = "default"


def child(world: str, every: int) -> None:
    """Solve one world's selected test tasks and print one JSON line of measurements."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    from resilibench.core.bounds import exact_bound, optimal_success
    from resilibench.core.world import get_world

    base = get_world()
    config_world = base if world == ANCHOR else base.load_config(ROOT / "examples" / "processes" / f"{world}.yaml")
    tasks = config_world.tasks(split="test")[::every]
    config = config_world.config
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    values = [optimal_success(t, config) for t in tasks]
    seconds = time.process_time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"world": world, "tasks": len(tasks), "cpu_s": seconds, "states": exact_bound(
        tasks[0], config).states_explored, "peak_rss_mb": rss / 1024, "dp_rss_mb": (rss - rss_before) / 1024,
        "mean": sum(values) / len(values), "values": {t.instance_id: repr(v) for t, v in zip(tasks, values,
                                                                                              strict=True)}}))


def measure(world: str, every: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", world, "--every", str(every)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="keep every K-th test task (quick runs: 5 or 10)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; medians are reported")
    parser.add_argument("--worlds", nargs="+", choices=PROCESS_WORLDS, default=list(PROCESS_WORLDS))
    parser.add_argument("--values", help="write every world's values (repr) to this JSON file")
    parser.add_argument("--compare", help="check the values against a file written by --values, bit for bit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.every)
        return

    runs: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for world in (ANCHOR, *args.worlds):
            runs.setdefault(world, []).append(measure(world, args.every))
    anchor_s = statistics.median(r["cpu_s"] for r in runs[ANCHOR])
    print(f"test split, every {args.every}th task ({runs[ANCHOR][0]['tasks']} tasks), {args.repeats} repeat(s), "
          f"one core, CPU time; anchor: the default world's bound (iii) (no processes)")
    print(f"{'world':<12} {'CPU s':>8} {'x anchor':>9} {'states':>10} {'peak RSS MB':>12} {'DP RSS MB':>10} "
          f"{'mean bound':>11}")
    for world, rs in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rs)
        print(f"{world:<12} {cpu:8.2f} {cpu / anchor_s:9.2f} {rs[0]['states']:10,} "
              f"{statistics.median(r['peak_rss_mb'] for r in rs):12.0f} "
              f"{statistics.median(r['dp_rss_mb'] for r in rs):10.0f} {rs[0]['mean']:11.6f}")
    values = {world: rs[0]["values"] for world, rs in runs.items()}
    if args.values:
        Path(args.values).write_text(json.dumps(values, indent=0, sort_keys=True))
    if args.compare:
        reference = json.loads(Path(args.compare).read_text())
        for world, mine in values.items():
            theirs = {k: v for k, v in reference.get(world, {}).items() if k in mine}
            differ = [k for k in theirs if theirs[k] != mine[k]]
            print(f"compare {world}: {len(theirs)} values in common, {len(differ)} differ"
                  + (f" (first: {differ[0]} {theirs[differ[0]]} != {mine[differ[0]]})" if differ else ""))


if __name__ == "__main__":
    main()
