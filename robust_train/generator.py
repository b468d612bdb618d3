"""The workflow generator's contract: task instruction in, a workflow of our tools out, as JSON.

A generator reads an instruction (a task description or one of its perturbed variants) and answers with
a workflow of tools in one of two forms (``GeneratorFormat.answer``): a DAG as JSON, ``{"nodes":
["file_operations_reader", ...], "edges": [[0, 1], ...]}``, or the tool names in call order, one per line
(``"names"``: the workflow is their chain, executed in that order; a short answer that a small model
learns fast). Both parse into the shared ``Workflow``. Everything the training and the evaluation need
comes from here:

- ``GeneratorFormat.messages``: the chat messages of an instruction (a system line saying the format,
  optionally the tool list for models that have not learned the tools);
- ``workflow_text``: the JSON answer the generator is taught for a workflow: tool names, the transitive
  reduction of its edges (fewest edges, the same order constraints); ``names_text`` the names answer;
  ``GeneratorFormat.answer_text`` the one of its format;
- ``parse_workflow`` / ``parse_names`` (``GeneratorFormat.parse``): the generator's answer back to a
  ``Workflow``, with a reason when it is not one;
- ``canonical_form``: the normalised DAG that ScPO counts votes on;
- ``tools_workflow``: the optimal workflow of a task for a guessed list of required tools (how the
  baselines that guess tools, bag-of-words and search, turn a guess into an answer);
- ``execution_score``: the exact expected full-success probability of following the workflow on the
  task (``core.plan_follower.workflow_success``), 0 for an answer that is not a workflow.
"""

from __future__ import annotations

__all__ = [
    "SYSTEM_PROMPT", "NAMES_PROMPT", "ANSWER_FORMS", "GeneratorFormat", "search_hints", "reduced", "workflow_text", "names_text",
    "GeneratorOutputError", "parse_workflow", "parse_names", "canonical_form", "tools_workflow", "execution_score",
]

import hashlib
import json
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache

import networkx as nx

from ..core.registry import default_registry
from ..core.tasks.library import Task, dependency_sort
from ..core.text.toolbox import ToolHit, search_method, search_tools_many
from ..core.workflow import Node, Workflow

SYSTEM_PROMPT = ('Answer with the workflow for the task as JSON: {"nodes": [tool names in call order], '
                 '"edges": [[i, j], ...] where step j needs step i}.')
NAMES_PROMPT = "Answer with the tool names of the workflow in call order, one per line."
ANSWER_FORMS = ("json", "names")


@cache
def _tool_list() -> str:
    registry = default_registry()
    return "\n".join(f"- {tool.name}: {tool.description}" for tool in registry.tools)


