"""`breaker`: find tasks that break a model (docs/agents/breaker.md), per taxonomy, into a resumable directory.

    resilibench breaker --runs flaw:10 --max-iterations flaw:4 --solver scripted:plan --output-dir runs/brk
    resilibench breaker --runs qc:8,itf:5 --max-iterations qc:15 --generator hf:GEN --solver hf:MODEL \\
        --judge "openai:http://127.0.0.1:8000/v1?model=J" --output-dir runs/brk-llm --csv

writes ``DIR/iterations.jsonl`` (every iteration), ``DIR/rows.jsonl`` (the model-breaking tasks, with
embeddings), ``DIR/meta.json`` and, with ``--csv``, ``DIR/rows.csv``. A rerun of the same command
continues with the runs not yet finished; a different config is refused.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from resilibench.cli.common import (
    SPLIT_CHOICES,
    CliError,
    add_config_option,
    add_library_options,
    add_output_dir_option,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    load_agent,
    load_backend,
    load_library,
    nonnegative_float,
    nonnegative_int,
    positive_int,
    select_tasks,
)
from resilibench.console import format_table


def _roles(args: argparse.Namespace, runs: dict[str, int]) -> dict[str, str | None]:
    """The role specs of the command, checked for what the taxonomies of ``runs`` need."""
    from resilibench.agents.breaker import LLM_TAXONOMIES

    llm = [name for name in runs if name in LLM_TAXONOMIES]
    for option in ("generator", "judge"):
        if llm and not getattr(args, option):
            raise CliError(
                f"--{option} is required for the taxonomies {', '.join(llm)} (a backend spec: hf:PATH, "
                "vllm:PATH or openai:URL?model=NAME)"
            )
    if not llm and (args.judge or args.validator):
        raise CliError(
            "--judge/--validator apply to qc, itf and mim only; flaw is judged by the evaluator and "
            "validated exactly"
        )
    return {
        "generator": args.generator,
        "validator": args.validator or args.judge,
        "solver": args.solver,
        "judge": args.judge,
    }


def _check_specs(roles: dict[str, str | None]) -> None:
    """Check every spec's form before anything is loaded."""
    from resilibench.agents.backends import check_spec
    from resilibench.agents.specs import AGENT_SPECS, check_agent_spec

    for role, spec in roles.items():
        if spec is None:
            continue
        try:
            (check_agent_spec if role == "solver" else check_spec)(spec)
        except (ValueError, OSError) as exc:
            forms = AGENT_SPECS if role == "solver" else "hf:PATH, vllm:PATH or openai:URL?model=NAME"
            raise CliError(f"--{role} {spec}: {exc} (forms: {forms})") from None


def _build(
    args: argparse.Namespace,
    runs: dict[str, int],
    roles: dict[str, str | None],
    config: Any,
    tasks: list[Any],
) -> dict[str, Any]:
    """The taxonomy objects; each backend spec is loaded once, however many roles use it."""
    from resilibench.agents.backends import BACKEND_KINDS
    from resilibench.agents.breaker import FlawTaxonomy, LLMTaxonomy
    from resilibench.agents.scripted import LLMAgent
    from resilibench.llm import GenerationConfig

    # Seeded: LLM solvers of flaw sample with it; the LLM taxonomies reseed every call from --seed.
    generation = GenerationConfig(
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, seed=args.seed
    )
    backends: dict[str, Any] = {}

    def backend(role: str) -> Any:
        spec = roles[role]
        assert spec is not None  # loaded only for a role given a spec (``_roles`` checked which need one)
        if spec not in backends:
            backends[spec] = load_backend(spec, f"--{role}", batch_size=args.batch_size)
        return backends[spec]

    taxonomies: dict[str, Any] = {}
    solver_spec: str = args.solver  # a required option
    for name in runs:
        if name == "flaw":
            if solver_spec.partition(":")[0] in BACKEND_KINDS:  # shared with other roles of the spec
                solver = LLMAgent(backend("solver"), generation)
            else:
                solver = load_agent(solver_spec, "--solver", generation, args.batch_size)
            generator = backend("generator") if roles["generator"] else None
            taxonomies[name] = FlawTaxonomy(
                solver, tasks, config, generator=generator, generation=generation, matcher=args.matcher
            )
        else:
            taxonomies[name] = LLMTaxonomy(
                name,
                backend("generator"),
                backend("solver"),
                backend("judge"),
                backend("validator"),
                generation=generation,
                judging=GenerationConfig(max_new_tokens=args.max_new_tokens, seed=0),
            )
    return taxonomies


