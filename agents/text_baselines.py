"""Two text-only baselines of the text protocol, which read nothing but the conversation, and an expert
that searches as one of them does.

* ``NameReadingTextAgent`` (``scripted:names``): calls the tool names written in the task text (any
  spelling: ``network_fetcher``, "network fetcher", an alias), in order of appearance. On world v0,
  whose descriptions name their tools, it does about as well as a good planner; on world v1 it finds
  nothing to call. It is the "copy" baseline a baseline-prompt result must beat.
* ``SearchTextAgent`` (``scripted:search``): finds tools from the description alone. Its first messages
  send one ``<tool_search>`` per sentence or clause of the task text (the first sentence, which says what
  the job is, aside), as many per message as the env answers; for each query it keeps the best hit not
  already chosen, when the hit's relevance reaches ``min_relevance``; then it calls the chosen tools in
  the order of the text.

Both execute their plan the same way: the first planned tool that has not succeeded and has calls
left, retried on failure, with a dependency that the feedback names as unmet called first; then
"Task completed.".

* ``SearchingOptimalTextAgent`` (``scripted:search-optimal``): sends ``scripted:search``'s searches,
  then plays the optimal policy of bound (iii) (it reads the episode, so it is an expert, not a
  baseline). Its transcripts show each right tool next to the search results it can be read from: a
  warm start's teacher for tasks whose tool sets the student has never seen.
"""

from __future__ import annotations

__all__ = [
    "MAX_CALLS_PER_TOOL", "MAX_SEARCHES", "task_text", "clauses", "next_message", "NameReadingTextAgent",
    "SearchTextAgent", "SearchingOptimalTextAgent",
]

import math
import re
from collections import Counter
from collections.abc import Sequence

from resilibench.llm import Message

from ..core.registry import ToolRegistry, default_registry, named_tools
from ..core.text.toolbox import UnknownToolError, resolve_tool
from ..envs.text.env import MAX_REQUESTS
from .scripted import COMPLETION_MESSAGE, Batch, OptimalTextAgent, call_message, episode_of

MAX_CALLS_PER_TOOL = 4  # the default task's cap (1 + max_retries)
MAX_SEARCHES = 10  # searches in all
_TASK = re.compile(r"^Task:\s*(.*?)(?:\n\s*\n(?:Input Data|Expected Output|Tool Search)|\Z)", re.S | re.M)
_CLAUSE_SPLIT = re.compile(r"(?<=[.;:])\s+|\n+")
_LEADING = re.compile(r"^(?:\d+\.\s*|(?:first|then|next|after that|once that is done|finally|last|lastly|to begin|"
                      r"to finish|begin|start by(?: making sure to)?|and finally|and|the job must|steps)\b[,:]?\s*)+",
                      re.I)
_CALLED = re.compile(r"^<tool_call>\s*(\w+)", re.M)
_SUCCEEDED = re.compile(r"^(\w+) executed successfully", re.M)
_FAILED = re.compile(r"^(\w+) failed\.", re.M)
_UNMET = re.compile(r"^- (\w+) must succeed first", re.M)
_RESULTS = re.compile(r"^Tool search results for ", re.M)
_HIT = re.compile(r"^\d+\. (\w+)$")
_RELEVANCE = re.compile(r"^\s+Relevance: ([0-9.]+)$")


def task_text(prompt: str) -> str:
    """The task's description in a prompt (the text after "Task:"), or the whole prompt."""
    m = _TASK.search(prompt)
    return m.group(1).strip() if m else prompt


def clauses(text: str) -> list[str]:
    """The sentences and clauses of a description, without their leading connectives and list numbers."""
    out = []
    for part in _CLAUSE_SPLIT.split(text):
        part = _LEADING.sub("", part.strip()).strip(" .;:")
        if len(part.split()) >= 2:
            out.append(part)
    return out


