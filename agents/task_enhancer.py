"""The optional LLM enhancement pass of task generation (paper C.2): descriptions rewritten by any backend.

An answer is accepted only when it names no tool (no name, alias, or name written with spaces), keeps
every literal of the template text (source, destinations, formats, numbers) and stays a description
(20 to 300% of the template's length). A rejected answer goes back with the reason; after ``attempts``
answers the template text is kept and the reason recorded in ``metadata["enhancement"]``. The template
text always stays in ``original_description``. A backend that fails every conversation of
``max_failed_batches`` batches in a row (a server that is down) stops the pass with ``BackendError``.
"""

from __future__ import annotations

__all__ = [
    "SYSTEM_PROMPT", "MIN_LENGTH_RATIO", "MAX_LENGTH_RATIO", "description_literals", "description_problem",
    "enhancement_messages", "TaskEnhancer",
]

import dataclasses
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from resilibench.llm import Backend, BackendError, GenerationConfig, Message, ask_until_valid, extract_answer

from ..core.registry import ToolRegistry, default_registry, named_tools
from ..core.tasks.library import Task

SYSTEM_PROMPT = (
    "You rewrite task descriptions for a benchmark of software agents. Keep the meaning, the order of the "
    "steps and every literal given (file paths, URLs, formats, numbers) exactly as written. Write natural, "
    "varied English that says what to achieve. Never name a software tool or function (no identifiers such "
    "as file_operations_reader, and no tool names written as words). Answer with the new description only, "
    "inside <answer>...</answer>."
)
_LITERAL = re.compile(r"https?://\S+?(?=[\s.,;)]*(?:\s|$))|\b[\w-]+/[\w./-]*\w|\b[A-Z]{3,}\b|\b\d+(?:\.\d+)?\b")
_LIST_MARKER = re.compile(r"^\s*\d+\.\s", re.MULTILINE)
MIN_LENGTH_RATIO, MAX_LENGTH_RATIO = 0.2, 3.0


def description_literals(text: str) -> list[str]:
    """What a rewrite must keep verbatim: URLs, paths, upper-case format names and numbers (not the numbers
    of a numbered list), in order."""
    text = _LIST_MARKER.sub("", text)
    return list(dict.fromkeys(m.group(0) for m in _LITERAL.finditer(text)))


def description_problem(original: str, text: str, registry: ToolRegistry | None = None) -> str | None:
    """Why ``text`` is not an acceptable rewrite of ``original`` (None when it is)."""
    if not text.strip():
        return "The description is empty."
    names = named_tools(text, registry)
    if names:
        return f"The description names tools ({', '.join(dict.fromkeys(names))}); describe what to achieve instead."
    missing = [x for x in description_literals(original) if x not in text]
    if missing:
        return f"These literals must appear exactly as written: {', '.join(missing)}."
    ratio = len(text) / max(len(original), 1)
    if not MIN_LENGTH_RATIO <= ratio <= MAX_LENGTH_RATIO:
        return f"The description is {ratio:.1f} times as long as the original; keep it between " \
               f"{MIN_LENGTH_RATIO} and {MAX_LENGTH_RATIO} times."
    return None


def enhancement_messages(task: Task) -> list[Message]:
    """The conversation asking for one rewrite of ``task``'s template description."""
    literals = description_literals(task.original_description or task.description)
    user = (f"Description:\n{task.original_description or task.description}\n\nLiterals to keep exactly: "
            + (" | ".join(literals) if literals else "(none)"))
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


@dataclass
class TaskEnhancer:
    """Rewrites task descriptions through ``backend``, validated (module docstring)."""

    backend: Backend
    attempts: int = 3
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=400, seed=0))
    registry: ToolRegistry = field(default_factory=default_registry)
    max_failed_batches: int = 2

    def enhance(self, tasks: Sequence[Task], batch_size: int = 32,
                on_batch: Callable[[int], Any] | None = None) -> list[Task]:
        """The tasks with enhanced descriptions, in order; ``on_batch(n)`` after each batch of n tasks.
        ``BackendError`` after ``max_failed_batches`` consecutive batches the backend failed entirely."""
        out: list[Task] = []
        failed = 0
        for start in range(0, len(tasks), batch_size):
            batch, backend_error = self._enhance_batch(list(tasks[start:start + batch_size]))
            failed = failed + 1 if backend_error else 0
            if failed >= self.max_failed_batches:
                raise BackendError(f"the backend failed {failed} batches in a row, stopped after {start + len(batch)} "
                                   f"of {len(tasks)} tasks; last: {backend_error}")
            out += batch
            if on_batch is not None:
                on_batch(len(batch))
        return out

    def _enhance_batch(self, tasks: list[Task]) -> tuple[list[Task], str | None]:
        """(the tasks of a batch enhanced, the backend's error when it answered none of them)."""
        def validate(i: int, answer: str) -> str:
            text = extract_answer(answer)
            problem = description_problem(tasks[i].original_description or tasks[i].description, text, self.registry)
            if problem:
                raise ValueError(problem)
            return text

        answers = ask_until_valid(self.backend, [enhancement_messages(t) for t in tasks], validate, self.attempts,
                                  self.generation)
        name = getattr(self.backend, "name", type(self.backend).__name__)
        out = []
        for task, got in zip(tasks, answers, strict=True):
            template = task.original_description or task.description
            if got.value is not None:
                record = {"status": "enhanced", "backend": name, "attempts": got.attempts, "errors": got.errors}
                description, llm = got.value, True
            else:
                reason = got.failure or f"no valid answer in {self.attempts} attempt(s); last: {got.errors[-1]}"
                record = {"status": "template", "backend": name, "reason": reason, "errors": got.errors}
                description, llm = template, False
            metadata = {**task.metadata, "llm_generated": llm, "enhancement": record}
            out.append(dataclasses.replace(task, description=description, original_description=template,
                                           metadata=metadata))
        silent = all(got.failure and not got.raw for got in answers)
        return out, answers[-1].failure if silent else None
