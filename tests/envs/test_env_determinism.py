"""Pinned traces and observations of ResiliBench-v0 (and of world v1) and the Episode core for fixed seeds.

These digests prove that optimisations change nothing a user can see: observations, rewards, ends,
info keys, action masks, traces (every field), levels and the random stream. A change to a rule must
change the env's version and these pins together. Re-pinned once when the counter-based random source
(``resilibench.core.stream``) replaced numpy's generators: the stream changed, the rules did not.
"""

from __future__ import annotations

import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest

import resilibench  # noqa: F401  (registers the envs)
from resilibench.core import stream as rs
from resilibench.core.config import WorldConfig
from resilibench.core.simulator import Episode, draw_stream, env_episode
from resilibench.core.world import get_world, load_tasks


def _choose(rng: np.random.Generator, mask: np.ndarray) -> int:
    """Mostly a random legal tool; sometimes FINISH, sometimes any action (masked ones included)."""
    r = rng.random()
    n_actions = len(mask)
    if r < 0.07:
        return n_actions - 1
    if r < 0.25:
        return int(rng.integers(n_actions))
    legal = np.flatnonzero(mask[:-1])
    if len(legal) == 0:
        return int(rng.integers(n_actions))
    return int(legal[rng.integers(len(legal))])


def _jsonable(value):
    if isinstance(value, np.ndarray):
        return value.tolist()
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def env_digest(seed: int, n_steps: int, **kwargs) -> str:
    """SHA-256 over everything the env returns for ``n_steps`` steps of a seeded mixed policy."""
    env = gym.make("ResiliBench-v0", **kwargs)
    rng = np.random.default_rng(seed + 10_000)
    h = hashlib.sha256()
    obs, info = env.reset(seed=seed)
    h.update(obs.tobytes())
    h.update(json.dumps({k: _jsonable(v) for k, v in sorted(info.items())}, sort_keys=True).encode())
    for _ in range(n_steps):
        action = _choose(rng, info["action_mask"])
        obs, reward, terminated, truncated, info = env.step(action)
        assert obs.dtype == np.float32 and info["action_mask"].dtype == np.int8
        h.update(obs.tobytes())
        h.update(repr((action, reward, terminated, truncated, sorted(info))).encode())
        h.update(json.dumps({k: _jsonable(v) for k, v in sorted(info.items())}, sort_keys=True).encode())
        if terminated or truncated:
            obs, info = env.reset()
            h.update(obs.tobytes())
            h.update(json.dumps({k: _jsonable(v) for k, v in sorted(info.items())}, sort_keys=True).encode())
    return h.hexdigest()


def episode_state(ep: Episode) -> dict:
    """Every public attribute of the Episode API, as plain data."""
    return {
        "calls": list(ep.calls),
        "succeeded": list(ep.succeeded),
        "status": list(ep.status),
        "n_failures": ep.n_failures,
        "consecutive_failures": ep.consecutive_failures,
        "last_tool": ep.last_tool,
        "same_tool_streak": ep.same_tool_streak,
        "turns_used": ep.turns_used,
        "turns_left": ep.turns_left,
        "draws_used": ep.draws_used,
        "next_required": ep.next_required,
        "required": list(ep.required),
        "required_position": sorted(ep.required_position.items()),
        "max_calls": ep.max_calls,
        "progress": ep.progress,
        "action_mask": ep.action_mask.tolist(),
        "legal_tools": ep.legal_tools().tolist(),
        "probabilities": [ep.probability(t) for t in range(len(ep.calls))],
        "unmet": [list(ep.unmet_dependencies(t)) for t in range(len(ep.calls))],
        "done": ep.done,
        "end_reason": ep.end_reason,
        "completed": ep.completed,
        "evaluation": ep.evaluation.to_dict() if ep.evaluation else None,
        "trace": [r.to_dict() for r in ep.trace],
        "stream": ep.stream.tolist(),
    }


