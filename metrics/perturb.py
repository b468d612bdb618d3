"""WorkflowPerturb's controlled perturbations of golden workflows (missing, compressed and reworded steps).

Golden workflows come from the task library: each task's ``reference_workflow`` (the bound-(iii)
policy's happy path, with step texts and dependency edges). Many tasks share one golden workflow, so
``golden_workflows`` deduplicates them by canonical form and keeps which tasks map to each.

A perturbation at rate p changes k = round(p * n) of the n steps (halves rounded up, at least one;
missing and compressed steps leave at least one step):

- ``missing_steps``: k steps chosen at random are removed; each removed step's prerequisites are joined
  to its dependents, so the remaining steps keep their order (n - k steps).
- ``compressed_steps``: k merges, each joining two steps adjacent in the execution order (chosen at
  random, a merged step may absorb further neighbours) into one step whose text combines theirs
  ("A, then B") and which names no single tool (n - k steps).
- ``description_change``: the texts of k steps chosen at random are reworded by a synonym and template
  bank that keeps their meaning; tools, edges and the other steps are untouched (n steps).

Every perturbation is seeded (``perturbation_rng``) and reproducible. ``LLMPerturber`` does the same
through any ``Backend``, with WorkflowPerturb's prompts (app. A): the answer is a JSON workflow,
validated for its exact node count (and, for rewording, for exactly the requested steps changed); a
failed check is sent back with the error, up to ``attempts`` answers, after which the variant is
recorded as invalid.
"""

from __future__ import annotations

__all__ = [
    "PERTURBATIONS", "RATES", "DEFAULT_MIN_NODES", "Golden", "GoldenSet", "golden_id", "golden_workflows",
    "affected_count", "expected_node_count", "expected_score", "perturbation_rng", "Perturbation",
    "remove_steps", "merge_text", "merge_steps", "missing_steps", "compressed_steps", "description_change",
    "RULES", "perturb", "SYNONYMS", "FRAMES", "reword", "paraphrase", "FORMAT_NOTE", "PROMPTS", "ACTIONS",
    "PerturbRequest", "PerturbFormatError", "LLMPerturber", "validate_variant",
]

import hashlib
import json
import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import numpy as np

from resilibench.llm import Backend, GenerationConfig, Message, ask_until_valid

from ..core.workflow import Node, Workflow
from .alignment import execution_order

PERTURBATIONS = ("missing_steps", "compressed_steps", "description_change")
RATES = (0.1, 0.3, 0.5)
DEFAULT_MIN_NODES = 5  # WorkflowPerturb keeps golden workflows with at least 5 steps


# --- golden workflows ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Golden:
    """A distinct golden workflow and the tasks whose reference workflow it is."""

    golden_id: str
    workflow: Workflow
    task_ids: tuple[str, ...]


@dataclass(frozen=True)
class GoldenSet:
    """Distinct golden workflows of the tasks used, in order of first appearance.

    ``task_ids``: the tasks used, in order; ``examined``: tasks looked at; ``too_small``: those skipped
    for having fewer than ``min_nodes`` steps.
    """

    goldens: tuple[Golden, ...]
    task_ids: tuple[str, ...]
    examined: int
    too_small: int
    min_nodes: int

    def golden_of(self) -> dict[str, Golden]:
        """task id -> its golden workflow."""
        return {t: g for g in self.goldens for t in g.task_ids}


def golden_id(workflow: Workflow) -> str:
    """A stable id of a workflow's canonical form."""
    return "g" + hashlib.sha1(workflow.canonical_key().encode()).hexdigest()[:10]


