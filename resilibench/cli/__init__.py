"""The ``resilibench`` command line: tools, tasks, bounds and the quick planner benchmark.

``main(argv)`` returns the exit status (0 ok, 2 bad arguments or input, 1 a read or write the system refused,
130 interrupted) and never raises for bad input: every error is one line naming the field and the accepted
values.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.console import format_table, progress_bar
from resilibench.errors import InputError, RunInterrupted
from resilibench.rundir import RunDirectory, blocking_ancestor
from resilibench.version import __version__

PROG = "resilibench"
SPLIT_CHOICES = ("train", "validation", "test", "all")
RUN_KEY = ("planner", "task_id", "seed")
# Commands of the other areas live in their own modules; each has ``add_commands(commands, parents)``
# where ``parents`` maps "library" (--tasks), "world" (--config) and "api" (--api and its options, read by
# ``load_api``) to argparse parent parsers.
COMMAND_MODULES = (
    "resilibench.cli.agents",
    "resilibench.cli.breaker",
    "resilibench.cli.calibrate",
    "resilibench.cli.mcp",
    "resilibench.cli.metrics",
    "resilibench.cli.realapi",
    "resilibench.cli.train",
    "resilibench.cli.robust",
)


class CliError(Exception):
    """Bad arguments or input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error message (no usage block) and exit status 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


# --- helpers shared with the command modules of other areas -----------------------------------------------------------------------------------


def nonnegative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer, got {value}")
    return value


