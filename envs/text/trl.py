"""``ResiliBenchText-v1`` as a TRL GRPO environment: ``GRPOTrainer(environment_factory=...)``.

TRL 1.16 makes every public method of an environment a tool the model may call natively (function
schemas in the chat template, structured tool calls parsed back), calls ``reset(**row)`` before each
rollout and ``get_reward()`` after it. ``grpo_environment_class`` builds that class: one method per tool
of the registry (its JSON Schema as the method's signature and docstring) plus ``tool_search`` and
``tool_info`` (or, with ``surface="search"``, those two and ``call_tool(name, arguments)``);
``reset(task_id, seed)`` opens the text env's episode of that task and seed and returns
the task prompt; ``get_reward()`` grades the episode with the evaluator.

Nothing of the world is re-typed here: ``reset`` is ``ResiliBenchTextEnv.reset`` (same task, same
episode seed, same Episode), calls go through ``toolbox.call_tool`` and answer with ``feedback_text``,
searches and info requests with the text env's own answers. Turn rules follow the text env with one
action per message: every method call is a turn (searches and info requests included), a call after
the last turn ends the episode unfinished, and the rollout's last message (one without a tool call) is
the completion signal.

    from trl import GRPOConfig, GRPOTrainer
    from resilibench.envs.text.trl import grpo_environment_class, task_rows

    env_class = grpo_environment_class()
    trainer = GRPOTrainer(model, args=GRPOConfig(...), train_dataset=Dataset.from_list(task_rows(tasks, [0])),
                          environment_factory=env_class)
"""

from __future__ import annotations

__all__ = ["SURFACES", "GRPOReward", "GRPOEnvironmentBase", "grpo_environment_class", "task_prompt",
           "task_rows", "tool_method"]

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...core.evaluator import LEVELS
from ...core.registry import Tool, ToolRegistry, default_registry
from ...core.simulator import Episode
from ...core.tasks.library import Task
from ...core.text.prompts import task_statement
from ...core.text.toolbox import (
    UnknownToolError,
    call_tool,
    end_text,
    feedback_text,
    no_calls_left,
    progress_text,
)
from ...core.world import DEFAULT_WORLD, World
from .env import ResiliBenchTextEnv

# JSON Schema types as the Python hints transformers turns back into the same schema types.
PYTHON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "object": dict, "array": list}
META_TOOLS = ("tool_search", "tool_info")
SURFACES = ("all", "search")

SYSTEM_PROMPT = (
    "You complete tasks by calling tools. Tools can fail like real APIs (timeouts, invalid input, unmet "
    "dependencies); read each result and react to it."
)


@dataclass(frozen=True)
class GRPOReward:
    """The reward of a finished rollout: ``levels[i]`` for evaluator level ``LEVELS[i]`` (failure,
    partial_success, full_success), plus ``progress_weight`` x the share of required tools that succeeded
    (0 by default: no shaping; a small weight such as 0.2 gives credit to partial progress)."""

    levels: tuple[float, float, float] = (0.0, 0.5, 1.0)
    progress_weight: float = 0.0

    def __post_init__(self) -> None:
        if len(self.levels) != len(LEVELS) or not all(isinstance(v, int | float) for v in self.levels):
            raise ValueError(f"reward levels must be {len(LEVELS)} numbers for {LEVELS}, got {self.levels!r}")
        if not isinstance(self.progress_weight, int | float) or self.progress_weight < 0:
            raise ValueError(f"reward progress_weight must be a number >= 0, got {self.progress_weight!r}")


def task_prompt(task: Task, turn_limit: int) -> str:
    """The user message of a task for native tool calling: the task, its inputs and expected outputs,
    and the rules (the tools themselves reach the model as function schemas)."""
    return (
        f"{task_statement(task)}\n\n"
        "Rules:\n"
        "- Find tools with tool_search, read one with tool_info, then call the tools in the right order.\n"
        f"- You have {turn_limit} turns: every tool call uses one, tool_search and tool_info included.\n"
        f"- A failed tool may be retried, up to {1 + task.max_retries} calls per tool.\n"
        "- When every step is done, answer without calling a tool: that ends the task."
    )


