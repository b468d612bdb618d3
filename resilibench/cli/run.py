"""`run`: the quick planner benchmark. Every planner on the selected tasks and seeds, beside bound (iii)
and bound (ii), into a resumable directory; `eval policy` plays a trained policy through the same code."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.cli.common import (
    SPLIT_CHOICES,
    ApiChoice,
    CliError,
    add_api_options,
    add_config_option,
    add_library_options,
    add_output_dir_option,
    add_resume_option,
    add_seeds_option,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    dedupe,
    load_api,
    load_library,
    output_file,
    positive_int,
    select_tasks,
)
from resilibench.console import format_table, progress_bar
from resilibench.rundir import RunDirectory

RUN_KEY = ("planner", "task_id", "seed")


def _print_run_table(summary: dict[str, Any], task_types: Sequence[str]) -> None:
    headers = ("planner", "task_type", "episodes", "full", "full 95% CI", "partial", "failure", "bound_iii",
               "bound_ii", "full/iii")
    rows = []
    for planner, overall in summary["overall"].items():
        per_type = summary["by_task_type"][planner]
        for name, st in [("all", overall), *((t, per_type[t]) for t in task_types if t in per_type)]:
            lo, hi = st["full_success_ci95"]
            rows.append((planner, name, st["episodes"], st["full_success"], f"[{lo:.3f}, {hi:.3f}]",
                         st["partial_success"], st["failure"], st["bound_iii"], st["bound_ii"],
                         st["full_over_bound_iii"]))
    print(format_table(headers, rows))


@dataclass
class RunPlan:
    """What `run` was asked to do, resolved and checked."""

    config: Any  # WorldConfig
    planners: list[str]
    seeds: list[int]
    task_types: list[str]
    tasks: list[Any]  # the selected Tasks
    jobs: list[tuple[str, Any, int]]
    run: RunDirectory  # identity: what must match for results to be mixed (world config, task library)
    run_config: dict[str, Any]  # written into the metadata
    api: ApiChoice | None = None  # real-API mode (`run --api`)


def run_directory(path: str, identity: dict[str, Any]) -> RunDirectory:
    """The RunDirectory of a planner run (`run`, `eval policy`): rows keyed by planner, task and seed."""
    return RunDirectory(path, identity, key=RUN_KEY, stale=("summary.png",),
                        level_fields=(*RUN_KEY, "task_type", "level"))


def cmd_run(args: argparse.Namespace) -> int:
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.policies.runner import episode_jobs

    world = choose_world(args, need_bounds=True)
    config = world.config
    if args.api_tasks is not None:
        raise CliError("--api-tasks: not for run (the planners play the world's own tools); use --api URL")
    api = load_api(args, simulator_log=True)
    tasks, source = load_library(args.tasks, world)
    planners, seeds = dedupe(args.planners), dedupe(args.seeds)
    task_types = dedupe(args.task_type) if args.task_type else list(TASK_TYPE_NAMES)
    selected = select_tasks(tasks, args.split, task_types, limit=args.limit)
    check_bound_turn_limit(config, selected)
    jobs = episode_jobs(planners, selected, seeds)
    identity: dict[str, Any] = {"world": config.to_dict(), "tasks_sha256": source["sha256"]}
    run_config = {"world": config.to_dict(), "tasks": source, "planners": planners, "split": args.split,
                  "task_types": task_types, "limit": args.limit, "task_count": len(selected), "episodes": len(jobs)}
    # The API target (None: the simulator; a run config recorded without one reads as None) is part of
    # the run: resuming against another target is refused.
    identity["api"] = run_config["api"] = None if api is None else api.identity
    plan = RunPlan(config=config, planners=planners, seeds=seeds, task_types=task_types, tasks=selected, jobs=jobs,
                   run=run_directory(args.output_dir, identity), run_config=run_config, api=api)
    # Without --api the runner writes the simulator's call log; with it, the HTTP client writes its own.
    simulator_log = output_file(args.call_log, "--call-log") if api is None else None
    return execute_run(plan, resume=args.resume, split=args.split, call_log=simulator_log)


def execute_run(plan: RunPlan, resume: bool, split: str, call_log: Path | None = None) -> int:
    """Run the missing episodes of ``plan`` into its directory, then write the summary and the plot;
    ``call_log``: a file that receives one call-log row per call of every episode played (appended)."""
    from resilibench.envs.real_api.call_log import logged_episodes
    from resilibench.policies.runner import run_jobs
    from resilibench.results import plot_full_success, run_metadata, summarize_levels

    run = plan.run
    plot_path = run.path / "summary.png"
    with run.session(resume):
        done = run.done()
        todo = [job for job in plan.jobs if (job[0], job[1].instance_id, job[2]) not in done]
        print(f"{len(plan.jobs)} episodes ({len(plan.planners)} planners x {len(plan.tasks)} tasks x "
              f"{len(plan.seeds)} seeds); {len(plan.jobs) - len(todo)} already in {run.results_path}, {len(todo)} "
              "to run", file=sys.stderr)
        if todo:
            run.open_results(run_metadata(plan.run_config, plan.seeds))
            logged = logged_episodes(call_log) if resume and call_log is not None else set()
            with progress_bar(len(todo), "episodes") as bar:
                run_jobs(todo, plan.config, on_result=lambda row: (run.write(row), bar.update(1)), call_log=call_log,
                         api=plan.api and plan.api.real, logged=logged)
        wanted = {(p, t.instance_id, s) for p, t, s in plan.jobs}
        rows = [row for row in run.rows() if run.key_of(row) in wanted]
        levels = summarize_levels(rows, "planner", "task_type", groups=plan.planners, subgroups=plan.task_types)
        summary = {
            "metadata": run_metadata(plan.run_config, plan.seeds),
            "files": {"results": run.results_path.name, "plot": plot_path.name},
            **levels,
        }
        run.write_summary(summary)
        plot_full_success(levels["overall"], levels["by_task_type"], plot_path,
                          title=f"Full success on {split} ({len(plan.tasks)} tasks x {len(plan.seeds)} seeds)")
    _print_run_table(summary, plan.task_types)
    print(f"wrote {run.results_path}, {run.summary_path} and {plot_path}", file=sys.stderr)
    return 0


def add_selection_options(parser: argparse.ArgumentParser) -> None:
    """The tasks and seeds a planner run plays (`run`, `eval policy`), with the library and world they come from."""
    add_library_options(parser)
    add_config_option(parser)
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="test", help="default test")
    add_task_type_option(parser)
    add_seeds_option(parser)
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N selected tasks (task types in turn)")


def _arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.policies.runner import PLANNER_NAMES

    parser.add_argument("--planners", nargs="+", choices=PLANNER_NAMES, default=list(PLANNER_NAMES), metavar="NAME",
                        help=f"default all: {' '.join(PLANNER_NAMES)}")
    add_selection_options(parser)
    add_api_options(parser)
    add_output_dir_option(parser, "runs/quick")
    add_resume_option(parser)
    parser.set_defaults(func=cmd_run)


def add_commands(commands: Any) -> None:
    """Add ``run`` to the ``resilibench`` parser."""
    commands.add_parser("run", help="the quick planner benchmark, beside bounds (iii) and (ii)", arguments=_arguments)
