"""`eval`: LLM agents (or the scripted references) in the text env, through the batched harness.

    resilibench eval --agent hf:PATH --prompts baseline optimal flawed --limit 10 --seeds 0 1 2

writes ``DIR/results.jsonl`` (one row per episode, appended as episodes end), ``DIR/summary.json``
(every table of ``agents.report`` with the run's metadata, over all episodes in the directory) and
``DIR/summary.png``, and prints the tables. A rerun of the same command resumes; results produced
under another world config, task library or evaluation settings are never mixed in.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from resilibench.cli import (
    SPLIT_CHOICES,
    CliError,
    check_bound_turn_limit,
    choose_world,
    dedupe,
    load_api,
    load_library,
    nonnegative_int,
    positive_int,
    select_tasks,
)
from resilibench.cli.options import add_options, option_values
from resilibench.core.text.prompts import PromptSettings

# Settings fields with `eval` options (built from the fields: resilibench.cli.options).
GENERATION_OPTIONS = ("max_new_tokens", "temperature", "seed")
REQUEST_OPTIONS = ("timeout", "max_retries", "max_concurrency")
EVAL_GENERATION: dict[str, Any] = {"seed": 0}  # eval samples reproducibly unless --generation-seed says otherwise


def flaw_severity(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def check_agent(spec: str) -> None:
    """Check ``--agent`` before any work: the spec's form and options, the directory of ``hf:`` / ``ppo:``."""
    from resilibench.agents.specs import AGENT_SPECS, check_agent_spec

    try:
        check_agent_spec(spec)
    except (ValueError, OSError) as exc:
        raise CliError(f"--agent {spec}: {exc} (forms: {AGENT_SPECS})") from None


def make_agent(spec: str, generation: Any, batch_size: int, requests: Any = None):
    """The agent of ``--agent`` (``agents.scripted.make_text_agent``)."""
    from resilibench.agents.specs import make_text_agent
    from resilibench.llm import BackendError

    try:
        return make_text_agent(spec, generation, batch_size, requests)
    except (ValueError, TypeError, OSError, ImportError, BackendError) as exc:
        raise CliError(f"--agent {spec}: {exc}") from None


def cmd_eval(args: argparse.Namespace) -> int:
    from resilibench.agents.backends import RequestSettings
    from resilibench.agents.harness import eval_directory, eval_jobs, run_eval, settled_rows
    from resilibench.agents.report import format_tables, plot_summary, summarize_eval
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.core.text.flaws import FLAW_TYPES
    from resilibench.core.text.prompts import PROMPT_VARIANTS
    from resilibench.llm import BackendError, GenerationConfig
    from resilibench.results import run_metadata, to_jsonable

    check_agent(args.agent)
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
        agent = make_agent(args.agent, generation, args.batch_size, requests)
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
                   "files": {"results": run.results_path.name, "plot": plot_path.name}, **summarize_eval(rows)}
        run.write_summary(summary)
        plot_summary(rows, plot_path, title=f"Full success in the text env ({len(rows)} episodes)")
    print(format_tables(summary))
    print(f"wrote {run.results_path}, {run.summary_path} and {plot_path}", file=sys.stderr)
    return 0


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``eval`` to the ``resilibench`` parser."""
    from resilibench.agents.backends import RequestSettings
    from resilibench.agents.specs import AGENT_SPECS
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.core.text.toolbox import PROTOCOLS, WORDINGS
    from resilibench.llm import GenerationConfig

    # Prompt variants and flaw types are checked when the command runs (``eval_jobs``), so building the
    # parser imports nothing from the prompt modules.
    ev = commands.add_parser("eval", parents=[parents["library"], parents["world"], parents["api"]],
                             help="evaluate an LLM agent (or a scripted reference) in the text env")
    ev.add_argument("--agent", required=True, metavar="SPEC", help=f"one of {AGENT_SPECS}")
    ev.add_argument("--prompts", nargs="+", metavar="P",
                    help="prompt variants: baseline, cot, optimal, flawed (default all)")
    ev.add_argument("--flaw-types", nargs="+", metavar="F",
                    help="flaw types of the flawed variant (default all seven; see `core.text.flaws.FLAW_TYPES`)")
    ev.add_argument("--severity", type=flaw_severity, default=0.5,
                    help="flaw severity in (0, 1]: share of the eligible plan steps changed (default 0.5)")
    ev.add_argument("--split", choices=SPLIT_CHOICES, default="test")
    ev.add_argument("--task-type", action="append", choices=TASK_TYPE_NAMES, metavar="TYPE",
                    help=f"repeatable (default all); one of {', '.join(TASK_TYPE_NAMES)}")
    ev.add_argument("--task-id", action="append", metavar="ID", help="repeatable; selects tasks of any split")
    ev.add_argument("--limit", type=positive_int, help="use only the first N selected tasks (types in turn)")
    ev.add_argument("--seeds", nargs="+", type=nonnegative_int, default=[0, 1, 2], metavar="N")
    ev.add_argument("--protocol", choices=PROTOCOLS, default="tags",
                    help="how the agent uses tools: tags in its text (the paper's, default) or native tool calls")
    ev.add_argument("--wording", choices=WORDINGS, default="plain",
                    help="the tag protocol's prompt wording: plain (no live example tag, default) or the paper's")
    ev.add_argument("--batch-size", type=positive_int, default=32,
                    help="episodes played at once: one batched agent call per round (default 32; 1 lets a "
                         "llama.cpp server reuse the shared prompt prefix)")
    add_options(ev, GenerationConfig, GENERATION_OPTIONS, defaults=GenerationConfig(**EVAL_GENERATION))
    add_options(ev, RequestSettings, REQUEST_OPTIONS)
    ev.add_argument("--retry-infra-errors", action="store_true",
                    help="play again the episodes stored as infrastructure errors (by default a resumed run "
                         "keeps them as finished)")
    ev.add_argument("--keep-messages", action="store_true", help="store each episode's conversation in its row")
    ev.add_argument("--output-dir", default="runs/eval", metavar="DIR", help="default runs/eval")
    ev.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="skip episodes already in DIR/results.jsonl (default); --no-resume starts afresh")
    ev.set_defaults(func=cmd_eval)
