"""`tasks generate|stats|show|list`: make a task library, describe it, show a task, list tasks."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from resilibench.cli.common import (
    PROG,
    SPLIT_CHOICES,
    CliError,
    add_config_option,
    add_group,
    add_library_options,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    load_backend,
    load_library,
    nonnegative_int,
    output_file,
    positive_int,
    select_tasks,
)


def cmd_generate(args: argparse.Namespace) -> int:
    from resilibench.core.matching import make_matcher
    from resilibench.core.tasks.library import write_tasks
    from resilibench.core.world import get_world

    output = output_file(args.output)
    try:
        matcher = make_matcher(args.matcher)
    except ImportError as exc:
        raise CliError(f"--matcher {args.matcher}: {exc}") from None
    started = time.perf_counter()
    tasks = get_world(args.world).generate(seed=args.seed, matcher=matcher)
    if args.enhance:
        tasks = _enhance(tasks, args)
    assert output is not None  # --output has a default
    path = write_tasks(tasks, output)
    elapsed = time.perf_counter() - started
    print(f"wrote {len(tasks)} tasks of world {args.world} to {path} (seed {args.seed}, matcher {matcher.name}, "
          f"{elapsed:.1f} s)")
    _print_library_stats(tasks)
    return 0


def _enhance(tasks: list[Any], args: argparse.Namespace) -> list[Any]:
    from resilibench.agents.task_enhancer import TaskEnhancer
    from resilibench.console import progress_bar
    from resilibench.llm import BackendError

    enhancer = TaskEnhancer(load_backend(args.enhance, "--enhance"), attempts=args.enhance_attempts)
    bar = progress_bar(len(tasks), "descriptions")
    try:
        out = enhancer.enhance(tasks, batch_size=args.enhance_batch_size, on_batch=bar.update)
    except BackendError as exc:
        raise CliError(f"--enhance {args.enhance}: {exc}") from None
    finally:
        bar.close()
    kept = sum(1 for t in out if not t.metadata.get("llm_generated"))
    print(f"enhanced {len(out) - kept} descriptions through {args.enhance}; {kept} kept their template text "
          "(reasons in each task's metadata.enhancement)", file=sys.stderr)
    return out


def _print_library_stats(tasks: Sequence[Any]) -> None:
    from resilibench.console import format_table
    from resilibench.core.tasks.library import COMPLEXITIES, SPLITS, TASK_TYPE_NAMES, library_stats

    stats = library_stats(tasks)
    rows = [(name, sum(t.task_type == name for t in tasks),
             *(sum(1 for t in tasks if t.task_type == name and t.split == s) for s in SPLITS),
             len({t.required_tools for t in tasks if t.task_type == name}))
            for name in TASK_TYPE_NAMES]
    rows.append(("total", len(tasks), *(stats["by_split"].get(s, 0) for s in SPLITS), stats["distinct_tool_lists"]))
    print(format_table(("task_type", "count", *SPLITS, "distinct lists"), rows))
    print("complexity: " + ", ".join(f"{c} {stats['by_complexity'].get(c, 0)}" for c in COMPLEXITIES))
    print("required tools per task: " + ", ".join(f"{k}: {v}" for k, v in stats["by_length"].items()))
    per_tool = stats["tasks_per_tool"]
    fewest = min(per_tool, key=per_tool.get)
    print(f"distinct required-tool lists: {stats['distinct_tool_lists']}; distinct descriptions: "
          f"{stats['distinct_descriptions']}")
    print(f"tasks per tool: min {per_tool[fewest]} ({fewest}), max {max(per_tool.values())}; tools required by "
          f"fewer than 20 tasks: {len(stats['tools_required_by_fewer_than_20'])}")
    print(f"descriptions that name a tool: {stats['descriptions_naming_a_tool']}; test tool lists also in train or "
          f"validation: {stats['test_lists_seen_in_train_or_validation']}")


def cmd_stats(args: argparse.Namespace) -> int:
    tasks, source = load_library(args.tasks, choose_world(args))
    if args.format == "json":
        from resilibench.core.tasks.library import library_stats

        print(json.dumps({"source": source, **library_stats(tasks)}, indent=2))
        return 0
    print(f"library: {source['path']} ({source['count']} tasks, sha256 {source['sha256'][:12]})")
    _print_library_stats(tasks)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    from resilibench.core.bounds import optimal_success, reference_workflow

    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, _ = load_library(args.tasks, world)
    (task,) = select_tasks(tasks, None, None, [args.task_id])
    check_bound_turn_limit(config, [task])
    print(json.dumps(task.to_dict(), indent=2, sort_keys=True))
    print()
    print("Reference workflow (the bound-(iii) policy's happy path):")
    print(reference_workflow(task, config).to_plan())
    print()
    print(f"Bound (iii), optimal full-success probability: {optimal_success(task, config):.6f}")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    from resilibench.console import format_table

    tasks, _ = load_library(args.tasks, choose_world(args))
    selected = select_tasks(tasks, args.split, args.task_type, limit=args.limit)
    rows = [(t.instance_id, t.task_type, t.complexity, t.split, " > ".join(t.required_tools)) for t in selected]
    print(format_table(("instance_id", "task_type", "complexity", "split", "required_tools"), rows))
    return 0


# --- parser ---------------------------------------------------------------------------------------------------


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.core.tasks.library import DEFAULT_SEED
    from resilibench.core.world import DEFAULT_WORLD, WORLDS

    parser.add_argument("--world", choices=WORLDS, default=DEFAULT_WORLD,
                        help=f"which world's generator (default {DEFAULT_WORLD})")
    parser.add_argument("--seed", type=nonnegative_int, default=DEFAULT_SEED, metavar="N",
                        help=f"default {DEFAULT_SEED}, the shipped libraries' seed")
    parser.add_argument("--matcher", choices=("auto", "semantic", "lexical"), default="auto",
                        help="operation-to-tool matching (default auto: semantic when the embed extra is installed)")
    parser.add_argument("--output", default="tasks.jsonl", metavar="FILE",
                        help="JSONL path, .gz compresses (default tasks.jsonl)")
    parser.add_argument("--enhance", metavar="BACKEND",
                        help="rewrite descriptions through an LLM backend (hf:PATH, openai:URL?model=M, vllm:PATH); "
                        "answers that name a tool or drop an input or output are retried, then the template text "
                        "is kept with the reason recorded")
    parser.add_argument("--enhance-attempts", type=positive_int, default=3, metavar="N",
                        help="answers asked for per description before the template text is kept (default 3)")
    parser.add_argument("--enhance-batch-size", type=positive_int, default=32, metavar="N",
                        help="descriptions sent to the backend at once (default 32)")
    parser.set_defaults(func=cmd_generate)


def _stats_arguments(parser: argparse.ArgumentParser) -> None:
    add_library_options(parser)
    parser.add_argument("--format", choices=("table", "json"), default="table", help="default table")
    parser.set_defaults(func=cmd_stats)


def _show_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("task_id", metavar="ID", help=f"a task id (`{PROG} tasks list` lists them)")
    add_library_options(parser)
    add_config_option(parser)
    parser.set_defaults(func=cmd_show)


def _list_arguments(parser: argparse.ArgumentParser) -> None:
    add_library_options(parser)
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="all", help="default all")
    add_task_type_option(parser)
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N selected tasks (task types in turn)")
    parser.set_defaults(func=cmd_list)


def add_commands(commands: Any) -> None:
    """Add ``tasks generate|stats|show|list`` to the ``resilibench`` parser."""
    add_group(commands, "tasks", "generate, describe, show and list tasks", {
        "generate": ("generate a world's 5,040-task library", _generate_arguments),
        "stats": ("what a library holds: counts, distinct tool lists, tools' use, leaks", _stats_arguments),
        "show": ("a task, its reference workflow and its bound (iii)", _show_arguments),
        "list": ("list tasks", _list_arguments),
    })
