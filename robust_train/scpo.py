"""Self-consistency preference optimisation (RobustFlow section 4.2) for our workflow generator.

One iteration t, starting from the generator M_t (a full model directory):

1. sample ``candidates`` (r) answers for every variant of every cluster (sampling, seeded);
2. parse and canonicalise each answer (``generator.canonical_form``); an answer that is not a workflow
   keeps its raw text as its identity and scores 0;
3. score every unique workflow: the execution score s (the exact expected full success of following it
   on the cluster's task) first, the self-consistency vote v second: ``exact`` counts identical
   canonical forms among the cluster's answers (eq. 10), ``soft`` sums the structural similarity (mean of
   node-chain F1 and reachability F1, metrics module) to every answer; both divided by |Y|;
4. sort lexicographically by (s, v) and take the extremal unique pair (eq. 12); its weight is the gap
   rho = R(w+) - R(w-) with R = s + lambda * v (eq. 11; lambda = ``vote_weight``);
5. train the pair under the prompt of every variant that produced w- (the phrasings the model got
   wrong): DPO with beta 1 plus the NLL term alpha 0.1, each example weighted by rho (eq. 13), on a new
   LoRA adapter over M_t, whose un-adapted weights are the reference model;
6. merge the adapter: M_t+1.

Everything is written as it is made (candidates per cluster as JSONL, the pairs, the adapter, the merged
model, ``state.json`` after each iteration) and a rerun resumes where the last one stopped.
"""

from __future__ import annotations

__all__ = [
    "VOTES", "PAIR_PROMPTS", "INVALID", "ScPOSettings", "Candidate", "Ranked", "judge_answer",
    "rank_candidates", "preference_pair", "pair_rows", "sample_cluster_candidates", "cluster_row",
    "rows_from_candidates", "sampling_backend", "run_scpo", "iteration_summary",
]

import json
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilibench.llm import Backend, GenerationConfig
from resilibench.results import run_metadata, write_json_atomic
from resilibench.rundir import RunDirectory
from resilibench.settings import AT_LEAST_ONE, Settings, setting

from .clusters import ClusterRecord, clusters_digest
from .generator import (
    GeneratorFormat,
    GeneratorOutputError,
    canonical_form,
    execution_score,
)
from .training import (
    PreferenceSettings,
    model_digest,
    train_preferences,
    trained_model,
)

VOTES = ("exact", "soft")
PAIR_PROMPTS = ("rejected", "all")
INVALID = "invalid:"  # the key prefix of an answer that is not a workflow


@dataclass(frozen=True)
class ScPOSettings(Settings):
    """ScPO's knobs; defaults are RobustFlow's (appendix A.4: r = 3 candidates per variant, beta 1,
    alpha 0.1, one epoch per iteration)."""

    iterations: int = setting(1, bounds=AT_LEAST_ONE, help="ScPO iterations")
    candidates: int = setting(3, bounds=AT_LEAST_ONE, metavar="R", help="answers sampled per variant")
    temperature: float = setting(1.0, above=0, reason="ScPO samples", help="sampling temperature")
    top_p: float = setting(1.0, above=0, bounds=(None, 1))
    max_new_tokens: int = setting(256, bounds=AT_LEAST_ONE, metavar="N", help="tokens per sampled answer")
    vote: str = setting("exact", choices=VOTES, help="exact: identical canonical DAGs; soft: structural similarity")
    vote_weight: float = setting(0.1, bounds=(0, None), metavar="LAMBDA", help="lambda of R = s + lambda * v")
    pair_prompts: str = setting("rejected", choices=PAIR_PROMPTS, help="the variants whose prompts carry a "
                                "cluster's pair: those that produced w-, or all")
    min_gap: float = setting(1e-9, bounds=(0, None))
    seed: int = setting(0, bounds=(0, None))
    clusters_per_batch: int = setting(8, bounds=AT_LEAST_ONE)
    batch_size: int = setting(64, bounds=AT_LEAST_ONE, help="conversations per forward pass of the sampler")
    preference: PreferenceSettings = setting(factory=PreferenceSettings)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Candidate:
    """One sampled answer: the variant it answered, its text, its identity (canonical form, or
    ``invalid:`` + the raw text), its execution score and, if it is not a workflow, why."""

    variant_id: str
    text: str
    key: str
    score: float
    error: str | None = None


