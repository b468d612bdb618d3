"""A tiny randomly initialised Llama-style causal LM with a tokenizer trained in-process, for tests.

Nothing is downloaded: the tokenizer is a byte-level BPE trained with the ``tokenizers`` library on
ResiliBench's own text (tool names and descriptions, the protocol tags, prompt words, task
descriptions), so it encodes any string and keeps our vocabulary in few tokens. It carries a chat
template (with ``{% generation %}`` markers around assistant turns, so TRL's assistant-only losses work)
and is saved with the model in one directory that ``AutoTokenizer`` / ``AutoModelForCausalLM`` load.

    from tiny_lm import build_tiny_lm
    path = build_tiny_lm(tmp_path / "tiny")   # about a second on one core

Tiny matrices gain nothing from torch's thread pool and lose a lot to it on a busy machine; the
``torch_one_thread`` fixture (import it into a test module) runs a module's tests on one thread.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

PROTOCOL_TAGS = ("<tool_search>", "</tool_search>", "<tool_info>", "</tool_info>", "<tool_call>", "</tool_call>")


def default_corpus() -> list[str]:
    """Text the tokenizer learns from: every tool's name, schema and description as agents read it, the
    protocol and its reminder, completion phrases and a sample of task descriptions."""
    from resilibench.core.config import EvaluatorConfig
    from resilibench.core.registry import default_registry
    from resilibench.core.text.toolbox import describe_text, describe_tool
    from resilibench.core.world import load_tasks
    from resilibench.envs.text.env import REMINDER

    registry = default_registry()
    corpus = [" ".join(registry.names), REMINDER]
    for tool in registry.tools:
        corpus.append(f"{tool.name}: {tool.description}")
        corpus.append(json.dumps(tool.to_dict()))
        corpus.append(describe_text(describe_tool(tool.name, registry), 0.5))
    corpus += [
        "<tool_search>file reader writer</tool_search> <tool_info>data_processing_parser</tool_info> "
        '<tool_call>file_operations_reader {"source": "input.csv"}</tool_call>',
        "Execute the tools in the correct order. Search for appropriate tools, then call them. Reasoning:",
        "Workflow Execution Plan: 1. Execute file_operations_reader 2. Execute data_processing_parser",
        "executed successfully. failed. Error: DEPENDENCY_ERROR TIMEOUT INVALID_INPUT OPERATION_FAILED",
        "Progress: 1/3 required tools done; 7 turns left.",
        *EvaluatorConfig().completion_phrases,
    ]
    corpus += [t.description for t in load_tasks(split="train")[:200]]
    return corpus


def build_tiny_lm(directory: str | Path, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
                  num_heads: int = 4, vocab_size: int = 4096, max_positions: int = 16384,
                  initializer_range: float = 0.2, corpus: Iterable[str] | None = None) -> Path:
    """Build and save a tiny random causal LM and its tokenizer (``default_corpus`` unless ``corpus``) in
    ``directory``; returns it. Deterministic for a seed. The weights are drawn wider than a real model's
    (``initializer_range``) so that greedy outputs vary with the input instead of repeating one token."""
    from resilibench.robust_train.scratch import build_causal_lm

    return build_causal_lm(directory, corpus if corpus is not None else default_corpus(), seed=seed,
                           hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
                           vocab_size=vocab_size, max_positions=max_positions,
                           initializer_range=initializer_range, extra_tokens=PROTOCOL_TAGS)


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """Run a test module with one torch thread (restored afterwards)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
