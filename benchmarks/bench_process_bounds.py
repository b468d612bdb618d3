"""Time bound (iii) under failure processes on the test split, per world, against the default world's bound
measured in the same run.

Each world runs in a fresh child process (cold DP memo, its own peak memory), pinned to one core: the
default world (no processes, the anchor) and each world of ``examples/processes/``. Per world it prints the
CPU seconds (``time.process_time``) of ``optimal_success`` over the selected test tasks, the DP states, the
peak resident memory of the child (``ru_maxrss``) and what the DP added to it beyond the loaded library,
and the ratio of CPU seconds to the anchor's. ``--repeats`` interleaves the worlds (anchor, worlds, anchor,
...) and reports medians.

``--before REV`` also runs each world on the bound of git revision REV (extracted to a temporary folder
that the child imports first), interleaved with the current one, and prints
the current/before ratios of CPU time and peak memory and whether the values agree bit for bit. ``--cold``
gives each child an empty numba cache (the compiled DP's compile time is then in its CPU time); the first
task's CPU seconds are printed apart either way.

``--every K`` keeps every K-th test task (a quick sub-sample; the memo is shared between tasks, so the cost
does not scale linearly). ``--values PATH`` writes every world's values (``repr`` of the float, so equal
text is equal bits) to a JSON file; ``--compare PATH`` checks them against such a file, bit for bit.

    python benchmarks/bench_process_bounds.py [--every 1] [--repeats 1] [--worlds bases latency ...]
        [--before REV] [--cold] [--values out.json] [--compare before.json]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROCESS_WORLDS = ("bases", "latency", "outages", "rate_limits")
ANCHOR = "default"


def child(world: str, every: int) -> None:
    """Solve one world's selected test tasks and print one JSON line of measurements."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    import resilibench.core.bounds as bounds
    from resilibench.core.bounds import exact_bound, optimal_success
    from resilibench.core.world import get_world

    base = get_world()
    config_world = base if world == ANCHOR else base.load_config(ROOT / "examples" / "processes" / f"{world}.yaml")
    tasks = config_world.tasks(split="test")[::every]
    config = config_world.config
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.process_time()
    values = [optimal_success(tasks[0], config)]
    first = time.process_time() - start
    values += [optimal_success(t, config) for t in tasks[1:]]
    seconds = time.process_time() - start
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"world": world, "source": str(Path(bounds.__file__).parent), "tasks": len(tasks), "cpu_s": seconds, "first_s": first, "states": exact_bound(
        tasks[0], config).states_explored, "peak_rss_mb": rss / 1024, "dp_rss_mb": (rss - rss_before) / 1024,
        "mean": sum(values) / len(values), "values": {t.instance_id: repr(v) for t, v in zip(tasks, values,
                                                                                              strict=True)}}))


def measure(world: str, every: int, before: Path | None = None, cold: bool = False) -> dict:
    """One child's measurements; ``before``: a folder holding an earlier revision's package, imported first."""
    env = dict(os.environ)
    if before is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(before), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as cache:
        if cold:
            env["NUMBA_CACHE_DIR"] = cache
        out = subprocess.run([sys.executable, __file__, "--child", world, "--every", str(every)], check=True,
                             capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def extract(revision: str, folder: Path) -> Path:
    """The checkout of git ``revision`` in ``folder`` (importable as it is: the package maps its folders)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=int, default=1, help="keep every K-th test task (quick runs: 5 or 10)")
    parser.add_argument("--repeats", type=int, default=1, help="interleaved repeats; medians are reported")
    parser.add_argument("--worlds", nargs="+", choices=PROCESS_WORLDS, default=list(PROCESS_WORLDS))
    parser.add_argument("--before", help="also run the bound of this git revision (e.g. main), interleaved")
    parser.add_argument("--cold", action="store_true", help="an empty numba cache in every child")
    parser.add_argument("--values", help="write every world's values (repr) to this JSON file")
    parser.add_argument("--compare", help="check the values against a file written by --values, bit for bit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.every)
        return

    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory() as folder:
        before = extract(args.before, Path(folder)) if args.before else None
        for _ in range(args.repeats):
            for world in (ANCHOR, *args.worlds):
                runs.setdefault(world, []).append(measure(world, args.every, cold=args.cold))
                if before is not None and world != ANCHOR:
                    runs.setdefault(f"{world}@before", []).append(measure(world, args.every, before))
    anchor_s = statistics.median(r["cpu_s"] for r in runs[ANCHOR])
    print(f"test split, every {args.every}th task ({runs[ANCHOR][0]['tasks']} tasks), {args.repeats} repeat(s), "
          f"one core, CPU time; anchor: the default world's bound (iii) (no processes)"
          + (f"; @before: revision {args.before}" if args.before else "") + ("; cold numba cache" if args.cold else ""))
    print(f"{'world':<19} {'CPU s':>8} {'first s':>8} {'x anchor':>9} {'states':>10} {'peak RSS MB':>12} "
          f"{'DP RSS MB':>10} {'mean bound':>11}")
    median = {name: {field: statistics.median(r[field] for r in rs) for field in ("cpu_s", "first_s", "peak_rss_mb",
                                                                                   "dp_rss_mb")}
              for name, rs in runs.items()}
    for name, rs in runs.items():
        m = median[name]
        print(f"{name:<19} {m['cpu_s']:8.2f} {m['first_s']:8.2f} {m['cpu_s'] / anchor_s:9.2f} {rs[0]['states']:10,} "
              f"{m['peak_rss_mb']:12.0f} {m['dp_rss_mb']:10.0f} {rs[0]['mean']:11.6f}")
    for name, rs in runs.items():
        print(f"{name}: bound from {rs[0]['source']}")
    for world in args.worlds if before is not None else ():
        now, then = median[world], median[f"{world}@before"]
        same = runs[world][0]["values"] == runs[f"{world}@before"][0]["values"]
        print(f"{world}: CPU {now['cpu_s'] / then['cpu_s']:.3f}x before ({then['cpu_s'] / now['cpu_s']:.1f} times "
              f"less), peak RSS {now['peak_rss_mb'] / then['peak_rss_mb']:.3f}x, DP RSS "
              f"{now['dp_rss_mb'] / max(then['dp_rss_mb'], 1e-9):.3f}x; values "
              + ("the same bit for bit" if same else "DIFFER"))
    values = {world: rs[0]["values"] for world, rs in runs.items() if "@" not in world}
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