def golden_workflows(tasks: Iterable[Any], config: Any = None, *, min_nodes: int = DEFAULT_MIN_NODES,
                     text_only: bool = False, limit: int | None = None) -> GoldenSet:
    """The golden workflows of ``tasks`` (their ``reference_workflow`` under ``config``), deduplicated.

    Tasks whose workflow has fewer than ``min_nodes`` steps are skipped; ``limit`` stops after that many
    tasks are used. ``text_only`` drops tool names, leaving steps described by text alone (the setting of
    WorkflowPerturb, whose workflows have no tools).
    """
    from ..core.bounds import reference_workflow

    if min_nodes < 1:
        raise ValueError(f"min_nodes must be >= 1, got {min_nodes}")
    members: dict[str, list[str]] = {}
    first: dict[str, Workflow] = {}
    used: list[str] = []
    examined = too_small = 0
    for task in tasks:
        if limit is not None and len(used) >= limit:
            break
        examined += 1
        workflow = reference_workflow(task, config)
        if len(workflow.nodes) < min_nodes:
            too_small += 1
            continue
        if text_only:
            workflow = Workflow(tuple(Node(None, n.label) for n in workflow.nodes), workflow.edges)
        key = golden_id(workflow)
        first.setdefault(key, workflow)
        members.setdefault(key, []).append(task.instance_id)
        used.append(task.instance_id)
    goldens = tuple(Golden(key, first[key], tuple(ids)) for key, ids in members.items())
    return GoldenSet(goldens, tuple(used), examined, too_small, min_nodes)


# --- counts and seeds ---------------------------------------------------------------------------------


def _check_kind_rate(kind: str, rate: float) -> None:
    if kind not in PERTURBATIONS:
        raise ValueError(f"perturbation kind must be one of {', '.join(PERTURBATIONS)}, got {kind!r}")
    if not 0 < rate < 1:
        raise ValueError(f"perturbation rate must be in (0, 1), got {rate!r}")


def affected_count(kind: str, n: int, rate: float) -> int:
    """k: how many of ``n`` steps a perturbation at ``rate`` changes (removed, merged away, reworded)."""
    _check_kind_rate(kind, rate)
    k = max(1, int(np.floor(rate * n + 0.5)))
    if kind != "description_change":
        if n < 2:
            raise ValueError(f"{kind} needs a workflow of at least 2 steps, got {n}")
        k = min(k, n - 1)
    return min(k, n)


def expected_node_count(kind: str, n: int, rate: float) -> int:
    """Steps a valid variant has: n - k for missing and compressed steps, n for description changes."""
    k = affected_count(kind, n, rate)
    return n if kind == "description_change" else n - k


def expected_score(kind: str, rate: float) -> float:
    """WorkflowPerturb's score of a variant: the remaining fraction 1 - p; 1 for description changes."""
    _check_kind_rate(kind, rate)
    return 1.0 if kind == "description_change" else 1.0 - rate


def perturbation_rng(seed: int, item: str, kind: str, rate: float) -> np.random.Generator:
    """The generator of one perturbation: independent streams per (seed, item, kind, rate)."""
    _check_kind_rate(kind, rate)
    return np.random.default_rng([seed, zlib.crc32(item.encode()), PERTURBATIONS.index(kind), round(rate * 1000)])


# --- rule-based perturbations -------------------------------------------------------------------------


@dataclass(frozen=True)
class Perturbation:
    """One perturbed variant. ``changed``: indices of the golden's steps it removed, merged or reworded;
    ``workflow`` is None when an LLM gave no valid variant within its attempts (``raw``: its answers,
    ``errors``: what was wrong with each)."""

    kind: str
    rate: float
    workflow: Workflow | None
    changed: tuple[int, ...]
    method: str = "rules"
    raw: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return self.workflow is not None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "rate": self.rate, "method": self.method, "valid": self.valid,
                               "changed": list(self.changed),
                               "workflow": None if self.workflow is None else self.workflow.to_dict()}
        if self.raw:
            out |= {"raw": list(self.raw), "errors": list(self.errors)}
        return out


@lru_cache(maxsize=65536)
def _remove_steps(workflow: Workflow, removed: frozenset[int]) -> Workflow:
    graph = workflow.to_networkx()
    for r in sorted(removed):
        graph.add_edges_from((p, s) for p in graph.predecessors(r) for s in graph.successors(r))
        graph.remove_node(r)
    kept = [i for i in range(len(workflow.nodes)) if i not in removed]
    index = {old: new for new, old in enumerate(kept)}
    edges = tuple(sorted((index[a], index[b]) for a, b in graph.edges))
    return Workflow(tuple(workflow.nodes[i] for i in kept), edges)


