"""Fixtures of the training tests."""

from pathlib import Path

import pytest
from tiny_lm import build_tiny_lm


@pytest.fixture(scope="module")
def tool_calling_lm(tmp_path_factory) -> Path:
    """A tiny random Llama whose tokenizer carries TRL's Qwen2.5 tool-calling chat template."""
    pytest.importorskip("trl")
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    path = build_tiny_lm(tmp_path_factory.mktemp("tiny") / "model")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = qwen2_5_chat_template
    tokenizer.save_pretrained(path)
    return path
