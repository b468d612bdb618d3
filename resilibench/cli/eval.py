"""`eval agent` and `eval policy`: LLM agents (or the scripted references) in the text env, and trained PPO
policies in the planner env.

    resilibench eval agent --agent hf:PATH --prompts baseline optimal flawed --limit 10 --seeds 0 1 2
    resilibench eval policy runs/ppo --split test

`eval agent` writes ``DIR/results.jsonl`` (one row per episode, appended as episodes end), ``DIR/summary.json``
(every table of ``agents.report`` with the run's metadata, over all episodes in the directory) and
``DIR/summary.png``, and prints the tables. `eval policy` plays a trained policy greedily with the
episodes and seeds of `resilibench run` and writes the same files as `run`, so PPO sits in the same
table as every other planner; --export-workflows adds its happy-path workflows beside the reference
workflows, with its exact success. A rerun of the same command resumes; results produced under another
world config, task library, evaluation settings or policy are never mixed in.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from resilibench.cli.common import (
    SPLIT_CHOICES,
    CliError,
    add_api_options,
    add_config_option,
    add_group,
    add_library_options,
    add_output_dir_option,
    add_resume_option,
    add_seeds_option,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    dedupe,
    fraction,
    load_agent,
    load_api,
    load_library,
    output_file,
    positive_int,
    select_tasks,
)
from resilibench.cli.options import add_options, option_values
from resilibench.cli.run import RunPlan, add_selection_options, execute_run, run_directory
from resilibench.console import format_table, progress_bar

# Settings fields with `eval agent` options (built from the fields: resilibench.cli.options).
GENERATION_OPTIONS = ("max_new_tokens", "temperature", "seed")
REQUEST_OPTIONS = ("timeout", "max_retries", "max_concurrency")
EVAL_GENERATION: dict[str, Any] = {"seed": 0}  # eval samples reproducibly unless --generation-seed says otherwise


# --- eval agent -----------------------------------------------------------------------------------------------


def _check_agent(spec: str) -> None:
    """Check ``--agent`` before any work: the spec's form and options, the directory of ``hf:`` / ``ppo:``."""
    from resilibench.agents.specs import AGENT_SPECS, check_agent_spec

    try:
        check_agent_spec(spec)
    except (ValueError, OSError) as exc:
        raise CliError(f"--agent {spec}: {exc} (forms: {AGENT_SPECS})") from None


