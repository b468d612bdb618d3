"""`bounds`: per task, the exact bound (iii) and, on request, the clairvoyant bound (ii)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from resilibench.cli.common import (
    SPLIT_CHOICES,
    add_config_option,
    add_library_options,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    load_library,
    nonnegative_int,
    output_file,
    select_tasks,
)


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def cmd_bounds(args: argparse.Namespace) -> int:
    from resilibench.console import format_table, progress_bar
    from resilibench.core.bounds import clairvoyant_success, optimal_success
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.results import run_metadata, write_json_atomic

    output_file(args.output)
    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, source = load_library(args.tasks, world)
    split = args.split or ("all" if args.task_id else "test")
    selected = select_tasks(tasks, split, args.task_type, args.task_id)
    check_bound_turn_limit(config, selected)
    # Bound (ii) reads the random streams that `run` episodes meet for these run seeds.
    seeds = list(range(args.clairvoyant_seeds))

    results = []
    with progress_bar(len(selected), "bounds") as bar:
        for task in selected:
            row = {"task_id": task.instance_id, "task_type": task.task_type, "split": task.split,
                   "required_tools": list(task.required_tools), "bound_iii": optimal_success(task, config)}
            if seeds:
                row["bound_ii"] = clairvoyant_success(task, seeds, config)
            results.append(row)
            bar.update(1)
    summary = {}
    for name in [*TASK_TYPE_NAMES, "all"]:
        mine = [r for r in results if name in ("all", r["task_type"])]
        if mine:
            summary[name] = {"count": len(mine), "bound_iii": _spread([r["bound_iii"] for r in mine])}
            if seeds:
                summary[name]["bound_ii"] = _spread([r["bound_ii"] for r in mine])
    document = {
        "metadata": run_metadata(
            {"world": config.to_dict(), "tasks": source, "split": split, "task_types": args.task_type,
             "task_ids": args.task_id, "clairvoyant_seeds": args.clairvoyant_seeds},
            seeds,
            extra={"bound_ii_streams": "the streams of `resilibench run` episodes for these run seeds"} if seeds else None,
        ),
        "tasks": results,
        "summary": summary,
    }
    if args.output:
        write_json_atomic(args.output, document)
    if args.format == "json":
        print(json.dumps(document, indent=2))
    else:
        headers = ["task_id", "task_type", "split", "tools", "bound_iii"] + (["bound_ii"] if seeds else [])
        rows = [(r["task_id"], r["task_type"], r["split"], len(r["required_tools"]), f"{r['bound_iii']:.6f}",
                 *([f"{r['bound_ii']:.4f}"] if seeds else [])) for r in results]
        print(format_table(headers, rows))
        print()
        headers = ["task_type", "count", "iii mean", "iii min", "iii max"]
        if seeds:
            headers += [f"ii mean ({len(seeds)} seeds)", "ii min", "ii max"]
        rows = []
        for name, st in summary.items():
            row = [name, st["count"], *st["bound_iii"].values()]
            if seeds:
                row += list(st["bound_ii"].values())
            rows.append(row)
        print(format_table(headers, rows))
    if args.output:
        print(f"wrote {args.output}", file=sys.stderr)
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    add_library_options(parser)
    add_config_option(parser)
    parser.add_argument("--split", choices=SPLIT_CHOICES, default=None,
                        help="default test (all when --task-id is given)")
    add_task_type_option(parser)
    parser.add_argument("--task-id", action="append", metavar="ID", help="repeatable; selects tasks of any split")
    parser.add_argument("--clairvoyant-seeds", type=nonnegative_int, default=0, metavar="N",
                        help="also compute bound (ii) averaged over run seeds 0..N-1, on the random streams "
                        "`resilibench run` episodes meet (default 0: skip)")
    parser.add_argument("--format", choices=("table", "json"), default="table", help="what is printed (default table)")
    parser.add_argument("--output", metavar="FILE", help="also write the JSON results (with metadata) to FILE")
    parser.set_defaults(func=cmd_bounds)


def add_commands(commands: Any) -> None:
    """Add ``bounds`` to the ``resilibench`` parser."""
    commands.add_parser("bounds", help="exact bound (iii) per task, optionally bound (ii)", arguments=_arguments)