def episode_digest(seed: int, config: WorldConfig, n_episodes: int = 40) -> str:
    """Drive the Episode core directly (calls by id and name, spend_turn, finish, out of turns)."""
    tasks = load_tasks(split="test", world="v0")
    rng = np.random.default_rng(seed)
    h = hashlib.sha256()
    for _ in range(n_episodes):
        task = tasks[int(rng.integers(len(tasks)))]
        ep = Episode.start(task, int(rng.integers(2**32)), config, success_rate=float(rng.random()))
        h.update(json.dumps(episode_state(ep)).encode())
        while not ep.done:
            r = rng.random()
            if r < 0.05:
                ep.finish()
            elif ep.turns_left == 0:
                ep.end_out_of_turns()
            elif r < 0.12:
                ep.spend_turn()
            elif r < 0.4 and ep.required:  # required tools by name, in order or repeated
                record = ep.call(ep.task.required_tools[int(rng.integers(len(ep.required)))])
                h.update(json.dumps(record.to_dict()).encode())
            else:
                record = ep.call(int(rng.integers(len(ep.calls))))
                h.update(json.dumps(record.to_dict()).encode())
            h.update(json.dumps(episode_state(ep)).encode())
    return h.hexdigest()


ENV_PINS = {
    "sparse": ({}, "d21443d1cf32426579db4f5d96014c13c3691cde485d54e8d5417b3401b437c0"),
    "strict": ({"rules": {"strict_dependencies": True}}, "89609d78cb3fb501ccb4abd4d9583a120a1083df5289da9653e154771d3b5b7e"),
    "shaped": ({"reward": "shaped"}, "25caa867c8a569e9ad666897e6b4d99c729a416b2805b6e87391a104f5ac9b43"),
    "shaped_sequence_training": ({"reward": "shaped", "reward_phase": "sequence", "rules": {"profile": "training"}}, "192a27b46f26ae80749012dc5c58ad3740932c987890b452222d379c1dacad7e"),
    "short_turns_test_split": ({"rules": {"turn_limit": 4}, "split": "test"}, "ef3f776f9c24c2b2b5054f1aabe07a1ff18d7e0015c5a9a8360f46ba66a32978"),
    # world v1: its library and grading through the same env class
    "v1_sparse": ({"world": "v1"}, "0a37753a34d87af47a08a9b2bcda134586e1ac13034db5cb2abf32042cea8df0"),
    "v1_strict": ({"world": "v1", "rules": {"strict_dependencies": True}},
                  "35d50a74eb99048afca2558440739f6a0c79646279cb6d4e811e0a419d5c07de"),
}


@pytest.mark.parametrize("name", sorted(ENV_PINS))
def test_env_digest_pinned(name):
    kwargs, expected = ENV_PINS[name]
    assert env_digest(7, 600, **kwargs) == expected


V0 = get_world("v0").config  # the pins are world v0's: its library and grading
EPISODE_PINS = {
    "test": (V0, "584dd409d86d7e0de3f9208e88825a7977decdb0e18d79f2dcb7a12e5dd31e32"),
    "strict": (V0.replace(rules={"strict_dependencies": True}), "1a427844e3429a2530542f1e31d01a9e82c1728af4008edacb8c348106945c24"),
    "training": (V0.replace(rules={"profile": "training"}), "e7d10f388f99b0a8c30530cb0909ec8cd7962c9c109e74359e75979dc9ac707d"),
    "tight_limits": (
        V0.replace(rules={"turn_limit": 6, "max_consecutive_failures": 2, "max_same_tool_failures": 2}),
        "fa79b5a0bc28208b03f7da67c94673cdf004d2352113346fa6f50f97e9bc21ff",
    ),
}


@pytest.mark.parametrize("name", sorted(EPISODE_PINS))
def test_episode_digest_pinned(name):
    config, expected = EPISODE_PINS[name]
    assert episode_digest(3, config) == expected