def cmd_eval_agent(args: argparse.Namespace) -> int:
    from resilibench.agents.backends import RequestSettings
    from resilibench.agents.harness import eval_directory, eval_jobs, run_eval, settled_rows
    from resilibench.agents.report import format_tables, plot_summary, summarize_eval
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.core.text.flaws import FLAW_TYPES
    from resilibench.core.text.prompts import PROMPT_VARIANTS, PromptSettings
    from resilibench.llm import BackendError, GenerationConfig
    from resilibench.results import run_metadata, to_jsonable

    _check_agent(args.agent)
    # The text env's world: the config's rules with strict dependencies (the text protocol's rule).
    world = choose_world(args, need_bounds=True).with_rules(strict_dependencies=True)
    config = world.config
    api = load_api(args)
    if api is not None and api.live is not None:  # a live API's own tasks, graded with its task types
        if args.tasks is not None:
            raise CliError("--tasks: not with --api-tasks (the task file holds the tasks)")
        tasks, source = list(api.live.tasks), {"path": args.api_tasks, "sha256": api.identity["tasks_sha256"],
                                                "count": len(api.live.tasks)}
        config = api.live.world_config(config)
        task_types = dedupe(args.task_type) if args.task_type else sorted({t.task_type for t in tasks})
    else:
        tasks, source = load_library(args.tasks, world)
        task_types = dedupe(args.task_type) if args.task_type else list(TASK_TYPE_NAMES)
    prompts, seeds = dedupe(args.prompts or PROMPT_VARIANTS), dedupe(args.seeds)
    flaw_types = dedupe(args.flaw_types or FLAW_TYPES) if "flawed" in prompts else []
    selected = select_tasks(tasks, args.split, task_types, args.task_id, limit=args.limit)
    if api is None or api.live is None:
        check_bound_turn_limit(config, selected)
    try:
        jobs = eval_jobs(selected, prompts, seeds, flaw_types, config=config)
    except ValueError as exc:
        raise CliError(f"--prompts/--flaw-types: {exc}") from None
    generation = GenerationConfig(**{**EVAL_GENERATION, **option_values(args, GenerationConfig, GENERATION_OPTIONS)})
    requests = RequestSettings(**option_values(args, RequestSettings, REQUEST_OPTIONS))
    settings = to_jsonable({"severity": args.severity, "plan_style": "numbered", "protocol": args.protocol,
                            "wording": args.wording,
                            "generation": {"max_new_tokens": generation.max_new_tokens,
                                           "temperature": generation.temperature, "seed": generation.seed}})
    run_config = {"world": config.to_dict(), "tasks": source, "agent": args.agent, "eval": settings,
                  "prompts": prompts, "flaw_types": flaw_types, "split": args.split, "task_types": task_types,
                  "task_ids": args.task_id, "limit": args.limit, "task_count": len(selected), "episodes": len(jobs)}
    identity = to_jsonable({"world": config.to_dict(), "tasks_sha256": source["sha256"], "eval": settings})
    # The API target (None: the simulator; a run config recorded without one reads as None) is part of
    # the run: resuming against another target is refused.
    identity["api"] = run_config["api"] = None if api is None else api.identity

    run = eval_directory(args.output_dir, identity)
    plot_path = run.path / "summary.png"
    with run.session(args.resume):
        agent = load_agent(args.agent, "--agent", generation, args.batch_size, requests)
        conditions = len([p for p in prompts if p != "flawed"]) + len(flaw_types)
        print(f"{len(jobs)} episodes ({len(selected)} tasks x {len(seeds)} seeds x up to {conditions} prompt "
              f"conditions: flaws that do not apply to a task's plan are left out) for {agent.name} into "
              f"{run.results_path}", file=sys.stderr)
        try:
            prompt = PromptSettings(severity=args.severity, protocol=args.protocol, wording=args.wording)
            run_eval(agent, jobs, env={"config": config, "prompt": prompt, "api": api and api.real},
                     batch_size=args.batch_size, output_dir=run, keep_messages=args.keep_messages,
                     metadata=run_metadata(run_config, seeds), retry_infra_errors=args.retry_infra_errors)
        except BackendError as exc:
            raise CliError(f"--agent {args.agent}: {exc}; finished episodes are saved in {run.results_path}: "
                           "rerun the same command to resume") from None

        # Every episode in the directory (all models), each key once (a retried infrastructure error replaced).
        rows = list(settled_rows([*run.existing.rows, *run.new_rows]).values())
        summary = {"metadata": run_metadata(run_config, seeds),
                   "files": {"results": run.results_path.name, "plot": plot_path.name},
                   **summarize_eval(rows, registry=api.live.registry if api is not None and api.live else None)}
        run.write_summary(summary)
        plot_summary(rows, plot_path, title=f"Full success in the text env ({len(rows)} episodes)")
    print(format_tables(summary))
    print(f"wrote {run.results_path}, {run.summary_path} and {plot_path}", file=sys.stderr)
    return 0


# --- eval policy ----------------------------------------------------------------------------------------------


def cmd_eval_policy(args: argparse.Namespace) -> int:
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.policies.ppo.evaluation import PPOPlanner, checkpoint_digest, registered_planner
    from resilibench.policies.runner import episode_jobs

    export = output_file(args.export_workflows, "--export-workflows")
    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, source = load_library(args.tasks, world)

    try:
        planner = PPOPlanner(args.checkpoint)
    except (ValueError, OSError) as exc:
        raise CliError(f"CHECKPOINT: {exc}") from None
    seeds = dedupe(args.seeds)
    task_types = dedupe(args.task_type) if args.task_type else list(TASK_TYPE_NAMES)
    selected = select_tasks(tasks, args.split, task_types, limit=args.limit)
    check_bound_turn_limit(config, selected)
    digest = checkpoint_digest(planner.checkpoint)
    planners = [planner.name]
    plan = RunPlan(
        config=config, planners=planners, seeds=seeds, task_types=task_types, tasks=selected,
        jobs=episode_jobs(planners, selected, seeds),
        run=run_directory(args.output_dir, {"world": config.to_dict(), "tasks_sha256": source["sha256"],
                                            "policy_sha256": digest}),
        run_config={"world": config.to_dict(), "tasks": source, "planners": planners, "split": args.split,
                    "task_types": task_types, "limit": args.limit, "task_count": len(selected),
                    "episodes": len(selected) * len(seeds), "policy_sha256": digest,
                    "policy": {"checkpoint": str(planner.checkpoint), "sha256": digest}},
    )
    with registered_planner(planner):
        status = execute_run(plan, resume=args.resume, split=args.split)
    if status == 0 and export is not None:
        _export_workflows(planner, selected, config, export, plan.run_config, seeds)
    return status


