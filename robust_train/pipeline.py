"""The robust-generation pipeline's stages, each resumable from its output directory:

- ``build_generator``: a small generator from scratch (tokenizer trained on the clusters' text, tool names
  as single tokens, random Llama weights);
- ``run_sft``: supervised fine-tuning on (instruction, reference workflow) rows: every variant of every
  cluster paired with the cluster's reference (instruction-augmented SFT, RobustFlow eq. 8), or only the
  originals (how the demo trains its base generator before augmentation); a LoRA adapter (paper
  defaults) is merged into the model afterwards so that sampling and the next stage load one directory;
- ``run_retriever``: the tool search's model tuned on the train clusters' clauses
  (``robust_train.retriever``), for a generator that reads search hits of a wording it never saw;
- ``evaluate_generator``: greedy answers to every variant and the robustness table
  (``robust_train.evaluation``);
- ``run_demo``: all of it on the built-in library, small enough for a 2-core machine
  (``resilibench robust demo``).

ScPO itself is ``robust_train.scpo.run_scpo``.

A finished stage is reused only when its inputs are the ones recorded in its ``stage.json`` (the input
model's content digest, the clusters' digest, the settings); other inputs are refused with the
difference (``ConfigChanged``), so a rerun never returns a model trained on something else.
"""

from __future__ import annotations

__all__ = [
    "MODEL", "STAGE_FILE", "stage_directory", "reuse_stage", "record_stage", "sft_rows", "run_sft", "run_retriever",
    "rows_too_long",
    "generator_corpus", "build_generator", "evaluate_generator", "DemoSettings", "check_demo_sizes", "demo_clusters",
    "run_demo", "demo_summary",
]

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigError, RunDirectoryError
from resilibench.results import run_metadata, write_json_atomic
from resilibench.rundir import RunDirectory
from resilibench.settings import AT_LEAST_ONE, Settings, setting

from ..core.tasks.wording import WORDINGS
from ..core.text.toolbox import search_method
from .clusters import ClusterRecord, clusters_digest
from .evaluation import (
    RobustnessTable,
    baseline_tables,
    format_tables,
    generate_answers,
    robustness_table,
)
from .generator import ANSWER_FORMS, GeneratorFormat
from .retriever import RetrieverSettings
from .scpo import ScPOSettings, run_scpo
from .training import PreferenceSettings, SFTSettings, json_digest, model_digest

# The demo's generator and its training (docs/robust_train/generation.md, "The demo", says why these).
HIDDEN, LAYERS = 128, 2
MAX_NEW_TOKENS = 32  # a names answer: up to 15 tools and their line breaks, then the end token
PRETRAIN = SFTSettings(epochs=24.0, learning_rate=3e-3, batch_size=16, gradient_accumulation_steps=1, lora=None,
                       max_length=256, save_steps=500, prompt_loss=True)
SFT = SFTSettings(epochs=5.0, learning_rate=1e-3, batch_size=16, gradient_accumulation_steps=1, lora=None,
                  max_length=256, save_steps=500)

# ScPO on the fresh clusters: every weight against a frozen copy of M_t (a LoRA adapter at RobustFlow's
# learning rate moved this generator too little to matter; generation.md, "What the ScPO stage needed").
SCPO = ScPOSettings(iterations=2, max_new_tokens=MAX_NEW_TOKENS, clusters_per_batch=32, batch_size=128,
                    preference=PreferenceSettings(batch_size=8, gradient_accumulation_steps=1, max_length=256,
                                                  lora=None))
RETRIEVER = RetrieverSettings()  # one epoch: the held-out clauses' first hits stop improving after it

MODEL = "model"  # the directory name of a stage's resulting model
STAGE_FILE = "stage.json"  # a stage's recorded inputs


def stage_directory(directory: Path, inputs: dict[str, Any], **files: Any) -> RunDirectory:
    """The RunDirectory of a stage: ``stage.json`` records its inputs (other inputs: ``ConfigChanged``)."""
    return RunDirectory(directory, inputs, summary=None, meta=STAGE_FILE,
                        restart="use another output directory, or delete it to start over", **files)


