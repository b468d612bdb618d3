"""The text env in SkyRL-Gym: a scripted agent played through ``skyrl_gym.make`` meets the text env's
trace, level and outcomes seed for seed; injected faults and infrastructure errors are recorded apart."""

from __future__ import annotations

import pytest

skyrl_gym = pytest.importorskip("skyrl_gym", reason="pip install 'resilibench[frameworks]' (skyrl-gym)")

from resilibench.agents.scripted import OptimalTextAgent  # noqa: E402
from resilibench.core.world import load_tasks  # noqa: E402
from resilibench.envs.text.env import ResiliBenchTextEnv  # noqa: E402
from resilibench.envs.text.skyrl import ENV_ID, register_skyrl, skyrl_rows  # noqa: E402

TASKS = load_tasks(split="test")[:4]


def play_text_env(task, seed):
    env = ResiliBenchTextEnv(split=None, tasks=TASKS)
    env.reset(seed=seed, options={"task_id": task.instance_id})
    agent, info = OptimalTextAgent(), env.info()
    while info["level"] is None:
        _, _, _, _, info = env.step(agent.respond([(env.messages, env)])[0])
    return info


def play_skyrl(row):
    env = skyrl_gym.make(ENV_ID, env_config={"tasks": TASKS}, extras=row["extras"])
    conversation, _ = env.init(row["prompt"])
    agent, steps = OptimalTextAgent(), []
    while True:
        action = agent.respond([(conversation, env.env)])[0]
        output = env.step(action)
        steps.append(output)
        conversation += [{"role": "assistant", "content": action}, *output["observations"]]
        if output["done"]:
            return steps, env


def test_a_scripted_agent_meets_the_text_env_seed_for_seed():
    register_skyrl()
    register_skyrl()  # once per process, whatever the calls
    faults = set()
    for row in skyrl_rows(TASKS, seeds=[0, 1, 2]):
        steps, env = play_skyrl(row)
        expected = play_text_env(env.env.task, row["extras"]["seed"])
        last = steps[-1]
        assert last["metadata"]["trace"] == expected["trace"]
        assert last["metadata"]["level"] == expected["level"]
        assert last["reward"] == float(expected["level"] == "full_success")
        assert all(s["reward"] == 0.0 for s in steps[:-1]) and "infrastructure_error" not in last["metadata"]
        assert last["metadata"]["faults"] == [r["error_code"] for r in expected["trace"] if not r["success"]]
        assert env.get_metrics()["full_success"] == last["reward"]
        faults |= set(last["metadata"]["faults"])
    assert faults  # the episodes met injected failures, not only successes


def test_infrastructure_errors_end_the_episode_apart_from_faults():
    register_skyrl()
    row = skyrl_rows(TASKS[:1], seeds=[0])[0]
    env = skyrl_gym.make(ENV_ID, env_config={"tasks": TASKS}, extras=row["extras"])
    env.init(row["prompt"])
    output = env.step(None)  # the env cannot read it: an infrastructure error, not a fault of the world
    assert output["done"] and output["reward"] == 0.0
    assert "ValueError" in output["metadata"]["infrastructure_error"] and output["metadata"]["faults"] == []
    with pytest.raises(ValueError, match="task_id"):
        skyrl_gym.make(ENV_ID, env_config={}, extras={"seed": 0})