def _export_workflows(planner, tasks, config, path: Path, run_config: dict[str, Any], seeds) -> None:
    from resilibench.policies.ppo.evaluation import compare_workflows
    from resilibench.results import run_metadata, write_json_atomic

    with progress_bar(len(tasks), "workflows") as bar:
        comparison = compare_workflows(planner, tasks, config, on_task=lambda: bar.update(1))
    write_json_atomic(path, {"metadata": run_metadata(run_config, seeds), **comparison})
    rows = [(name, s["tasks"], s["match_rate"], s["bound_iii"], s["policy_success"], s["policy_over_bound_iii"])
            for name, s in comparison["summary"].items()]
    print(format_table(("task_type", "tasks", "workflow = reference", "bound_iii", "ppo exact", "exact/iii"), rows))
    print(f"wrote {path}", file=sys.stderr)




# --- parser ---------------------------------------------------------------------------------------------------


def _agent_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.agents.backends import RequestSettings
    from resilibench.agents.specs import AGENT_SPECS
    from resilibench.core.text.toolbox import PROTOCOLS, WORDINGS
    from resilibench.llm import GenerationConfig

    parser.add_argument("--agent", required=True, metavar="SPEC", help=f"one of {AGENT_SPECS}")
    add_library_options(parser)
    add_config_option(parser)
    add_api_options(parser)
    # Prompt variants and flaw types are checked when the command runs (``eval_jobs``), naming the option.
    parser.add_argument("--prompts", nargs="+", metavar="P",
                        help="prompt variants: baseline, cot, optimal, flawed (default all)")
    parser.add_argument("--flaw-types", nargs="+", metavar="F",
                        help="flaw types of the flawed variant (default all seven: `core.text.flaws.FLAW_TYPES`)")
    parser.add_argument("--severity", type=fraction(include_one=True), default=0.5, metavar="X",
                        help="flaw severity in (0, 1]: share of the eligible plan steps changed (default 0.5)")
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="test", help="default test")
    add_task_type_option(parser)
    parser.add_argument("--task-id", action="append", metavar="ID", help="repeatable; selects tasks of any split")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N selected tasks (task types in turn)")
    add_seeds_option(parser)
    parser.add_argument("--protocol", choices=PROTOCOLS, default="tags",
                        help="how the agent uses tools: tags in its text (the paper's, default) or native tool calls")
    parser.add_argument("--wording", choices=WORDINGS, default="plain",
                        help="the tag protocol's prompt wording: plain (no live example tag, default) or the paper's")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="episodes played at once: one batched agent call per round (default 32; 1 lets a "
                        "llama.cpp server reuse the shared prompt prefix)")
    add_options(parser, GenerationConfig, GENERATION_OPTIONS, defaults=GenerationConfig(**EVAL_GENERATION))
    add_options(parser, RequestSettings, REQUEST_OPTIONS)
    parser.add_argument("--retry-infra-errors", action="store_true",
                        help="play again the episodes stored as infrastructure errors (by default a resumed run "
                        "keeps them as finished)")
    parser.add_argument("--keep-messages", action="store_true", help="store each episode's conversation in its row")
    add_output_dir_option(parser, "runs/eval")
    add_resume_option(parser)
    parser.set_defaults(func=cmd_eval_agent)


def _policy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint, or a `train ppo` output directory")
    add_selection_options(parser)
    add_output_dir_option(parser, "runs/eval-ppo")
    add_resume_option(parser)
    parser.add_argument("--export-workflows", metavar="FILE",
                        help="also write each task's happy-path workflow, whether it equals the reference "
                        "workflow, and the policy's exact success beside bound (iii), as JSON")
    parser.set_defaults(func=cmd_eval_policy)


def add_commands(commands: Any) -> None:
    """Add ``eval agent|policy`` to the ``resilibench`` parser."""
    add_group(commands, "eval", "evaluate an LLM agent in the text env, or a trained policy as `run` does", {
        "agent": ("an LLM agent (or a scripted reference) in the text env", _agent_arguments),
        "policy": ("a trained PPO policy, played greedily as `run` plays planners", _policy_arguments),
    })
