"""Test helpers: small hand-made tasks and a way to script an episode's random stream."""

from __future__ import annotations

import signal
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from resilibench.core.bounds import call_branches, episode_state, exact_bound, optimal_success, play_episode
from resilibench.core.bounds.base import required_in_order
from resilibench.core.config import WorldConfig
from resilibench.core.registry import default_registry
from resilibench.core.simulator import Episode
from resilibench.core.tasks.library import TASK_TYPE_NAMES, Task
from resilibench.core.world import load_tasks
from resilibench.llm import GenerationConfig, Message
from resilibench.policies.runner import episode_jobs, make_planner, run_jobs

PIPELINE = (
    "file_operations_reader",
    "data_processing_validator",
    "data_processing_transformer",
    "data_processing_aggregator",
    "file_operations_writer",
)


def make_task(required=PIPELINE, task_type="complex_validation_pipeline", max_retries=3, task_id="task_test") -> Task:
    return Task(
        instance_id=task_id,
        task_type=task_type,
        description="hand-made test task",
        inputs={},
        expected_outputs={"success": True},
        required_tools=tuple(required),
        constraints={"timeout": 300, "max_retries": max_retries},
        complexity="medium",
    )


def scripted_episode(task: Task, outcomes, config: WorldConfig | None = None) -> Episode:
    """An episode whose i-th draw succeeds iff outcomes[i] (True/False); later draws fail."""
    episode = Episode.start(task, 0, config)
    stream = np.ones_like(episode.stream)
    for i, ok in enumerate(outcomes):
        stream[i, 0] = 0.0 if ok else 1.0
    stream[:, 1] = 0.0
    episode.stream = stream
    return episode


def exact_play_success(play: Callable[[Episode], object], task: Task, config: WorldConfig | None = None) -> float:
    """The exact full-success probability of ``play`` (plays an episode to its end, deterministically) on
    ``task`` in a world without failure processes: every sequence of success draws is scripted
    (``scripted_episode``) and weighted by the probabilities its calls recorded."""
    config = config or WorldConfig()

    def explore(outcomes: list[bool]) -> float:
        episode = scripted_episode(task, outcomes, config)
        play(episode)
        if episode.draws_used > len(outcomes):  # it drew past the script: branch on that draw
            return explore([*outcomes, True]) + explore([*outcomes, False])
        weight = 1.0
        for record in episode.trace:
            if record.probability is not None:
                weight *= record.probability if record.success else 1.0 - record.probability
        return weight if episode.evaluation.level == "full_success" else 0.0

    return explore([])


def depth_first_success(planner, task: Task, config: WorldConfig) -> float:
    """A planner's exact full-success probability in a world with failure processes, by a depth-first
    enumeration of every call's branches with a memo per episode state (one ``act`` per state): the
    reference that ``exact_policy_success``'s frontier-at-a-time enumeration must match bit for bit."""
    planner.reset(task, np.random.default_rng(0))
    root = Episode.start(task, 0, config)
    root.stream = np.zeros_like(root.stream)
    finish, memo = len(root.registry), {}

    def expand(episode: Episode) -> float:
        if episode.done:
            return float(episode.evaluation.level == "full_success")
        if not required_in_order(episode):
            return 0.0
        key = episode_state(episode)
        if key not in memo:
            action = planner.act(episode, None)
            if action == finish or episode.turns_left == 0:
                episode.finish() if action == finish else episode.end_out_of_turns()
                memo[key] = expand(episode)
            else:
                memo[key] = sum(q * expand(b) for q, b in call_branches(episode, action) if q > 0.0)
        return memo[key]

    return expand(root)


class ScriptedBackend:
    """A Backend whose answers come from ``answer(conversation)``; ``calls`` records each batch size.

    A real implementation of the Backend interface with fixed behaviour, for feeding exact answers."""

    name = "scripted"

    def __init__(self, answer: Callable[[list[Message]], str]):
        self.answer = answer
        self.calls: list[int] = []

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        self.calls.append(len(conversations))
        return [self.answer(list(c)) for c in conversations]


