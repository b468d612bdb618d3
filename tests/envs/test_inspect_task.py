"""The text env as an Inspect AI task: a scripted model (Inspect's mockllm, answering from the episode)
played through ``inspect_ai.eval`` meets the text env's trace, level and outcomes seed for seed; the log
holds the episodes for Inspect's viewer; infrastructure errors are unscored, apart from injected faults."""

from __future__ import annotations

import io
import json
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

inspect_ai = pytest.importorskip("inspect_ai", reason="pip install 'resilibench[frameworks]' (inspect-ai)")

from inspect_ai.log import EvalLog  # noqa: E402
from inspect_ai.model import ModelOutput, ModelUsage, get_model  # noqa: E402

from resilibench.agents.scripted import OptimalTextAgent  # noqa: E402
from resilibench.core.bounds import optimal_success  # noqa: E402
from resilibench.core.world import get_task  # noqa: E402
from resilibench.envs.text.env import ResiliBenchTextEnv  # noqa: E402
from resilibench.envs.text.inspect_task import episode_in_progress, resilibench_task  # noqa: E402


def counted(output: ModelOutput) -> ModelOutput:
    """The output with its token usage given (mockllm would count tokens with tiktoken's downloaded files)."""
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


def scripted_optimal(input, tools, tool_choice, config):  # noqa: A002 - mockllm's signature
    """The optimal policy as a model: one native tool call per message, then the completion signal."""
    env = episode_in_progress()
    message = OptimalTextAgent.message(env.episode)
    call = re.fullmatch(r"<tool_call>(\w+)</tool_call>", message)
    if call is None:
        return counted(ModelOutput.from_content(model="mockllm", content=message))
    return counted(ModelOutput.for_tool_call(model="mockllm", tool_name=call.group(1), tool_arguments={}))


def text_env_outcome(task_id, seed):
    env = ResiliBenchTextEnv(split=None)
    env.reset(seed=seed, options={"task_id": task_id})
    agent, info = OptimalTextAgent(), env.info()
    while info["level"] is None:
        _, _, _, _, info = env.step(agent.respond([(env.messages, env)])[0])
    return info


@pytest.mark.slow
def test_a_scripted_model_meets_the_text_env_and_the_log_holds_the_episodes(tmp_path):
    model = get_model("mockllm/model", custom_outputs=scripted_optimal)
    (log,) = inspect_ai.eval(resilibench_task(limit=3, seeds=[0, 1]), model=model, log_dir=str(tmp_path),
                             display="none")
    assert log.status == "success" and len(log.samples) == 6
    faults = set()
    for sample in log.samples:
        task_id, seed = sample.metadata["task_id"], sample.metadata["seed"]
        expected = text_env_outcome(task_id, seed)
        score = sample.scores["episode_level"]
        assert score.metadata["trace"] == expected["trace"] and score.answer == expected["level"]
        assert score.value == float(expected["level"] == "full_success")
        assert score.metadata["bound_iii"] == optimal_success(get_task(task_id), ResiliBenchTextEnv().config)
        calls = [c.function for m in sample.messages if m.role == "assistant" for c in (m.tool_calls or ())]
        assert calls == [r["tool"] for r in expected["trace"]]  # the episode, message by message, in the log
        faults |= set(score.metadata["faults"])
    assert faults
    with inspect_view(tmp_path) as viewer:
        check_the_viewer_serves(viewer, log)


@contextmanager
def inspect_view(log_dir: Path) -> Iterator[str]:
    """Inspect's log viewer (`inspect view`) on ``log_dir``, on a free local port: its address once it answers."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen([sys.executable, "-m", "inspect_ai", "view", "start", "--log-dir", str(log_dir),
                               "--host", "127.0.0.1", "--port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            assert server.poll() is None and time.monotonic() < deadline, server.stderr and server.stderr.read()
            try:
                urllib.request.urlopen(f"{url}/api/log-files", timeout=5)
                break
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.2)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read()


def check_the_viewer_serves(viewer: str, log: EvalLog) -> None:
    """What the viewer's page asks its server for: the listing of the log directory, then the log, as JSON
    (``/api/logs``) and as the ``.eval`` file's bytes (``/api/log-bytes``, unzipped in the browser), hold our
    episodes: each sample's score, level and tool calls as the eval returned them."""
    assert b"<html" in get(f"{viewer}/").lower()  # the viewer's page itself
    (listed,) = json.loads(get(f"{viewer}/api/log-files"))["files"]
    assert listed["task"] == "resilibench" and listed["name"].endswith(Path(log.location).name)
    quoted = urllib.parse.quote(listed["name"], safe="")
    served = json.loads(get(f"{viewer}/api/logs/{quoted}"))
    assert served["status"] == "success" and served["results"]["scores"][0]["name"] == "episode_level"

    def episodes(samples: list) -> dict:
        """(id, epoch): the score's value and level, the assistant's tool calls, the faults met."""
        return {(s["id"], s["epoch"]): (s["scores"]["episode_level"]["value"], s["scores"]["episode_level"]["answer"],
                                        [c["function"] for m in s["messages"] if m["role"] == "assistant"
                                         for c in m.get("tool_calls") or ()],
                                        s["scores"]["episode_level"]["metadata"]["faults"]) for s in samples}

    expected = episodes([s.model_dump(mode="json") for s in log.samples or ()])
    assert len(expected) == 6 and episodes(served["samples"]) == expected
    size = int(get(f"{viewer}/api/log-size/{quoted}"))
    with zipfile.ZipFile(io.BytesIO(get(f"{viewer}/api/log-bytes/{quoted}?start=0&end={size - 1}"))) as archive:
        samples = [json.loads(archive.read(n)) for n in archive.namelist() if n.startswith("samples/")]
    assert episodes(samples) == expected


@pytest.mark.slow
def test_an_environment_error_is_unscored_apart_from_faults(tmp_path):
    def broken(input, tools, tool_choice, config):  # noqa: A002
        episode_in_progress().episode = None  # the env loses its episode: it cannot go on
        return counted(ModelOutput.for_tool_call(model="mockllm", tool_name="utility_logger", tool_arguments={}))

    (log,) = inspect_ai.eval(resilibench_task(limit=2), model=get_model("mockllm/model", custom_outputs=broken),
                             log_dir=str(tmp_path), display="none", fail_on_error=False)
    assert [s.error is not None and "RuntimeError" in s.error.message for s in log.samples] == [True, True]
    assert all(not s.scores for s in log.samples)  # unscored: the harness failed, not the model