def reuse_stage(directory: Path, finished: bool, inputs: dict[str, Any]) -> bool:
    """Whether the finished stage in ``directory`` can be reused for ``inputs``; False when the stage has yet
    to run (or to finish). Raises ``ConfigChanged`` with the differences when the recorded inputs are
    others, ``RunDirectoryError`` when a finished stage has no record."""
    run = stage_directory(directory, inputs)
    if run.meta_path is not None and run.meta_path.is_file():
        run.check()
        return finished
    if finished:
        raise RunDirectoryError(f"{directory} holds a finished stage whose inputs were not recorded; use another "
                                "output directory, or delete it to start over")
    return False


def record_stage(directory: Path, inputs: dict[str, Any]) -> None:
    """Record a stage's inputs in ``directory/stage.json`` (checked by ``reuse_stage``)."""
    stage_directory(directory, inputs).write_meta(run_metadata(inputs, None))


def sft_rows(records: Sequence[ClusterRecord], fmt: GeneratorFormat, originals_only: bool = False
             ) -> list[dict[str, Any]]:
    """Prompt-completion rows: each variant's instruction (or only the original's) as a training prompt
    (``GeneratorFormat.user``) with the cluster's reference workflow as the answer."""
    fmt.prepare(v.text for record in records for v in record.variants)
    return [{"prompt": fmt.messages(v.text, training=True),
             "completion": [{"role": "assistant", "content": fmt.answer_text(record.reference)}]}
            for record in records for v in (record.variants[:1] if originals_only else record.variants)]


def run_sft(model_dir: str | Path, records: Sequence[ClusterRecord], output_dir: str | Path,
            settings: SFTSettings | None = None, fmt: GeneratorFormat | None = None, *,
            originals_only: bool = False, progress: bool = True) -> Path:
    """Fine-tune ``model_dir`` on the clusters; returns ``output_dir/model`` (the adapter merged in, or
    the fully fine-tuned model). Resumes an interrupted run; returns at once when it is done with the
    same inputs (model, clusters, format, settings), and refuses other inputs (``ConfigChanged``)."""
    from .training import train_sft, trained_model

    settings, fmt = settings or SFTSettings(), fmt or GeneratorFormat()
    output_dir = Path(output_dir)
    inputs = {"stage": "sft", "model_sha256": model_digest(model_dir), "clusters_sha256": clusters_digest(records),
              "originals_only": originals_only, "format": fmt.to_dict(), "settings": asdict(settings)}
    if reuse_stage(output_dir, (output_dir / MODEL).is_dir(), inputs):
        return output_dir / MODEL
    record_stage(output_dir, inputs)
    result = train_sft(model_dir, sft_rows(records, fmt, originals_only), output_dir / "train", settings,
                       progress=progress)
    return trained_model(model_dir, result, settings.lora, output_dir / MODEL)


def run_retriever(records: Sequence[ClusterRecord], output_dir: str | Path,
                  settings: RetrieverSettings | None = None, *, progress: bool = True) -> Path:
    """Tune the search's model on the clauses of ``records`` (every variant); returns ``output_dir/model``.
    Returns at once when it is done with the same inputs and refuses others (``ConfigChanged``); an
    interrupted run starts over (it takes minutes)."""
    from .retriever import clause_tools, train_retriever

    settings, output_dir = settings or RetrieverSettings(), Path(output_dir)
    inputs = {"stage": "retriever", "clusters_sha256": clusters_digest(records), "settings": asdict(settings)}
    if reuse_stage(output_dir, (output_dir / MODEL).is_dir(), inputs):
        return output_dir / MODEL
    record_stage(output_dir, inputs)
    return train_retriever(clause_tools(records), output_dir / MODEL, settings, progress=progress)


def generator_corpus(records: Sequence[ClusterRecord], fmt: GeneratorFormat) -> list[str]:
    """The text a from-scratch generator's tokenizer learns: the system line, every variant's
    instruction (with its search hits when the format shows them) and every reference answer."""
    fmt.prepare(v.text for r in records for v in r.variants)
    return [fmt.system, *(fmt.user(v.text) for r in records for v in r.variants),
            *(fmt.answer_text(r.reference) for r in records)]