@dataclass(frozen=True)
class GeneratorFormat:
    """How an instruction is put to the generator and how it answers. ``answer``: ``"json"`` (a DAG) or
    ``"names"`` (tool names in call order, one per line). ``tool_list`` appends the 30 tools with their
    descriptions to the system message (for pretrained models meeting our tools for the first time; a
    generator trained on our data has learned them and saves the tokens). The search hit options are
    ``user``'s; ``search_retriever``: the directory of a retriever tuned on train instructions
    (``robust_train.retriever``) that searches the hits in place of the shipped model."""

    tool_list: bool = False
    answer: str = "json"
    search_hits: int = 0
    search_hits_only: bool = False
    search_scores: bool = False
    search_hits_by_clause: bool = False
    clause_dropout: float = 0.0
    search_retriever: str | None = None

    def __post_init__(self) -> None:
        if self.answer not in ANSWER_FORMS:
            raise ValueError(f"GeneratorFormat.answer must be one of {', '.join(ANSWER_FORMS)}, got {self.answer!r}")
        if not isinstance(self.search_hits, int) or self.search_hits < 0:
            raise ValueError(f"GeneratorFormat.search_hits must be an integer >= 0, got {self.search_hits!r}")
        if self.search_hits_only and not self.search_hits:
            raise ValueError("GeneratorFormat.search_hits_only needs search_hits >= 1 (the hits to show)")
        if self.search_scores and not self.search_hits:
            raise ValueError("GeneratorFormat.search_scores needs search_hits >= 1 (the hits to score)")
        if self.search_hits_by_clause and (not self.search_hits or self.search_hits_only):
            raise ValueError("GeneratorFormat.search_hits_by_clause needs search_hits >= 1 and not search_hits_only "
                             "(each clause is shown with its hits)")
        if not 0.0 <= self.clause_dropout < 1.0 or (self.clause_dropout and not self.search_hits_by_clause):
            raise ValueError(f"GeneratorFormat.clause_dropout must be in [0, 1) and needs search_hits_by_clause, "
                             f"got {self.clause_dropout!r}")
        if self.search_retriever is not None and not self.search_hits:
            raise ValueError("GeneratorFormat.search_retriever needs search_hits >= 1 (the hits it searches)")

    @property
    def prompt(self) -> str:
        """The line that says the answer format."""
        return NAMES_PROMPT if self.answer == "names" else SYSTEM_PROMPT

    @property
    def system(self) -> str:
        """The system message: the answer format (and the tool list when asked)."""
        return f"{self.prompt}\nTools:\n{_tool_list()}" if self.tool_list else self.prompt

    def user(self, instruction: str, *, training: bool = False) -> str:
        """The user message: the instruction, followed with ``search_hits`` by its search hits line (or
        that line alone with ``search_hits_only``); ``search_scores`` writes each hit's relevance after it.
        With ``search_hits_by_clause``, the instruction's first clause, then one line a searched clause:
        its words, ``=>``, its hits; in ``training`` prompts ``clause_dropout`` of those clauses (drawn
        from the instruction's text, the same every run) show ``_`` in place of their words, so that a
        generator learns to read the hits where the words are new to it."""
        if not self.search_hits:
            return instruction
        if self.search_hits_by_clause:
            head, searched = _search_clauses(instruction)
            groups = _hit_groups([instruction], self.search_hits, self.search_scores, self.search_retriever)[0]
            dropped = _dropped(instruction, len(searched), self.clause_dropout if training else 0.0)
            lines = [f"{'_' if i in dropped else clause} => {hits}"
                     for i, (clause, hits) in enumerate(zip(searched, groups, strict=True))]
            return "\n".join([head, *lines] if head else lines)
        hits = search_hints([instruction], self.search_hits, self.search_scores, self.search_retriever)[0]
        return hits if self.search_hits_only else f"{instruction}\n{hits}"

    def messages(self, instruction: str, *, training: bool = False) -> list[dict[str, str]]:
        """The chat messages of an instruction (``training``: a training prompt; see ``user``)."""
        return [{"role": "system", "content": self.system},
                {"role": "user", "content": self.user(instruction, training=training)}]

    def prepare(self, instructions: Iterable[str]) -> None:
        """Compute the search hits of many instructions at once (in embedding batches), so that the
        ``messages`` that follow find them ready; nothing to do without ``search_hits``."""
        if self.search_hits:
            search_hints(list(instructions), self.search_hits, self.search_scores, self.search_retriever)

    def answer_text(self, workflow: Workflow) -> str:
        """The answer the generator is taught for ``workflow`` in this format."""
        return names_text(workflow) if self.answer == "names" else workflow_text(workflow)

    def parse(self, text: str) -> Workflow:
        """The workflow of an answer in this format (``GeneratorOutputError`` when there is none)."""
        return parse_names(text) if self.answer == "names" else parse_workflow(text)

    def to_dict(self) -> dict[str, object]:
        """The format as stage records hold it; with search hits, also how they are searched (semantic or
        lexical: another method shows other hits), and without, nothing more (the records of runs without
        hits stay what they were)."""
        hits = ({"search_hits": self.search_hits, "search_hits_only": self.search_hits_only,
                 "search_method": search_method()} if self.search_hits else {})
        if self.search_scores:
            hits["search_scores"] = True
        if self.search_hits_by_clause:
            hits |= {"search_hits_by_clause": True, "clause_dropout": self.clause_dropout}
        if self.search_retriever is not None:
            from .training import model_digest

            hits["search_retriever_sha256"] = model_digest(self.search_retriever)
        return {"system": self.prompt, "tool_list": self.tool_list, "answer": self.answer, **hits}