def remove_steps(workflow: Workflow, removed: Iterable[int]) -> Workflow:
    """``workflow`` without the ``removed`` steps; each removed step's prerequisites are joined to its
    dependents, so every order between remaining steps is kept (memoised: tasks share golden workflows)."""
    return _remove_steps(workflow, frozenset(removed))


def merge_text(texts: Sequence[str]) -> str:
    """The description of a merged step: its parts in order, "A, then B, then C"."""
    return ", then ".join(t.strip().rstrip(".") for t in texts)


def merge_steps(workflow: Workflow, groups: Sequence[Sequence[int]]) -> Workflow:
    """Contract each group (consecutive steps of the execution order) into one step; a group of one
    keeps its step. Edges between groups are kept, so the result stays acyclic (memoised)."""
    return _merge_steps(workflow, tuple(tuple(g) for g in groups))


@lru_cache(maxsize=65536)
def _merge_steps(workflow: Workflow, groups: tuple[tuple[int, ...], ...]) -> Workflow:
    block = {i: b for b, group in enumerate(groups) for i in group}
    if sorted(block) != list(range(len(workflow.nodes))):
        raise ValueError("merge groups must partition the workflow's steps")
    nodes = tuple(workflow.nodes[g[0]] if len(g) == 1 else Node(None, merge_text([workflow.nodes[i].label for i in g]))
                  for g in groups)
    edges = tuple(sorted({(block[a], block[b]) for a, b in workflow.edges if block[a] != block[b]}))
    return Workflow(nodes, edges)


def missing_steps(workflow: Workflow, rate: float, rng: np.random.Generator) -> Perturbation:
    """Remove k random steps (module docstring)."""
    k = affected_count("missing_steps", len(workflow.nodes), rate)
    removed = tuple(sorted(int(i) for i in rng.choice(len(workflow.nodes), size=k, replace=False)))
    return Perturbation("missing_steps", rate, remove_steps(workflow, removed), removed)


def compressed_steps(workflow: Workflow, rate: float, rng: np.random.Generator) -> Perturbation:
    """Make k random merges of execution-order neighbours (module docstring)."""
    k = affected_count("compressed_steps", len(workflow.nodes), rate)
    groups = [[i] for i in execution_order(workflow)]
    for _ in range(k):
        j = int(rng.integers(len(groups) - 1))
        groups[j:j + 2] = [groups[j] + groups[j + 1]]
    changed = tuple(sorted(i for g in groups if len(g) > 1 for i in g))
    return Perturbation("compressed_steps", rate, merge_steps(workflow, groups), changed)


def description_change(workflow: Workflow, rate: float, rng: np.random.Generator) -> Perturbation:
    """Reword the texts of k random steps with ``paraphrase`` (module docstring)."""
    k = affected_count("description_change", len(workflow.nodes), rate)
    chosen = tuple(sorted(int(i) for i in rng.choice(len(workflow.nodes), size=k, replace=False)))
    nodes = list(workflow.nodes)
    for i in chosen:
        node = nodes[i]
        nodes[i] = Node(node.tool, paraphrase(node.label if node.text else node.label.replace("_", " "), rng),
                        node.params)
    return Perturbation("description_change", rate, Workflow(tuple(nodes), workflow.edges), chosen)


RULES = {"missing_steps": missing_steps, "compressed_steps": compressed_steps,
         "description_change": description_change}


def perturb(workflow: Workflow, kind: str, rate: float, rng: np.random.Generator) -> Perturbation:
    """The rule-based perturbation ``kind`` at ``rate``."""
    _check_kind_rate(kind, rate)
    return RULES[kind](workflow, rate, rng)


# --- rewording bank -----------------------------------------------------------------------------------

