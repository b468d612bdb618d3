"""`robust clusters|scratch|sft|scpo|evaluate|demo`: robust workflow generation (RobustFlow). `clusters`
builds a cluster dataset, `scratch` a small generator from nothing, `sft` and `scpo` train a generator,
`evaluate` prints the robustness table, `demo` runs it all on the built-in library.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
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
    error_text,
    load_backend,
    load_library,
    nonnegative_int,
    positive_int,
    print_to_stderr,
    select_tasks,
)
from resilibench.cli.options import add_options, option_values
from resilibench.console import format_table, progress_bar
from resilibench.rundir import check_directory

# Settings fields with command-line options (built from the fields: resilibench.cli.options).
TRAINER_OPTIONS = ("epochs", "learning_rate", "batch_size", "gradient_accumulation_steps", "max_steps", "max_length",
                   "seed")
LORA_OPTIONS = ("r", "alpha", "dropout")
PREFERENCE_OPTIONS = ("beta", "nll_alpha")
SCPO_OPTIONS = ("iterations", "candidates", "temperature", "vote", "vote_weight", "max_new_tokens")
DEMO_OPTIONS = ("train_clusters", "test_clusters", "pretrain_tasks", "scpo_clusters", "wording", "search_hits",
                "search_hits_only", "search_scores", "search_hits_by_clause", "clause_dropout", "tune_retriever", "seed")


# --- clusters -----------------------------------------------------------------------------------------


def _per_type(tasks: list[Any], n: int | None) -> list[Any]:
    """The first ``n`` tasks of each task type (all when ``n`` is None), task types in turn."""
    from resilibench.core.tasks.library import interleave_task_types

    if n is None:
        return tasks
    seen: Counter[str] = Counter()
    kept = []
    for task in tasks:
        if seen[task.task_type] < n:
            kept.append(task)
            seen[task.task_type] += 1
    return interleave_task_types(kept)


def cmd_clusters(args: argparse.Namespace) -> int:
    from resilibench.core.tasks.library import interleave_task_types
    from resilibench.llm import GenerationConfig
    from resilibench.robust_train.clusters import parse_types, write_clusters
    from resilibench.robust_train.instructions import InstructionPerturber

    try:
        types = parse_types(args.types)
    except ValueError as exc:
        raise CliError(f"--types: {exc}") from None
    world = choose_world(args, need_bounds=True)
    config = world.config
    tasks, source = load_library(args.tasks, world)
    tasks, source = _worded(tasks, source, args.wording)
    task_types = dedupe(args.task_type) if args.task_type else None
    selected = _per_type(select_tasks(tasks, args.split, task_types), args.per_type)
    check_bound_turn_limit(config, selected)
    if args.limit is not None:
        selected = interleave_task_types(selected)[:args.limit]
    directory = check_directory(args.output_dir)
    perturber = None
    if args.backend:
        perturber = InstructionPerturber(load_backend(args.backend), attempts=args.attempts,
                                         generation=GenerationConfig(max_new_tokens=args.max_new_tokens, seed=0))
    selection = {"split": args.split, "task_types": task_types, "per_type": args.per_type, "limit": args.limit,
                 "task_count": len(selected)}
    bars: list[Any] = []
    try:
        result = write_clusters(directory, selected, types=types, variants_per_type=args.variants_per_type,
                                seed=args.seed, perturber=perturber, config=config, source=source,
                                selection=selection, resume=args.resume, batch_size=args.batch_size,
                                on_start=lambda n: bars.append(progress_bar(n, "clusters")),
                                on_record=lambda _: bars[0].update(1))
    finally:
        for bar in bars:
            bar.close()
    _print_summary(result, types)
    print(f"wrote {result.path} and {directory / 'meta.json'} ({result.built} clusters built now, {result.found} "
          "already there)", file=sys.stderr)
    return 0


def _worded(tasks: list[Any], source: dict[str, Any], wording: str) -> tuple[list[Any], dict[str, Any]]:
    """The tasks under the --wording option, and their source description recording it."""
    from resilibench.core.tasks.wording import apply_wording

    try:
        return apply_wording(tasks, wording), {**source, "wording": wording}
    except ValueError as exc:
        raise CliError(f"--wording: {exc}") from None


def _print_summary(result: Any, types: tuple[str, ...]) -> None:
    """Clusters, and per perturbation type: variants, their sources and the mean noise rate."""
    print(f"{len(result.records)} clusters ({result.found} already in {result.path}, {result.built} built now)")
    rows = []
    for kind in types:
        variants = [v for r in result.records for v in r.variants_of(kind)]
        sources = Counter(v.source for v in variants)
        rates = [v.rate for v in variants if v.rate is not None]
        fallbacks = sum(1 for v in variants if "fallback_reason" in v.notes)
        rows.append((kind, len(variants), sources["rules"], sources["llm"], fallbacks,
                     sum(rates) / len(rates) if rates else None))
    print(format_table(("perturbation", "variants", "rules", "llm", "llm fallbacks", "mean rate"), rows))


# --- sft, scpo, evaluate, scratch, demo ---------------------------------------------------------------


@contextmanager
def _errors_of(action: str) -> Iterator[None]:
    """The library's ValueError (a bad setting or input) as one line naming the command."""
    try:
        yield
    except ValueError as exc:
        raise CliError(f"robust {action}: {error_text(exc)}") from None


