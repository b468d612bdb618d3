"""`train ppo` and `train grpo`: RLlib PPO planners and GRPO-trained LLM agents, measured against bound (iii).

`train ppo` writes checkpoints, a progress log and its config into --output-dir and resumes from the last
checkpoint with --resume; `eval policy` then plays the policy as `run` plays planners. `train grpo` trains
an LLM agent with TRL's GRPO inside the text env (native tool calls, LoRA) and evaluates it on held-out
tasks before and after; its options are the fields of ``resilibench.robust_train.grpo.GRPOSettings``
(help text included).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from resilibench.cli.common import (
    CliError,
    add_config_option,
    add_group,
    add_library_options,
    add_output_dir_option,
    choose_world,
    nonnegative_int,
)
from resilibench.cli.options import add_options, option_values
from resilibench.console import format_table
from resilibench.errors import ConfigError, InputError
from resilibench.rundir import check_directory

# PPOTrainConfig fields that `train ppo` has options for (built from the fields); --set reaches the others.
TRAIN_OPTIONS = ("task_types", "split", "reward", "curriculum", "encoder", "features", "warm_start", "iterations",
                 "time_budget_min",
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
          f"{row.get('train_seconds', 0) / 60:.1f} min of training, {row.get('validation_seconds', 0) / 60:.1f} min of "
          f"validation); checkpoint {row['checkpoint']}", file=sys.stderr)
    print(f"evaluate it with: resilibench eval policy {directory} --split test", file=sys.stderr)
    return 0


# --- train grpo ----------------------------------------------------------------------------------------

# GRPOSettings fields with `train grpo` options (built from the fields); --lora-r and --lora-dropout set the
# adapter.
GRPO_OPTIONS = ("model", "world", "split", "eval_split", "task_types", "train_tasks", "eval_tasks", "seeds",
                "eval_seeds", "max_steps", "time_budget_min", "num_generations", "batch_size",
                "gradient_accumulation_steps", "eval_batch_size", "activation_checkpointing", "learning_rate", "beta",
                "temperature", "max_completion_length", "tools", "search_k", "progress_weight", "chat_template",
                "use_vllm", "vllm_mode", "warm_start", "expert", "sft_task_types", "sft_tasks", "sft_epochs",
                "sft_learning_rate", "sft_batch_size", "save_steps", "logging_steps", "seed", "torch_threads")


def _grpo_settings(args: argparse.Namespace):
    """The GRPOSettings of the command line (dataclass defaults, then the options given)."""
    from resilibench.robust_train.grpo import GRPOSettings
    from resilibench.robust_train.training import LoraSettings

    values = option_values(args, GRPOSettings, GRPO_OPTIONS)
    dropout = option_values(args, LoraSettings, ("dropout",))
    if args.lora_r == 0:
        if dropout:
            raise CliError("--lora-dropout: --lora-r 0 trains every weight, without an adapter")
        values["lora"] = None
    elif args.lora_r is not None or dropout:
        r = args.lora_r or LoraSettings().r
        values["lora"] = LoraSettings(r=r, alpha=2 * r, **dropout)
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
    warm = summary.get("warm_start") is not None
    agents = {"no_tool_agent": summary.get("no_tool_agent"), **summary.get("scripted", {}), "base": summary.get("base"),
              "sft" if warm else "before": summary.get("before"), "sft+grpo" if warm else "after": summary.get("after")}
    rows = [(name, s["rollouts"], s["success"], "{:.3f}-{:.3f}".format(*s["success_ci95"]), s["bound_iii"],
             s["success_over_bound_iii"]) for name, s in agents.items() if s]
    if rows:
        print(format_table(("agent", "rollouts", "full success", "95% interval", "bound_iii", "success/iii"), rows))
    if summary.get("nonzero_advantage_groups") is not None:
        print(f"GRPO groups with non-zero advantages: {summary['nonzero_advantage_groups']:.3f}")
    print(f"wrote {directory / 'summary.json'}", file=sys.stderr)
    return 0


# --- parser ---------------------------------------------------------------------------------------------------


def _ppo_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.policies.ppo.training import PPOTrainConfig

    add_library_options(parser)
    add_config_option(parser)
    add_options(parser, PPOTrainConfig, TRAIN_OPTIONS)
    parser.add_argument("--address", metavar="ADDR", help="Ray cluster to join (e.g. auto); default: start local Ray")
    add_output_dir_option(parser, "runs/ppo")
    parser.add_argument("--resume", action="store_true", help="continue the run in DIR from its last checkpoint")
    parser.add_argument("--set", action="append", type=_assignment, metavar="KEY=VALUE",
                        help="any other hyperparameter of PPOTrainConfig, value as JSON (e.g. --set lr=0.001)")
    parser.set_defaults(func=cmd_train_ppo)


def _grpo_arguments(parser: argparse.ArgumentParser) -> None:
    """One option per GRPOSettings field, its help from the field."""
    from resilibench.robust_train.grpo import GRPOSettings
    from resilibench.robust_train.training import LoraSettings

    add_options(parser, GRPOSettings, GRPO_OPTIONS)
    parser.add_argument("--lora-r", type=nonnegative_int, metavar="R",
                        help="LoRA rank, alpha 2R (default 16, alpha 32); 0 trains every weight")
    add_options(parser, LoraSettings, ("dropout",))
    add_output_dir_option(parser, "runs/grpo")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in DIR from its last checkpoint (refused if the settings changed)")
    parser.set_defaults(func=cmd_train_grpo)


def add_commands(commands: Any) -> None:
    """Add ``train ppo|grpo`` to the ``resilibench`` parser."""
    add_group(commands, "train", "train planners (RLlib PPO) and LLM agents (TRL GRPO)", {
        "ppo": ("train a PPO planner (local Ray by default, --address for a cluster)", _ppo_arguments,
                f"Without --iterations or --time-budget, training stops after {DEFAULT_TIME_BUDGET_MIN:g} minutes. "
                "See docs/policies/ppo.md."),
        "grpo": ("train an LLM agent with GRPO in the text env (TRL, LoRA; native tool calls)", _grpo_arguments,
                 "Train an LLM agent with TRL's GRPO inside the text env, then evaluate it on held-out tasks before "
                 "and after, beside bound (iii). See docs/robust_train/grpo.md."),
    }, metavar="ALGO")