def next_message(plan: Sequence[str], conversation: Sequence[Message], start: int) -> str:
    """The next message that executes ``plan`` given the feedback from message ``start`` on."""
    succeeded: set[str] = set()
    calls: Counter[str] = Counter()
    blocked_by: dict[str, list[str]] = {}
    for message in conversation[start:]:
        text = message["content"]
        if message["role"] == "assistant":
            calls.update(_CALLED.findall(text))
        else:
            succeeded.update(_SUCCEEDED.findall(text))
            failed = _FAILED.findall(text)
            if failed:
                blocked_by[failed[0]] = _UNMET.findall(text)
    for tool in plan:
        if tool in succeeded or calls[tool] >= MAX_CALLS_PER_TOOL:
            continue
        missing = [d for d in blocked_by.get(tool, ()) if d not in succeeded and calls[d] < MAX_CALLS_PER_TOOL]
        return call_message(missing[0] if missing else tool)
    return COMPLETION_MESSAGE


class NameReadingTextAgent:
    """Calls the tool names written in the task text (module docstring)."""

    name = "scripted:names"

    def __init__(self, registry: ToolRegistry | None = None):
        self.registry = registry or default_registry()

    def plan(self, prompt: str) -> list[str]:
        names = []
        for written in named_tools(task_text(prompt), self.registry):
            try:
                names.append(self.registry.names[resolve_tool(written, self.registry)])
            except UnknownToolError:
                continue
        return list(dict.fromkeys(names))

    def respond(self, batch: Batch) -> list[str]:
        return [next_message(self.plan(conversation[0]["content"]), conversation, 1) for conversation, _ in batch]


class SearchTextAgent:
    """Finds tools with ``<tool_search>`` from the description alone (module docstring)."""

    name = "scripted:search"

    def __init__(self, min_relevance: float = 0.1):
        self.min_relevance = min_relevance

    @staticmethod
    def searches(prompt: str) -> list[str]:
        parts = clauses(task_text(prompt))
        return parts[1:MAX_SEARCHES + 1] if len(parts) > 1 else parts  # the first sentence says what the job is

    @classmethod
    def search_message(cls, conversation: Sequence[Message]) -> str | None:
        """The message of this turn's searches (as many as the env answers per message), or None once
        every search has been sent."""
        queries = cls.searches(conversation[0]["content"])
        turn = len(conversation) // 2  # assistant messages so far
        round_ = queries[turn * MAX_REQUESTS:(turn + 1) * MAX_REQUESTS]
        return "".join(f"<tool_search>{q}</tool_search>" for q in round_) or None

    def plan(self, search_feedback: str) -> list[str]:
        """The tools ``choose`` picks from the search results in ``search_feedback``."""
        results = []
        for block in _RESULTS.split(search_feedback)[1:]:
            hits, name = [], None
            for line in block.splitlines():
                if m := _HIT.match(line):
                    name = m.group(1)
                elif (m := _RELEVANCE.match(line)) and name is not None:
                    hits.append((name, float(m.group(1))))
            results.append(hits)
        return self.choose(results)

    def choose(self, results: Sequence[Sequence[tuple[str, float]]]) -> list[str]:
        """Per query's ``(name, relevance)`` hits, in order, the best hit not chosen yet whose relevance
        reaches ``min_relevance``."""
        chosen: list[str] = []
        for hits in results:
            best = next((n for n, score in hits if n not in chosen and score >= self.min_relevance), None)
            if best is not None:
                chosen.append(best)
        return chosen

    def respond(self, batch: Batch) -> list[str]:
        replies = []
        for conversation, _ in batch:
            if search := self.search_message(conversation):
                replies.append(search)
                continue
            rounds = math.ceil(len(self.searches(conversation[0]["content"])) / MAX_REQUESTS)
            feedback = "\n".join(conversation[2 * i + 2]["content"] for i in range(rounds))
            replies.append(next_message(self.plan(feedback), conversation, 2 * rounds + 1))
        return replies


class SearchingOptimalTextAgent:
    """Searches as ``scripted:search`` does, then plays the optimal policy (module docstring)."""

    name = "scripted:search-optimal"

    def respond(self, batch: Batch) -> list[str]:
        return [SearchTextAgent.search_message(conversation) or OptimalTextAgent.message(episode_of(env))
                for conversation, env in batch]
