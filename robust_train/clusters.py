"""Semantic clusters (RobustFlow 3.2): a task, its reference workflow and its instruction variants.

A cluster dataset is a directory with ``clusters.jsonl`` (one ``ClusterRecord`` a line, written as each
cluster is built, so an interrupted build resumes where it stopped) and ``meta.json`` (the settings,
seed, task library digest and package versions). Every record carries the full task, so the file is
self-contained (a custom task library needs no second file), and the reference workflow each variant
should map to. Variants depend only on (seed, task, type, index), so adding tasks to a dataset later
gives the clusters a fresh build would give.
"""

from __future__ import annotations

__all__ = [
    "CLUSTERS_FILE", "META_FILE", "FORMAT_VERSION", "ClusterRecord", "parse_types", "build_clusters",
    "clusters_path", "clusters_digest", "load_clusters", "WriteResult", "write_clusters",
]

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.errors import RunDirectoryError

from ..core.tasks.library import Task
from ..core.workflow import Workflow
from .instructions import (
    LLM_TYPES,
    ORIGINAL,
    PERTURBATION_TYPES,
    InstructionPerturber,
    InstructionRequest,
    Variant,
    original_variant,
    rule_variant,
    variant_rng,
)

CLUSTERS_FILE = "clusters.jsonl"
META_FILE = "meta.json"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class ClusterRecord:
    """One semantic cluster: ``cluster_id`` (the task's instance id), the task, its reference workflow,
    and its variants, the original first (variant 0)."""

    cluster_id: str
    task: Task
    reference: Workflow
    variants: tuple[Variant, ...]

    def variants_of(self, perturbation: str) -> tuple[Variant, ...]:
        """The variants of one perturbation type ("original" included), in index order."""
        return tuple(v for v in self.variants if v.perturbation == perturbation)

    def to_dict(self) -> dict[str, Any]:
        return {"cluster_id": self.cluster_id, "format": FORMAT_VERSION, "task": self.task.to_dict(),
                "reference": self.reference.to_dict(), "variants": [v.to_dict() for v in self.variants]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ClusterRecord:
        """A record from ``to_dict`` data; ValueError naming the cluster and the bad field."""
        if not isinstance(data, dict):
            raise ValueError(f"a cluster must be a JSON object, got {type(data).__name__}")
        missing = [k for k in ("cluster_id", "task", "reference", "variants") if k not in data]
        if missing:
            raise ValueError(f"cluster is missing field(s) {missing}; a line of {CLUSTERS_FILE} holds "
                             "cluster_id, task, reference and variants")
        where = f"cluster {data['cluster_id']!r}"
        if data.get("format", FORMAT_VERSION) != FORMAT_VERSION:
            raise ValueError(f"{where}: format {data.get('format')!r} is not {FORMAT_VERSION}")
        try:
            task = Task.from_dict(data["task"])
            reference = Workflow.from_dict(data["reference"])
            if not isinstance(data["variants"], list):
                raise ValueError("variants must be a list")
            variants = tuple(Variant.from_dict(v) for v in data["variants"])
        except (ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{where}: {exc}") from None
        if task.instance_id != data["cluster_id"]:
            raise ValueError(f"{where}: its task is {task.instance_id!r}; cluster_id must be the task's instance_id")
        if not variants or variants[0].perturbation != ORIGINAL:
            raise ValueError(f"{where}: variant 0 must be the original")
        return cls(data["cluster_id"], task, reference, variants)


def parse_types(text: str | Sequence[str]) -> tuple[str, ...]:
    """Perturbation types from "paraphrase,noise_heavy" (or a list; an empty list gives original-only
    clusters), deduplicated in table order; ValueError naming the accepted values."""
    names = [t.strip() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    unknown = [t for t in names if t not in PERTURBATION_TYPES]
    if unknown or (isinstance(text, str) and not names):
        raise ValueError(f"perturbation types must be a comma-separated subset of {','.join(PERTURBATION_TYPES)}, "
                         f"got {text!r}")
    return tuple(t for t in PERTURBATION_TYPES if t in names)


def build_clusters(tasks: Iterable[Task], types: Sequence[str] = PERTURBATION_TYPES, variants_per_type: int = 1,
                   seed: int = 0, perturber: InstructionPerturber | None = None, config: Any = None,
                   batch_size: int = 32) -> Iterator[ClusterRecord]:
    """One cluster per task, in order: the original, then ``variants_per_type`` variants of each type.

    Without ``perturber`` every variant comes from the rules; with one, paraphrases and requirement
    variants come from its LLM (one generate call per round for all pending variants of ``batch_size``
    tasks) and noise from the rules. ``config`` (a WorldConfig) sets the reference workflow."""
    from ..core.bounds import reference_workflow

    types = parse_types(types)
    if variants_per_type < 1:
        raise ValueError(f"variants_per_type must be >= 1, got {variants_per_type}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    size = batch_size if perturber is not None else 1  # only LLM calls gain from batching
    batch: list[tuple[Task, Workflow]] = []
    for task in tasks:
        batch.append((task, reference_workflow(task, config)))
        if len(batch) >= size:
            yield from _build_batch(batch, types, variants_per_type, seed, perturber)
            batch = []
    if batch:
        yield from _build_batch(batch, types, variants_per_type, seed, perturber)


def _build_batch(batch: Sequence[tuple[Task, Workflow]], types: Sequence[str], variants_per_type: int, seed: int,
                 perturber: InstructionPerturber | None) -> Iterator[ClusterRecord]:
    slots = [(task, reference, kind, i) for task, reference in batch for kind in types for i in range(variants_per_type)]
    llm = [s for s in slots if perturber is not None and s[2] in LLM_TYPES]
    made: dict[tuple[str, str, int], Variant] = {}
    if llm and perturber is not None:
        requests = [InstructionRequest(task, reference, kind, i, variant_rng(seed, task.instance_id, kind, i))
                    for task, reference, kind, i in llm]
        for (task, _, kind, i), variant in zip(llm, perturber.perturb(requests), strict=True):
            made[(task.instance_id, kind, i)] = variant
    for task, reference in batch:
        variants = [original_variant(task)]
        for kind in types:
            for i in range(variants_per_type):
                variant = made.get((task.instance_id, kind, i))
                if variant is None:
                    variant = rule_variant(task, reference, kind, variant_rng(seed, task.instance_id, kind, i), i)
                variants.append(variant)
        yield ClusterRecord(task.instance_id, task, reference, tuple(variants))


# --- files --------------------------------------------------------------------------------------------


def clusters_path(path: str | Path) -> Path:
    """``path`` itself when it names a file, else ``path/clusters.jsonl``."""
    path = Path(path)
    return path / CLUSTERS_FILE if path.is_dir() or not path.suffix else path


def clusters_digest(records: Sequence[ClusterRecord]) -> str:
    """sha256 (first ``training.DIGEST_CHARS``) of the cluster records, in order."""
    from .training import json_digest

    return json_digest([r.to_dict() for r in records])


def load_clusters(path: str | Path) -> list[ClusterRecord]:
    """The clusters of a dataset directory (or of a clusters.jsonl file), in file order, the first record
    of each cluster id kept; FileNotFoundError or ValueError with the path and the problem."""
    from resilibench.results import read_jsonl

    file = clusters_path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no cluster dataset here (build one with `resilibench robust clusters "
                                "--output-dir DIR`)")
    contents = read_jsonl(file)
    records: dict[str, ClusterRecord] = {}
    for number, row in enumerate(contents.rows, 1):
        try:
            record = ClusterRecord.from_dict(row)
        except ValueError as exc:
            raise ValueError(f"{file}: record {number}: {exc}") from None
        records.setdefault(record.cluster_id, record)
    if not records:
        raise ValueError(f"{file}: the file holds no clusters")
    return list(records.values())


@dataclass(frozen=True)
class WriteResult:
    """What ``write_clusters`` did: the dataset's clusters file, the clusters of the tasks asked for (in
    their order), how many of them were built now and how many were found in the file."""

    path: Path
    records: tuple[ClusterRecord, ...]
    built: int
    found: int


def write_clusters(directory: str | Path, tasks: Sequence[Task], *, types: Sequence[str] = PERTURBATION_TYPES,
                   variants_per_type: int = 1, seed: int = 0, perturber: InstructionPerturber | None = None,
                   config: Any = None, source: dict[str, Any] | None = None, selection: dict[str, Any] | None = None,
                   resume: bool = True, batch_size: int = 32, on_start: Callable[[int], None] | None = None,
                   on_record: Callable[[ClusterRecord], None] | None = None) -> WriteResult:
    """Build the clusters of ``tasks`` that ``directory/clusters.jsonl`` lacks and append them one by
    one, then write ``meta.json``. A directory built with other settings, world config or task library
    (``source``: ``cli.load_library``'s description, with the wording option ``core.tasks.wording``
    under "wording"; default "in-memory", no digest, shared wording) is refused with
    ``errors.ConfigChanged``, a task whose stored copy differs with ``errors.RunDirectoryError``;
    ``resume=False`` starts afresh. The directory is locked while building (``rundir.RunDirectory``).
    ``selection`` (split, limits) is recorded but may differ between runs: each cluster depends only on
    its task and the settings. ``on_start`` is told how many clusters will be built, ``on_record`` gets
    each as it is written (progress bars). The result lists the clusters of ``tasks`` in their order."""
    from resilibench.results import run_metadata
    from resilibench.rundir import RunDirectory

    from ..core.config import WorldConfig

    types = parse_types(types)
    world = (config or WorldConfig()).to_dict()
    source = {"wording": "shared", **(source or {"path": "in-memory", "sha256": None, "count": None})}
    settings = {"types": list(types), "variants_per_type": variants_per_type, "seed": seed,
                "llm": perturber.settings if perturber is not None else None, "wording": source["wording"]}
    run_config = {"world": world, "tasks": source, "clusters": settings, "selection": selection or {}}
    run = RunDirectory(directory, {"world": world, "tasks_sha256": source["sha256"], "clusters": settings},
                       key=("cluster_id",), results=CLUSTERS_FILE, summary=None, meta=META_FILE)
    with run.session(resume):
        existing: dict[str, ClusterRecord] = {}
        for number, row in enumerate(run.existing.rows, 1):
            try:
                record = ClusterRecord.from_dict(row)
            except ValueError as exc:
                raise RunDirectoryError(f"{run.path}: {CLUSTERS_FILE} record {number}: {exc}; use another "
                                        "directory, or start afresh without resuming") from None
            existing.setdefault(record.cluster_id, record)
        tasks = list({t.instance_id: t for t in tasks}.values())
        for task in tasks:
            if task.instance_id in existing and existing[task.instance_id].task != task:
                raise RunDirectoryError(f"{run.path}: cluster {task.instance_id!r} in {CLUSTERS_FILE} was built from "
                                        "a different version of that task; use another directory, or start afresh "
                                        "without resuming")
        todo = [t for t in tasks if t.instance_id not in existing]
        built: list[ClusterRecord] = []
        metadata = run_metadata(run_config, [seed])
        if on_start is not None:
            on_start(len(todo))
        if todo or not run.results_path.exists():
            run.write_meta(metadata)
            run.open_results(metadata)
            for record in build_clusters(todo, types, variants_per_type, seed, perturber, config, batch_size):
                run.write(record.to_dict())
                built.append(record)
                if on_record is not None:
                    on_record(record)
        by_id = existing | {r.cluster_id: r for r in built}
        found = sum(1 for t in tasks if t.instance_id in existing)
        run.write_meta({**metadata, "files": {"clusters": CLUSTERS_FILE},
                        "counts": {"clusters_in_file": len(by_id), "selected": len(tasks), "built_now": len(built)}})
    return WriteResult(run.results_path, tuple(by_id[t.instance_id] for t in tasks), len(built), found)
