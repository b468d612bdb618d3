"""ResiliBench-v1: Gymnasium compliance, seeding, options, rewards and errors."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import resilibench  # noqa: F401  (registers the env ids)
from resilibench.core.world import load_tasks
from resilibench.envs.planner.observation import ObservationLayout


def rollout(env, seed, policy_seed=0, options=None):
    rng = np.random.default_rng(policy_seed)
    obs, info = env.reset(seed=seed, options=options)
    steps = [(obs, info["action_mask"])]
    done = False
    while not done:
        legal = np.flatnonzero(info["action_mask"])
        obs, reward, terminated, truncated, info = env.step(int(rng.choice(legal)))
        steps.append((obs, reward))
        done = terminated or truncated
    return [(r["tool"], r["success"], r["error_code"]) for r in info["trace"]], info["level"], steps


def test_check_env_passes():
    check_env(gym.make("ResiliBench-v1").unwrapped, skip_render_check=False)
    check_env(gym.make("ResiliBench-v1", reward="shaped", rules={"strict_dependencies": True}).unwrapped)


def test_spaces_and_info():
    env = gym.make("ResiliBench-v1")
    assert env.action_space == gym.spaces.Discrete(31)
    obs, info = env.reset(seed=3)
    assert obs.dtype == np.float32 and obs.shape == (ObservationLayout(30).size,)
    assert env.observation_space.contains(obs)
    assert info["action_mask"].dtype == np.int8 and info["action_mask"].shape == (31,)
    assert info["trace"] == [] and "level" not in info


def test_same_seed_same_trace_across_instances_and_repeats():
    a, b = gym.make("ResiliBench-v1"), gym.make("ResiliBench-v1")
    for seed in range(20):
        ta, la, sa = rollout(a, seed, policy_seed=seed)
        tb, lb, sb = rollout(b, seed, policy_seed=seed)
        assert ta == tb and la == lb
        assert all(np.array_equal(x[0], y[0]) for x, y in zip(sa, sb, strict=True))
    again = rollout(a, 5, policy_seed=5)[0]
    assert again == rollout(a, 5, policy_seed=5)[0]
    assert len({tuple(rollout(a, s, policy_seed=s)[0]) for s in range(10)}) > 1


def test_task_id_option_and_split_selection():
    task = load_tasks(split="validation", task_types="advanced_computation_pipeline")[0]
    env = gym.make("ResiliBench-v1", split="test", task_types=["complex_network_integration"])
    _, info = env.reset(seed=0, options={"task_id": task.instance_id})
    assert info["task_id"] == task.instance_id
    for seed in range(30):
        _, info = env.reset(seed=seed)
        assert info["task_type"] == "complex_network_integration"
    with pytest.raises(KeyError, match="no task"):
        env.reset(options={"task_id": "task_missing"})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"task": "x"})


def test_level_and_sparse_reward_at_end():
    env = gym.make("ResiliBench-v1")
    obs, info = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(30)  # FINISH at once
    assert terminated and not truncated
    assert info["level"] == "failure" and reward == 0.0
    with pytest.raises(RuntimeError, match="reset"):
        env.step(0)


def test_full_success_pays_one():
    env = gym.make("ResiliBench-v1", split="test")
    wins = 0
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        task = env.unwrapped.episode.task
        total = 0.0
        for tool in task.required_tools:
            for _ in range(3):
                if info["action_mask"][env.unwrapped.registry.id_of(tool)] == 0:
                    break
                obs, r, term, trunc, info = env.step(env.unwrapped.registry.id_of(tool))
                total += r
                if term or info["trace"][-1]["success"]:
                    break
            if term:
                break
        if not term:
            obs, r, term, trunc, info = env.step(30)
            total += r
        assert total == (1.0 if info["level"] == "full_success" else 0.0)
        wins += info["level"] == "full_success"
    assert wins > 0


def test_tool_action_after_turn_limit_truncates():
    env = gym.make("ResiliBench-v1", rules={"turn_limit": 2})
    obs, info = env.reset(seed=0)
    for tool in (25, 26):  # dependency-free utilities
        obs, r, term, trunc, info = env.step(tool)
        if term:
            pytest.skip("ended early")
    assert info["action_mask"][:30].sum() == 0 and info["action_mask"][30] == 1
    obs, r, term, trunc, info = env.step(0)
    assert trunc and not term and info["end_reason"] == "out_of_turns"


def test_shaped_reward_differs_and_is_deterministic():
    sparse = gym.make("ResiliBench-v1", reward="sparse")
    shaped = gym.make("ResiliBench-v1", reward="shaped")
    sparse_returns = [sum(s[1] for s in rollout(sparse, k)[2][1:]) for k in range(5)]
    shaped_returns = [sum(s[1] for s in rollout(shaped, k)[2][1:]) for k in range(5)]
    assert shaped_returns != sparse_returns
    assert any(r > 1.0 for r in shaped_returns)
    again = gym.make("ResiliBench-v1", reward="shaped")
    assert shaped_returns == [sum(s[1] for s in rollout(again, k)[2][1:]) for k in range(5)]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"reward": "dense"}, "reward must be one of"),
        ({"split": "dev"}, "split must be one of"),
        ({"task_types": ["cooking"]}, "unknown task type"),
        ({"rules": {"turn_limit": 0}}, "turn_limit"),
        ({"rules": {"profile": "fast"}}, "profile"),
        ({"reward_phase": "late"}, "reward phase"),
        ({"rules": {"turn_limit": "10"}}, "turn_limit must be an integer"),
        ({"rules": {"turn_limit": 10.0}}, "turn_limit must be an integer"),
        ({"rules": {"strict_dependencies": "no"}}, "strict_dependencies must be true or false"),
        ({"api": "http://127.0.0.1:9"}, "api: must be a RealApi"),  # a URL alone: RealApi(url) is meant
        ({"task_types": 5}, "task_types must be a task type name or a list of them"),
    ],
)
def test_bad_kwargs_are_clear(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gym.make("ResiliBench-v1", **kwargs)


def test_bad_actions_are_clear():
    env = gym.make("ResiliBench-v1")
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"action must be in \[0, 30\]"):
        env.step(31)
    with pytest.raises(ValueError, match="action must be an integer"):
        env.step("reader")


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 3.7, 3.0, "5", True, np.float64(2.0), np.bool_(True)])
def test_non_integer_actions_are_rejected_before_anything_happens(bad):
    env = gym.make("ResiliBench-v1")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action must be an integer"):
        env.step(bad)
    assert env.unwrapped.episode.turns_used == 0


@pytest.mark.parametrize("good", [np.int64(2), np.int32(2), np.uint8(2), np.array(2)])
def test_numpy_integer_actions_are_accepted(good):
    env = gym.make("ResiliBench-v1")
    env.reset(seed=0)
    info = env.step(good)[4]
    assert info["trace"][-1]["tool"] == env.unwrapped.registry.names[2]


def test_render_ansi():
    env = gym.make("ResiliBench-v1", render_mode="ansi")
    env.reset(seed=0)
    env.step(0)
    text = env.render()
    assert "turn 1" in text and "required" in text
