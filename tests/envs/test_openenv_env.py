"""The text env as an OpenEnv server: a scripted agent played through OpenEnv's own WebSocket client against
the served app (a real uvicorn server on loopback) meets the text env's trace, level and outcomes seed for
seed, sessions side by side stay apart, and infrastructure errors are recorded apart from injected faults."""

from __future__ import annotations

import importlib.util
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest

from helpers import optimal_text_outcome
from resilibench.agents.scripted import OptimalTextAgent
from resilibench.core.world import load_tasks
from resilibench.envs.real_api.service import running_service
from resilibench.envs.text.env import ResiliBenchTextEnv

if importlib.util.find_spec("openenv") is None:
    pytest.skip("pip install 'resilibench[frameworks]' (openenv)", allow_module_level=True)
pytestmark = pytest.mark.slow  # openenv is imported by the tests, not at collection (the fast lane skips them)

TASKS = load_tasks(split="test")[:4]


@pytest.fixture(scope="module")
def oe():
    from resilibench.envs.text import openenv

    return openenv


@pytest.fixture(scope="module")
def server_url(oe):
    with running_service(SimpleNamespace(app=oe.create_openenv_app(tasks=TASKS))) as url:  # type: ignore[arg-type]
        yield url


def play(oe, client, task_id, seed):
    """The optimal agent's episode through the server, beside the text env played with the same messages:
    each observation is the text env's answer; returns the last result and the text env's info."""
    reference = ResiliBenchTextEnv(split=None, tasks=TASKS)
    reference.reset(seed=seed, options={"task_id": task_id})
    result = client.reset(task_id=task_id, seed=seed)
    assert result.observation.messages == reference.messages and not result.done
    rewards = []
    while not result.done:
        message = OptimalTextAgent.message(reference.episode)
        observation, *_, info = reference.step(message)
        result = client.step(oe.ResiliBenchAction(message=message))
        assert [m["content"] for m in result.observation.messages] == [observation]
        rewards.append(result.reward)
    state = client.state()
    assert state.task_id == task_id and state.seed == seed and state.step_count == len(rewards)
    assert state.level == info["level"] and all(r == 0.0 for r in rewards[:-1])
    return result, info


def test_a_scripted_agent_meets_the_text_env_seed_for_seed(oe, server_url):
    faults = set()
    for task in TASKS:
        for seed in (0, 1, 2):
            with oe.ResiliBenchEnvClient(base_url=server_url).sync() as client:
                result, _ = play(oe, client, task.instance_id, seed)
            expected = optimal_text_outcome(task.instance_id, seed, tasks=TASKS)
            record = result.observation.metadata
            assert record["trace"] == expected["trace"] and record["level"] == expected["level"]
            assert result.reward == float(expected["level"] == "full_success")
            assert record["faults"] == [r["error_code"] for r in expected["trace"] if not r["success"]]
            assert "infrastructure_error" not in record
            faults |= set(record["faults"])
    assert faults  # the episodes met injected failures, not only successes


def test_sessions_side_by_side_stay_apart(oe, server_url):
    episodes = [(t.instance_id, s) for t in TASKS for s in (3, 4)]
    with ThreadPoolExecutor(len(episodes)) as pool:
        results = list(pool.map(lambda e: play_session(oe, server_url, *e), episodes))
    for (result, info), (task_id, _) in zip(results, episodes, strict=True):
        assert result.observation.metadata["task_id"] == task_id
        assert result.observation.metadata["trace"] == info["trace"]


def play_session(oe, url, task_id, seed):
    with oe.ResiliBenchEnvClient(base_url=url).sync() as client:
        return play(oe, client, task_id, seed)


def test_infrastructure_errors_end_the_episode_apart_from_faults(oe, server_url):
    with oe.ResiliBenchEnvClient(base_url=server_url).sync() as client:
        played, _ = play(oe, client, TASKS[1].instance_id, 1)
        # a step after the end: the env cannot go on, an infrastructure error and not a fault of the world
        result = client.step(oe.ResiliBenchAction(message="<tool_call>utility_logger</tool_call>"))
        assert result.done and result.reward == 0.0 and result.observation.messages == []
        record = result.observation.metadata
        assert "RuntimeError" in record["infrastructure_error"]
        assert record["faults"] == played.observation.metadata["faults"]  # the episode's own, unchanged
        with pytest.raises(RuntimeError, match="task_id must be a string"):
            client.reset(seed=0)