# Meaning-preserving substitutes for the words of workflow step descriptions (longest phrases first).
SYNONYMS: dict[str, tuple[str, ...]] = {
    "access credentials": ("login credentials", "access tokens"),
    "at given times": ("at set times", "on a fixed timetable"),
    "from one format or shape into another": ("into a different format or shape",),
    "between formats": ("from one format to another",),
    "read": ("load", "read in"), "retrieve": ("obtain", "pull"), "data": ("information",),
    "files": ("documents", "file contents"), "file": ("document",), "parse": ("interpret", "break down"),
    "raw": ("unprocessed",), "input": ("inputs",), "structured": ("organised", "well-defined"),
    "format": ("layout", "representation"), "transform": ("reshape", "restructure"),
    "validate": ("verify", "check"), "schema": ("specification", "expected structure"),
    "report": ("list", "flag"), "violations": ("breaches", "problems found"),
    "aggregate": ("consolidate", "gather"), "combine": ("join", "bring together"), "merge": ("unify", "fuse"),
    "records": ("entries", "rows"), "summaries": ("overviews", "summary tables"), "filter": ("screen", "sift"),
    "match": ("satisfy", "meet"), "criteria": ("conditions", "rules"), "write": ("save", "store"),
    "export": ("output", "emit"), "results": ("outcomes", "outputs"), "destination": ("target", "location"),
    "scan": ("inspect", "look through"), "directories": ("folders",), "discover": ("find", "locate"),
    "content": ("contents", "material"), "compress": ("pack", "shrink"), "decompress": ("unpack", "expand"),
    "archives": ("bundles", "archive files"), "convert": ("translate", "change"),
    "fetch": ("download", "pull down"), "remote": ("external", "distant"), "endpoint": ("address", "service"),
    "post": ("submit", "upload"), "send": ("transmit", "deliver"), "monitor": ("watch", "keep an eye on"),
    "health": ("condition", "health state"), "status": ("state",), "services": ("systems", "servers"),
    "route": ("direct", "forward"), "requests": ("calls", "queries"), "calculate": ("compute", "work out"),
    "numeric": ("numerical",), "analyze": ("examine", "study"), "compute": ("derive", "produce"),
    "statistics": ("figures", "summary measures"), "insights": ("findings", "observations"),
    "optimize": ("tune", "improve"), "parameters": ("settings", "tuning parameters"), "improve": ("raise", "better"),
    "objective": ("goal", "target metric"), "simulate": ("emulate", "run a simulation of"), "process": ("procedure",),
    "over time": ("across time", "through time"), "predict": ("forecast", "estimate"),
    "future": ("upcoming", "coming"), "values": ("quantities", "figures"), "historical": ("past", "earlier"),
    "connect": ("link", "attach"), "external": ("outside", "third-party"), "systems": ("platforms",),
    "authenticate": ("sign in", "log in"), "obtain": ("acquire", "get"), "service": ("system",),
    "map": ("translate", "align"), "fields": ("attributes", "columns"), "schemas": ("structures", "layouts"),
    "different": ("distinct", "other"), "queue": ("enqueue", "line up"), "messages": ("notifications", "events"),
    "jobs": ("tasks", "work items"), "asynchronous": ("deferred", "background"), "processing": ("handling",),
    "schedule": ("plan", "arrange"), "log": ("record", "note"), "events": ("occurrences", "happenings"),
    "auditing": ("audit purposes", "later review"), "cache": ("store", "keep"),
    "intermediate": ("interim", "partial"), "reuse": ("later use", "reusing"), "notify": ("alert", "inform"),
    "users": ("people", "operators"), "track": ("follow", "keep track of"), "progress": ("advancement",),
    "running": ("ongoing", "active"), "work": ("jobs",), "provide": ("offer", "supply"),
    "general": ("generic", "all-purpose"), "helper": ("support", "assisting"), "utilities": ("tools", "functions"),
    "network": ("networked",), "api": ("web API", "HTTP interface"),
}
# Frames around the reworded phrase; "{}" alone is the phrase as it is.
FRAMES = ("{}", "{} as the next step", "next, {}", "in this step, {}", "{} at this point")

_PATTERN = re.compile(r"\b(" + "|".join(re.escape(k) for k in sorted(SYNONYMS, key=len, reverse=True)) + r")\b",
                      re.IGNORECASE)


_ARTICLE = re.compile(r"\b([Aa]n?) (\w)")


def _agree(m: re.Match[str]) -> str:
    """"a" or "an" to suit the next word after a substitution ("a external" -> "an external")."""
    article = "an" if m.group(2).lower() in "aeiou" else "a"
    return (article.capitalize() if m.group(1)[0].isupper() else article) + " " + m.group(2)


