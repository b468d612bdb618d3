"""The counter-based random source (``resilibench.core.stream``): its documented test vectors, scalar
and array forms bit for bit, and the uses every front end shares (docs/core/stream.md)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import resilibench  # noqa: F401  (registers the envs)
from resilibench.core import stream as rs
from resilibench.core.simulator import EnvEpisodes, Episode, draw_stream, env_episode, task_seed
from resilibench.core.world import load_tasks
from resilibench.envs.real_api.serving import start_episode


def test_splitmix64_reference_outputs():
    """bits(seed, i) is output i of SplitMix64 started at key(seed), and key(seed) is output 0 of
    SplitMix64 started at seed: the reference implementation's published outputs for state 1234567."""
    k = 1234567
    assert [rs.mix((k + (i + 1) * rs.GAMMA) & rs.M64) for i in range(3)] == [
        6457827717110365317, 3203168211198807973, 9817491932198370423]
    assert rs.key(0) == 0xE220A8397B1DCDAF


# The test vectors of docs/core/stream.md.
VECTORS = {
    0: (0xE220A8397B1DCDAF, [0xA706DD2F4D197E6F, 0xB382A305F4414F5E, 0x631A9154FBABF717], 0.6524484863740322),
    1: (0x910A2DEC89025CC1, [0x5E41AB087439611E, 0xF18D6CE93D6CF1EE, 0x0B95F66D327E8D78], 0.36818951565166946),
    2**64 - 1: (0xE4D971771B652C20, [0x5DC20AA7B2A27137, 0xBDA5668A01D7049C, 0x82B43276ABB80226],
                0.3662420901697574),
}


@pytest.mark.parametrize("seed", sorted(VECTORS))
def test_documented_vectors(seed):
    key, draws, u0 = VECTORS[seed]
    assert rs.key(seed) == key
    assert [rs.bits(key, i) for i in range(3)] == draws
    assert rs.uniform(key, 0) == u0 == (draws[0] >> 11) / 2**53
    assert env_episode(0, 0, 3528) == (2301, 12935080325729570654)
    assert env_episode(7, 2, 100) == (34, 3362569151192863174)
    assert task_seed("task_98a7b093", 0) == 3953554738770070296


def test_scalar_and_array_forms_agree_bit_for_bit():
    rng = np.random.default_rng(0)
    seeds = rng.integers(0, 2**64, size=300, dtype=np.uint64)
    seeds[:4] = [0, 1, 2**63, 2**64 - 1]
    index = rng.integers(0, 2**40, size=300).astype(np.int64)
    index[:4] = [0, 1, 19, 2**40 - 1]
    keys = rs.key_array(seeds)
    x = rs.bits_array(keys, rs.offsets(index))
    u = rs.to_uniform(x)
    for j, (s, i) in enumerate(zip(seeds.tolist(), index.tolist(), strict=True)):
        k = rs.key(s)
        assert int(keys[j]) == k and int(x[j]) == rs.bits(k, i)
        assert u[j] == rs.uniform(k, i)  # the same double, not merely close
        assert rs.below_array(x[j : j + 1], 3528)[0] == rs.below(rs.bits(k, i), 3528)
    assert ((u >= 0.0) & (u < 1.0)).all()


def test_uniforms_look_uniform():
    """A coarse quality check that could fail: 100,000 draws of consecutive seeds and indices fill ten
    bins evenly and successive draws are uncorrelated."""
    keys = rs.key_array(np.arange(1000, dtype=np.uint64))[:, None]
    u = rs.to_uniform(rs.bits_array(keys, rs.offsets(np.arange(100))[None, :]))
    counts = np.bincount((u * 10).astype(np.int64).ravel(), minlength=10)
    assert np.abs(counts - 10_000).max() < 500  # about 5 standard deviations
    assert abs(np.corrcoef(u[:, :-1].ravel(), u[:, 1:].ravel())[0, 1]) < 0.02
    assert abs(np.corrcoef(u[:-1].ravel(), u[1:].ravel())[0, 1]) < 0.02  # neighbouring seeds


def test_env_episodes_follow_the_counter():
    episodes = EnvEpisodes()
    first = [episodes.next(11 if e == 0 else None, 50) for e in range(4)]
    assert first == [env_episode(11, e, 50) for e in range(4)]
    assert episodes.next(11, 50) == first[0]  # reseeding restarts the sequence
    assert episodes.next(11 + 2**64, 50) == first[0]  # seeds are taken modulo 2**64
    unseeded = EnvEpisodes()
    unseeded.next(None, 50)
    assert unseeded.env_seed is not None and unseeded.count == 1


def test_every_front_end_reads_the_same_stream():
    """Planner env, text env, MCP server and a paired run reset (task_seed) meet one episode seed."""
    task = load_tasks(split="test")[5]
    seed = task_seed(task.instance_id, 4)
    expected_seed = env_episode(seed, 0, 1)[1]
    planner = gym.make("ResiliBench-v1")
    planner.reset(seed=seed, options={"task_id": task.instance_id})
    text = gym.make("ResiliBenchText-v1")
    text.reset(seed=seed, options={"task_id": task.instance_id})
    mcp = start_episode(task, 4)
    for episode in (planner.unwrapped.episode, text.unwrapped.episode, mcp):
        assert episode.seed == expected_seed
        np.testing.assert_array_equal(episode.stream, draw_stream(expected_seed, 10))
    assert Episode.start(task, expected_seed).stream.tolist() == mcp.stream.tolist()


def test_a_bad_pinned_task_draws_nothing():
    """A reset that fails on an unknown task id leaves the env's episode sequence where it was."""
    env = gym.make("ResiliBench-v1")
    env.reset(seed=3)
    with pytest.raises(KeyError, match="no task"):
        env.reset(options={"task_id": "task_does_not_exist"})
    env.reset()
    assert env.unwrapped.episode.seed == env_episode(3, 1, len(env.unwrapped.tasks))[1]
