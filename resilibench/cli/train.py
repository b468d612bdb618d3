"""`train ppo`, `train grpo` and `eval-policy`: RLlib PPO planners and GRPO-trained LLM agents, measured
against bound (iii).

`train grpo` trains an LLM agent with TRL's GRPO inside the text env (native tool calls, LoRA) and
evaluates it on held-out tasks before and after; its options are the fields of
``resilibench.robust_train.grpo.GRPOSettings`` (help text included).

`train ppo` writes checkpoints, a progress log and its config into --output-dir and resumes from the last
checkpoint with --resume. `eval-policy` plays a trained policy greedily with the episodes and seeds of
`resilibench run` and writes the same results files (results.jsonl, summary.json, summary.png), so PPO
sits in the same table as every other planner; --export-workflows adds its happy-path workflows beside
the reference workflows, with its exact success.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from resilibench.cli import (
    SPLIT_CHOICES,
    CliError,
    Parser,
    _execute_run,
    _RunPlan,
    check_bound_turn_limit,
    choose_world,
    dedupe,
    load_library,
    nonnegative_int,
    positive_int,
    run_directory,
    select_tasks,
)
from resilibench.cli.options import add_options, option_values
from resilibench.console import format_table, progress_bar
from resilibench.errors import ConfigError, InputError
from resilibench.rundir import check_directory

# PPOTrainConfig fields that `train ppo` has options for (built from the fields); --set reaches the others.
TRAIN_OPTIONS = ("task_types", "split", "reward", "curriculum", "encoder", "features", "iterations", "time_budget_min",
                 "num_env_runners", "num_envs_per_env_runner", "num_learners", "num_gpus_per_learner", "seed",
                 "checkpoint_every")
DEFAULT_TIME_BUDGET_MIN = 20.0  # when neither --iterations nor --time-budget is given


def _assignment(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    try:
        return key, json.loads(value)
    except ValueError:
        return key, value  # a bare string


# --- train ppo -----------------------------------------------------------------------------------------


def _train_config(args: argparse.Namespace):
    """The PPOTrainConfig of the command line (defaults from the dataclass, then flags, then --set)."""
    from resilibench.policies.ppo.training import PPOTrainConfig

    fields = {f.name for f in dataclasses.fields(PPOTrainConfig)}
    values: dict[str, Any] = {}
    for key, value in args.set or []:
        if key not in fields:
            raise CliError(f"--set {key}: unknown hyperparameter; accepted: {', '.join(sorted(fields))}")
        values[key] = value
    flags = option_values(args, PPOTrainConfig, TRAIN_OPTIONS)
    if args.tasks is not None:
        flags["tasks_path"] = args.tasks
    values.update(flags)
    if values.get("iterations") is None and values.get("time_budget_min") is None:
        values["time_budget_min"] = DEFAULT_TIME_BUDGET_MIN
    from resilibench.core.world import DEFAULT_WORLD

    world = choose_world(args)
    if args.config or world.name != DEFAULT_WORLD:
        values["world"] = world.config.to_dict()
    if args.tasks is None and world.name != DEFAULT_WORLD:  # that world's shipped library
        values["tasks_path"] = str(world.library_path)
    if args.tasks is not None and not Path(args.tasks).is_file():
        raise CliError(f"--tasks: {args.tasks} does not exist (generate one with `resilibench tasks generate`)")
    try:
        return PPOTrainConfig(**values)
    except ConfigError as exc:
        raise CliError(f"train ppo: {exc}") from None


def _held_run(output_dir: str, marker: str, resume: bool) -> tuple[Path, bool]:
    """A training run's --output-dir and whether it holds a run (``marker`` exists there); a held run
    without --resume is refused."""
    directory = check_directory(output_dir)
    held = (directory / marker).exists()
    if held and not resume:
        raise CliError(f"--output-dir {directory} already holds a training run: add --resume to continue it, "
                       "or use another --output-dir")
    if resume and not held:
        print(f"nothing to resume in {directory}; starting a new run", file=sys.stderr)
    return directory, held


def cmd_train_ppo(args: argparse.Namespace) -> int:
    cfg = _train_config(args)
    from resilibench.policies.ppo.training import TRAINING_FILE, train

    directory, held = _held_run(args.output_dir, TRAINING_FILE, args.resume)
    try:
        row = train(cfg, directory, resume=held, address=args.address, log=lambda line: print(line, flush=True))
    except InputError:
        raise
    except ValueError as exc:
        raise CliError(f"train ppo: {exc}") from None
    print(f"trained to iteration {row.get('iteration')} ({row.get('env_steps', 0):,} env steps, "
          f"{row.get('train_seconds', 0) / 60:.1f} min); checkpoint {row['checkpoint']}", file=sys.stderr)
    print(f"evaluate it with: resilibench eval-policy {directory} --split test", file=sys.stderr)
    return 0


# --- train grpo ----------------------------------------------------------------------------------------

# GRPOSettings fields with `train grpo` options (built from the fields); --lora-r sets the adapter.
GRPO_OPTIONS = ("model", "world", "split", "eval_split", "task_types", "train_tasks", "eval_tasks", "seeds",
                "eval_seeds", "max_steps", "time_budget_min", "num_generations", "batch_size",
                "gradient_accumulation_steps", "learning_rate", "beta", "temperature", "max_completion_length",
                "tools", "search_k", "progress_weight", "chat_template", "use_vllm", "vllm_mode",
                "save_steps", "logging_steps", "seed", "torch_threads")


def _grpo_settings(args: argparse.Namespace):
    """The GRPOSettings of the command line (dataclass defaults, then the options given)."""
    from resilibench.robust_train.grpo import GRPOSettings
    from resilibench.robust_train.training import LoraSettings

    values = option_values(args, GRPOSettings, GRPO_OPTIONS)
    if args.lora_r is not None:
        values["lora"] = None if args.lora_r == 0 else LoraSettings(r=args.lora_r, alpha=2 * args.lora_r)
    return GRPOSettings(**values)


def cmd_train_grpo(args: argparse.Namespace) -> int:
    settings = _grpo_settings(args)
    from resilibench.robust_train.grpo import train_grpo
    from resilibench.robust_train.training import RUN_FILE

    directory, held = _held_run(args.output_dir, RUN_FILE, args.resume)
    try:
        summary = train_grpo(settings, directory, resume=held, log=lambda line: print(line, flush=True))
    except InputError:
        raise
    except ValueError as exc:
        raise CliError(f"train grpo: {exc}") from None
    rows = [(name, s["rollouts"], s["success"], s["bound_iii"], s["success_over_bound_iii"])
            for name, s in ((k, summary.get(k)) for k in ("no_tool_agent", "before", "after")) if s]
    if rows:
        print(format_table(("agent", "rollouts", "full success", "bound_iii", "success/iii"), rows))
    print(f"wrote {directory / 'summary.json'}", file=sys.stderr)
    return 0


def _add_grpo(algorithms: Any) -> None:
    """`train grpo`: one flag per GRPOSettings field, its help from the field."""
    from resilibench.robust_train.grpo import GRPOSettings

    grpo = algorithms.add_parser(
        "grpo", help="train an LLM agent with GRPO in the text env (TRL, LoRA; native tool calls)",
        description="Train an LLM agent with TRL's GRPO inside the text env, then evaluate it on held-out "
        "tasks before and after, beside bound (iii). See docs/robust_train/grpo.md.")
    add_options(grpo, GRPOSettings, GRPO_OPTIONS)
    grpo.add_argument("--lora-r", type=nonnegative_int, metavar="R",
                      help="LoRA rank, alpha 2R (default 16, alpha 32); 0 trains every weight")
    grpo.add_argument("--output-dir", default="runs/grpo", metavar="DIR", help="default runs/grpo")
    grpo.add_argument("--resume", action="store_true",
                      help="continue the run in DIR from its last checkpoint (refused if the settings changed)")
    grpo.set_defaults(func=cmd_train_grpo)


# --- eval-policy ---------------------------------------------------------------------------------------


def cmd_eval_policy(args: argparse.Namespace) -> int:
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.policies.runner import episode_jobs

    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, source = load_library(args.tasks, world)
    from resilibench.policies.ppo.evaluation import PPOPlanner, checkpoint_digest, registered_planner

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
    plan = _RunPlan(
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
        status = _execute_run(plan, resume=args.resume, split=args.split)
    if status == 0 and args.export_workflows:
        _export_workflows(planner, selected, config, Path(args.export_workflows), plan.run_config, seeds)
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


# --- parser -------------------------------------------------------------------------------------------


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add `train ppo` and `eval-policy` to the ``resilibench`` parser."""
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.policies.ppo.training import PPOTrainConfig

    type_help = f"repeatable (default all); one of {', '.join(TASK_TYPE_NAMES)}"
    train = commands.add_parser("train", help="train planners (RLlib PPO) and LLM agents (TRL GRPO)")
    algorithms = train.add_subparsers(dest="train_command", metavar="ALGO", required=True, parser_class=Parser)
    ppo = algorithms.add_parser(
        "ppo", parents=[parents["library"], parents["world"]],
        help="train a PPO planner on ResiliBench-v1 (local Ray by default, --address for a cluster)",
        description=f"Without --iterations or --time-budget, training stops after {DEFAULT_TIME_BUDGET_MIN:g} minutes.")
    add_options(ppo, PPOTrainConfig, TRAIN_OPTIONS)
    ppo.add_argument("--address", metavar="ADDR", help="Ray cluster to join (e.g. auto); default: start local Ray")
    ppo.add_argument("--output-dir", default="runs/ppo", metavar="DIR", help="default runs/ppo")
    ppo.add_argument("--resume", action="store_true", help="continue the run in DIR from its last checkpoint")
    ppo.add_argument("--set", action="append", type=_assignment, metavar="KEY=VALUE",
                     help="any other hyperparameter of PPOTrainConfig, value as JSON (e.g. --set lr=0.001)")
    ppo.set_defaults(func=cmd_train_ppo)
    _add_grpo(algorithms)

    evaluate = commands.add_parser(
        "eval-policy", parents=[parents["library"], parents["world"]],
        help="play a trained PPO policy greedily, as `run` plays planners (same files, same seeds)")
    evaluate.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint, or a `train ppo` output directory")
    evaluate.add_argument("--split", choices=SPLIT_CHOICES, default="test")
    evaluate.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE", help=type_help)
    evaluate.add_argument("--seeds", nargs="+", type=nonnegative_int, default=[0, 1, 2], metavar="N")
    evaluate.add_argument("--limit", type=positive_int, help="use only the first N selected tasks")
    evaluate.add_argument("--output-dir", default="runs/eval-ppo", metavar="DIR", help="default runs/eval-ppo")
    evaluate.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                          help="skip episodes already in DIR/results.jsonl (default); --no-resume starts afresh")
    evaluate.add_argument("--export-workflows", metavar="FILE",
                          help="also write each task's happy-path workflow, whether it equals the reference "
                          "workflow, and the policy's exact success beside bound (iii), as JSON")
    evaluate.set_defaults(func=cmd_eval_policy)