def positive_int(text: str) -> int:
    value = nonnegative_int(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a positive integer, got 0")
    return value


def _float_at_least(text: str, lowest: float, strict: bool, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a {what} number, got {text!r}") from None
    if not (value > lowest if strict else value >= lowest):
        raise argparse.ArgumentTypeError(f"expected a {what} number, got {text}")
    return value


def positive_float(text: str) -> float:
    return _float_at_least(text, 0.0, True, "positive")


def nonnegative_float(text: str) -> float:
    return _float_at_least(text, 0.0, False, "non-negative")


def dedupe(values: Sequence[Any]) -> list[Any]:
    return list(dict.fromkeys(values))


def output_file(path: str | None, option: str = "--output") -> Path | None:
    """The file an output option names, checked before any work: CliError when it is a directory or
    sits below a file."""
    if path is None:
        return None
    file = Path(path)
    if file.is_dir():
        raise CliError(f"{option}: {file} is a directory; give the path of a file")
    blocking = blocking_ancestor(file)
    if blocking is not None:
        raise CliError(f"{option}: {blocking} is not a directory, so {file} cannot be written")
    return file


def choose_world(args: argparse.Namespace, need_bounds: bool = False):
    """The ``World`` of ``--world`` under ``--config`` (the world's own config when none is given), chosen
    once per command; CliError on any problem with the file."""
    from resilibench.core.processes import tool_bases
    from resilibench.core.registry import default_registry
    from resilibench.core.world import get_world

    try:
        world = get_world(args.world).load_config(getattr(args, "config", None))
        config = world.config
        tool_bases(config.processes, config.failure, default_registry())  # tool names known, before any work
    except (OSError, ValueError, TypeError) as exc:
        raise CliError(f"--config: {exc}") from None
    if need_bounds and config.rules.profile != "test":
        raise CliError(f"--config {args.config}: rules.profile must be 'test' here (bounds exist only for the "
                       f"test failure profile), got {config.rules.profile!r}")
    return world


def check_bound_turn_limit(config, tasks) -> None:
    """CliError when bound (iii) is undefined for some of ``tasks`` under ``config``'s turn limit (it needs
    one spare tool per turn: ``core.bounds.largest_turn_limit``)."""
    from resilibench.core.bounds import largest_turn_limit

    if not tasks:
        return
    limit = config.rules.turn_limit
    task = min(tasks, key=largest_turn_limit)
    largest = largest_turn_limit(task)
    if limit > largest:
        raise CliError(f"--config: rules.turn_limit={limit}: bound (iii) needs {limit} spare tools (dependency-free "
                       f"tools a task does not use), task {task.instance_id} has {largest}; the largest turn limit "
                       f"for these tasks is {largest}")


def load_library(path: str | None, world):
    """(all tasks, description of their source with its sha256) for ``--tasks`` or ``world``'s library."""
    from resilibench.core.tasks.library import read_tasks

    if path is None:
        file = world.library_path
        tasks = world.tasks()
    else:
        file = Path(path)
        if not file.is_file():
            raise CliError(f"--tasks: file {path} does not exist (make one with `{PROG} tasks generate`)")
        try:
            tasks = read_tasks(file)
        except (ValueError, OSError, EOFError) as exc:
            raise CliError(f"--tasks: {exc}") from None
    digest = hashlib.sha256(file.read_bytes()).hexdigest()
    source = {"path": f"default ({world.name})" if path is None else str(file), "world": world.name, "sha256": digest,
              "count": len(tasks)}
    return tasks, source


@dataclass(frozen=True)
class ApiChoice:
    """What ``--api`` / ``--api-tasks`` / ``--call-log`` / ``--api-timeout`` chose: the front end's ``RealApi``
    (a tool service URL or a ``LiveApi``, with the client's settings) and the run identity's ``api`` entry."""

    real: Any
    identity: dict[str, Any]

    @property
    def live(self) -> Any:
        """The ``LiveApi`` of ``--api-tasks``, or None."""
        return self.real.live


def load_api(args: argparse.Namespace, simulator_log: bool = False) -> ApiChoice | None:
    """The real-API mode of a command (None: the simulator). ``--api URL`` alone: our tool service, whose
    episodes mirror the world's; with ``--api-tasks FILE``: the live API that file names (its tools from
    the OpenAPI document at URL/openapi.json unless the file names one). CliError naming the option."""
    if args.api is None and args.api_tasks is None:
        for option, value in (("--call-log", args.call_log), ("--api-timeout", args.api_timeout)):
            if value is not None and not (option == "--call-log" and simulator_log):
                raise CliError(f"{option}: for real-API mode only (give --api URL)")
        return None
    from resilibench.envs.real_api.live_apis import RealApi, load_live_api, task_file_path

    if args.api is not None and not args.api.startswith(("http://", "https://")):
        raise CliError(f"--api: expected the http:// or https:// base URL of a tool service, got {args.api!r}")
    log = output_file(args.call_log, "--call-log")
    options: dict[str, Any] = {"timeout": args.api_timeout or 10.0, "log": log}
    url: str | None = args.api
    identity: dict[str, Any] = {"url": url}
    if args.api_tasks is None and url is not None:
        import urllib.request

        try:  # reachable now, rather than a traceback at the first episode
            urllib.request.urlopen(url.rstrip("/") + "/health", timeout=options["timeout"]).close()
        except OSError as exc:
            raise CliError(f"--api: no tool service answers at {args.api} ({exc}); start one with "
                           f"`{PROG} serve-tools`") from None
        return ApiChoice(RealApi(url, options), identity)

    task_file = str(args.api_tasks)
    try:
        live = load_live_api(task_file, base_url=url)
    except InputError as exc:
        raise CliError(f"--api-tasks {task_file}: {exc}") from None
    identity.update({"tasks": live.name, "source": live.source,
                     "tasks_sha256": hashlib.sha256(task_file_path(task_file).read_bytes()).hexdigest()})
    return ApiChoice(RealApi(live, options), identity)


def select_tasks(tasks, split: str | None, task_types: Sequence[str] | None,
                  task_ids: Sequence[str] | None = None, limit: int | None = None):
    """Filter the library; task ids (when given) select tasks regardless of split. ``limit`` keeps the
    first tasks of each task type in turn (one of each type, then a second of each, ...)."""
    if task_ids:
        by_id = {t.instance_id: t for t in tasks}
        missing = [i for i in task_ids if i not in by_id]
        if missing:
            examples = ", ".join(t.instance_id for t in tasks[:3])
            raise CliError(f"--task-id: unknown task id(s) {missing}; ids look like {examples} "
                           f"(list them with `{PROG} tasks list`)")
        selected = [by_id[i] for i in dedupe(task_ids)]
    else:
        selected = [t for t in tasks if split in (None, "all") or t.split == split]
    if task_types:
        selected = [t for t in selected if t.task_type in task_types]
    if limit is not None and limit < len(selected):
        from resilibench.core.tasks.library import interleave_task_types

        selected = interleave_task_types(selected)[:limit]
    if not selected:
        raise CliError("no task matches the selection (--split / --task-type / --task-id)")
    return selected


# --- tools --------------------------------------------------------------------------------------------


def cmd_tools(args: argparse.Namespace) -> int:
    from resilibench.core.registry import default_registry
    from resilibench.results import write_text_atomic

    output_file(args.output)
    registry = default_registry()
    if args.json or args.output:
        text = registry.to_json() + "\n"
        if args.output:
            write_text_atomic(args.output, text)
            print(f"wrote the registry of {len(registry)} tools to {args.output}")
        else:
            sys.stdout.write(text)
        return 0
    rows = [(t.name, t.category, t.role or "-", ", ".join(t.dependencies) or "-") for t in registry.tools]
    print(format_table(("name", "category", "role", "dependencies"), rows))
    return 0


# --- tasks --------------------------------------------------------------------------------------------


def cmd_tasks_generate(args: argparse.Namespace) -> int:
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
    path = write_tasks(tasks, output)
    elapsed = time.perf_counter() - started
    print(f"wrote {len(tasks)} tasks of world {args.world} to {path} (seed {args.seed}, matcher {matcher.name}, "
          f"{elapsed:.1f} s)")
    _print_library_stats(tasks)
    return 0


def _enhance(tasks: list[Any], args: argparse.Namespace) -> list[Any]:
    from resilibench.agents.backends import make_backend
    from resilibench.agents.task_enhancer import TaskEnhancer

    try:
        backend = make_backend(args.enhance)
    except (ValueError, ImportError) as exc:
        raise CliError(f"--enhance: {exc}") from None
    enhancer = TaskEnhancer(backend, attempts=args.enhance_attempts)
    bar = progress_bar(len(tasks), "descriptions")
    out = enhancer.enhance(tasks, batch_size=args.enhance_batch_size, on_batch=bar.update)
    bar.close()
    kept = sum(1 for t in out if not t.metadata.get("llm_generated"))
    print(f"enhanced {len(out) - kept} descriptions through {args.enhance}; {kept} kept their template text "
          "(reasons in each task's metadata.enhancement)", file=sys.stderr)
    return out


def _print_library_stats(tasks: Sequence[Any]) -> None:
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


def cmd_tasks_stats(args: argparse.Namespace) -> int:
    tasks, source = load_library(args.tasks, choose_world(args))
    if args.format == "json":
        from resilibench.core.tasks.library import library_stats

        print(json.dumps({"source": source, **library_stats(tasks)}, indent=2))
        return 0
    print(f"library: {source['path']} ({source['count']} tasks, sha256 {source['sha256'][:12]})")
    _print_library_stats(tasks)
    return 0


def cmd_tasks_show(args: argparse.Namespace) -> int:
    from resilibench.core.bounds import optimal_success, reference_workflow

    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, _ = load_library(args.tasks, choose_world(args))
    (task,) = select_tasks(tasks, None, None, [args.task_id])
    check_bound_turn_limit(config, [task])
    print(json.dumps(task.to_dict(), indent=2, sort_keys=True))
    print()
    print("Reference workflow (the bound-(iii) policy's happy path):")
    print(reference_workflow(task, config).to_plan())
    print()
    print(f"Bound (iii), optimal full-success probability: {optimal_success(task, config):.6f}")
    return 0


def cmd_tasks_list(args: argparse.Namespace) -> int:
    tasks, _ = load_library(args.tasks, choose_world(args))
    selected = select_tasks(tasks, args.split, args.task_type, limit=args.limit)
    rows = [(t.instance_id, t.task_type, t.complexity, t.split, " > ".join(t.required_tools)) for t in selected]
    print(format_table(("instance_id", "task_type", "complexity", "split", "required_tools"), rows))
    return 0


# --- bounds -------------------------------------------------------------------------------------------


def _spread(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"mean": sum(values) / len(values), "min": min(values), "max": max(values)}


def cmd_bounds(args: argparse.Namespace) -> int:
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


# --- run ----------------------------------------------------------------------------------------------


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
class _RunPlan:
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
    """The RunDirectory of a planner run (`run`, `eval-policy`): rows keyed by planner, task and seed."""
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
    plan = _RunPlan(config=config, planners=planners, seeds=seeds, task_types=task_types, tasks=selected, jobs=jobs,
                    run=run_directory(args.output_dir, identity), run_config=run_config, api=api)
    # Without --api the runner writes the simulator's call log; with it, the HTTP client writes its own.
    simulator_log = output_file(args.call_log, "--call-log") if api is None else None
    return _execute_run(plan, resume=args.resume, split=args.split, call_log=simulator_log)


def _execute_run(plan: _RunPlan, resume: bool, split: str, call_log: Path | None = None) -> int:
    """Run the missing episodes of ``plan`` into its directory, then write the summary and the plot;
    ``call_log``: a file that receives one call-log row per call of every episode played (appended)."""
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
            with progress_bar(len(todo), "episodes") as bar:
                run_jobs(todo, plan.config, on_result=lambda row: (run.write(row), bar.update(1)), call_log=call_log,
                         api=plan.api and plan.api.real)
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


# --- parser -------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from resilibench.core.tasks.library import DEFAULT_SEED, TASK_TYPE_NAMES
    from resilibench.core.world import DEFAULT_WORLD, WORLDS
    from resilibench.policies.runner import PLANNER_NAMES

    parser = Parser(prog=PROG, description="ResiliBench: tools, task library, exact bounds, quick benchmark.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)

    tools = commands.add_parser("tools", help="list the 30 tools, or export the registry as JSON")
    tools.add_argument("--json", action="store_true", help="print the registry JSON export")
    tools.add_argument("--output", metavar="FILE", help="write the registry JSON to FILE (implies --json)")
    tools.set_defaults(func=cmd_tools)

    tasks = commands.add_parser("tasks", help="generate, list and show tasks")
    task_commands = tasks.add_subparsers(dest="task_command", metavar="ACTION", required=True,
                                         parser_class=Parser)
    generate = task_commands.add_parser("generate", help="generate the 5,040-task library")
    generate.add_argument("--seed", type=nonnegative_int, default=DEFAULT_SEED, help=f"default {DEFAULT_SEED}")
    generate.add_argument("--matcher", choices=("auto", "semantic", "lexical"), default="auto",
                          help="operation-to-tool matching (auto: semantic when the embed extra is installed)")
    generate.add_argument("--output", default="tasks.jsonl", help="JSONL path, .gz allowed (default tasks.jsonl)")
    generate.add_argument("--world", choices=WORLDS, default=DEFAULT_WORLD,
                          help=f"which world's generator (default {DEFAULT_WORLD})")
    generate.add_argument("--enhance", metavar="BACKEND",
                          help="rewrite descriptions through an LLM backend (hf:PATH, openai:URL?model=M, "
                          "vllm:PATH); answers that name a tool or drop an input or output are retried, then the "
                          "template text is kept with the reason recorded")
    generate.add_argument("--enhance-attempts", type=positive_int, default=3, metavar="N",
                          help="answers asked for per description before the template text is kept (default 3)")
    generate.add_argument("--enhance-batch-size", type=positive_int, default=32, metavar="N",
                          help="descriptions sent to the backend at once (default 32)")
    generate.set_defaults(func=cmd_tasks_generate)

    library = Parser(add_help=False)
    library.add_argument("--tasks", metavar="FILE", help="task library JSONL(.gz) (default: the world's shipped one)")
    library.add_argument("--world", choices=WORLDS, default=DEFAULT_WORLD,
                         help=f"the world: its shipped task library and grading rules (default {DEFAULT_WORLD}; "
                         "v0 reproduces earlier figures)")
    world = Parser(add_help=False)
    world.add_argument("--config", metavar="FILE", help="WorldConfig as YAML or JSON (default: paper values)")
    api = Parser(add_help=False)
    api.add_argument("--api", metavar="URL", help="real-API mode: tool calls go over HTTP to the tool service at URL "
                     "(`resilibench serve-tools`; its episodes mirror the world's), or to the live API of --api-tasks")
    api.add_argument("--api-tasks", metavar="FILE", help="a live API's task file (YAML; docs/envs/real_apis.md), or "
                     "live_example (the shipped set): its tasks over the API's tools (from URL/openapi.json unless "
                     "the file names its OpenAPI document or MCP server)")
    api.add_argument("--call-log", metavar="FILE", help="append one JSON line per HTTP attempt to FILE (`run` without "
                     "--api: per simulated call); the call log that `calibrate-failures` reads")
    api.add_argument("--api-timeout", type=positive_float, metavar="SECONDS",
                     help="seconds an HTTP call may take before it fails with TIMEOUT (default 10)")

    show = task_commands.add_parser("show", parents=[library, world],
                                    help="a task, its reference workflow and its bound (iii)")
    show.add_argument("task_id", metavar="ID")
    show.set_defaults(func=cmd_tasks_show)

    stats = task_commands.add_parser("stats", parents=[library],
                                     help="what a library holds: counts, distinct tool lists, tools' use, leaks")
    stats.add_argument("--format", choices=("table", "json"), default="table")
    stats.set_defaults(func=cmd_tasks_stats)

    listing = task_commands.add_parser("list", parents=[library], help="list tasks")
    listing.add_argument("--split", choices=SPLIT_CHOICES, default="all")
    listing.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE",
                         help=f"repeatable; one of {', '.join(TASK_TYPE_NAMES)}")
    listing.add_argument("--limit", type=positive_int)
    listing.set_defaults(func=cmd_tasks_list)

    bounds = commands.add_parser("bounds", parents=[library, world], help="exact bound (iii), optional bound (ii)")
    bounds.add_argument("--split", choices=SPLIT_CHOICES, default=None,
                        help="default test (all when --task-id is given)")
    bounds.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE",
                        help=f"repeatable; one of {', '.join(TASK_TYPE_NAMES)}")
    bounds.add_argument("--task-id", action="append", metavar="ID", help="repeatable; selects tasks of any split")
    bounds.add_argument("--clairvoyant-seeds", type=nonnegative_int, default=0, metavar="N",
                        help="also compute bound (ii) averaged over run seeds 0..N-1, on the random streams "
                        "`resilibench run` episodes meet (default 0: skip)")
    bounds.add_argument("--format", choices=("table", "json"), default="table")
    bounds.add_argument("--output", metavar="FILE", help="also write the JSON results (with metadata) to FILE")
    bounds.set_defaults(func=cmd_bounds)

    run = commands.add_parser("run", parents=[library, world, api], help="the quick planner benchmark")
    run.add_argument("--planners", nargs="+", choices=PLANNER_NAMES, default=list(PLANNER_NAMES), metavar="NAME",
                     help=f"default all: {' '.join(PLANNER_NAMES)}")
    run.add_argument("--split", choices=SPLIT_CHOICES, default="test")
    run.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE",
                     help=f"repeatable (default all); one of {', '.join(TASK_TYPE_NAMES)}")
    run.add_argument("--seeds", nargs="+", type=nonnegative_int, default=[0, 1, 2], metavar="N")
    run.add_argument("--limit", type=positive_int, help="use only the first N selected tasks")
    run.add_argument("--output-dir", default="runs/quick", metavar="DIR", help="default runs/quick")
    run.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                     help="skip episodes already in DIR/results.jsonl (default); --no-resume starts afresh")
    run.set_defaults(func=cmd_run)

    for module in COMMAND_MODULES:
        importlib.import_module(module).add_commands(commands, {"library": library, "world": world, "api": api})
    return parser


def option_name(field: str) -> str:
    """The command-line option of a library field: ``output_dir`` -> ``--output-dir`` (dotted settings fields,
    such as ``rules.turn_limit``, are kept as they are)."""
    return field if "." in field or not field.isidentifier() else "--" + field.replace("_", "-")


def error_text(exc: Exception) -> str:
    """An exception as one line in the CLI's words: a library ``InputError`` names its field's option
    (unless its message already starts with the field, as a settings ``ConfigError``'s does)."""
    if not isinstance(exc, InputError) or exc.message.startswith(exc.field):
        return str(exc)
    return f"{option_name(exc.field)}: {exc.message}"


def _print_warning(message: Warning | str, *_: Any, **__: Any) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status. Warnings are printed as one line each."""
    with warnings.catch_warnings():
        warnings.showwarning = _print_warning
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except InputError as exc:  # the library's own: its field becomes the option's name
        print(f"{PROG}: error: {error_text(exc)}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:  # the run directory is resumable
        print(f"\n{PROG}: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `resilibench tasks list | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except OSError as exc:  # the system refused a read or write: a full disk, a read-only directory...
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
