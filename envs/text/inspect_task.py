"""``ResiliBenchText-v1`` as an Inspect AI task: ``resilibench_task()`` for ``inspect_ai.eval``.

Each sample is one episode (a task and a seed). The solver plays it through the text env's tools protocol:
the model sees the task prompt and the tools as Inspect tool definitions (``ToolInfo``, the text env's own
function schemas, ``tool_search`` and ``tool_info`` included), each assistant message goes to
``ResiliBenchTextEnv.step`` as it is, and the env's answers come back as Inspect tool messages, so every
rule (turns, dependencies, retries, completion) is the text env's and the trace, level and outcomes are the
text env's for the same task and seed. The scorer is the evaluator's level: 1 for full success, else 0
(``answer`` holds the level), with the exact optimal success probability of the task (bound (iii)) in the
score's metadata beside the trace.

Injected faults and infrastructure errors stay apart: the world's failures are the trace's error codes
(the score's ``metadata["faults"]``, part of the episode the model plays), while an exception of the
environment propagates, so Inspect records the sample as an error, unscored and retryable with
``eval_retry`` (``fail_on_error`` decides whether the rest of the run goes on): the failure of the harness
is never counted as the model's.

    from inspect_ai import eval
    from resilibench.envs.text.inspect_task import resilibench_task
    eval(resilibench_task(limit=20, seeds=[0]), model="openai/gpt-4o-mini")   # then: inspect view
"""

from __future__ import annotations

__all__ = ["resilibench_task", "episode_in_progress", "inspect_tools"]

import json
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from inspect_ai import Task, task
from inspect_ai.dataset import MemoryDataset, Sample
from inspect_ai.model import ChatMessageTool, ChatMessageUser, get_model
from inspect_ai.scorer import Score, Target, accuracy, scorer, stderr
from inspect_ai.solver import Generate, TaskState, solver
from inspect_ai.tool import ToolInfo, ToolParams

from ...core.bounds import optimal_success
from ...core.text.prompts import PromptSettings
from .env import ResiliBenchTextEnv

_EPISODE: ContextVar[ResiliBenchTextEnv | None] = ContextVar("resilibench_episode", default=None)


def episode_in_progress() -> ResiliBenchTextEnv | None:
    """The text env of the sample being played in this context (for scripted models, e.g. Inspect's
    ``mockllm`` with a function that reads the episode); None outside a sample."""
    return _EPISODE.get()


def inspect_tools(env: ResiliBenchTextEnv) -> list[ToolInfo]:
    """The text env's function schemas as Inspect tool definitions."""
    assert env.tools is not None  # the tools protocol
    return [ToolInfo(name=f["function"]["name"], description=f["function"]["description"],
                     parameters=ToolParams.model_validate(f["function"]["parameters"])) for f in env.tools]


def _assistant_message(message: Any) -> dict[str, Any]:
    """An Inspect assistant message as the text env's tools protocol reads it."""
    calls = [{"id": c.id, "type": "function", "function": {"name": c.function, "arguments": c.arguments}}
             for c in message.tool_calls or ()]
    return {"role": "assistant", "content": message.text or "", **({"tool_calls": calls} if calls else {})}


def _inspect_message(reply: dict[str, Any], names: dict[str, str]) -> Any:
    """A reply of the text env (a tool or user message) as an Inspect chat message."""
    if reply["role"] == "tool":
        return ChatMessageTool(content=reply["content"], tool_call_id=reply["tool_call_id"],
                               function=names.get(reply["tool_call_id"]))
    return ChatMessageUser(content=reply["content"])


@solver
def play_episode(env_options: dict[str, Any] | None = None):
    """Play the sample's episode in a text env of the tools protocol (``env_options``: its keyword
    arguments) with the task's model; the env's info goes to ``state.metadata["resilibench"]``."""
    options = dict(env_options or {})

    async def solve(state: TaskState, generate: Generate) -> TaskState:
        env = ResiliBenchTextEnv(**{**options, "split": None, "prompt": PromptSettings(protocol="tools")})
        token = _EPISODE.set(env)
        try:
            env.reset(seed=state.metadata["seed"], options={"task_id": state.metadata["task_id"]})
            state.messages = [ChatMessageUser(content=env.messages[0]["content"])]
            tools, model, info = inspect_tools(env), get_model(), env.info()
            while info["level"] is None:
                output = await model.generate(state.messages, tools=tools)
                state.messages.append(output.message)
                asked = _assistant_message(output.message)
                names = {c["id"]: c["function"]["name"] for c in asked.get("tool_calls", ())}
                before = len(env.messages)
                *_, info = env.step(asked)
                state.messages += [_inspect_message(m, names) for m in env.messages[before + 1:]]
            state.metadata["resilibench"] = info
        finally:
            _EPISODE.reset(token)
            env.close()
        state.completed = True
        return state

    return solve


@scorer(metrics=[accuracy(), stderr()])
def episode_level():
    """1 for full success, 0 otherwise (the evaluator's level as the answer); bound (iii) beside it."""

    async def score(state: TaskState, target: Target) -> Score:
        info = state.metadata.get("resilibench", {})
        faults = [r["error_code"] for r in info.get("trace", ()) if not r["success"]]
        metadata = {"trace": info.get("trace"), "faults": faults, "end_reason": info.get("end_reason"),
                    "bound_iii": state.metadata.get("bound_iii")}
        return Score(value=1.0 if info.get("level") == "full_success" else 0.0, answer=info.get("level"),
                     explanation=json.dumps(info.get("evaluation")), metadata=metadata)

    return score


@task
def resilibench_task(split: str = "test", limit: int | None = None, seeds: Sequence[int] = (0,),
                     env_options: dict[str, Any] | None = None) -> Task:
    """Episodes of the text env's tasks of ``split`` (the first ``limit``) for each seed in ``seeds``,
    played with the evaluated model and scored by the evaluator. ``env_options``: further keyword arguments
    of ``ResiliBenchTextEnv`` (``world``, ``rules``, ``search``, ...)."""
    options = dict(env_options or {})
    env = ResiliBenchTextEnv(split=split, **options)
    tasks = env.tasks[:limit]
    samples = [Sample(input=task.description, id=f"{task.instance_id}/{seed}",
                      metadata={"task_id": task.instance_id, "seed": int(seed), "task_type": task.task_type,
                                "bound_iii": optimal_success(task, env.config)})
               for task in tasks for seed in seeds]
    return Task(dataset=MemoryDataset(samples, name="resilibench"), solver=play_episode(options),
                scorer=episode_level(), name="resilibench")
