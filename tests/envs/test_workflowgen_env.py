"""WorkflowGen-v1: the API checker, masks, determinism, rejection of illegal actions, and its reward."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import resilibench  # noqa: F401  (registers the env ids)
from helpers import representative_tasks
from resilibench.core.bounds import optimal_success, reference_workflow
from resilibench.core.config import WorldConfig
from resilibench.core.plan_follower import workflow_success
from resilibench.core.workflow import Workflow
from resilibench.envs.workflowgen.env import WorkflowGenEnv, WorkflowReward
from resilibench.metrics.structural import chain_f1, reachability_f1

TASKS = representative_tasks()
HAPPY = WorldConfig().replace(rules={"strict_dependencies": True, "max_same_tool_failures": 5})  # see test_plan_follower


def build(env, workflow, task_id, seed=0):
    obs, info = env.reset(seed=seed, options={"task_id": task_id})
    for action in env.unwrapped.actions_for(workflow):
        assert info["action_mask"][action] == 1
        obs, reward, terminated, truncated, info = env.step(action)
    assert terminated and not truncated and "illegal_action" not in info
    return reward, info


def test_passes_the_gymnasium_checker():
    env = gym.make("WorkflowGen-v1", split="test")
    check_env(env.unwrapped)
    assert env.unwrapped.action_space.n == 30 + 10 * 10 + 1
    assert env.unwrapped.observation_space.shape == (20 + 30 + 10 * 30 + 10 * 10 + 2,)


def test_building_the_reference_earns_its_execution_and_full_structure():
    env = WorkflowGenEnv(tasks=TASKS, reward=WorkflowReward(w_exec=0.7, w_struct=0.3))
    for task in TASKS:
        reference = reference_workflow(task)
        reward, info = build(env, reference, task.instance_id)
        assert info["workflow"] == reference and info["structure"] == 1.0
        assert reward == pytest.approx(0.7 * workflow_success(task, reference) + 0.3, abs=1e-12)
        assert reward <= 0.7 * optimal_success(task) + 0.3 + 1e-12
    happy = WorkflowGenEnv(tasks=TASKS, config=HAPPY)  # rules where following the reference is optimal
    for task in TASKS:
        reward, _ = build(happy, reference_workflow(task, HAPPY), task.instance_id)
        assert reward == pytest.approx(0.5 * optimal_success(task, HAPPY) + 0.5, abs=1e-12)


def test_other_workflows_score_lower_and_the_metric_is_a_choice():
    task = TASKS[2]
    reference = reference_workflow(task)
    reversed_plan = Workflow(tuple(reversed(reference.nodes)),
                             tuple((len(reference.nodes) - 1 - b, len(reference.nodes) - 1 - a) for a, b in reference.edges))
    for metric, function in (("chain_f1", chain_f1), ("reachability_f1", reachability_f1)):
        env = WorkflowGenEnv(tasks=[task], reward=WorkflowReward(structural_metric=metric))
        reward, info = build(env, reversed_plan, task.instance_id)
        assert info["structure"] == function(reversed_plan, reference).f1 < 1.0
        assert info["execution"] == workflow_success(task, reversed_plan)
        assert reward < build(env, reference, task.instance_id)[0]
    env = WorkflowGenEnv(tasks=[task])
    env.reset(seed=0)
    _, reward, terminated, _, info = env.step(env.stop_action)  # an empty workflow is worth nothing
    assert terminated and reward == 0.0 and info["execution"] == 0.0 and info["structure"] == 0.0


def test_masks_reject_what_they_mask():
    env = WorkflowGenEnv(split="test", max_nodes=4, max_copies=1, max_steps=30)
    obs, info = env.reset(seed=3)
    mask = info["action_mask"]
    assert mask[: env.n_tools].all() and not mask[env.edge_offset : env.stop_action].any() and mask[env.stop_action]
    for tool in (5, 7, 9):
        obs, *_ = env.step(tool)
    edge = lambda u, v: env.edge_offset + u * env.max_nodes + v  # noqa: E731
    for u, v in ((0, 1), (1, 2)):
        obs, reward, terminated, truncated, info = env.step(edge(u, v))
        assert "illegal_action" not in info
    mask = info["action_mask"]
    assert not mask[5] and mask[6]  # one step per tool
    assert not mask[edge(2, 0)] and not mask[edge(0, 1)] and not mask[edge(1, 1)] and not mask[edge(0, 3)]
    assert mask[edge(0, 2)] and mask[edge(2, 1)] == 0 and mask[edge(1, 0)] == 0
    for action, reason in ((edge(2, 0), "cycle"), (edge(0, 1), "already"), (edge(1, 1), "self-loop"),
                           (edge(0, 3), "exist"), (5, "max_copies")):
        before = obs.copy()
        obs, reward, terminated, truncated, info = env.step(action)
        assert reason in info["illegal_action"] and reward == 0.0 and not terminated
        assert np.array_equal(obs[:-1], before[:-1])  # only the step counter moved
    env.step(11)
    assert not env.action_mask()[: env.n_tools].any()  # max_nodes reached
    assert "max_nodes" in env.step(12)[4]["illegal_action"]
    with pytest.raises(ValueError, match="STOP"):
        env.step(env.stop_action + 1)


def test_observation_layout():
    env = WorkflowGenEnv(split="test")
    task = TASKS[1]
    obs, _ = env.reset(seed=0, options={"task_id": task.instance_id})
    required = np.flatnonzero(obs[20:50])
    assert list(required) == sorted(task.required_ids())
    env.step(4)
    env.step(0)
    obs, *_ = env.step(env.edge_offset + 0 * 10 + 1)
    slots = obs[50:350].reshape(10, 30)
    assert slots[0, 4] == 1 and slots[1, 0] == 1 and slots.sum() == 2
    adjacency = obs[350:450].reshape(10, 10)
    assert adjacency[0, 1] == 1 and adjacency.sum() == 1
    assert obs[450] == pytest.approx(0.2) and obs[451] == pytest.approx(3 / env.max_steps)
    assert env.observation_space.contains(obs)


def test_rollouts_are_deterministic_and_truncate_on_wasted_steps():
    def rollout(seed):
        env = WorkflowGenEnv(split="test", max_nodes=5)
        obs, info = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        trajectory, done = [obs], False
        while not done:
            legal = np.flatnonzero(info["action_mask"][:-1])
            action = int(rng.choice(legal)) if len(legal) and rng.random() < 0.9 else env.stop_action
            obs, reward, terminated, truncated, info = env.step(action)
            trajectory.append(obs)
            done = terminated or truncated
            assert "illegal_action" not in info
        return np.stack(trajectory), reward, info["workflow"]

    first, second = rollout(7), rollout(7)
    assert np.array_equal(first[0], second[0]) and first[1] == second[1] and first[2] == second[2]
    env = WorkflowGenEnv(split="test", max_steps=3)
    env.reset(seed=1)
    env.step(3)
    env.step(env.edge_offset + 99)  # illegal: wastes a step
    _, reward, terminated, truncated, info = env.step(env.edge_offset + 98)
    assert truncated and not terminated and info["workflow"].tools == (env.registry.names[3],)
    assert reward == pytest.approx(info["reward_exec"] + info["reward_struct"])
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def test_bad_arguments_and_rendering():
    for fields, field in (({"structural_metric": "bleu"}, "structural_metric"), ({"w_exec": -1}, "w_exec"),
                          ({"w_exec": float("nan")}, "w_exec"), ({"w_struct": float("inf")}, "w_struct"),
                          ({"w_exec": "0.5"}, "w_exec")):
        with pytest.raises(ValueError, match=field):
            WorkflowGenEnv(reward=WorkflowReward(**fields))
    for kwargs, field in (({"max_nodes": 0}, "max_nodes"), ({"split": "dev"}, "split"),
                          ({"render_mode": "human"}, "render_mode"), ({"max_nodes": True}, "max_nodes"),
                          ({"max_steps": 0}, "max_steps"), ({"reward": {"w_exec": 1}}, "reward")):
        with pytest.raises(ValueError, match=field):
            WorkflowGenEnv(**kwargs)
    env = WorkflowGenEnv(split="test", render_mode="ansi")
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)
    env.reset(seed=0, options={"task_id": TASKS[0].instance_id})
    with pytest.raises(ValueError, match="task_id"):
        env.reset(options={"task": "x"})
    env.reset(seed=0, options={"task_id": TASKS[0].instance_id})
    for bad in (float("inf"), 3.7, "5", True):
        with pytest.raises(ValueError, match="action must be an integer"):
            env.step(bad)
    assert env.steps == 0
    env.step(np.int64(env.registry.id_of("file_operations_reader")))
    text = env.render()
    assert TASKS[0].instance_id in text and "1. file_operations_reader: read and retrieve data from files" in text