@dataclass(frozen=True)
class Ranked:
    """A unique answer of a cluster with its score s, vote v (fraction of |Y|), the variants that
    produced it and one of its texts."""

    key: str
    text: str
    score: float
    vote: float
    variants: tuple[str, ...]

    def preference(self, vote_weight: float) -> float:
        """R = s + lambda * v (eq. 11)."""
        return self.score + vote_weight * self.vote


def judge_answer(record: ClusterRecord, variant_id: str, text: str, fmt: GeneratorFormat | None = None
                 ) -> Candidate:
    """Parse (in ``fmt``'s answer form, JSON by default), canonicalise and score one answer to one of the
    cluster's variants."""
    try:
        workflow = (fmt or GeneratorFormat()).parse(text)
    except GeneratorOutputError as exc:
        return Candidate(variant_id, text, f"{INVALID}{text}", 0.0, str(exc))
    return Candidate(variant_id, text, canonical_form(workflow), execution_score(record.task, workflow))


def _soft_votes(candidates: Sequence[Candidate]) -> dict[str, float]:
    """Per unique key, the summed structural similarity (mean of chain and reachability F1) to every
    candidate; answers that are not workflows have similarity 0."""
    from ..core.workflow import Workflow
    from ..metrics.structural import chain_f1, reachability_f1

    workflows = {c.key: Workflow.from_json(c.key) for c in candidates if not c.key.startswith(INVALID)}

    def similarity(a: str, b: str) -> float:
        if a not in workflows or b not in workflows:
            return float(a == b)
        return (chain_f1(workflows[a], workflows[b]).f1 + reachability_f1(workflows[a], workflows[b]).f1) / 2

    return {key: sum(similarity(key, c.key) for c in candidates) for key in dict.fromkeys(c.key for c in candidates)}


def rank_candidates(candidates: Sequence[Candidate], vote: str = "exact") -> list[Ranked]:
    """Unique answers, best first: by execution score, then by vote (lexicographic, eq. 11-12)."""
    if not candidates:
        return []
    counts = Counter(c.key for c in candidates)
    votes = _soft_votes(candidates) if vote == "soft" else counts
    ranked = []
    for key in counts:
        members = [c for c in candidates if c.key == key]
        ranked.append(Ranked(key, members[0].text, members[0].score, votes[key] / len(candidates),
                             tuple(dict.fromkeys(c.variant_id for c in members))))
    return sorted(ranked, key=lambda r: (-r.score, -r.vote, r.key))


def preference_pair(ranked: Sequence[Ranked], vote_weight: float, min_gap: float = 1e-9
                    ) -> tuple[Ranked, Ranked, float] | None:
    """The extremal pair (w+, w-) and its weight rho = R(w+) - R(w-), or None when the cluster's answers
    are all one workflow, equally good, or none of them a workflow."""
    if len(ranked) < 2 or ranked[0].key.startswith(INVALID):
        return None
    best, worst = ranked[0], ranked[-1]
    gap = best.preference(vote_weight) - worst.preference(vote_weight)
    return (best, worst, gap) if gap > min_gap else None


