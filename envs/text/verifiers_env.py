"""``ResiliBenchText-v1`` as a verifiers environment (``verifiers.MultiTurnEnv``, what prime-rl trains on).

verifiers runs a rollout per dataset row: the model answers the row's ``prompt``, ``env_response`` answers
each model message, until a stop condition holds; a rubric scores the finished rollout.
``ResiliBenchVerifiersEnv`` plays the text env's episode of the row's ``info`` (``task_id``, ``seed``) under
the tag protocol: the prompt is the text env's opening conversation, each model message goes to
``ResiliBenchTextEnv.step`` as it is and the env's answer comes back as a user message, so the trace, the
level and every outcome are the text env's for the same task and seed. ``load_environment`` (verifiers'
entry point: ``vf.load_environment("resilibench.envs.text.verifiers_env", ...)``) builds it for a split.

The rubric's reward is the text env's (1 for full success, else 0), with ``partial_success`` and ``turns``
as metrics. The two kinds of failure stay apart: ``state["resilibench"]`` holds the episode's level, trace
and ``faults``, the failures the world injected (part of the episode the model plays and is scored on);
an exception of the environment itself ends the rollout with ``state["error"]``, a ``verifiers.InfraError``
(the stop condition ``has_error``), which verifiers and prime-rl keep apart from scored rollouts.

    import verifiers as vf
    env = vf.load_environment("resilibench.envs.text.verifiers_env", split="test", limit=20, seeds=[0])
    results = env.evaluate_sync(client=AsyncOpenAI(...), model="...")
"""

from __future__ import annotations

__all__ = ["ResiliBenchVerifiersEnv", "load_environment", "verifiers_rows"]

from collections.abc import Sequence
from typing import Any

import verifiers as vf
from datasets import Dataset

from ...core.tasks.library import Task
from .env import ResiliBenchTextEnv, episode_record

ENV_KEY = "resilibench_env"  # the rollout's text env in its state (not part of the output)
RECORD_KEY = "resilibench"  # what the rollout records of the episode (a state column)


def verifiers_rows(env: ResiliBenchTextEnv, tasks: Sequence[Task], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Dataset rows, one per task and seed: the text env's opening conversation as the ``prompt``, the
    episode in ``info``."""
    rows = []
    for task in tasks:
        for seed in seeds:
            env.reset(seed=int(seed), options={"task_id": task.instance_id})
            rows.append({"prompt": [dict(m) for m in env.messages], "answer": "",
                         "info": {"task_id": task.instance_id, "seed": int(seed)}})
    return rows


async def full_success(state: vf.State) -> float:
    """The text env's reward: 1 for full success, else 0."""
    return float(state.get(RECORD_KEY, {}).get("level") == "full_success")


async def partial_success(state: vf.State) -> float:
    return float(state.get(RECORD_KEY, {}).get("level") == "partial_success")


async def turns(state: vf.State) -> float:
    return float(state.get(RECORD_KEY, {}).get("turn", 0))


class ResiliBenchVerifiersEnv(vf.MultiTurnEnv):
    """Episodes of the text env for verifiers: one per task of ``tasks`` and seed of ``seeds``.
    ``env_options``: keyword arguments of ``ResiliBenchTextEnv`` (``world``, ``rules``, ...)."""

    def __init__(self, tasks: Sequence[Task], seeds: Sequence[int] = (0,),
                 env_options: dict[str, Any] | None = None, **kwargs: Any):
        if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
            raise ValueError(f"seeds must be integers >= 0, got {list(seeds)!r}")
        self.env_options = {"split": None, "tasks": list(tasks), **dict(env_options or {})}
        env = ResiliBenchTextEnv(**self.env_options)
        rows = Dataset.from_list(verifiers_rows(env, tasks, seeds))
        rubric = vf.Rubric(funcs=[full_success])
        rubric.add_metric(partial_success)
        rubric.add_metric(turns)
        # No max_turns: the text env ends every episode itself (its turn limit), and a cut of verifiers' would
        # leave the last message unanswered and the episode ungraded.
        super().__init__(dataset=rows, eval_dataset=rows, rubric=rubric, **kwargs)
        env.close()

    async def setup_state(self, state: vf.State) -> vf.State:
        env = ResiliBenchTextEnv(**self.env_options)
        _, info = env.reset(seed=state["info"]["seed"], options={"task_id": state["info"]["task_id"]})
        state[ENV_KEY], state[RECORD_KEY] = env, episode_record(info)
        return state

    async def env_response(self, messages: vf.Messages, state: vf.State, **kwargs: Any) -> vf.Messages:
        env: ResiliBenchTextEnv = state[ENV_KEY]
        message = messages[-1].get("content") if isinstance(messages, list) else messages
        try:
            observation, _, terminated, truncated, info = env.step(message)
        except Exception as exc:  # the env could not go on: not the model's failure, not a fault of the world
            raise vf.InfraError(f"the environment failed: {type(exc).__name__}: {exc}") from exc
        state[RECORD_KEY] = episode_record(info)
        reply: vf.Messages = [{"role": "user", "content": observation}]
        if terminated or truncated:
            state["final_env_response"] = reply
        return reply

    @vf.cleanup
    async def close_episode(self, state: vf.State) -> None:
        env = state.pop(ENV_KEY, None)
        if env is not None:
            env.close()


def load_environment(split: str = "test", limit: int | None = None, seeds: Sequence[int] = (0,),
                     **env_options: Any) -> ResiliBenchVerifiersEnv:
    """The episodes of the first ``limit`` tasks of ``split`` for each seed in ``seeds``; ``env_options``:
    further keyword arguments of ``ResiliBenchTextEnv`` (``world``, ``rules``, ...)."""
    tasks = ResiliBenchTextEnv(split=split, **env_options).tasks[:limit]
    return ResiliBenchVerifiersEnv(tasks, seeds, env_options)