def _torch_threads_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--torch-threads", type=positive_int, default=1, metavar="N",
                        help="torch threads of this process (default 1: more stall on a busy machine)")


def _use_torch_threads(args: argparse.Namespace) -> None:
    """Apply --torch-threads before any model is loaded."""
    from resilibench.robust_train.training import set_torch_threads

    set_torch_threads(args.torch_threads)


def _model_dir(text: str) -> Path:
    path = Path(text)
    if not (path / "config.json").is_file():
        raise CliError(f"MODEL {text}: not a directory holding a transformers model (config.json is missing)")
    return path


def _clusters(path: str, option: str = "--clusters") -> list[Any]:
    from resilibench.robust_train.clusters import load_clusters

    try:
        records = load_clusters(path)
    except (FileNotFoundError, ValueError) as exc:
        raise CliError(f"{option}: {exc}") from None
    if not records:
        raise CliError(f"{option} {path}: no clusters in the dataset")
    return records


def _format(args: argparse.Namespace):
    from resilibench.robust_train.generator import GeneratorFormat

    return GeneratorFormat(tool_list=args.tool_list, answer=args.answer, search_hits=args.search_hits,
                           search_hits_only=args.search_hits_only, search_scores=args.search_scores,
                           search_hits_by_clause=args.search_hits_by_clause, clause_dropout=args.clause_dropout,
                           search_retriever=_retriever(args.search_retriever))


def _retriever(path: str | None) -> str | None:
    """--search-retriever's directory, checked: a tuned retriever's model directory."""
    if path is not None and not Path(path, "config.json").is_file():
        raise CliError(f"--search-retriever {path}: not a tuned retriever's directory (no config.json); "
                       "`resilibench robust demo --tune-retriever` writes one in OUTPUT_DIR/retriever/model")
    return path


def _lora(args: argparse.Namespace, default: Any) -> Any:
    from dataclasses import replace

    from resilibench.robust_train.training import LoraSettings

    if getattr(args, "full", False):
        return None
    return replace(default, **option_values(args, LoraSettings, LORA_OPTIONS))


def _trainer_settings(default: Any, args: argparse.Namespace) -> Any:
    """``default`` (SFTSettings or PreferenceSettings) with the options that were given."""
    from dataclasses import replace

    from resilibench.robust_train.training import PreferenceSettings

    names = TRAINER_OPTIONS + (PREFERENCE_OPTIONS if isinstance(default, PreferenceSettings) else ())
    return replace(default, lora=_lora(args, default.lora), **option_values(args, type(default), names))


def _train_flags(parser: argparse.ArgumentParser, defaults: Any) -> None:
    """The optimiser and LoRA options shared by `robust sft` and `robust scpo` (defaults from ``defaults``)."""
    from resilibench.robust_train.training import LoraSettings

    add_options(parser, type(defaults), TRAINER_OPTIONS, defaults=defaults)
    add_options(parser, LoraSettings, LORA_OPTIONS, defaults=defaults.lora)
    _format_flags(parser)


