"""The one interface every LLM backend implements (transformers, vLLM, OpenAI-compatible HTTP).

A backend turns a batch of chat conversations into one completion each. Callers batch on purpose: the
evaluation harness, the judge, ScPO sampling and the breaker loop all hand over every pending
conversation at once, which is what makes vLLM and batched transformers generation fast.

Native tool calling: ``generate_with_tools(conversations, config, tools)`` offers function schemas
(OpenAI form) and returns assistant messages that may carry ``tool_calls``; conversations may then hold
assistant messages with ``tool_calls`` and ``tool`` messages (``tool_call_id``) answering them.

When some conversations of a batch fail (a timeout, a prompt longer than the model's context), a backend
raises ``PartialFailure`` with the answers it has and a ``BackendError`` in place of each failed one, so
that a caller can carry on with the rest.
"""

from __future__ import annotations

__all__ = [
    "Message", "BackendError", "InfraError", "ContextOverflowError", "RequestTimeoutError", "PartialFailure",
    "raise_failures", "GenerationConfig", "Backend", "ValidatedAnswer", "RETRY_MESSAGE", "ask_until_valid",
    "extract_answer",
]

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from resilibench.settings import Settings, setting

Message = dict[str, Any]  # {"role": "system" | "user" | "assistant" | "tool", "content": "...", ...}


class BackendError(RuntimeError):
    """A backend could not produce completions (bad server answer, exhausted retries, missing extra)."""


class InfraError(BackendError):
    """One conversation could not be answered for a reason of its own (it is too long, its request timed
    out): the harness ends that episode as an infrastructure error and goes on with the others."""


class ContextOverflowError(InfraError):
    """A conversation does not fit the model's context (prompt plus ``max_new_tokens``)."""


class RequestTimeoutError(InfraError):
    """No answer to a conversation within the request timeout."""


class PartialFailure(BackendError):
    """Some conversations of a batch failed: ``answers`` holds, in order, each conversation's answer or
    the ``BackendError`` that stopped it."""

    def __init__(self, answers: list[Any]):
        self.answers = answers
        failures = [a for a in answers if isinstance(a, BackendError)]
        super().__init__(f"{len(failures)} of {len(answers)} conversations failed; first: {failures[0]}")


def raise_failures(answers: list[Any]) -> list[Any]:
    """``answers`` as they are, or ``PartialFailure`` when one of them is a ``BackendError``."""
    if any(isinstance(a, BackendError) for a in answers):
        raise PartialFailure(answers)
    return answers


@dataclass(frozen=True)
class GenerationConfig(Settings):
    """Sampling settings shared by every backend; ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = setting(256, bounds=(1, None), metavar="N", help="tokens per answer")
    temperature: float = setting(0.0, bounds=(0, None), help="0 = greedy")
    top_p: float = setting(1.0, above=0, bounds=(None, 1), help="nucleus sampling mass")
    seed: int | None = setting(None, bounds=(0, None), flag="--generation-seed",
                             help="sampling seed (null: the backend's own)")
    stop: tuple[str, ...] = setting((), help="strings that end an answer")


class Backend(Protocol):
    """Generates one assistant message per conversation, in the order given."""

    name: str

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]: ...

    def generate_with_tools(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig,
                            tools: Sequence[dict[str, Any]]) -> list[Message]:
        """One assistant message per conversation (``content`` and, when the model called any,
        ``tool_calls`` as ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``)."""
        ...


@dataclass
class ValidatedAnswer:
    """What ``ask_until_valid`` got for one conversation: the validated value (None when no answer
    passed), every raw answer and every rejection message in order, and a backend failure message ("" when
    none)."""

    value: Any = None
    raw: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    failure: str = ""

    @property
    def attempts(self) -> int:
        return len(self.raw)


RETRY_MESSAGE = "{error} Try again."


def ask_until_valid(backend: Backend, conversations: Sequence[Sequence[Message]],
                    validate: Callable[[int, str], Any], attempts: int, generation: GenerationConfig,
                    retry_message: str = RETRY_MESSAGE, record_backend_errors: bool = True
                    ) -> list[ValidatedAnswer]:
    """Ask every conversation until ``validate(index, answer)`` accepts an answer (returns without raising
    ValueError), at most ``attempts`` rounds. All pending conversations go to the backend in one call per
    round; a rejected answer is sent back with ``retry_message`` (``{error}``: the rejection). A backend
    error stops the rounds and is recorded as each pending conversation's ``failure``, or raised when
    ``record_backend_errors`` is False."""
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    chats = [list(c) for c in conversations]
    results = [ValidatedAnswer() for _ in chats]
    pending = list(range(len(chats)))
    for _ in range(attempts):
        if not pending:
            break
        try:
            answers = backend.generate([chats[i] for i in pending], generation)
            if len(answers) != len(pending):
                raise RuntimeError(f"backend {getattr(backend, 'name', '?')} returned {len(answers)} answers "
                                   f"for {len(pending)} conversations")
        except (RuntimeError, OSError, ValueError) as exc:
            if not record_backend_errors:
                raise
            for i in pending:
                results[i].failure = f"backend error: {exc}"
            break
        still = []
        for i, answer in zip(pending, answers, strict=True):
            results[i].raw.append(answer)
            try:
                results[i].value = validate(i, answer)
            except ValueError as exc:
                results[i].errors.append(str(exc))
                chats[i] += [{"role": "assistant", "content": answer},
                             {"role": "user", "content": retry_message.format(error=exc)}]
                still.append(i)
        pending = still
    return results


_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_answer(text: str) -> str:
    """The text between the first <answer> and </answer>, stripped; ValueError saying what is missing."""
    m = _ANSWER.search(text)
    if m is None:
        missing = "</answer> is missing" if "<answer>" in text else "no <answer>...</answer> block was found"
        raise ValueError(f"The reply is malformed: {missing}.")
    return m.group(1).strip()