def build_generator(directory: str | Path, records: Sequence[ClusterRecord], fmt: GeneratorFormat, *,
                    hidden_size: int = 128, num_layers: int = 4, num_heads: int = 4, vocab_size: int = 2048,
                    seed: int = 0) -> Path:
    """A random generator whose tokenizer is trained on the clusters (tool names are single tokens);
    returns ``directory`` (built once; another corpus or size is refused with ``ConfigChanged``). For the
    names answer its decoding is constrained to the tool names, the line break and the end token."""
    from ..core.registry import default_registry
    from .scratch import build_causal_lm

    directory = Path(directory)
    corpus = generator_corpus(records, fmt)
    inputs = {"stage": "scratch", "corpus_sha256": json_digest(corpus),
              "hidden_size": hidden_size, "num_layers": num_layers, "num_heads": num_heads,
              "vocab_size": vocab_size, "seed": seed, "answer": fmt.answer}
    if reuse_stage(directory, (directory / "config.json").exists(), inputs):
        return directory
    tmp = directory.with_name(directory.name + ".tmp")
    build_causal_lm(tmp, corpus, seed=seed, hidden_size=hidden_size,
                    num_layers=num_layers, num_heads=num_heads, vocab_size=vocab_size, max_positions=1024,
                    extra_tokens=default_registry().names,
                    answer_texts=[*default_registry().names, "\n"] if fmt.answer == "names" else None)
    record_stage(tmp, inputs)
    tmp.rename(directory)
    return directory


