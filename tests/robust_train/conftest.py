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


@pytest.fixture(scope="module")
def cluster_records():
    """Clusters of four train tasks of one type: the original, a paraphrase and heavy noise each."""
    from resilibench.core.world import load_tasks
    from resilibench.robust_train.clusters import build_clusters

    tasks = [t for t in load_tasks(split="train") if t.task_type == "basic_file_processing"][:4]
    return list(build_clusters(tasks, types=("paraphrase", "noise_heavy"), seed=0))