def pair_rows(record: ClusterRecord, best: Ranked, worst: Ranked, weight: float,
              fmt: GeneratorFormat, prompts: str = "rejected") -> list[dict[str, Any]]:
    """The DPO rows of a cluster's pair: one per variant that produced w- (``prompts="rejected"``) or per
    variant of the cluster (``"all"``), with that variant's prompt. The
    chosen answer is w+ written out cleanly (``fmt.answer_text`` of the sampled workflow, node order kept),
    so that the NLL term teaches the answer format and nothing a sample had around its answer; the
    rejected answer is the sample as it was."""
    texts = {v.variant_id: v.text for v in record.variants}
    chosen = fmt.answer_text(fmt.parse(best.text))
    return [{"prompt": fmt.messages(texts[variant_id]),
             "chosen": [{"role": "assistant", "content": chosen}],
             "rejected": [{"role": "assistant", "content": worst.text}],
             "weight": weight, "cluster_id": record.cluster_id, "variant_id": variant_id}
            for variant_id in (worst.variants if prompts == "rejected" else texts)]


def sample_cluster_candidates(backend: Backend, records: Sequence[ClusterRecord], fmt: GeneratorFormat,
                              settings: ScPOSettings, seed: int) -> list[list[Candidate]]:
    """``settings.candidates`` sampled answers to every variant of every record, in one generate call;
    judged. Returns the candidates per record."""
    fmt.prepare(v.text for record in records for v in record.variants)
    jobs = [(i, v.variant_id, fmt.messages(v.text)) for i, record in enumerate(records)
            for v in record.variants for _ in range(settings.candidates)]
    config = GenerationConfig(max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                              top_p=settings.top_p, seed=seed)
    answers = backend.generate([messages for _, _, messages in jobs], config)
    out: list[list[Candidate]] = [[] for _ in records]
    for (i, variant_id, _), text in zip(jobs, answers, strict=True):
        out[i].append(judge_answer(records[i], variant_id, text, fmt))
    return out


def cluster_row(record: ClusterRecord, candidates: Sequence[Candidate], settings: ScPOSettings) -> dict[str, Any]:
    """What an iteration keeps of a cluster: every candidate, the ranking and the chosen pair."""
    ranked = rank_candidates(candidates, settings.vote)
    pair = preference_pair(ranked, settings.vote_weight, settings.min_gap)
    return {"cluster_id": record.cluster_id, "candidates": [asdict(c) for c in candidates],
            "ranked": [asdict(r) for r in ranked],
            "pair": None if pair is None else {"chosen": asdict(pair[0]), "rejected": asdict(pair[1]),
                                               "weight": pair[2]}}


def rows_from_candidates(records: Iterable[ClusterRecord], rows: dict[str, dict[str, Any]],
                         fmt: GeneratorFormat, prompts: str = "rejected") -> list[dict[str, Any]]:
    """The DPO rows of an iteration from its per-cluster rows, in the records' order."""
    out = []
    for record in records:
        pair = rows[record.cluster_id]["pair"]
        if pair is not None:
            best, worst = Ranked(**_ranked(pair["chosen"])), Ranked(**_ranked(pair["rejected"]))
            out += pair_rows(record, best, worst, pair["weight"], fmt, prompts)
    return out


def _ranked(data: dict[str, Any]) -> dict[str, Any]:
    return {**data, "variants": tuple(data["variants"])}


def sampling_backend(model_dir: Path, batch_size: int) -> Backend:
    """vLLM when it is installed and a GPU is there; else transformers (on the GPU if there is one)."""
    import torch

    from ..agents.backends import TransformersBackend, VLLMBackend

    if torch.cuda.is_available():
        try:
            import vllm  # noqa: F401
        except ImportError:
            return TransformersBackend(model_dir, device="cuda", batch_size=batch_size)
        return VLLMBackend(model_dir)
    return TransformersBackend(model_dir, batch_size=batch_size)