def reword(text: str, rng: np.random.Generator) -> str:
    """``text`` with every bank word or phrase replaced by a synonym (articles agreeing), no frame."""

    def substitute(m: re.Match[str]) -> str:
        word = m.group(0)
        choice = SYNONYMS[word.lower()][int(rng.integers(len(SYNONYMS[word.lower()])))]
        return choice[0].upper() + choice[1:] if word[0].isupper() else choice

    return _ARTICLE.sub(_agree, _PATTERN.sub(substitute, text))


def paraphrase(text: str, rng: np.random.Generator) -> str:
    """A rewording of ``text`` that keeps its meaning: bank words replaced by a synonym, then a frame;
    never the text itself (a non-trivial frame is used when no word of the bank occurs)."""
    body = reword(text.strip(), rng)
    frames = FRAMES if body != text.strip() else FRAMES[1:]
    frame = frames[int(rng.integers(len(frames)))]
    if frame != "{}" and body[:1].isupper() and not body[:2].isupper():
        body = body[0].lower() + body[1:]
    return frame.format(body)


# --- LLM perturbations --------------------------------------------------------------------------------

FORMAT_NOTE = ('Answer with exactly one JSON object and nothing else: {"nodes": [{"text": "..."}, ...], '
               '"edges": [[i, j], ...]}, where [i, j] means step i must finish before step j (0-based indices '
               "into nodes).")
PROMPTS = {
    "missing_steps": ("Given the following workflow, remove exactly {k} of its {n} steps ({pct}%). Keep the "
                      "remaining steps in their order and copy their texts verbatim. Do not add or paraphrase "
                      "any content."),
    "compressed_steps": ("Given the following workflow, merge consecutive steps so that exactly {k} of its {n} "
                         "steps ({pct}%) are merged into a neighbour: the result must have exactly {m} steps. Each "
                         "merged step should concisely describe the actions of the combined steps. Copy the steps "
                         "outside the merged groups verbatim."),
    "description_change": ("Given the following workflow, paraphrase the descriptions of exactly these {k} steps "
                           "({pct}% of {n}): {which}. Keep the meaning of each paraphrased step unchanged. Do not "
                           "remove, merge or add any steps, and copy every other step verbatim."),
}
ACTIONS = {"missing_steps": "removal", "compressed_steps": "compression", "description_change": "paraphrase"}


@dataclass(frozen=True)
class PerturbRequest:
    """One perturbation to ask an LLM for; ``rng`` picks the steps to reword (description changes)."""

    workflow: Workflow
    kind: str
    rate: float
    rng: np.random.Generator


def _workflow_json(workflow: Workflow) -> str:
    return json.dumps({"nodes": [{"text": n.label} for n in workflow.nodes], "edges": [list(e) for e in workflow.edges]})


def _count_error(kind: str, got: int, expected: int, k: int, rate: float) -> str:
    verb = {"missing_steps": "removed", "compressed_steps": "merged into a neighbour",
            "description_change": "paraphrased"}[kind]
    return (f"Your output had {got} nodes instead of {expected} for a {round(rate * 100)}% {ACTIONS[kind]}. "
            f"Please regenerate the workflow and ensure that exactly {k} node{'s' if k != 1 else ''} "
            f"{'are' if k != 1 else 'is'} {verb}, leaving exactly {expected} nodes.")


class PerturbFormatError(ValueError):
    """An LLM variant that fails validation; the message is fed back to the model."""


