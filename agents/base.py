"""The one interface every LLM backend implements (transformers, vLLM, OpenAI-compatible HTTP).

A backend turns a batch of chat conversations into one completion each. Callers batch on purpose: the
evaluation harness, the judge, ScPO sampling and the breaker loop all hand over every pending
conversation at once, which is what makes vLLM and batched transformers generation fast.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

Message = dict[str, str]  # {"role": "system" | "user" | "assistant", "content": "..."}


@dataclass(frozen=True)
class GenerationConfig:
    """Sampling settings shared by every backend; ``temperature == 0`` means greedy decoding."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


class Backend(Protocol):
    """Generates one assistant message per conversation, in the order given."""

    name: str

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]: ...