def test_first_episode_trace_literal():
    """A readable pin: the first episode of seed 0 under a fixed action list."""
    env = gym.make("ResiliBench-v0")
    obs, info = env.reset(seed=0)
    assert info["task_id"] == "task_98a7b093"
    trace = None
    for action in (0, 1, 0, 3, 5, 11, 11, 30):
        obs, reward, terminated, truncated, info = env.step(action)
        trace = info["trace"]
        if terminated or truncated:
            break
    got = [(r["tool"], r["success"], r["error_code"], r["turn"], r["probability"]) for r in trace]
    assert got == [
        ("data_processing_parser", True, None, 1, 0.8),
        ("data_processing_transformer", True, None, 2, 0.8),
        ("data_processing_parser", True, None, 3, None),  # replay of a success: no draw
        ("data_processing_aggregator", False, "TIMEOUT", 4, 0.8),
        ("file_operations_reader", False, "PERMISSION_DENIED", 5, 0.7200000000000001),
        ("network_poster", True, None, 6, 0.4536),
        ("network_poster", True, None, 7, None),
    ]
    assert (info.get("level"), reward, terminated, truncated) == ("partial_success", 0.0, True, False)


def test_random_stream_rule():
    """The documented uses of the counter-based stream (docs/core/stream.md): the env seeded S draws its e-th
    task from bits(S, 2e) and its e-th episode seed bits(S, 2e + 1); the episode's k-th drawing call
    reads uniform(seed, 2k) and uniform(seed, 2k + 1)."""
    env = gym.make("ResiliBench-v0")
    tasks = env.unwrapped.tasks
    env.reset(seed=123)
    env.reset()  # episode 1 of seed 123
    ep = env.unwrapped.episode
    k = rs.key(123)
    assert ep.task is tasks[((rs.bits(k, 2) >> 32) * len(tasks)) >> 32]
    assert ep.seed == rs.bits(k, 3) and (ep.task is tasks[env_episode(123, 1, len(tasks))[0]])
    key = rs.key(ep.seed)
    expected = np.array([[(rs.bits(key, 2 * i + j) >> 11) / 2**53 for j in (0, 1)] for i in range(10)])
    np.testing.assert_array_equal(ep.stream, expected)
    np.testing.assert_array_equal(draw_stream(ep.seed, 10), expected)


def test_stream_read_lazily_or_as_array_gives_the_same_episode():
    """An episode draws the same numbers whether its stream was read as an array (which fixes it) or
    computed draw by draw."""
    tasks = load_tasks(split="test", world="v0")
    for seed in range(30):
        lazy, fixed = (Episode.start(tasks[seed], seed * 7919) for _ in range(2))
        assert fixed.stream.shape == (10, 2)
        for t in range(12):
            tool = (seed + 3 * t) % len(lazy.calls)
            if lazy.done or lazy.turns_left == 0:
                break
            assert lazy.call(tool) == fixed.call(tool)
        assert lazy.trace == fixed.trace and lazy._stream is None


def test_info_trace_is_not_mutated_by_later_steps():
    """``info["trace"]`` is a list of plain dicts (as in the text env); a later step leaves it unchanged."""
    env = gym.make("ResiliBench-v0")
    _, info = env.reset(seed=5, options={"task_id": load_tasks(split="train", world="v0")[0].instance_id})
    snapshots = []
    for action in (0, 1, 2, 0, 3):
        _, _, terminated, truncated, info = env.step(action)
        trace = info["trace"]
        assert type(trace) is list and all(type(r) is dict for r in trace)
        snapshots.append((trace, json.dumps(trace)))
        if terminated or truncated:
            break
    assert len(snapshots) >= 3
    for trace, frozen in snapshots:
        assert json.dumps(trace) == frozen
    assert snapshots[-1][0] == [r.to_dict() for r in env.unwrapped.episode.trace]
