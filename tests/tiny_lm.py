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

SPECIAL_TOKENS = ("<|pad|>", "<|begin|>", "<|end|>", "<|unk|>")
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
PROTOCOL_TAGS = ("<tool_search>", "</tool_search>", "<tool_info>", "</tool_info>", "<tool_call>", "</tool_call>")

# Roles, then the content; assistant turns wrapped in generation markers (TRL's assistant masks).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\n' }}"
    "{% if message['role'] == 'assistant' %}"
    "{% generation %}{{ message['content'] + eos_token }}{% endgeneration %}"
    "{% else %}{{ message['content'] + eos_token }}{% endif %}"
    "{{ '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def default_corpus() -> list[str]:
    """Text the tokenizer learns from: every tool's name, schema and description as agents read it, the
    protocol and its reminder, completion phrases and a sample of task descriptions."""
    from resilibench.envs.config import EvaluatorConfig
    from resilibench.envs.registry import default_registry
    from resilibench.envs.tasks import load_tasks
    from resilibench.envs.text_env import REMINDER
    from resilibench.envs.toolbox import describe_text, describe_tool

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


def build_tokenizer(corpus: Iterable[str] | None = None, vocab_size: int = 4096):
    """A ``PreTrainedTokenizerFast``: byte-level BPE trained on ``corpus`` (default: ``default_corpus``),
    with pad/bos/eos/unk, the role markers and protocol tags as single tokens, and ``CHAT_TEMPLATE``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(unk_token="<|unk|>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(list(corpus if corpus is not None else default_corpus()), trainer=trainer)
    # Role markers and tags are ordinary (non-special) tokens: decoding keeps them.
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*ROLE_TOKENS, *PROTOCOL_TAGS)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, pad_token="<|pad|>", bos_token="<|begin|>",
                                        eos_token="<|end|>", unk_token="<|unk|>", padding_side="left")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def build_tiny_lm(directory: str | Path, seed: int = 0, hidden_size: int = 32, num_layers: int = 2,
                  num_heads: int = 4, vocab_size: int = 4096, max_positions: int = 16384,
                  initializer_range: float = 0.2, corpus: Iterable[str] | None = None) -> Path:
    """Build and save a tiny random ``LlamaForCausalLM`` and its tokenizer in ``directory``; returns it.

    Deterministic for a seed. The weights are drawn wider than a real model's (``initializer_range``)
    so that greedy outputs vary with the input instead of repeating one token. The generation config
    stops at the tokenizer's end token."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    directory = Path(directory)
    tokenizer = build_tokenizer(corpus, vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_positions, tie_word_embeddings=True, initializer_range=initializer_range,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(pad_token_id=tokenizer.pad_token_id,
                                               bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def torch_one_thread() -> Iterator[None]:
    """Run a test module with one torch thread (restored afterwards)."""
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
