"""The batched ResiliBench-v1 (``ResiliBenchVectorEnv``) against N single envs.

The reference is ``gymnasium.make_vec(..., vectorization_mode="sync")``: N real ``ResiliBenchEnv``
instances with Gymnasium's own seeding (sub-env i gets seed s + i) and NEXT_STEP autoreset. Every step
must agree exactly: observations, rewards, terminations, truncations, action masks and final levels.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

import resilibench  # noqa: F401  (registers the envs)
from resilibench.core.config import WorldConfig
from resilibench.core.evaluator import LEVELS
from resilibench.core.simulator import END_REASONS
from resilibench.core.world import load_tasks
from resilibench.envs.planner.observation import UINT8_SCALE, quantize_uint8
from resilibench.envs.planner.vector import ResiliBenchVectorEnv

FINISH = 30


def make_pair(num_envs: int, observation_dtype: str = "float32", **kwargs):
    vec = gym.make_vec("ResiliBench-v1", num_envs=num_envs, vectorization_mode="vector_entry_point",
                       observation_dtype=observation_dtype, **kwargs)
    ref = gym.make_vec("ResiliBench-v1", num_envs=num_envs, vectorization_mode="sync", **kwargs)
    return vec, ref


def as_dtype(obs: np.ndarray, observation_dtype: str) -> np.ndarray:
    """The single env's float32 observation as the batched env gives it with ``observation_dtype``."""
    return quantize_uint8(obs) if observation_dtype == "uint8" else obs.astype(observation_dtype)


def mixed_actions(rng: np.random.Generator, mask: np.ndarray, obs: np.ndarray | None = None) -> np.ndarray:
    """Per row: often the next required tool (read from the observation) and FINISH once all are done, so
    that episodes also end in full success; else a random legal tool, any action (masked ones too), or an
    early FINISH."""
    n_rows, n_actions = mask.shape
    n_tools = n_actions - 1
    actions = rng.integers(n_actions, size=n_rows)  # any action, illegal ones included
    r = rng.random(n_rows)
    for i in np.flatnonzero(r >= 0.2):
        legal = np.flatnonzero(mask[i, :-1])
        if legal.size:
            actions[i] = legal[rng.integers(legal.size)]
    if obs is not None:
        next_required = obs[:, 5 * n_tools : 6 * n_tools]
        guided = r >= 0.45
        has_next = next_required.any(axis=1)
        actions[guided & has_next] = next_required[guided & has_next].argmax(axis=1)
        actions[guided & ~has_next & (obs[:, 6 * n_tools] == 1.0)] = FINISH  # progress 1: signal completion
    actions[r < 0.05] = FINISH
    return actions


def assert_same_step(vec_out, ref_out, where: str, observation_dtype: str = "float32") -> None:
    obs, reward, terminated, truncated, info = vec_out
    r_obs, r_reward, r_terminated, r_truncated, r_info = ref_out
    assert obs.dtype == observation_dtype
    np.testing.assert_array_equal(obs, as_dtype(r_obs, observation_dtype), err_msg=f"observations differ {where}")
    np.testing.assert_array_equal(reward, r_reward, err_msg=f"rewards differ {where}")
    np.testing.assert_array_equal(terminated, r_terminated, err_msg=f"terminated differs {where}")
    np.testing.assert_array_equal(truncated, r_truncated, err_msg=f"truncated differs {where}")
    np.testing.assert_array_equal(info["action_mask"], r_info["action_mask"], err_msg=f"masks differ {where}")
    ended = terminated | truncated
    np.testing.assert_array_equal(info["_level"], ended, err_msg=f"level mask {where}")
    if ended.any():
        names = ResiliBenchVectorEnv.level_names(info["level"])
        np.testing.assert_array_equal(names[ended], r_info["level"][ended], err_msg=f"levels differ {where}")
        reasons = ResiliBenchVectorEnv.end_reason_names(info["end_reason"])
        np.testing.assert_array_equal(reasons[ended], r_info["end_reason"][ended], err_msg=f"end reasons {where}")
    assert (info["level"][~ended] == -1).all() and (info["end_reason"][~ended] == 0).all()


