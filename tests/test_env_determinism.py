"""Pinned traces and observations of ResiliBench-v0 (and of world v1) and the Episode core for fixed seeds.

These digests were recorded before the hot path of ``envs/simulator.py`` and ``envs/planner_env.py`` was
optimised; they prove that optimisations change nothing a user can see: observations, rewards, ends,
info keys, action masks, traces (every field), levels and the random stream. A change to a rule must
change the env's version and these pins together.
"""

from __future__ import annotations

import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest

import resilibench  # noqa: F401  (registers the envs)
from resilibench.envs.config import WorldConfig
from resilibench.envs.simulator import Episode, draw_stream, episode_seed
from resilibench.envs.tasks import load_tasks


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
    "sparse": ({}, "872c4f847c9b4be2f5834a0465a9f9d5594b837a9b06a08b6b861cbaa5c7eca2"),
    "strict": ({"strict_dependencies": True}, "022d5d899e878744f971002129c0633037f32f16d86308dc5b910bfe08596491"),
    "shaped": ({"reward": "shaped"}, "10779ef58e214749f1a8a7d5ab5539c84778eab3aca4f3c9ea137391b320fcee"),
    "shaped_sequence_training": ({"reward": "shaped", "reward_phase": "sequence", "profile": "training"}, "a9d99faa6191090a2dd5716788643cc1532913b55ce3f9a4572aa55f298bc7dd"),
    "short_turns_test_split": ({"turn_limit": 4, "split": "test"}, "feed4aaeb70d6c1b8874a70981650d97930104515d67e4468fd54df96a34e1c5"),
    # world v1: its library and grading through the same env class
    "v1_sparse": ({"world": "v1"}, "ec8b3c6770976dff2aa973d4296034d0f129f06c4de5d5df3f29ecae47f9493e"),
    "v1_strict": ({"world": "v1", "strict_dependencies": True},
                  "ac4fbe0fbb44fe3e3b0072daefaab2f4f35acc54cd3d5368a75cee6085450483"),
}


@pytest.mark.parametrize("name", sorted(ENV_PINS))
def test_env_digest_pinned(name):
    kwargs, expected = ENV_PINS[name]
    assert env_digest(7, 600, **kwargs) == expected


V0 = WorldConfig.for_world("v0")  # the pins are world v0's: its library and grading
EPISODE_PINS = {
    "test": (V0, "3795847761a12b034b7a1d0a46610c0997c53fd405514afb4a9b961a12b6b3ec"),
    "strict": (V0.replace(rules={"strict_dependencies": True}), "fae481608b77379eded1bd23593c2615b33733fad2f49e0f74fff99a3bd7a409"),
    "training": (V0.replace(rules={"profile": "training"}), "9e53008818779c45d027948c534b67781f690942823c87a28b5f8d1fc45f25c6"),
    "tight_limits": (
        V0.replace(rules={"turn_limit": 6, "max_consecutive_failures": 2, "max_same_tool_failures": 2}),
        "9806e9e095bf3fd2258137eb8ee29199cf7d49e520d1fa9ae37b194e452899f6",
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
    assert info["task_id"] == "task_eeb146e7"
    trace = None
    for action in (0, 1, 0, 3, 5, 11, 11, 30):
        obs, reward, terminated, truncated, info = env.step(action)
        trace = info["trace"]
        if terminated or truncated:
            break
    got = [(r.tool, r.success, r.error_code, r.turn, r.probability) for r in trace]
    assert got == [
        ("data_processing_parser", True, None, 1, 0.8),
        ("data_processing_transformer", True, None, 2, 0.8),
        ("data_processing_parser", True, None, 3, None),  # replay of a success: no draw
        ("data_processing_aggregator", True, None, 4, 0.8),
        ("file_operations_reader", True, None, 5, 0.8),
        ("network_poster", False, "OPERATION_FAILED", 6, 0.8),
        ("network_poster", False, "OPERATION_FAILED", 7, 0.7200000000000001),
    ]
    assert (info.get("level"), reward, terminated, truncated) == ("partial_success", 0.0, True, False)


def test_random_stream_rule():
    """The episode stream comes from ``episode_seed`` of the env generator, then ``draw_stream``."""
    env = gym.make("ResiliBench-v0")
    env.reset(seed=123)
    ep = env.unwrapped.episode
    g = np.random.default_rng(np.random.SeedSequence(123))
    tasks = env.unwrapped.tasks
    assert ep.task is tasks[int(g.integers(len(tasks)))]
    expected = draw_stream(np.random.default_rng(episode_seed(g)), 10)
    np.testing.assert_array_equal(ep.stream, expected)
    assert ep.stream.shape == (10, 2)


def test_info_trace_is_not_mutated_by_later_steps():
    env = gym.make("ResiliBench-v0")
    _, info = env.reset(seed=5, options={"task_id": load_tasks(split="train", world="v0")[0].instance_id})
    snapshots = []
    for action in (0, 1, 2, 0, 3):
        _, _, terminated, truncated, info = env.step(action)
        trace = info["trace"]
        snapshots.append((trace, [r.to_dict() for r in trace]))
        if terminated or truncated:
            break
    for trace, frozen in snapshots:
        assert [r.to_dict() for r in trace] == frozen
        assert len(trace) == len(frozen)
        with pytest.raises((TypeError, AttributeError)):
            trace.append(None)  # type: ignore[union-attr]