def _hits(text: str) -> int:
    """--search-hits' value: an integer >= 0."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"search hits must be an integer >= 0, got {text!r}")
    return value


def _format_flags(parser: argparse.ArgumentParser) -> None:
    """--tool-list and --answer: the generator's prompt and answer form (the same in every stage)."""
    from resilibench.robust_train.generator import ANSWER_FORMS

    parser.add_argument("--tool-list", action="store_true",
                        help="put the 30 tools in the system message (models that have not learned them)")
    parser.add_argument("--answer", choices=ANSWER_FORMS, default="json",
                        help="json: a DAG; names: tool names in call order, one per line (default json)")
    parser.add_argument("--search-hits", type=_hits, default=0, metavar="K",
                        help="show the K best tool search hits of each clause after the instruction (default 0: none)")
    parser.add_argument("--search-hits-only", action="store_true",
                        help="show the search hits instead of the instruction (with --search-hits)")
    parser.add_argument("--search-scores", action="store_true",
                        help="show each search hit's relevance in hundredths after its name (with --search-hits)")
    parser.add_argument("--search-hits-by-clause", action="store_true",
                        help="show each clause of the instruction followed by its hits (with --search-hits)")
    parser.add_argument("--clause-dropout", type=float, default=0.0, metavar="P",
                        help="the fraction of clauses shown without their words in training prompts "
                             "(with --search-hits-by-clause; default 0)")
    parser.add_argument("--search-retriever", metavar="DIR",
                        help="search the hits with this tuned retriever (robust_train.retriever) in place of the "
                             "shipped model (with --search-hits)")


def cmd_sft(args: argparse.Namespace) -> int:
    from resilibench.robust_train.pipeline import run_sft
    from resilibench.robust_train.training import SFTSettings

    _use_torch_threads(args)
    model, records = _model_dir(args.model), _clusters(args.clusters)
    settings = _trainer_settings(SFTSettings(), args)
    rows = len(records) if args.originals_only else sum(len(r.variants) for r in records)
    print(f"SFT on {rows} instructions of {len(records)} clusters "
          f"({'full fine-tuning' if settings.lora is None else f'LoRA r {settings.lora.r}'})", file=sys.stderr)
    with _errors_of("sft"):
        out = run_sft(model, records, args.output_dir, settings, _format(args), originals_only=args.originals_only)
    print(f"model: {out}")
    return 0


def cmd_scpo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from resilibench.robust_train.scpo import ScPOSettings, run_scpo

    _use_torch_threads(args)
    model, records = _model_dir(args.model), _clusters(args.clusters)
    defaults = ScPOSettings()
    changes = option_values(args, ScPOSettings, SCPO_OPTIONS)
    with _errors_of("scpo"):
        settings = replace(defaults, preference=_trainer_settings(defaults.preference, args),
                           seed=args.seed or 0, **changes)
        out = run_scpo(model, records, args.output_dir, settings, _format(args), log=print_to_stderr)
    print(f"model: {out}")
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from resilibench.core.text.toolbox import search_method
    from resilibench.results import write_json_atomic
    from resilibench.robust_train.evaluation import baseline_tables, format_tables
    from resilibench.robust_train.instructions import PERTURBATION_TYPES
    from resilibench.robust_train.pipeline import evaluate_generator

    _use_torch_threads(args)
    models = [_model_dir(m) for m in args.models]
    names = args.name or [m.name if m.name != "model" else m.parent.name for m in models]
    if len(names) != len(models) or len(set(names)) != len(names):
        raise CliError(f"--name: give one distinct name per MODEL ({len(models)}), got {names}")
    records = _clusters(args.clusters)
    train = _clusters(args.baselines, "--baselines") if args.baselines else None
    with _errors_of("evaluate"):
        tables = {name: evaluate_generator(model, records, Path(args.output_dir) / name, _format(args),
                                           max_new_tokens=args.max_new_tokens, batch_size=args.batch_size)
                  for name, model in zip(names, models, strict=True)}
        if train is not None:
            baselines = baseline_tables(train, records)
            write_json_atomic(Path(args.output_dir) / "baselines.json",
                              {"search_method": search_method(), "train_clusters": args.baselines,
                               "tables": {name: t.to_dict() for name, t in baselines.items()}})
            tables = {**baselines, **tables}
    kinds = ("original", *PERTURBATION_TYPES)
    print(format_tables(tables, kinds))
    if train is not None:
        print(format_tables(tables, kinds, ("exec_ratio",)))
    print(f"tables and answers in {args.output_dir}/<name>/", file=sys.stderr)
    return 0