def run_equivalence(num_envs: int, n_steps: int, seed: int, policy_seed: int, observation_dtype: str = "float32",
                    **kwargs) -> dict:
    vec, ref = make_pair(num_envs, observation_dtype, **kwargs)
    obs, info = vec.reset(seed=seed)
    r_obs, r_info = ref.reset(seed=seed)
    np.testing.assert_array_equal(obs, as_dtype(r_obs, observation_dtype))
    np.testing.assert_array_equal(info["action_mask"], r_info["action_mask"])
    task_ids = [vec.unwrapped.known_tasks[i].instance_id for i in info["task_index"]]
    assert task_ids == list(r_info["task_id"])
    rng = np.random.default_rng(policy_seed)
    counts = {"ended": 0, "full": 0, "truncated": 0, "failure_end": 0}
    mask = info["action_mask"]
    for step in range(n_steps):
        actions = mixed_actions(rng, mask, r_obs)
        out = vec.step(actions)
        ref_out = ref.step(actions)
        assert_same_step(out, ref_out, f"at step {step} (num_envs={num_envs}, {kwargs})", observation_dtype)
        r_obs = ref_out[0]
        obs, reward, terminated, truncated, info = out
        mask = info["action_mask"]
        counts["ended"] += int((terminated | truncated).sum())
        counts["full"] += int(reward.sum())
        counts["truncated"] += int(truncated.sum())
        counts["failure_end"] += int((info["end_reason"] >= 3).sum())
    vec.close()
    ref.close()
    return counts


@pytest.mark.parametrize("strict", [False, True])
@pytest.mark.parametrize("num_envs", [1, 7, 64])
def test_matches_single_envs(num_envs, strict):
    n_steps = {1: 400, 7: 250, 64: 120}[num_envs]
    counts = run_equivalence(num_envs, n_steps, seed=100 + num_envs, policy_seed=num_envs,
                             rules={"strict_dependencies": strict})
    # The run exercised what it claims to: many episode ends of every kind.
    assert counts["ended"] >= 20 and counts["failure_end"] > 0 and counts["full"] > 0


def test_matches_single_envs_tight_rules():
    """Short turn limit (truncations), tight failure limits, one task type, the test split."""
    config = WorldConfig().replace(rules={"max_consecutive_failures": 2, "max_same_tool_failures": 2})
    counts = run_equivalence(16, 150, seed=5, policy_seed=7, config=config, rules={"turn_limit": 4}, split="test",
                             task_types=["complex_validation_pipeline"])
    assert counts["truncated"] > 0 and counts["failure_end"] > 0


def test_matches_single_envs_without_dependency_hints():
    """The ablation's observation (features="no_dependency_hints"): the batched env agrees with single envs."""
    counts = run_equivalence(16, 150, seed=9, policy_seed=3, features="no_dependency_hints",
                             rules={"strict_dependencies": True})
    assert counts["ended"] >= 20 and counts["failure_end"] > 0
    vec = ResiliBenchVectorEnv(num_envs=4, features="no_dependency_hints")
    first, _ = vec.reset(seed=0)
    for _ in range(5):
        obs, *_ = vec.step(np.zeros(4, dtype=np.int64))
        np.testing.assert_array_equal(obs[:, 150:180], first[:, 150:180])  # the required order stays fixed
    with pytest.raises(ValueError, match="features must be one of"):
        ResiliBenchVectorEnv(num_envs=2, features="no_hints")


def test_matches_single_envs_one_task_pool():
    """A pool of one task: every task draw gives index 0."""
    task = load_tasks(split="validation")[3]
    counts = run_equivalence(5, 120, seed=0, policy_seed=1, tasks=[task])
    assert counts["ended"] > 0


def test_equivalence_check_can_fail():
    """The comparison detects a sub-env seeded differently from Gymnasium's seed + i convention."""
    vec = gym.make_vec("ResiliBench-v1", num_envs=3, vectorization_mode="vector_entry_point")
    ref = gym.make_vec("ResiliBench-v1", num_envs=3, vectorization_mode="sync")
    vec.reset(seed=[10, 11, 12])
    ref.reset(seed=[10, 11, 13])
    actions = np.array([0, 0, 0])
    with pytest.raises(AssertionError):
        for step in range(30):
            assert_same_step(vec.step(actions), ref.step(actions), f"step {step}")
            actions = (actions + 7) % 31


