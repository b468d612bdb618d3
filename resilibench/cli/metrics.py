"""`metrics score|calibrate`: workflow metrics and their WorkflowPerturb calibration."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.cli.common import (
    SPLIT_CHOICES,
    CliError,
    add_config_option,
    add_group,
    add_library_options,
    add_output_dir_option,
    add_resume_option,
    add_task_type_option,
    check_bound_turn_limit,
    choose_world,
    dedupe,
    load_backend,
    load_library,
    output_file,
    positive_int,
    select_tasks,
)
from resilibench.cli.options import add_options, option_values
from resilibench.console import format_table, progress_bar
from resilibench.rundir import RunDirectory

# CalibrationSettings fields with `metrics calibrate` options of their own (built from the fields); the metric
# options that `metrics score` shares are added by _add_metric_options.
CALIBRATE_OPTIONS = ("min_nodes", "text_only", "seed", "perturber")


# --- shared -------------------------------------------------------------------------------------------


def _metrics(args: argparse.Namespace) -> list[str]:
    """The metrics asked for: --metrics, else every metric (the judge only with --backend)."""
    from resilibench.metrics.calibration import METRICS

    if args.metrics:
        metrics = dedupe(args.metrics)
        if "judge" in metrics and not args.backend:
            raise CliError("--metrics judge needs --backend SPEC (an LLM, e.g. hf:PATH or openai:URL?model=NAME)")
        return metrics
    return [m for m in METRICS if m != "judge" or args.backend]


def _check_backend_spec(spec: str | None) -> None:
    """Reject a malformed --backend before any work (building the backend waits until it is needed)."""
    from resilibench.agents.backends import parse_spec

    if spec is not None:
        try:
            parse_spec(spec)
        except ValueError as exc:
            raise CliError(f"--backend: {exc}") from None


def _generation(args: argparse.Namespace, default: int):
    from resilibench.llm import GenerationConfig

    return GenerationConfig(max_new_tokens=args.max_new_tokens or default, seed=0)


def _scorer(metrics: Sequence[str], backend: Any, args: argparse.Namespace):
    from resilibench.metrics.calibration import WorkflowScorer
    from resilibench.metrics.judge import Judge

    judge = Judge(backend, attempts=args.attempts, generation=_generation(args, 768)) if "judge" in metrics else None
    return WorkflowScorer(metrics, judge=judge, mcis_budget=args.mcis_budget)


def _add_metric_options(parser: argparse.ArgumentParser) -> None:
    from resilibench.metrics.calibration import METRICS
    from resilibench.metrics.structural import DEFAULT_MCIS_BUDGET

    parser.add_argument("--metrics", nargs="+", choices=METRICS, metavar="NAME",
                        help=f"default all but judge, plus judge with --backend; from {' '.join(METRICS)}")
    parser.add_argument("--backend", metavar="SPEC",
                        help="LLM for the judge (and --perturber llm): hf:PATH, vllm:PATH or openai:URL?model=NAME")
    parser.add_argument("--attempts", type=positive_int, default=3, metavar="N",
                        help="answers asked of the LLM per item before it is recorded invalid (default 3)")
    parser.add_argument("--max-new-tokens", type=positive_int, metavar="N",
                        help="longest LLM answer (default 768 for the judge, 1024 for --perturber llm)")
    parser.add_argument("--batch-size", type=positive_int, default=64, metavar="N",
                        help="pairs per scoring batch and per LLM call (default 64; scores do not depend on it)")
    parser.add_argument("--mcis-budget", type=positive_int, default=DEFAULT_MCIS_BUDGET, metavar="N",
                        help="search calls per MCIS before it reports bounds instead of the exact value "
                             f"(default {DEFAULT_MCIS_BUDGET}: seconds on 300-step workflows)")


# --- score --------------------------------------------------------------------------------------------

INPUT_FORMATS = ("resilibench", "worfbench", "robustflow")


def _workflow(value: Any, args: argparse.Namespace, role: str):
    """One workflow in the --input-format, read leniently: a malformed prediction is repaired and scored
    (a cyclic one scores 0 structurally); a reference must be a DAG."""
    from resilibench.core.workflow import Workflow

    if args.input_format == "worfbench":
        workflow = Workflow.from_worfbench(value)
    elif args.input_format == "robustflow":
        workflow = Workflow.from_graph(value)
    else:
        workflow = Workflow.from_dict(value, string_steps=args.string_steps, lenient=True)
    if role == "ref" and workflow.repairs.cyclic:
        cycle = workflow.repairs.self_loops + workflow.repairs.cycle_edges
        raise ValueError(f"the reference has a cycle (edges {', '.join(map(str, cycle))}); references must be DAGs")
    return workflow


def _documents(path: str, option: str, fmt: str) -> list[tuple[str | None, Any]]:
    """The workflows a --pred/--ref file holds, as (id or None, raw value): a JSON list holds several
    (paired by position); WorFBench files may also be one answer as plain text, a gold file
    (``conversations``, the answer last) or a prediction file (``workflow``)."""
    file = Path(path)
    if not file.is_file():
        raise CliError(f"{option}: file {path} does not exist")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CliError(f"{option} {path}: {exc}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        if fmt == "worfbench":
            return [(None, text)]
        raise CliError(f"{option} {path}: workflow is not valid JSON: {exc}") from None
    except RecursionError:
        raise CliError(f"{option} {path}: JSON nested too deeply to read") from None
    items = data if isinstance(data, list) else [data]
    out = []
    for item in items:
        item_id = str(item["id"]) if isinstance(item, dict) and "id" in item else None
        if fmt == "worfbench" and isinstance(item, dict):
            if "workflow" in item:
                item = item["workflow"]
            elif isinstance(item.get("conversations"), list) and item["conversations"]:
                last = item["conversations"][-1]
                item = last.get("content") if isinstance(last, dict) else last
        out.append((item_id, item))
    return out


def _read_files(args: argparse.Namespace) -> list[tuple[str, Any, Any, str | None]]:
    """(id, pred, ref, task) from --pred FILE and --ref FILE."""
    preds = _documents(args.pred, "--pred", args.input_format)
    refs = _documents(args.ref, "--ref", args.input_format)
    if len(preds) != len(refs):
        raise CliError(f"--pred {args.pred} holds {len(preds)} workflows and --ref {args.ref} {len(refs)}; "
                       "they are paired by position")
    pairs = []
    for number, ((pred_id, pred), (ref_id, ref)) in enumerate(zip(preds, refs, strict=True), 1):
        where = "" if len(preds) == 1 else f" (workflow {number})"
        pair_id = ref_id or pred_id or ("pair" if len(preds) == 1 else str(number))
        try:
            reference = _workflow(ref, args, "ref")
        except ValueError as exc:
            raise CliError(f"--ref {args.ref}{where}: {exc}") from None
        pairs.append((pair_id, _prediction(pred, args, pair_id, f"--pred {args.pred}{where}"), reference, None))
    return pairs


def _prediction(value: Any, args: argparse.Namespace, pair_id: str, where: str):
    """A prediction as ``_workflow`` reads it; one it cannot read is an empty workflow (it scores 0) noted in
    ``args.unreadable`` as (pair id, reason), or, with --strict, a CliError naming ``where``."""
    from resilibench.core.workflow import Workflow

    try:
        return _workflow(value, args, "pred")
    except ValueError as exc:
        if args.strict:
            raise CliError(f"{where}: {exc}") from None
        args.unreadable[pair_id] = str(exc)
        return Workflow((), ())


def _read_pairs(args: argparse.Namespace) -> list[tuple[str, Any, Any, str | None]]:
    """(id, pred, ref, task) per line of a JSONL file of {"pred": workflow, "ref": workflow}."""
    path = args.pairs
    file = Path(path)
    if not file.is_file():
        raise CliError(f"--pairs: file {path} does not exist")
    pairs = []
    for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        where = f"--pairs {path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CliError(f"{where}: not JSON ({exc})") from None
        except RecursionError:
            raise CliError(f"{where}: JSON nested too deeply to read") from None
        if not isinstance(row, dict) or "pred" not in row or "ref" not in row:
            raise CliError(f"{where}: each line must be an object with 'pred' and 'ref' workflows "
                           "(and optional 'id' and 'task')")
        pair_id = str(row.get("id", number))
        try:
            ref = _workflow(row["ref"], args, "ref")
        except ValueError as exc:
            raise CliError(f"{where}: ref: {exc}") from None
        task = row.get("task")
        pairs.append((pair_id, _prediction(row["pred"], args, pair_id, f"{where}: pred"), ref,
                      task if isinstance(task, str) else None))
    if not pairs:
        raise CliError(f"--pairs {path}: no pairs in the file")
    return pairs


def _report_caveats(rows: list[dict[str, Any]], unreadable: dict[str, str]) -> None:
    """Say on stderr which predictions could not be read (scored 0), which were repaired and which MCIS
    scores are bounds, not values."""
    if unreadable:
        first = next(iter(unreadable.items()))
        print(f"warning: {len(unreadable)} of {len(rows)} prediction(s) could not be read and score 0 "
              f"(details.unreadable in --format json; --strict stops instead); first: {first[0]}: {first[1]}",
              file=sys.stderr)
    repaired = [r["id"] for r in rows if "repairs" in r["details"]]
    cyclic = [r["id"] for r in rows if {"self_loops", "cycle_edges"} & set(r["details"].get("repairs", {}))]
    bounded = [r["id"] for r in rows if r["details"].get("mcis_f1", {}).get("exact") is False]
    if repaired:
        print(f"note: {len(repaired)} prediction(s) repaired (details.repairs in --format json); cyclic, scored 0 "
              f"structurally: {', '.join(cyclic) or 'none'}", file=sys.stderr)
    if bounded:
        print(f"note: mcis_f1 of {len(bounded)} pair(s) is a lower bound, the search ran past --mcis-budget: "
              f"{', '.join(bounded)} (f1_bounds in --format json)", file=sys.stderr)


def cmd_score(args: argparse.Namespace) -> int:
    from resilibench.metrics.calibration import iter_chunks
    from resilibench.results import dumps_row, write_text_atomic

    if args.pairs and (args.pred or args.ref) or not args.pairs and not (args.pred and args.ref):
        raise CliError("give either --pred FILE and --ref FILE, or --pairs FILE")
    output_file(args.output)
    if args.string_steps and args.input_format != "resilibench":
        raise CliError(f"--string-steps applies to --input-format resilibench; {args.input_format} steps are texts")
    args.unreadable = {}
    pairs = _read_pairs(args) if args.pairs else _read_files(args)
    if len(args.unreadable) == len(pairs):  # not a stray bad answer: the input is not in this format
        pair_id, reason = next(iter(args.unreadable.items()))
        raise CliError(f"no prediction could be read (pair {pair_id}: {reason})")
    metrics = _metrics(args)
    scorer = _scorer(metrics, load_backend(args.backend) if args.backend else None, args)
    rows: list[dict[str, Any]] = []
    with progress_bar(len(pairs), "pairs") as bar:
        for chunk in iter_chunks(pairs, args.batch_size):
            results = scorer.score([(p, r) for _, p, r, _ in chunk], [t for *_, t in chunk])
            rows += [{"id": pair_id, **result} for (pair_id, *_), result in zip(chunk, results, strict=True)]
            bar.update(len(chunk))
    for row in rows:
        if row["id"] in args.unreadable:
            row["details"]["unreadable"] = args.unreadable[row["id"]]
    if args.output:
        write_text_atomic(args.output, "".join(dumps_row(r) + "\n" for r in rows))
    if args.format == "json":
        print(json.dumps(rows, indent=2))
    elif len(rows) == 1:
        print(format_table(("metric", "score"), list(rows[0]["scores"].items())))
    else:
        table = [(r["id"], *(r["scores"][m] for m in metrics)) for r in rows]
        means = []
        for m in metrics:
            values = [r["scores"][m] for r in rows if r["scores"][m] is not None]
            means.append(sum(values) / len(values) if values else None)
        print(format_table(("id", *metrics), [*table, ("mean", *means)]))
    _report_caveats(rows, args.unreadable)
    if args.output:
        print(f"wrote {len(rows)} rows to {args.output}", file=sys.stderr)
    return 0


# --- calibrate ----------------------------------------------------------------------------------------


@dataclass
class _Calibration:
    """What `metrics calibrate` was asked to do, resolved and checked."""

    plan: Any  # CalibrationPlan
    metrics: list[str]
    run: RunDirectory  # identity: world config, task library and calibration settings must match to mix rows
    run_config: dict[str, Any]
    args: argparse.Namespace


def cmd_calibrate(args: argparse.Namespace) -> int:
    from resilibench.core.tasks.library import interleave_task_types
    from resilibench.metrics.calibration import CalibrationSettings, plan_calibration
    from resilibench.metrics.perturb import golden_workflows

    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, source = load_library(args.tasks, world)
    task_types = dedupe(args.task_type) if args.task_type else None
    selected = select_tasks(tasks, args.split, task_types)
    check_bound_turn_limit(config, selected)
    metrics = _metrics(args)
    _check_backend_spec(args.backend)
    cal = CalibrationSettings(
        metrics=tuple(metrics), backend=args.backend, attempts=args.attempts, max_new_tokens=args.max_new_tokens,
        mcis_budget=args.mcis_budget, **option_values(args, CalibrationSettings, CALIBRATE_OPTIONS))
    if cal.perturber == "llm" and not cal.backend:
        raise CliError("--perturber llm needs --backend SPEC")
    settings = dataclasses.asdict(cal)
    run = RunDirectory(args.output_dir, {"world": config.to_dict(), "tasks_sha256": source["sha256"],
                                         "calibration": settings},
                       key=("item_id",), stale=("goldens.json", "scores.png", "sensitivity.png"))
    goldens = golden_workflows(interleave_task_types(selected), config, min_nodes=cal.min_nodes, text_only=cal.text_only,
                               limit=args.limit)
    if not goldens.goldens:
        raise CliError(f"no selected task has a workflow of at least {cal.min_nodes} steps (--min-nodes)")
    plan = plan_calibration(goldens, seed=cal.seed, method=cal.perturber)
    job = _Calibration(
        plan=plan, metrics=metrics, run=run,
        run_config={"world": config.to_dict(), "tasks": source, "split": args.split, "task_types": task_types,
                    "limit": args.limit, "calibration": settings},
        args=args,
    )
    with run.session(args.resume):
        return _execute_calibration(job)


def _execute_calibration(job: _Calibration) -> int:
    """Score the pairs of the plan that the directory lacks, then write the summary, tables and plots."""
    from resilibench.metrics.calibration import plot_scores, plot_sensitivity, run_items, summarize
    from resilibench.metrics.perturb import LLMPerturber
    from resilibench.results import run_metadata, write_json_atomic

    args, plan, run = job.args, job.plan, job.run
    paths = {name: run.path / name for name in ("results.jsonl", "summary.json", "goldens.json", "scores.png",
                                                 "sensitivity.png")}
    done = {item_id for (item_id,) in run.done()}
    todo = [item for item in plan.items if item.item_id not in done]
    counts = plan.counts()
    print(f"{counts['tasks']} tasks with >= {plan.goldens.min_nodes} steps ({counts['distinct_goldens']} distinct "
          f"golden workflows) x {len(plan.kinds) * len(plan.rates)} variants = {counts['task_variants']} task "
          f"variants, {counts['distinct_pairs']} distinct pairs; {counts['distinct_pairs'] - len(todo)} already in "
          f"{run.results_path}, {len(todo)} to score", file=sys.stderr)

    scorer = None
    if todo:
        backend = load_backend(args.backend) if args.backend else None
        scorer = _scorer(job.metrics, backend, args)
        perturber = None
        if plan.method == "llm":
            assert backend is not None  # --perturber llm needs --backend (checked above)
            perturber = LLMPerturber(backend, attempts=args.attempts, generation=_generation(args, 1024))
        run.open_results(run_metadata(job.run_config, [plan.seed], extra={"scorer": scorer.settings}))
        with progress_bar(len(todo), "pairs") as bar:
            run_items(todo, scorer, lambda row: (run.write(row), bar.update(1)), seed=plan.seed,
                      perturber=perturber, chunk_size=args.batch_size)

    summary = summarize(plan, run.rows(), job.metrics)
    document = {
        "metadata": run_metadata(job.run_config, [plan.seed],
                                 extra={"scorer": scorer.settings if scorer else {"metrics": job.metrics}}),
        "files": {k: v.name for k, v in paths.items() if k != "summary.json"},
        "expected_score": "1 - p for missing and compressed steps, 1 for description changes",
        **summary,
    }
    run.write_summary(document)
    write_json_atomic(paths["goldens.json"], [
        {"golden_id": g.golden_id, "tasks": list(g.task_ids), "workflow": g.workflow.to_dict()}
        for g in plan.goldens.goldens])
    _print_tables(summary, plan)
    plot_scores(summary, paths["scores.png"])
    plot_sensitivity(summary, paths["sensitivity.png"])
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return 0


def _print_tables(summary: dict[str, Any], plan: Any, view: str = "tasks") -> None:
    """Per perturbation: mean ± std per rate, residuals and sensitivity of every metric."""
    c = summary["counts"]
    print(f"Calibration on {c['tasks']} tasks ({c['distinct_goldens']} distinct golden workflows), "
          f"{c['task_variants']} task variants ({c['distinct_pairs']} distinct pairs, "
          f"{c['invalid_variants']} invalid); view: {view} (each task's variant counts once)")
    from resilibench.metrics.perturb import expected_score

    table = summary["views"][view]
    for kind in plan.kinds:
        expected = " / ".join(f"{expected_score(kind, r):.1f}" for r in plan.rates)
        print(f"\n{kind} (expected {expected})")
        headers = ["metric", *(f"{r:.0%}" for r in plan.rates), *(f"resid {r:.0%}" for r in plan.rates),
                   "sensitivity"]
        rows = []
        for metric, kinds in table.items():
            cells = [kinds[kind]["rates"][str(r)] for r in plan.rates]
            rows.append([metric,
                         *(f"{c['mean']:.3f} ± {c['std']:.3f}" if c["mean"] is not None else "-" for c in cells),
                         *(c["residual"] for c in cells), kinds[kind]["sensitivity"]])
        print(format_table(headers, rows))


# --- parser ---------------------------------------------------------------------------------------------------


def _score_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.core.workflow import STRING_STEPS

    parser.add_argument("--pred", metavar="FILE", help="predicted workflow(s) in --input-format (a JSON list: several, "
                        "paired with --ref by position)")
    parser.add_argument("--ref", metavar="FILE", help="reference workflow(s) in --input-format")
    parser.add_argument("--pairs", metavar="FILE", help="JSONL, one {\"pred\": ..., \"ref\": ...} object a line "
                        "(optional \"id\", and \"task\" text for the judge)")
    parser.add_argument("--input-format", choices=INPUT_FORMATS, default="resilibench",
                        help="resilibench (default): {\"nodes\": [{\"tool\":..., \"text\":...}], \"edges\": [[i, j]]}; "
                             "worfbench: the answer text 'Node: 1: ... Edge: (START,1) (1,2) ...' (also WorFBench's "
                             "gold and prediction JSON files); robustflow: {\"nodes\": [\"START\", text, ..., \"END\"], "
                             "\"edges\": [[i, j]]}")
    parser.add_argument("--string-steps", choices=STRING_STEPS,
                        help="read a step given as a plain JSON string as a tool name or as a step text "
                             "(compared by meaning); required when the input has such steps")
    _add_metric_options(parser)
    parser.add_argument("--format", choices=("table", "json"), default="table", help="what is printed (default table)")
    parser.add_argument("--output", metavar="FILE", help="also write one JSON row per pair to FILE (JSONL)")
    parser.add_argument("--strict", action="store_true",
                        help="stop at a prediction that cannot be read (default: it scores 0, counted in a warning, "
                             "as WorFBench's scorer skips it; when no prediction can be read the command stops)")
    parser.set_defaults(func=cmd_score)


def _calibrate_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.metrics.calibration import CalibrationSettings

    add_library_options(parser)
    add_config_option(parser)
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="all", help="default all")
    add_task_type_option(parser)
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N tasks with enough steps (task types in turn)")
    add_options(parser, CalibrationSettings, CALIBRATE_OPTIONS)
    _add_metric_options(parser)
    add_output_dir_option(parser, "runs/calibration")
    add_resume_option(parser, rows="pairs")
    parser.set_defaults(func=cmd_calibrate)


def add_commands(commands: Any) -> None:
    """Add ``metrics score|calibrate`` to the ``resilibench`` parser."""
    add_group(commands, "metrics", "score workflows against references; calibrate the metrics", {
        "score": ("every metric for a (pred, ref) pair or a JSONL file of pairs", _score_arguments),
        "calibrate": ("WorkflowPerturb calibration on the task library's golden workflows", _calibrate_arguments),
    })