def cmd_scratch(args: argparse.Namespace) -> int:
    from resilibench.robust_train.pipeline import build_generator

    _use_torch_threads(args)
    records = [r for path in args.clusters for r in _clusters(path)]
    with _errors_of("scratch"):
        out = build_generator(args.output_dir, records, _format(args), hidden_size=args.hidden_size,
                              num_layers=args.num_layers, num_heads=args.num_heads, vocab_size=args.vocab_size,
                              seed=args.seed)
    print(f"model: {out}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from resilibench.robust_train.pipeline import DemoSettings, run_demo

    _use_torch_threads(args)
    defaults = DemoSettings()
    changes = option_values(args, DemoSettings, DEMO_OPTIONS)
    settings = replace(defaults, **changes)
    if args.scpo_iterations is not None:
        settings = replace(settings, scpo=replace(settings.scpo, iterations=args.scpo_iterations))
    if args.max_length is not None:
        settings = settings.with_max_length(args.max_length)
    check_directory(args.output_dir)
    with _errors_of("demo"):
        run_demo(args.output_dir, settings, log=print_to_stderr)
    print((Path(args.output_dir) / "table.txt").read_text(), end="")
    return 0


# --- parser ---------------------------------------------------------------------------------------------------


def _clusters_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.core.tasks.wording import WORDINGS
    from resilibench.robust_train.instructions import PERTURBATION_TYPES

    add_library_options(parser)
    add_config_option(parser)
    add_output_dir_option(parser, None, "where clusters.jsonl and meta.json go (resumed when present)")
    parser.add_argument("--split", choices=SPLIT_CHOICES, default="train", help="default train")
    parser.add_argument("--wording", choices=WORDINGS, default="shared",
                        help="held_out: test descriptions worded in phrase-bank clauses no train task uses (world v1; "
                        "default shared, the library as shipped)")
    add_task_type_option(parser)
    parser.add_argument("--per-type", type=positive_int, metavar="N", help="use the first N tasks of each task type")
    parser.add_argument("--limit", type=positive_int, metavar="N",
                        help="only the first N selected tasks (task types in turn)")
    parser.add_argument("--types", default=",".join(PERTURBATION_TYPES), metavar="LIST",
                        help=f"comma-separated perturbation types (default all: {','.join(PERTURBATION_TYPES)})")
    parser.add_argument("--variants-per-type", type=positive_int, default=1, metavar="N", help="default 1")
    parser.add_argument("--seed", type=nonnegative_int, default=0, metavar="N", help="perturbation seed (default 0)")
    parser.add_argument("--backend", metavar="SPEC",
                        help="LLM for paraphrases and requirements: hf:PATH, vllm:PATH or openai:URL?model=NAME "
                        "(default: offline rules)")
    parser.add_argument("--attempts", type=positive_int, default=3, metavar="N",
                        help="LLM answers per variant before falling back to the rules (default 3)")
    parser.add_argument("--max-new-tokens", type=positive_int, default=512, metavar="N",
                        help="longest LLM answer (default 512)")
    parser.add_argument("--batch-size", type=positive_int, default=32, metavar="N",
                        help="tasks whose LLM variants share one generate call (default 32)")
    add_resume_option(parser, rows="clusters", file="clusters.jsonl")
    parser.set_defaults(func=cmd_clusters)


def _model_and_clusters(parser: argparse.ArgumentParser, model: str, output: str) -> None:
    """MODEL, --clusters DIR and --output-dir DIR of the commands that train a generator."""
    parser.add_argument("model", metavar="MODEL", help=model)
    parser.add_argument("--clusters", required=True, metavar="DIR", help="a `robust clusters` dataset")
    add_output_dir_option(parser, None, output)


def _sft_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.robust_train.training import SFTSettings

    _model_and_clusters(parser, "a local transformers model directory", "checkpoints, adapter and DIR/model")
    parser.add_argument("--originals-only", action="store_true", help="train on the original instructions only")
    parser.add_argument("--full", action="store_true", help="full fine-tuning instead of a LoRA adapter")
    _train_flags(parser, SFTSettings())
    _torch_threads_flag(parser)
    parser.set_defaults(func=cmd_sft)


def _scpo_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.robust_train.scpo import ScPOSettings
    from resilibench.robust_train.training import PreferenceSettings

    _model_and_clusters(parser, "the generator M_0 (e.g. `robust sft`'s DIR/model)", "iter_NN/ per iteration; resumed")
    add_options(parser, ScPOSettings, SCPO_OPTIONS)
    add_options(parser, PreferenceSettings, PREFERENCE_OPTIONS)
    _train_flags(parser, ScPOSettings().preference)
    _torch_threads_flag(parser)
    parser.set_defaults(func=cmd_scpo)


def _evaluate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("models", nargs="+", metavar="MODEL", help="generator model directories")
    parser.add_argument("--name", action="append", metavar="NAME", help="column name per MODEL (repeatable)")
    parser.add_argument("--clusters", required=True, metavar="DIR", help="a `robust clusters` dataset")
    add_output_dir_option(parser, None, "answers and tables; reused")
    parser.add_argument("--max-new-tokens", type=positive_int, default=256, metavar="N", help="default 256")
    parser.add_argument("--batch-size", type=positive_int, default=64, metavar="N", help="default 64")
    parser.add_argument("--baselines", metavar="DIR", help="a train `robust clusters` dataset: add the four "
                        "baselines (names, lookup, bow and search; lookup and bow learn from DIR) beside the models, "
                        "and their exec ratios (OUTPUT_DIR/baselines.json)")
    _format_flags(parser)
    _torch_threads_flag(parser)
    parser.set_defaults(func=cmd_evaluate)


def _scratch_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--clusters", required=True, nargs="+", metavar="DIR", help="datasets to train the tokenizer on")
    add_output_dir_option(parser, None, "the model directory")
    for option, default in (("--hidden-size", 128), ("--num-layers", 4), ("--num-heads", 4), ("--vocab-size", 2048)):
        parser.add_argument(option, type=positive_int, default=default, metavar="N", help=f"default {default}")
    parser.add_argument("--seed", type=nonnegative_int, default=0, metavar="N", help="default 0")
    _format_flags(parser)
    _torch_threads_flag(parser)
    parser.set_defaults(func=cmd_scratch)


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.robust_train.pipeline import DemoSettings

    add_output_dir_option(parser, "runs/robust-demo")
    add_options(parser, DemoSettings, DEMO_OPTIONS)
    parser.add_argument("--scpo-iterations", type=positive_int, metavar="N",
                        help=f"ScPO iterations (default {DemoSettings().scpo.iterations})")
    parser.add_argument("--max-length", type=positive_int, metavar="N", help="tokens of a training row in "
                        f"every stage (default {DemoSettings().sft.max_length}; longer rows are cut)")
    _torch_threads_flag(parser)
    parser.set_defaults(func=cmd_demo)


def add_commands(commands: Any) -> None:
    """Add ``robust clusters|scratch|sft|scpo|evaluate|demo`` to the ``resilibench`` parser."""
    add_group(commands, "robust", "robust workflow generation: clusters, SFT, ScPO, robustness", {
        "clusters": ("build a semantic cluster dataset: each task with its perturbed instructions", _clusters_arguments),
        "scratch": ("a small random generator with a tokenizer trained on cluster datasets", _scratch_arguments),
        "sft": ("instruction-augmented SFT of a generator (TRL SFTTrainer, PEFT LoRA)", _sft_arguments),
        "scpo": ("self-consistency preference optimisation iterations (weighted DPO + NLL)", _scpo_arguments),
        "evaluate": ("robustness table of generators (RobustFlow Table 2 in shape)", _evaluate_arguments),
        "demo": ("from scratch -> SFT -> ScPO on the built-in library, with the table", _demo_arguments),
    })