def run_scpo(model_dir: str | Path, records: Sequence[ClusterRecord], output_dir: str | Path,
             settings: ScPOSettings | None = None, fmt: GeneratorFormat | None = None, *,
             make_backend: Callable[[Path], Backend] | None = None, progress: bool = True,
             log: Callable[[str], None] = print) -> Path:
    """Run ``settings.iterations`` ScPO iterations from the model in ``model_dir`` (M_0, typically the
    merged SFT model) on ``records``; returns the last model's directory. Resumes from ``output_dir``."""
    settings, fmt = settings or ScPOSettings(), fmt or GeneratorFormat()
    config = {"model": str(Path(model_dir).resolve()), "model_sha256": model_digest(model_dir),
              "settings": settings.to_dict(), "format": fmt.to_dict(),
              "clusters": [r.cluster_id for r in records], "clusters_sha256": clusters_digest(records)}
    run = RunDirectory(output_dir, config, summary=None, meta="meta.json")
    with run.session():
        run.write_meta(run_metadata(config, [settings.seed]))
        return _iterate(run, Path(model_dir), records, settings, fmt,
                        make_backend or (lambda path: sampling_backend(path, settings.batch_size)), progress, log)


def _iterate(run: RunDirectory, model: Path, records: Sequence[ClusterRecord], settings: ScPOSettings,
             fmt: GeneratorFormat, make_backend: Callable[[Path], Backend], progress: bool,
             log: Callable[[str], None]) -> Path:
    """The ScPO iterations ``run`` (its session held) lacks, from ``model`` or the last iteration's model."""
    state_path = run.path / "state.json"
    state = json.loads(state_path.read_text()) if state_path.exists() else {"iterations": []}
    model = Path(state["iterations"][-1]["model"]) if state["iterations"] else model
    for t in range(len(state["iterations"]) + 1, settings.iterations + 1):
        step = run.path / f"iter_{t:02d}"
        step.mkdir(exist_ok=True)
        writer = run.writer(f"{step.name}/candidates.jsonl")
        done = {row["cluster_id"]: row for row in writer.existing.rows}
        pending = [r for r in records if r.cluster_id not in done]
        position = {}  # a batch's sampling seed follows its first cluster's place in ``records``
        for i, record in enumerate(records):
            position.setdefault(record.cluster_id, i)
        if pending:
            backend = make_backend(model)
            with _bar(len(records), len(done), t, progress) as bar:
                for start in range(0, len(pending), settings.clusters_per_batch):
                    batch = pending[start:start + settings.clusters_per_batch]
                    seed = settings.seed + 1_000_003 * t + position[batch[0].cluster_id]
                    for record, candidates in zip(batch, sample_cluster_candidates(backend, batch, fmt, settings, seed),
                                                  strict=True):
                        row = cluster_row(record, candidates, settings)
                        writer.write(row)
                        done[record.cluster_id] = row
                    bar.update(len(batch))
            del backend
        writer.close()
        rows = rows_from_candidates(records, done, fmt, settings.pair_prompts)
        summary = iteration_summary(records, done, rows)
        log(f"iteration {t}: {summary['pairs']} pairs from {summary['clusters_with_pair']} of "
            f"{len(records)} clusters; mean candidate score {summary['mean_score']:.3f}, "
            f"valid {summary['valid']:.1%}")
        if rows:
            result = train_preferences(model, rows, step / "train", settings.preference, progress=progress)
            model = trained_model(model, result, settings.preference.lora, step / "model")
            summary["train_loss"] = result.train_loss
        state["iterations"].append({"iteration": t, "model": str(model), **summary})
        write_json_atomic(state_path, state)
    return model


def iteration_summary(records: Sequence[ClusterRecord], rows: dict[str, dict[str, Any]],
                      pairs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and means of one iteration's candidates and pairs."""
    candidates = [c for r in records for c in rows[r.cluster_id]["candidates"]]
    return {"pairs": len(pairs), "clusters_with_pair": sum(rows[r.cluster_id]["pair"] is not None for r in records),
            "mean_score": sum(c["score"] for c in candidates) / max(1, len(candidates)),
            "valid": sum(c["error"] is None for c in candidates) / max(1, len(candidates)),
            "mean_weight": sum(p["weight"] for p in pairs) / max(1, len(pairs))}


def _bar(total: int, initial: int, iteration: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=f"ScPO iteration {iteration}: sampling", unit="cluster",
                disable=not enabled, leave=False)