STRICT = WorldConfig().replace(rules={"strict_dependencies": True})  # the text protocol's rule


def one_task_per_signature():
    seen = {}
    for task in load_tasks(split=None):
        seen.setdefault(task.required_tools, task)
    return list(seen.values())


def representative_tasks():
    """The longest-signature task of every type."""
    tasks = one_task_per_signature()
    return [max((t for t in tasks if t.task_type == ty), key=lambda t: len(exact_bound(t).tools))
            for ty in TASK_TYPE_NAMES]


def check_env_plays_the_episodes(task: Task, config: WorldConfig, planners: Sequence[str], seeds: Sequence[int]
                                 ) -> list[dict]:
    """Through the planner env (``run_jobs``) each deterministic planner makes the calls and meets the end
    that ``play_episode`` (which ``monte_carlo_success`` counts) gives on ``Episode``, seed for seed, and
    every row carries bound (iii) exactly; returns the rows."""
    rows = run_jobs(episode_jobs(list(planners), [task], list(seeds)), config, clairvoyant=False)
    bound = optimal_success(task, config)
    for row in rows:
        episode = play_episode(make_planner(row["planner"], config), task, row["seed"], config)
        assert episode.evaluation is not None
        assert ([r.tool for r in episode.trace], episode.evaluation.level) == (row["tools"], row["level"])
        assert row["bound_iii"] == bound
    return rows


def with_ctrl_c() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT: Ctrl-C's default disposition, as in a
    terminal (a child of a shell's background job would otherwise inherit SIGINT ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def valid_arguments(tool_name: str) -> dict[str, Any]:
    """Arguments that fit the tool's schema: each required parameter with a plain value of its type."""
    values = {"string": "input.csv", "object": {}, "number": 1.0, "integer": 1, "boolean": True}
    tool = default_registry()[tool_name]
    args = {p.name: p.constraints["enum"][0] if "enum" in p.constraints else values[p.type]
            for p in tool.parameters if p.required}
    assert tool.check_arguments(args) is None
    return args


def optimal_text_outcome(task_id: str, seed: int, **env_options: Any) -> dict[str, Any]:
    """The text env's final info for the optimal agent's episode of ``task_id`` and ``seed`` (what every
    framework's adapter must reproduce seed for seed); ``env_options``: the text env's keyword arguments."""
    from resilibench.agents.scripted import OptimalTextAgent
    from resilibench.envs.text.env import ResiliBenchTextEnv

    env = ResiliBenchTextEnv(**{"split": None, **env_options})
    env.reset(seed=seed, options={"task_id": task_id})
    agent, info = OptimalTextAgent(), env.info()
    while info["level"] is None:
        _, _, _, _, info = env.step(agent.respond([(env.messages, env)])[0])
    return info


def toy_demo_settings(**changes):
    """The demo at toy sizes: every stage runs in seconds (two steps each, one ScPO iteration)."""
    from resilibench.robust_train.pipeline import DemoSettings
    from resilibench.robust_train.scpo import ScPOSettings
    from resilibench.robust_train.training import LoraSettings, PreferenceSettings, SFTSettings

    steps = {"max_steps": 2, "batch_size": 4, "gradient_accumulation_steps": 1, "warmup_ratio": 0}
    return DemoSettings(
        train_clusters=3, test_clusters=2, pretrain_tasks=5, scpo_clusters=3, hidden_size=32, num_layers=1,
        pretrain=SFTSettings(lora=None, learning_rate=1e-3, prompt_loss=True, **steps),
        sft=SFTSettings(lora=LoraSettings(r=4, alpha=8), **steps),
        scpo=ScPOSettings(iterations=1, candidates=2, max_new_tokens=16,
                          preference=PreferenceSettings(max_steps=1, batch_size=2, gradient_accumulation_steps=1,
                                                        warmup_ratio=0)),
        max_new_tokens=16, **changes)