def test_reset_options_match_single_envs():
    """Seed lists, pinned tasks (also from outside the pool) and partial resets behave like N single envs."""
    vec, ref = make_pair(4)
    other_split_task = load_tasks(split="test")[0].instance_id
    pool_task = vec.unwrapped.tasks[17].instance_id
    seeds = [3, None, 2**40 + 5, 8]
    vec.reset(seed=[3, 4, 2**40 + 5, 8])
    ref.reset(seed=[3, 4, 2**40 + 5, 8])
    ids = [other_split_task, None, pool_task, None]
    obs, info = vec.reset(seed=seeds, options={"task_id": ids})
    for i, env in enumerate(ref.envs):  # the sync env passes one options dict to every sub-env
        o, inf = env.reset(seed=seeds[i], options={"task_id": ids[i]} if ids[i] else None)
        np.testing.assert_array_equal(obs[i], o)
        assert vec.unwrapped.known_tasks[info["task_index"][i]].instance_id == inf["task_id"]
    assert vec.unwrapped.known_tasks[info["task_index"][0]].instance_id == other_split_task
    rng = np.random.default_rng(0)
    mask = info["action_mask"]
    for _ in range(40):
        actions = mixed_actions(rng, mask)
        out = vec.step(actions)
        ref_out = ref.step(actions)
        assert_same_step(out, ref_out, "after pinned reset")
        mask = out[4]["action_mask"]
    # Partial reset: only rows 1 and 3, continuing their episode sequences.
    reset_mask = np.array([False, True, False, True])
    obs, info = vec.reset(options={"reset_mask": reset_mask})
    r_obs, _ = ref.reset(options={"reset_mask": reset_mask.copy()})
    np.testing.assert_array_equal(obs[reset_mask], r_obs[reset_mask])
    for _ in range(40):
        actions = mixed_actions(rng, info["action_mask"])
        out = vec.step(actions)
        assert_same_step(out, ref.step(actions), "after partial reset")
        info = out[4]


def test_autoreset_next_step():
    env = gym.make_vec("ResiliBench-v1", num_envs=3, vectorization_mode="vector_entry_point")
    assert env.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    obs0, info0 = env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step(np.array([FINISH, 0, FINISH]))
    assert terminated.tolist() == [True, False, True] and not truncated.any()
    assert info["_level"].tolist() == [True, False, True]
    np.testing.assert_array_equal(info["action_mask"][0], np.eye(31, dtype=np.int8)[FINISH])
    assert END_REASONS[info["end_reason"][0]] == "finished"
    assert LEVELS[info["level"][0]] in LEVELS  # a real level code
    np.testing.assert_array_equal(obs[0], obs0[0])  # FINISH does not change the observation
    # The next step resets rows 0 and 2 whatever their actions; row 1 acts.
    obs, reward, terminated, truncated, info = env.step(np.array([5, 1, 29]))
    assert reward[0] == reward[2] == 0.0 and not terminated[[0, 2]].any() and not truncated[[0, 2]].any()
    assert (info["action_mask"][[0, 2]] == 1).all()
    layout = env.unwrapped.layout
    assert obs[0, layout.status : layout.required : 4].sum() == 30  # every tool NOT_ATTEMPTED again
    assert obs[1, layout.step] > 0 and obs[0, layout.step] == 0  # row 1 used a turn, row 0 starts over
    assert not info["_level"].any()


def test_truncation_after_turn_limit():
    config = WorldConfig().replace(rules={"max_consecutive_failures": 9, "max_same_tool_failures": 9})
    env = gym.make_vec("ResiliBench-v1", num_envs=2, vectorization_mode="vector_entry_point", config=config,
                       rules={"turn_limit": 2})
    env.reset(seed=0)
    for t in (0, 1):
        _, _, terminated, truncated, info = env.step(np.array([t, t + 10]))
        assert not (terminated | truncated).any()
    assert (info["action_mask"][:, :30] == 0).all() and (info["action_mask"][:, 30] == 1).all()
    _, reward, terminated, truncated, info = env.step(np.array([3, FINISH]))
    assert truncated.tolist() == [True, False] and terminated.tolist() == [False, True]
    assert END_REASONS[info["end_reason"][0]] == "out_of_turns"


def test_spaces_and_dtypes():
    env = gym.make_vec("ResiliBench-v1", num_envs=5, vectorization_mode="vector_entry_point")
    u = env.unwrapped
    assert isinstance(u, ResiliBenchVectorEnv) and u.num_envs == 5
    assert u.single_action_space == gym.spaces.Discrete(31)
    assert u.action_space == gym.spaces.MultiDiscrete([31] * 5)
    assert u.single_observation_space.shape == (204,) and u.observation_space.shape == (5, 204)
    obs, info = env.reset(seed=0)
    assert obs.dtype == np.float32 and u.observation_space.contains(obs)
    assert info["action_mask"].dtype == np.int8 and info["action_mask"].shape == (5, 31)
    assert info["task_index"].dtype == np.int64
    for _ in range(30):
        obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert u.observation_space.contains(obs)
        assert reward.dtype == np.float64 and reward.shape == (5,)
        assert terminated.dtype == np.bool_ and truncated.dtype == np.bool_
        assert info["level"].dtype == np.int8 and info["end_reason"].dtype == np.int8
        assert not (terminated & truncated).any()
    # Returned arrays are the env's buffers, read-only, overwritten by the next step (a kept copy is not).
    kept = obs.copy(), info["action_mask"].copy()
    for array in (obs, reward, terminated, truncated, *(v for v in info.values())):
        assert not array.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        obs[0, 0] = 0.5
    obs2, *_, info2 = env.step(env.action_space.sample())
    assert obs2 is obs and info2["action_mask"] is info["action_mask"]
    assert not np.array_equal(obs2, kept[0])  # five rows each made a call
    assert np.shares_memory(obs, u._obs_buf)