_HITS: dict[tuple[str, int, bool, str | None], tuple[str, ...]] = {}
HINTS_BATCH = 512  # instructions searched per embedding batch (and per step of the progress bar)


def search_hints(instructions: Sequence[str], k: int, scores: bool = False, retriever: str | None = None
                 ) -> list[str]:
    """The search hits line of each instruction: for every clause the text env's ``scripted:search``
    would search (``SearchTextAgent.searches``), its ``k`` best tools by the tool search of the env
    (``search_tools_many``), clauses in the text's order: ``"Search hits: a b c | d e f"``; with
    ``scores``, each name followed by its relevance in hundredths (``"a 27 b 23"``, 0.27 and 0.23). What
    the search baseline reads, given to a generator so that it can map a wording it never saw; with
    ``retriever``, searched with that tuned model (``robust_train.retriever``); cached."""
    return ["Search hits: " + " | ".join(groups) for groups in _hit_groups(instructions, k, scores, retriever)]


def _hit_groups(instructions: Sequence[str], k: int, scores: bool, retriever: str | None = None
                ) -> list[tuple[str, ...]]:
    """Per instruction, the hits of each searched clause as text (``search_hints``' groups); cached, and
    searched in embedding batches of ``HINTS_BATCH`` instructions."""
    from tqdm.auto import tqdm

    encoder = None
    if retriever is not None:
        from .retriever import retriever_encoder

        encoder = retriever_encoder(str(retriever))
    pending = [text for text in dict.fromkeys(instructions) if (text, k, scores, retriever) not in _HITS]
    with tqdm(total=len(pending), desc="tool searches", unit="instruction", disable=len(pending) < HINTS_BATCH,
              leave=False) as bar:
        for start in range(0, len(pending), HINTS_BATCH):
            batch = pending[start:start + HINTS_BATCH]
            searched = {text: _search_clauses(text)[1] for text in batch}
            hits = iter(search_tools_many([q for text in batch for q in searched[text]], k, encoder=encoder))
            for text in batch:
                _HITS[text, k, scores, retriever] = tuple(" ".join(_hit_text(hit, scores) for hit in next(hits))
                                               for _ in searched[text])
            bar.update(len(batch))
    return [_HITS[text, k, scores, retriever] for text in instructions]


def _search_clauses(instruction: str) -> tuple[str | None, list[str]]:
    """The instruction's first clause when it is not searched (None when it is), and the clauses the
    text env's ``scripted:search`` searches (``SearchTextAgent.searches``)."""
    from ..agents.text_baselines import SearchTextAgent, clauses, task_text  # loaded when asked

    searched = SearchTextAgent.searches(instruction)
    parts = clauses(task_text(instruction))
    return (parts[0] if len(parts) > 1 else None), searched


def _dropped(instruction: str, count: int, rate: float) -> set[int]:
    """Which of an instruction's ``count`` searched clauses a training prompt shows without words: each
    with probability ``rate``, drawn from a generator seeded by the instruction's text (the same every run)."""
    if not rate:
        return set()
    rng = random.Random(hashlib.sha256(instruction.encode()).digest())
    return {i for i in range(count) if rng.random() < rate}


def _hit_text(hit: ToolHit, score: bool) -> str:
    """A hit as the hits line shows it: its name, with ``score`` then its relevance in hundredths (two
    digits, 0 to 99)."""
    return f"{hit.name} {min(99, max(0, round(hit.score * 100))):02d}" if score else hit.name


