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
from pathlib import Path
from typing import Any

from resilibench.cli import (
    SPLIT_CHOICES,
    CliError,
    check_bound_turn_limit,
    dedupe,
    load_library,
    load_world_config,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
    read_existing_results,
    select_tasks,
)


def flaw_severity(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {value}")
    return value


def _help(settings: type, name: str) -> str:
    """The help text of a settings dataclass field."""
    return settings.__dataclass_fields__[name].metadata["help"]


def check_agent(spec: str) -> None:
    """Check ``--agent`` before any work: the spec's form and options, the directory of ``hf:`` / ``ppo:``."""
    from resilibench.agents.scripted import AGENT_SPECS, check_agent_spec

    try:
        check_agent_spec(spec)
    except (ValueError, OSError) as exc:
        raise CliError(f"--agent {spec}: {exc} (forms: {AGENT_SPECS})") from None


def make_agent(spec: str, generation: Any, batch_size: int, requests: Any = None):
    """The agent of ``--agent`` (``agents.scripted.make_text_agent``)."""
    from resilibench.agents.backends import BackendError
    from resilibench.agents.scripted import make_text_agent

    try:
        return make_text_agent(spec, generation, batch_size, requests)
    except (ValueError, TypeError, OSError, ImportError, BackendError) as exc:
        raise CliError(f"--agent {spec}: {exc}") from None


def cmd_eval(args: argparse.Namespace) -> int:
    from resilibench.agents.backends import BackendError, RequestSettings
    from resilibench.agents.base import GenerationConfig
    from resilibench.agents.harness import EVAL_KEY, eval_jobs, run_eval
    from resilibench.agents.report import format_tables, plot_summary, summarize_eval
    from resilibench.envs.planner_env import make_world_config
    from resilibench.envs.tasks import TASK_TYPE_NAMES
    from resilibench.policies.flaws import FLAW_TYPES
    from resilibench.policies.prompts import PROMPT_VARIANTS
    from resilibench.results import (
        INFRA_ERROR,
        LEVEL_NAMES,
        exclusive_lock,
        read_jsonl,
        run_metadata,
        to_jsonable,
        write_json_atomic,
    )

    check_agent(args.agent)
    # The text env's world: the config's rules with strict dependencies (the text protocol's rule).
    config = make_world_config(load_world_config(args.config, need_bounds=True, world=args.world), None, True, None)
    tasks, source = load_library(args.tasks, args.world)
    prompts, seeds = dedupe(args.prompts or PROMPT_VARIANTS), dedupe(args.seeds)
    flaw_types = dedupe(args.flaw_types or FLAW_TYPES) if "flawed" in prompts else []
    task_types = dedupe(args.task_type) if args.task_type else list(TASK_TYPE_NAMES)
    selected = select_tasks(tasks, args.split, task_types, args.task_id, limit=args.limit)
    check_bound_turn_limit(config, selected)
    try:
        jobs = eval_jobs(selected, prompts, seeds, flaw_types, config=config)
    except ValueError as exc:
        raise CliError(f"--prompts/--flaw-types: {exc}") from None
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                  seed=args.generation_seed)
    try:
        requests = RequestSettings(timeout=args.request_timeout, max_retries=args.max_retries,
                                   max_concurrency=args.concurrency)
    except ValueError as exc:
        raise CliError(f"--request-timeout/--max-retries/--concurrency: {exc}") from None
    settings = to_jsonable({"severity": args.severity, "plan_style": "numbered", "protocol": args.protocol,
                            "wording": args.wording,
                            "generation": {"max_new_tokens": generation.max_new_tokens,
                                           "temperature": generation.temperature, "seed": generation.seed}})
    run_config = {"world": config.to_dict(), "tasks": source, "agent": args.agent, "eval": settings,
                  "prompts": prompts, "flaw_types": flaw_types, "split": args.split, "task_types": task_types,
                  "task_ids": args.task_id, "limit": args.limit, "task_count": len(selected), "episodes": len(jobs)}
    identity = to_jsonable({"world": config.to_dict(), "tasks_sha256": source["sha256"], "eval": settings})

    directory = Path(args.output_dir)
    if directory.exists() and not directory.is_dir():
        raise CliError(f"--output-dir: {directory} exists and is not a directory")
    results_path, summary_path, plot_path = (directory / n for n in ("results.jsonl", "summary.json", "summary.png"))
    lock = directory / ".lock"
    try:
        with exclusive_lock(lock):
            if args.resume:
                read_existing_results(directory, results_path, identity, ("level",), (*LEVEL_NAMES, INFRA_ERROR))
            else:
                for stale in (summary_path, plot_path):
                    stale.unlink(missing_ok=True)
            agent = make_agent(args.agent, generation, args.batch_size, requests)
            conditions = len([p for p in prompts if p != "flawed"]) + len(flaw_types)
            print(f"{len(jobs)} episodes ({len(selected)} tasks x {len(seeds)} seeds x up to {conditions} prompt "
                  f"conditions: flaws that do not apply to a task's plan are left out) for {agent.name} into "
                  f"{results_path}", file=sys.stderr)
            try:
                run_eval(agent, jobs, config=config, severity=args.severity, batch_size=args.batch_size,
                         results_path=results_path, resume=args.resume, keep_messages=args.keep_messages,
                         metadata=run_metadata(run_config, seeds), protocol=args.protocol,
                         retry_infra_errors=args.retry_infra_errors, env_kwargs={"wording": args.wording})
            except BackendError as exc:
                raise CliError(f"--agent {args.agent}: {exc}; finished episodes are saved in {results_path}: "
                               "rerun the same command to resume") from None
            except KeyboardInterrupt:
                print(f"\ninterrupted; finished episodes are saved in {results_path}: rerun the same command to "
                      "resume", file=sys.stderr)
                return 130

            # Every episode in the directory (all models), each key once.
            rows = list({tuple(r.get(f) for f in EVAL_KEY): r for r in read_jsonl(results_path).rows}.values())
            summary = {"metadata": run_metadata(run_config, seeds),
                       "files": {"results": results_path.name, "plot": plot_path.name}, **summarize_eval(rows)}
            write_json_atomic(summary_path, summary)
            print(format_tables(summary))
            plot_summary(rows, plot_path, title=f"Full success in the text env ({len(rows)} episodes)")
            print(f"wrote {results_path}, {summary_path} and {plot_path}", file=sys.stderr)
    except BlockingIOError:
        raise CliError(f"--output-dir {directory}: another run is writing there (lock {lock}); wait for it or use "
                       "another --output-dir") from None
    return 0


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``eval`` to the ``resilibench`` parser."""
    from resilibench.agents.backends import RequestSettings
    from resilibench.agents.scripted import AGENT_SPECS
    from resilibench.envs.tasks import TASK_TYPE_NAMES
    from resilibench.envs.toolbox import PROTOCOLS, WORDINGS

    # Prompt variants and flaw types are checked when the command runs (``eval_jobs``), so building the
    # parser imports nothing from the prompt modules.
    ev = commands.add_parser("eval", parents=[parents["library"], parents["world"]],
                             help="evaluate an LLM agent (or a scripted reference) in the text env")
    ev.add_argument("--agent", required=True, metavar="SPEC", help=f"one of {AGENT_SPECS}")
    ev.add_argument("--prompts", nargs="+", metavar="P",
                    help="prompt variants: baseline, cot, optimal, flawed (default all)")
    ev.add_argument("--flaw-types", nargs="+", metavar="F",
                    help="flaw types of the flawed variant (default all seven; see `policies.flaws.FLAW_TYPES`)")
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
    ev.add_argument("--max-new-tokens", type=positive_int, default=256, help="tokens per reply (default 256)")
    ev.add_argument("--request-timeout", type=positive_float, default=RequestSettings.timeout, metavar="S",
                    help=f"{_help(RequestSettings, 'timeout')}; it ends that episode as an infrastructure error "
                         f"(default {RequestSettings.timeout:g})")
    ev.add_argument("--max-retries", type=nonnegative_int, default=RequestSettings.max_retries, metavar="N",
                    help=f"{_help(RequestSettings, 'max_retries')} (default {RequestSettings.max_retries})")
    ev.add_argument("--concurrency", type=positive_int, default=RequestSettings.max_concurrency, metavar="N",
                    help=f"HTTP {_help(RequestSettings, 'max_concurrency')} (default "
                         f"{RequestSettings.max_concurrency}: a local server computes one at a time)")
    ev.add_argument("--retry-infra-errors", action="store_true",
                    help="play again the episodes stored as infrastructure errors (by default a resumed run "
                         "keeps them as finished)")
    ev.add_argument("--temperature", type=nonnegative_float, default=0.0, help="0 = greedy (default)")
    ev.add_argument("--generation-seed", type=nonnegative_int, default=0, help="sampling seed (default 0)")
    ev.add_argument("--keep-messages", action="store_true", help="store each episode's conversation in its row")
    ev.add_argument("--output-dir", default="runs/eval", metavar="DIR", help="default runs/eval")
    ev.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                    help="skip episodes already in DIR/results.jsonl (default); --no-resume starts afresh")
    ev.set_defaults(func=cmd_eval)