def rows_too_long(model_dir: str | Path, rows: Sequence[dict[str, Any]], max_length: int) -> int:
    """How many prompt-completion ``rows`` (``sft_rows``) the tokenizer in ``model_dir`` writes in more
    than ``max_length`` tokens: the trainer cuts them, their answers first."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = [tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False) for row in rows]
    return sum(len(ids) > max_length for ids in tokenizer(texts)["input_ids"])


def evaluate_generator(model_dir: str | Path, records: Sequence[ClusterRecord], output_dir: str | Path,
                       fmt: GeneratorFormat | None = None, *, max_new_tokens: int = 256,
                       batch_size: int = 64, progress: bool = True) -> RobustnessTable:
    """Greedy answers of the generator in ``model_dir`` to every variant (``answers.jsonl``) and its
    robustness table (``table.json``) in ``output_dir``; both reused when present for the same model,
    clusters, format and answer length (others are refused with ``ConfigChanged``)."""
    from .scpo import sampling_backend

    fmt = fmt or GeneratorFormat()
    output_dir = Path(output_dir)
    inputs = {"stage": "evaluation", "model_sha256": model_digest(model_dir),
              "clusters_sha256": clusters_digest(records), "format": fmt.to_dict(), "max_new_tokens": max_new_tokens}
    if reuse_stage(output_dir, (output_dir / "table.json").exists(), inputs):
        return RobustnessTable.from_dict(json.loads((output_dir / "table.json").read_text()))
    run = stage_directory(output_dir, inputs, key=("cluster_id",), results="answers.jsonl")
    with run.session():
        run.write_meta(run_metadata(inputs, None))
        backend = sampling_backend(Path(model_dir), batch_size)
        answers = generate_answers(backend, records, fmt, run, max_new_tokens=max_new_tokens, progress=progress)
        table = robustness_table(records, answers, fmt)
        write_json_atomic(output_dir / "table.json", table.to_dict())
    return table


@dataclass(frozen=True)
class DemoSettings(Settings):
    """The demo's sizes, chosen to finish within 40 minutes on 2 idle cores (``docs/robust_train/generation.md``
    gives the measured times)."""

    train_clusters: int = setting(400, bounds=AT_LEAST_ONE, metavar="N", help="clusters for SFT")
    test_clusters: int = setting(120, bounds=AT_LEAST_ONE, metavar="N", help="clusters for the table")
    pretrain_tasks: int = setting(2000, bounds=AT_LEAST_ONE, metavar="N", help="original instructions for the base")
    scpo_clusters: int = setting(800, bounds=AT_LEAST_ONE, metavar="N", help="clusters of train tasks that no "
                                 "earlier stage saw, for ScPO (no reference answer is used)")
    wording: str = setting("shared", choices=WORDINGS, help="held_out: test descriptions worded in phrase-bank "
                           "clauses no train task uses (core.tasks.wording)")
    search_hits: int = setting(0, bounds=(0, None), metavar="K", help="show the generator the K best tool "
                               "search hits of each clause of its instruction (GeneratorFormat.search_hits; 0: none)")
    search_hits_only: bool = setting(False, help="show the generator the search hits instead of the instruction")
    search_scores: bool = setting(False, help="show each search hit's relevance after it (GeneratorFormat.search_scores)")
    search_hits_by_clause: bool = setting(False, help="show each clause of the instruction followed by its search "
                                          "hits (GeneratorFormat.search_hits_by_clause)")
    clause_dropout: float = setting(0.0, bounds=(0.0, 0.99), metavar="P", help="the fraction of clauses shown "
                                    "without their words in training prompts (GeneratorFormat.clause_dropout)")
    tune_retriever: bool = setting(False, help="tune the tool search's model on the train clusters' clauses and show "
                                   "the generator its hits (GeneratorFormat.search_retriever; needs search_hits)")
    seed: int = setting(0, bounds=(0, None), metavar="N", help="seed of every stage")
    answer: str = setting("names", choices=ANSWER_FORMS, help="the generator's answer form")
    hidden_size: int = setting(HIDDEN, bounds=AT_LEAST_ONE)
    num_layers: int = setting(LAYERS, bounds=AT_LEAST_ONE)
    pretrain: SFTSettings = PRETRAIN
    sft: SFTSettings = SFT
    scpo: ScPOSettings = SCPO
    max_new_tokens: int = setting(MAX_NEW_TOKENS, bounds=AT_LEAST_ONE)

    def with_max_length(self, tokens: int) -> DemoSettings:
        """These settings with every stage's training rows cut at ``tokens`` (the base, SFT and ScPO's pairs)."""
        return replace(self, pretrain=replace(self.pretrain, max_length=tokens),
                       sft=replace(self.sft, max_length=tokens),
                       scpo=replace(self.scpo, preference=replace(self.scpo.preference, max_length=tokens)))

    def to_dict(self) -> dict[str, Any]:
        """The settings as records hold them (the search hit options only when set, as in ``GeneratorFormat``)."""
        settings = asdict(self)
        if not self.search_hits:
            del settings["search_hits"], settings["search_hits_only"]
        if not self.search_scores:
            del settings["search_scores"]
        if not self.search_hits_by_clause:
            del settings["search_hits_by_clause"], settings["clause_dropout"]
        if not self.tune_retriever:
            del settings["tune_retriever"]
        return settings


def check_demo_sizes(settings: DemoSettings, train_tasks: int | None = None) -> None:
    """``ConfigError`` naming the field when the base's tasks and ScPO's fresh ones, taken one after the
    other from the train split (``train_tasks`` of them; counted when None), do not fit in it."""
    if train_tasks is None:
        from ..core.world import load_tasks

        train_tasks = len(load_tasks(split="train"))
    if settings.pretrain_tasks + settings.scpo_clusters > train_tasks:
        raise ConfigError("DemoSettings.scpo_clusters", f"DemoSettings.pretrain_tasks + scpo_clusters must be at "
                          f"most the {train_tasks} train tasks, got {settings.pretrain_tasks} + "
                          f"{settings.scpo_clusters}")


def demo_clusters(output_dir: Path, settings: DemoSettings) -> tuple[tuple[ClusterRecord, ...], ...]:
    """The demo's cluster datasets (built once, offline): train clusters for SFT, test clusters for the
    table, original-only records of more train tasks for the base generator, those tasks again with one
    perturbed variant each (the type cycling through the five) for SFT's rehearsal, and the clusters of
    the next ``scpo_clusters`` train tasks, which no earlier stage saw, for ScPO. ``ConfigError`` when the
    train split has too few tasks for the base and ScPO."""
    from ..core.tasks.library import interleave_task_types
    from ..core.tasks.wording import apply_wording
    from ..core.world import load_tasks
    from .clusters import write_clusters
    from .instructions import PERTURBATION_TYPES

    ordered = {split: interleave_task_types(load_tasks(split=split)) for split in ("train", "test")}
    check_demo_sizes(settings, len(ordered["train"]))

    def dataset(name: str, split: str, count: int, types: Sequence[str], start: int = 0) -> tuple[ClusterRecord, ...]:
        tasks = apply_wording(ordered[split][start:start + count], settings.wording, settings.seed)
        return write_clusters(output_dir / "clusters" / name, tasks, types=types, seed=settings.seed,
                              source={"path": "default (v1)", "sha256": None, "count": None,
                                      "wording": settings.wording}).records

    rehearsal = tuple(replace(record, variants=(record.variants[0], record.variants[1 + i % len(PERTURBATION_TYPES)]))
                      for i, record in enumerate(dataset("rehearsal", "train", settings.pretrain_tasks,
                                                         PERTURBATION_TYPES)))
    return (dataset("train", "train", settings.train_clusters, PERTURBATION_TYPES),
            dataset("test", "test", settings.test_clusters, PERTURBATION_TYPES),
            dataset("pretrain", "train", settings.pretrain_tasks, ()), rehearsal,
            dataset("scpo", "train", settings.scpo_clusters, PERTURBATION_TYPES, start=settings.pretrain_tasks))


def run_demo(output_dir: str | Path, settings: DemoSettings = DemoSettings(), *, progress: bool = True,
             log: Callable[[str], None] = print) -> dict[str, RobustnessTable]:
    """Base generator from scratch -> instruction-augmented SFT -> ScPO, with the robustness table on the
    test clusters after each stage, beside the four baselines ("names", "lookup", "bow", trained on the
    SFT stage's instructions: the train clusters and the rehearsal, and "search";
    ``robust_train.evaluation``) and the 95% intervals over clusters of the mean execution score under
    noise (``demo_summary``). With ``tune_retriever``, a retriever tuned on the train clusters first
    (``run_retriever``) searches the hits the generator reads, and a fifth baseline, "search_tuned",
    searches with it. Every stage resumes from ``output_dir``; ``report.json`` records the search
    baseline's method (semantic or lexical)."""
    from .instructions import PERTURBATION_TYPES

    if settings.tune_retriever and not settings.search_hits:
        raise ConfigError("DemoSettings.tune_retriever", "DemoSettings.tune_retriever needs search_hits >= 1 "
                          "(the hits the tuned retriever searches)")
    fmt = GeneratorFormat(answer=settings.answer, search_hits=settings.search_hits,
                          search_hits_only=settings.search_hits_only, search_scores=settings.search_scores,
                          search_hits_by_clause=settings.search_hits_by_clause, clause_dropout=settings.clause_dropout)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    demo = {"stage": "demo", "demo": settings.to_dict()}
    check_demo_sizes(settings)  # sizes the split cannot hold, then other sizes: refused before anything runs
    reuse_stage(output_dir, False, demo)
    record_stage(output_dir, demo)
    write_json_atomic(output_dir / "meta.json", run_metadata({"demo": settings.to_dict()}, [settings.seed]))
    started = time.monotonic()

    def stage(name: str) -> None:
        log(f"[{(time.monotonic() - started) / 60:5.1f} min] {name}")

    stage(f"cluster datasets ({settings.wording} wording)")
    train, test, pretrain, rehearsal, fresh = demo_clusters(output_dir, settings)
    retriever = None
    if settings.tune_retriever:
        stage(f"retriever: the search's model tuned on the clauses of the {len(train)} train clusters")
        retriever = str(run_retriever(train, output_dir / "retriever", replace(RETRIEVER, seed=settings.seed),
                                      progress=progress))
        fmt = replace(fmt, search_retriever=retriever)
    if settings.search_hits:
        stage(f"search hits ({settings.search_hits} a clause) of every instruction")
        fmt.prepare(v.text for records in (train, test, pretrain, rehearsal, fresh) for r in records for v in r.variants)
    stage("generator from scratch")
    scratch = build_generator(output_dir / "scratch", train + pretrain, fmt, hidden_size=settings.hidden_size,
                              num_layers=settings.num_layers, seed=settings.seed)
    longest = max(settings.pretrain.max_length, settings.sft.max_length)
    if cut := rows_too_long(scratch, sft_rows(train + rehearsal + pretrain, fmt), longest):
        log(f"warning: {cut} training rows are longer than max_length ({longest} tokens) and are cut, their "
            "answers first (DemoSettings.with_max_length, --max-length)")
    stage(f"base generator: trained on {len(pretrain)} original instructions")
    base = run_sft(scratch, pretrain, output_dir / "base", settings.pretrain, fmt, originals_only=True,
                   progress=progress)
    tables: dict[str, RobustnessTable] = {}
    models = {"base": base}
    stage(f"SFT: {len(train)} clusters x {len(train[0].variants)} instructions, with the base's "
          f"{len(rehearsal)} tasks rehearsed (the original and one perturbed variant each)")
    models["sft"] = run_sft(base, train + rehearsal, output_dir / "sft", settings.sft, fmt, progress=progress)
    stage(f"ScPO: {settings.scpo.iterations} iteration(s) on {len(fresh)} clusters of train tasks no earlier "
          "stage saw")
    run_scpo(models["sft"], fresh, output_dir / "scpo", settings.scpo, fmt, progress=progress, log=log)
    state = json.loads((output_dir / "scpo" / "state.json").read_text())
    for step in state["iterations"][:settings.scpo.iterations]:
        models[f"scpo{step['iteration']}"] = Path(step["model"])
    for name, model in models.items():
        stage(f"evaluating {name} on {len(test)} test clusters")
        tables[name] = evaluate_generator(model, test, output_dir / "eval" / name, fmt,
                                          max_new_tokens=settings.max_new_tokens, progress=progress)
    stage("baselines")
    tables = {**baseline_tables(train + rehearsal, test, seed=settings.seed, retriever=retriever), **tables}
    stage("done")
    kinds = ("original", *PERTURBATION_TYPES)
    summary = demo_summary(tables, list(models)[-1])
    text = "\n\n".join([format_tables(tables, kinds), format_tables(tables, kinds, ("exec_ratio",)),
                         *summary["lines"]])
    (output_dir / "table.txt").write_text(text + "\n")
    write_json_atomic(output_dir / "report.json", {"settings": settings.to_dict(), "summary": summary,
                                                   "search_method": search_method(),
                                                   "tables": {name: t.to_dict() for name, t in tables.items()}})
    return tables