def cmd_breaker(args: argparse.Namespace) -> int:
    from resilibench.agents.breaker import (
        breaker_directory,
        export_csv,
        parse_max_iterations,
        parse_runs,
        run_breaker,
    )
    from resilibench.llm import BackendError
    from resilibench.results import to_jsonable

    runs = parse_runs(args.runs)  # errors.InputError naming --runs / --max-iterations
    caps = parse_max_iterations(args.max_iterations, runs)
    roles = _roles(args, runs)
    _check_specs(roles)
    world = choose_world(args, need_bounds=True).with_rules(strict_dependencies=True)
    config = world.config
    library, source = load_library(args.tasks, world)
    tasks = select_tasks(library, args.split, args.task_type, limit=args.limit) if "flaw" in runs else []
    check_bound_turn_limit(config, tasks)
    generation = {"max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    identity = to_jsonable(
        {
            "world": config.to_dict(),
            "tasks_sha256": source["sha256"],
            "roles": roles,
            "generation": generation,
            "seed": args.seed,
            "max_iterations": caps,
            "pool": {
                "split": args.split,
                "task_types": args.task_type,
                "limit": args.limit,
                "matcher": args.matcher,
            },
        }
    )
    run_config = {"tasks": source, "pool_size": len(tasks)}
    if args.resume:
        breaker_directory(args.output_dir, identity).check()  # before any model is loaded
    taxonomies = _build(args, runs, roles, config, tasks)
    try:
        summary = run_breaker(
            args.output_dir,
            taxonomies,
            runs,
            caps,
            seed=args.seed,
            run_config=run_config,
            identity=identity,
            resume=args.resume,
        )
    except BackendError as exc:
        raise CliError(
            f"{exc}; finished iterations are saved in {args.output_dir}: rerun the same command to resume"
        ) from None
    rows = [
        (name, s["runs"], s["model_breaking"], s["model_breaking"] / s["runs"], s["iterations"], s["invalid"])
        for name, s in summary.taxonomies.items()
    ]
    print(format_table(("taxonomy", "runs", "model_breaking", "break_rate", "iterations", "invalid"), rows))
    written = [summary.iterations_path, summary.rows_path]
    if args.csv:
        csv_path = Path(args.output_dir) / "rows.csv"
        export_csv(summary.rows_path, csv_path)
        written.append(csv_path)
    print(f"wrote {', '.join(map(str, written))}", file=sys.stderr)
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", required=True, metavar="SPEC",
                        help="runs per taxonomy, e.g. qc:8,itf:5 or flaw (a bare name is one run); taxonomies: "
                        "qc, itf, mim, flaw")
    parser.add_argument("--max-iterations", metavar="SPEC",
                        help="iteration cap per taxonomy, e.g. qc:15 (names must be in --runs; default 1)")
    add_output_dir_option(parser, None, "iterations.jsonl, rows.jsonl and meta.json (resumed when present)")
    parser.add_argument("--solver", required=True, metavar="SPEC",
                        help="the model under test: a backend spec (hf:PATH, vllm:PATH, openai:URL?model=NAME); for "
                        "flaw also scripted:optimal, scripted:plan, a planner name or ppo:CHECKPOINT_DIR")
    parser.add_argument("--generator", metavar="SPEC",
                        help="task generator backend (required for qc/itf/mim; optional for flaw, whose default is "
                        "the seeded scripted proposer)")
    parser.add_argument("--judge", metavar="SPEC", help="grading backend (qc/itf/mim)")
    parser.add_argument("--validator", metavar="SPEC", help="reference-answer checker backend (default: --judge)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, metavar="N",
                        help="seeds every choice, sample and episode (default 0)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=1024, metavar="N",
                        help="longest LLM answer (default 1024)")
    parser.add_argument("--temperature", type=nonnegative_float, default=0.7, metavar="X",
                        help="sampling temperature of the generator and the solver (default 0.7); the judge and "
                        "the validator decode greedily")
    parser.add_argument("--batch-size", type=positive_int, default=8, metavar="N",
                        help="hf backends: rows per forward pass (default 8)")
    add_library_options(parser)
    add_config_option(parser)
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="test", help="flaw: the task pool's split (default test)")
    add_task_type_option(parser, "flaw: repeatable (default all)")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="flaw: the first N tasks of the pool (task types in turn)")
    parser.add_argument("--matcher", choices=("auto", "semantic", "lexical"), default="auto",
                        help="flaw: tool similarity used by flaw injection (default auto: semantic when installed)")
    parser.add_argument("--resume", action=argparse.BooleanOptionalAction, default=True,
                        help="continue the runs not yet finished in DIR (default); --no-resume starts DIR afresh")
    parser.add_argument("--csv", action="store_true", help="also write DIR/rows.csv (the original CSV columns)")
    parser.set_defaults(func=cmd_breaker)


def add_commands(commands: Any) -> None:
    """Add ``breaker`` to the ``resilibench`` parser."""
    commands.add_parser("breaker", help="search for tasks that break a model (qc, itf, mim, flaw)", arguments=_arguments)