def reduced(workflow: Workflow) -> Workflow:
    """The workflow with the transitive reduction of its edges (same reachability, fewest edges)."""
    reduction = nx.transitive_reduction(workflow.to_networkx())
    return Workflow(workflow.nodes, tuple(sorted(reduction.edges)))


def workflow_text(workflow: Workflow) -> str:
    """The answer a generator is taught for ``workflow``: tool names and reduced edges as compact JSON."""
    flat = reduced(workflow)
    return json.dumps({"nodes": [n.tool for n in flat.nodes], "edges": [list(e) for e in flat.edges]})


def names_text(workflow: Workflow) -> str:
    """The names answer for ``workflow``: its tool names in node (call) order, one per line."""
    return "\n".join(n.tool or "" for n in workflow.nodes)


class GeneratorOutputError(ValueError):
    """A generator's answer that is not a workflow of known tools."""


def parse_workflow(text: str) -> Workflow:
    """The workflow in a generator's answer (the first JSON object in it). Tool aliases map to their
    names. Raises ``GeneratorOutputError`` with the reason for anything else: no JSON, not a workflow, an
    unknown tool, a bad or cyclic edge, no nodes."""
    registry = default_registry()
    start = text.find("{")
    if start < 0:
        raise GeneratorOutputError("no JSON object in the answer")
    try:
        data, _ = json.JSONDecoder().raw_decode(text[start:])
        workflow = Workflow.from_dict(data)
    except (json.JSONDecodeError, ValueError, TypeError) as exc:
        raise GeneratorOutputError(f"not a workflow: {exc}") from None
    if not workflow.nodes:
        raise GeneratorOutputError("the workflow has no nodes")
    nodes = []
    for i, node in enumerate(workflow.nodes):
        try:
            nodes.append(Node(registry.names[registry.id_of(node.tool or "")]))
        except KeyError:
            raise GeneratorOutputError(f"node {i}: unknown tool {node.tool!r}") from None
    parsed = Workflow(tuple(nodes), tuple(sorted(set(workflow.edges))))
    if not nx.is_directed_acyclic_graph(parsed.to_networkx()):
        raise GeneratorOutputError("the edges have a cycle")
    return parsed


@cache
def _names_pattern() -> re.Pattern[str]:
    names = sorted(default_registry().names, key=len, reverse=True)
    return re.compile("|".join(re.escape(n) for n in names))


def parse_names(text: str) -> Workflow:
    """The workflow of a names answer: the tool names in ``text``, in order (separators or none), as a
    chain, each step after the one before (the order a plan follower calls them in). Raises
    ``GeneratorOutputError`` when it names no tool."""
    tools = _names_pattern().findall(text)
    if not tools:
        raise GeneratorOutputError("the answer names no tool")
    return Workflow(tuple(Node(t) for t in tools), tuple((i, i + 1) for i in range(len(tools) - 1)))


def canonical_form(workflow: Workflow) -> str:
    """The normalised DAG ScPO votes on: tool names only, transitively reduced edges, canonical node
    order (``Workflow.canonical_key``)."""
    return reduced(Workflow(tuple(Node(n.tool) for n in workflow.nodes), workflow.edges)).canonical_key()


def tools_workflow(task: Task, tools: Sequence[str]) -> Workflow:
    """The optimal workflow of ``task`` with ``tools`` as its required tools (dependencies added; the
    world's own completion, ``core.bounds.reference_workflow``); tools in an order that puts one before a
    tool it depends on are first sorted by dependencies (stable)."""
    from ..core.bounds import reference_workflow

    try:
        return reference_workflow(replace(task, required_tools=tuple(tools)))
    except ValueError:  # the order contradicts a dependency: the workflow would have a cycle
        return reference_workflow(replace(task, required_tools=tuple(dependency_sort(tools))))


def execution_score(task: Task, workflow: Workflow | None) -> float:
    """The exact expected full-success probability of following ``workflow`` on ``task``; 0 for None."""
    from ..core.plan_follower import workflow_success

    return 0.0 if workflow is None else workflow_success(task, workflow)