def demo_summary(tables: dict[str, RobustnessTable], final: str) -> dict[str, Any]:
    """What the demo is judged on: the final stage's exec ratio on the original instructions and beside
    the bag-of-words generator's under every perturbation, and each stage's mean execution score under
    noise with its 95% interval over clusters, with the final stage's paired difference from SFT."""
    from .evaluation import exec_interval, paired_interval

    rows, bow = tables[final].rows, tables["bow"].rows
    ratios = {kind: {"final": rows[kind]["exec_ratio"], "bow": bow[kind]["exec_ratio"]} for kind in rows}
    noise = {name: exec_interval(t) for name, t in tables.items() if t.cluster_exec}
    difference = paired_interval(tables[final], tables["sft"]) if final != "sft" else None
    lines = [f"{final} exec ratio on the original instructions: {ratios['original']['final']:.3f}",
             "exec ratio under each perturbation, " + final + " vs bow: " + ", ".join(
                 f"{kind} {r['final']:.3f} vs {r['bow']:.3f}" for kind, r in ratios.items() if kind != "original"),
             "mean exec under noise (95% interval over clusters): " + "; ".join(f"{n} {i}" for n, i in noise.items())]
    if difference is not None:
        lines.append(f"{final} minus sft under noise, paired over clusters: {difference}")
    return {"final": final, "exec_ratio": ratios, "noise_exec": {n: asdict(i) for n, i in noise.items()},
            "final_minus_sft": None if difference is None else asdict(difference), "lines": lines}