def task_rows(tasks: Sequence[Task], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Dataset rows for ``GRPOTrainer``: one per task and seed, ``reset`` reads ``task_id`` and ``seed``;
    the prompt holds the system message, ``reset`` appends the task to the (empty) user message."""
    prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": ""}]
    return [{"prompt": prompt, "task_id": t.instance_id, "seed": int(s)} for s in seeds for t in tasks]


class GRPOEnvironmentBase:
    """State and rules shared by every generated environment class (see ``grpo_environment_class``)."""

    _env_kwargs: dict[str, Any] = {}
    _reward = GRPOReward()
    _outcomes: list[dict[str, Any]] | None = None

    def __init__(self) -> None:
        self._env = ResiliBenchTextEnv(**self._env_kwargs)
        self._seed: int | None = None

    def reset(self, task_id: str, seed: int, **_: Any) -> str:
        """Open the episode of ``task_id`` and ``seed`` (the text env's episode for them); return the
        task prompt. Other dataset columns (the prompt) are ignored."""
        self._seed = int(seed)
        self._env.reset(seed=self._seed, options={"task_id": task_id})
        return task_prompt(self._episode().task, self._env.config.rules.turn_limit)

    def get_reward(self) -> float:
        """Grade the rollout: the end of the rollout is the completion signal for a running episode."""
        episode = self._episode()
        if not episode.done:
            episode.finish()
        assert episode.evaluation is not None  # an ended episode is graded
        level = episode.evaluation.level
        reward = self._reward.levels[LEVELS.index(level)] + self._reward.progress_weight * episode.progress
        if self._outcomes is not None:
            self._outcomes.append({"task_id": episode.task.instance_id, "seed": self._seed, "level": level,
                                   "reward": reward, "turns": episode.turns_used,
                                   "progress": episode.progress, "end_reason": episode.end_reason})
        return reward

    # --- helpers (private: TRL exposes public methods only) -------------------------------------------

    def _episode(self) -> Episode:
        if self._env.episode is None:
            raise RuntimeError("call reset() before a tool")
        return self._env.episode

    def _turn(self, action: Callable[[], str]) -> str:
        """Play one turn with the text env's rules: nothing after the end, and a call after the last
        turn ends the episode unfinished (as a message without the completion signal does there)."""
        episode = self._episode()
        if episode.done:
            return f"Not executed: the episode has ended. {end_text(episode)}"
        if episode.turns_left == 0:
            episode.end_out_of_turns()
            return f"{no_calls_left(episode)}: not executed. {end_text(episode)}"
        return action()

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        episode = self._episode()
        return self._turn(lambda: feedback_text(call_tool(episode, name, arguments), episode))

    def _not_executed(self, answer: str) -> str:
        """Spend the turn of a message without a played call; ``answer`` and the progress line."""
        episode = self._episode()
        episode.spend_turn()
        return f"{answer}\n\n{progress_text(episode)}"

    def _lookup(self, answer: Callable[[str], str], text: str) -> str:
        """A search or info request: the text env's answer; the turn is spent as a message of it."""
        return self._turn(lambda: self._not_executed(answer(text)))


def _call_tool_method() -> Callable:
    def call_tool(self, name: str, arguments: dict | None = None) -> str:
        """Call one tool by name. Uses one turn.

        Args:
            name: The tool's name (find tools with tool_search).
            arguments: The tool's arguments as an object (read its parameters with tool_info).
        """
        try:
            return self._call(name, arguments or {})
        except UnknownToolError as exc:  # as the text env answers an unknown name: the turn is spent
            problem = f"Tool call not executed: {exc}"
            return self._turn(lambda: self._not_executed(problem))

    return call_tool


def _meta_methods() -> dict[str, Callable]:
    def tool_search(self, query: str) -> str:
        """Find tools by what they do: the closest tools with their parameters, errors and dependencies.
        Uses one turn.

        Args:
            query: What the tool should do, in a few words.
        """
        return self._lookup(self._env._search, query)

    def tool_info(self, name: str) -> str:
        """A tool's parameters, returns, possible errors and dependencies. Uses one turn.

        Args:
            name: The tool's name.
        """
        return self._lookup(self._env._tool_info, name)

    return {"tool_search": tool_search, "tool_info": tool_info}


def tool_method(tool: Tool) -> Callable:
    """A method calling ``tool`` whose signature and Google-style docstring carry the tool's input schema
    (what ``transformers.utils.get_json_schema`` reads). Any keyword is accepted: the tool's own schema
    check turns an unknown or ill-typed argument into the simulator's INVALID_INPUT failure."""
    schema = tool.input_schema()
    required = set(schema.get("required", ()))
    parameters = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    annotations: dict[str, Any] = {"return": str}
    lines = []
    for name, spec in schema["properties"].items():
        hint = PYTHON_TYPES[spec["type"]]
        default = inspect.Parameter.empty if name in required else None
        parameters.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hint))
        annotations[name] = hint
        choices = f" (choices: {list(spec['enum'])!r})".replace("'", '"') if "enum" in spec else ""
        lines.append(f"    {name}: {spec.get('description', name)}{choices}")

    def method(self, **arguments: Any) -> str:
        return self._call(tool.name, arguments)

    method.__name__ = method.__qualname__ = tool.name
    method.__signature__ = inspect.Signature(parameters, return_annotation=str)
    method.__annotations__ = annotations
    method.__doc__ = f"{tool.description}\n\nArgs:\n" + "\n".join(lines) if lines else tool.description
    return method


def grpo_environment_class(registry: ToolRegistry | None = None, *, surface: str = "all",
                           reward: GRPOReward = GRPOReward(), outcomes: list[dict[str, Any]] | None = None,
                           split: str | None = None, world: str | World = DEFAULT_WORLD,
                           **env_kwargs: Any) -> type[GRPOEnvironmentBase]:
    """A class for ``GRPOTrainer(environment_factory=cls)``. ``surface``: "all" offers every tool of
    ``registry`` as a method, plus ``tool_search`` and ``tool_info``; "search" offers ``tool_search``,
    ``tool_info`` and ``call_tool(name, arguments)`` only (the tag protocol's discovery by search, and a
    prompt about 3,700 tokens shorter). ``env_kwargs`` go to ``ResiliBenchTextEnv`` (``config``,
    ``tasks``, ``search``: a ``SearchSettings``...; ``split=None`` by default, so any task id of ``world``
    resets). When ``outcomes`` is a list, every graded rollout appends its task, seed, level, reward,
    turns and progress to it."""
    if surface not in SURFACES:
        raise ValueError(f"surface must be one of {SURFACES}, got {surface!r}")
    registry = registry or default_registry()
    clash = {*META_TOOLS, "call_tool"} & set(registry.names)
    if clash:
        raise ValueError(f"registry tool names clash with {sorted(clash)}")
    methods: dict[str, Any] = _meta_methods()
    if surface == "all":
        methods.update({tool.name: tool_method(tool) for tool in registry.tools})
    else:
        methods["call_tool"] = _call_tool_method()
    methods.update(_env_kwargs={"registry": registry, "split": split, "world": world, **env_kwargs},
                   _reward=reward, _outcomes=outcomes)
    return type("ResiliBenchGRPOEnv", (GRPOEnvironmentBase,), methods)