@pytest.mark.parametrize(("dtype", "high"), [("float16", 1.0), ("uint8", UINT8_SCALE)])
def test_compact_observation_matches_single_envs(dtype, high):
    """float16: the single env's observation rounded to half precision; uint8: ``quantize_uint8`` of it.
    Step for step against N single envs, every task type and strict dependencies included."""
    env = ResiliBenchVectorEnv(num_envs=16, observation_dtype=dtype)
    assert env.single_observation_space == gym.spaces.Box(0, high, (204,), np.dtype(dtype).type)
    assert env.observation_space.shape == (16, 204) and env.observation_space.dtype == np.dtype(dtype)
    counts = run_equivalence(16, 150, seed=21, policy_seed=4, observation_dtype=dtype,
                             rules={"strict_dependencies": True})
    assert counts["ended"] >= 20 and counts["full"] > 0 and counts["failure_end"] > 0
    with pytest.raises(ValueError, match="observation_dtype must be one of"):
        ResiliBenchVectorEnv(num_envs=2, observation_dtype="float64")


def test_uint8_quantization():
    """Binary entries and fractions with a denominator dividing 240 are exact; sevenths are within 1/480."""
    exact = np.array([0, 1, 1 / 2, 1 / 3, 1 / 6, 3 / 8, 7 / 10, 11 / 12, 4 / 15], dtype=np.float32)
    np.testing.assert_allclose(quantize_uint8(exact) / UINT8_SCALE, exact, rtol=0, atol=1e-7)
    sevenths = np.arange(8, dtype=np.float32) / 7
    q = quantize_uint8(sevenths)
    assert q.dtype == np.uint8 and q[-1] == UINT8_SCALE and q.tolist() == [0, 34, 69, 103, 137, 171, 206, 240]
    assert np.abs(q / UINT8_SCALE - sevenths).max() <= 1 / 480


def test_deterministic_under_seed():
    def trajectory():
        env = gym.make_vec("ResiliBench-v1", num_envs=8, vectorization_mode="vector_entry_point")
        obs, _ = env.reset(seed=77)
        rng = np.random.default_rng(5)
        out = [obs.copy()]
        for _ in range(50):
            obs, reward, *_ = env.step(rng.integers(31, size=8))
            out += [obs.copy(), reward.copy()]
        return out

    for a, b in zip(trajectory(), trajectory(), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"reward": "shaped"}, "vectorization_mode='sync'"),
        ({"rules": {"profile": "training"}}, "vectorization_mode='sync'"),
        ({"reward": "dense"}, "reward must be one of"),
        ({"split": "holdout"}, "split must be one of"),
        ({"reward_phase": "late"}, "reward phase"),
        ({"render_mode": "human"}, "does not render"),
        ({"task_types": ["no_such_type"]}, "unknown task type"),
    ],
)
def test_bad_kwargs(kwargs, match):
    with pytest.raises(ValueError, match=match):
        gym.make_vec("ResiliBench-v1", num_envs=2, vectorization_mode="vector_entry_point", **kwargs)


def test_bad_num_envs():
    with pytest.raises(ValueError, match="num_envs"):
        ResiliBenchVectorEnv(num_envs=0)


def test_bad_actions_and_reset_options():
    env = ResiliBenchVectorEnv(num_envs=3)
    with pytest.raises(RuntimeError, match="reset"):
        env.step(np.zeros(3, dtype=np.int64))
    env.reset(seed=0)
    for bad in (np.zeros(2, dtype=np.int64), np.array([0, 1, 31]), np.array([0, -1, 2]), np.zeros(3) + 0.5,
                np.zeros((3, 1), dtype=np.int64)):
        with pytest.raises(ValueError, match="actions"):
            env.step(bad)
    for bad in (1.5, "1", True, -1, [0, 1, 2.5], [0, 1, True]):
        with pytest.raises(ValueError, match="seed"):
            env.reset(seed=bad)
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"task": "x"})
    with pytest.raises(ValueError, match="reset_mask"):
        env.reset(options={"reset_mask": [True, False, True]})
    with pytest.raises(ValueError, match="at least one"):
        env.reset(options={"reset_mask": np.zeros(3, dtype=bool)})
    with pytest.raises(ValueError, match="seeds"):
        env.reset(seed=[1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        env.reset(seed=[1, -2, 3])
    with pytest.raises(KeyError, match="no task"):
        env.reset(options={"task_id": "task_does_not_exist"})
    # A rejected call changed nothing: the env still steps.
    env.step(np.array([0, 1, 2]))