@dataclass
class LLMPerturber:
    """WorkflowPerturb's LLM perturbations with validation and error feedback (module docstring)."""

    backend: Backend
    attempts: int = 3
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=1024, seed=0))

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")

    def messages(self, request: PerturbRequest, chosen: tuple[int, ...]) -> list[Message]:
        n = len(request.workflow.nodes)
        k = affected_count(request.kind, n, request.rate)
        text = PROMPTS[request.kind].format(k=k, n=n, m=n - k, pct=round(request.rate * 100),
                                            which=", ".join(str(i) for i in chosen))
        return [{"role": "user", "content": f"{text}\n\nWorkflow:\n{_workflow_json(request.workflow)}\n\n{FORMAT_NOTE}"}]

    def perturb(self, requests: Sequence[PerturbRequest]) -> list[Perturbation]:
        """One variant per request; every pending request goes to the backend in one call per attempt."""
        chosen = []
        for r in requests:
            _check_kind_rate(r.kind, r.rate)
            n = len(r.workflow.nodes)
            if r.kind == "description_change":
                pick = r.rng.choice(n, size=affected_count(r.kind, n, r.rate), replace=False)
                chosen.append(tuple(sorted(int(i) for i in pick)))
            else:
                chosen.append(())
        conversations = [self.messages(r, c) for r, c in zip(requests, chosen, strict=True)]
        answers = ask_until_valid(self.backend, conversations,
                                  lambda i, answer: validate_variant(requests[i], chosen[i], answer), self.attempts,
                                  self.generation, retry_message="{error}", record_backend_errors=False)
        out = []
        for r, c, got in zip(requests, chosen, answers, strict=True):
            workflow, changed = got.value or (None, c)
            out.append(Perturbation(r.kind, r.rate, workflow, changed, "llm", tuple(got.raw), tuple(got.errors)))
        return out


def _parse_workflow(answer: str) -> Workflow:
    decoder = json.JSONDecoder()
    i = answer.find("{")
    while i >= 0:
        try:
            data, _ = decoder.raw_decode(answer, i)
        except ValueError:
            i = answer.find("{", i + 1)
            continue
        if isinstance(data, dict) and "nodes" in data:
            nodes = data["nodes"]
            if not isinstance(nodes, list) or not all(isinstance(n, dict) and isinstance(n.get("text"), str)
                                                      and n["text"].strip() for n in nodes):
                raise PerturbFormatError('Every entry of "nodes" must be an object with a non-empty "text". '
                                         + FORMAT_NOTE)
            try:
                return Workflow.from_dict({"nodes": [{"text": n["text"].strip()} for n in nodes],
                                           "edges": data.get("edges", [])})
            except ValueError as exc:
                raise PerturbFormatError(f"The workflow is not valid: {exc}. {FORMAT_NOTE}") from None
        i = answer.find("{", i + 1)
    raise PerturbFormatError(f"No JSON workflow found. {FORMAT_NOTE}")


def validate_variant(request: PerturbRequest, chosen: tuple[int, ...], answer: str) -> tuple[Workflow, tuple[int, ...]]:
    """The variant in an LLM answer, checked for its exact node count and content; PerturbFormatError
    with a message for the model otherwise. Returns (variant, indices of changed golden steps)."""
    golden = request.workflow
    n = len(golden.nodes)
    k = affected_count(request.kind, n, request.rate)
    expected = expected_node_count(request.kind, n, request.rate)
    variant = _parse_workflow(answer)
    if len(variant.nodes) != expected:
        raise PerturbFormatError(_count_error(request.kind, len(variant.nodes), expected, k, request.rate))
    labels = [node.label for node in golden.nodes]
    texts = [node.text for node in variant.nodes]
    if request.kind == "description_change":
        changed = tuple(i for i in range(n) if texts[i] != labels[i])
        if changed != chosen:
            raise PerturbFormatError(f"You changed steps {list(changed)}, but exactly steps {list(chosen)} must be "
                                     "paraphrased (0-based) and every other step copied verbatim.")
        nodes = tuple(Node(g.tool, t, g.params) for g, t in zip(golden.nodes, texts, strict=True))
        return Workflow(nodes, golden.edges), changed
    if request.kind == "missing_steps":
        kept, position = [], 0
        for j, text in enumerate(texts):
            while position < n and labels[position] != text:
                position += 1
            if position == n:
                raise PerturbFormatError(f"Step {j} ({text!r}) is not a step of the original workflow copied "
                                         "verbatim in its original order. Remove steps; do not change the others.")
            kept.append(position)
            position += 1
        removed = tuple(i for i in range(n) if i not in kept)
        return remove_steps(golden, removed), removed
    # Compressed steps: a step copied verbatim keeps its tool; merged steps name none.
    by_label = {g.label: g for g in golden.nodes}
    nodes = tuple(by_label.get(t, Node(None, t)) for t in texts)
    changed = tuple(i for i in range(n) if labels[i] not in texts)
    return Workflow(nodes, variant.edges), changed
