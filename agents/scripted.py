"""Agents of the text protocol: the interface the harness drives, the LLM agent, two scripted references.

An agent answers a batch of running episodes at once: ``respond(batch)`` gets ``(conversation, env)``
pairs and returns one assistant message per pair. ``LLMAgent`` hands every conversation to its backend
in one ``generate`` call. The scripted agents write the same kind of messages an LLM would:

* ``OptimalTextAgent`` plays the exact optimal policy of bound (iii) (``OptimalPlanner``), reading the
  episode state from ``env.unwrapped.episode``; its full-success rate is bound (iii) under the text
  env's own rules, which makes it the reference every model is compared with.
* ``PlanFollowingTextAgent`` reads the workflow plan from the prompt text alone and follows it
  literally (``PlanFollower``: first unfinished step with calls left, retried on failure), passing each
  step's arguments as JSON; it measures what a prompt's plan is worth to an executor that trusts it.

``PlannerTextAgent`` lets any ``Planner`` (a heuristic, a PPO policy) play the text protocol, and
``make_text_agent(spec)`` builds any of these agents from a spec (``AGENT_SPECS``).

Both say "task completed" in a message of its own, which costs no turn in the text env.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

from resilibench.agents.base import Backend, GenerationConfig, Message
from resilibench.envs.simulator import Episode
from resilibench.metrics.workflow import Workflow

COMPLETION_MESSAGE = "Task completed."

# One (conversation, env) pair per running episode; the env is the unwrapped ResiliBenchTextEnv.
Batch = Sequence[tuple[Sequence[Message], Any]]


class Agent(Protocol):
    """Answers every running episode of a batch; ``name`` is the model column of results."""

    name: str

    def respond(self, batch: Batch) -> list[str]: ...


def call_message(tool: str, arguments: dict[str, Any] | None = None) -> str:
    """A ``<tool_call>`` message, with the arguments as JSON when there are any."""
    args = f" {json.dumps(arguments, sort_keys=True)}" if arguments else ""
    return f"<tool_call>{tool}{args}</tool_call>"


def episode_of(env: Any) -> Episode:
    """The simulator episode of a (possibly wrapped) text env."""
    episode = getattr(getattr(env, "unwrapped", env), "episode", None)
    if episode is None:
        raise RuntimeError("the env has no running episode; reset it first")
    return episode


class LLMAgent:
    """An LLM behind a ``Backend``: one batched ``generate`` call per round of the harness."""

    def __init__(self, backend: Backend, config: GenerationConfig | None = None, name: str | None = None):
        self.backend = backend
        self.config = config or GenerationConfig()
        self.name = name or backend.name

    def respond(self, batch: Batch) -> list[str]:
        replies = self.backend.generate([conversation for conversation, _ in batch], self.config)
        if len(replies) != len(batch):
            raise RuntimeError(f"backend {self.backend.name} returned {len(replies)} messages for {len(batch)} "
                               "conversations")
        return replies


class OptimalTextAgent:
    """The bound-(iii) optimal policy speaking the text protocol (reads ``env.unwrapped.episode``)."""

    name = "scripted:optimal"

    def respond(self, batch: Batch) -> list[str]:
        return [self.message(episode_of(env)) for _, env in batch]

    @staticmethod
    def message(episode: Episode) -> str:
        """The optimal policy's next message for ``episode``: one tool call, or the completion signal."""
        from resilibench.policies.bounds import OptimalPlanner

        planner = OptimalPlanner(episode.config)  # the episode's own rules (strict dependencies, turns)
        planner.reset(episode.task, None)
        action = planner.act(episode, None)
        if action == len(episode.registry):
            return COMPLETION_MESSAGE
        return call_message(episode.registry.names[action])


class PlanFollowingTextAgent:
    """Follows the plan written in the prompt (the first message of the conversation), step by step.

    The plan is parsed from the prompt text with ``policies.prompts.parse_plan``; the episode state
    (which tools succeeded, calls used) is what the feedback messages have told the agent, read from
    ``env.unwrapped.episode`` for brevity. A prompt without a plan gets the completion signal at once.
    """

    name = "scripted:plan"

    def __init__(self, cache_size: int = 4096):
        self._plans: OrderedDict[str, tuple[Workflow | None, Any]] = OrderedDict()
        self._cache_size = cache_size

    def respond(self, batch: Batch) -> list[str]:
        return [self.message(conversation, episode_of(env)) for conversation, env in batch]

    def message(self, conversation: Sequence[Message], episode: Episode) -> str:
        """The next plan step as a tool call with its arguments, or the completion signal."""
        workflow, follower = self._plan(conversation[0]["content"], episode)
        step = None if follower is None else follower.next_step(episode)
        if step is None:
            return COMPLETION_MESSAGE
        node = workflow.nodes[step]
        return call_message(node.tool, node.arguments if node.params else None)

    def _plan(self, prompt: str, episode: Episode) -> tuple[Workflow | None, Any]:
        """(plan, PlanFollower) of a prompt text, cached: every turn of an episode reads the same prompt."""
        from resilibench.policies.plan_follower import PlanFollower
        from resilibench.policies.prompts import parse_plan

        cached = self._plans.get(prompt)
        if cached is None:
            try:
                workflow = parse_plan(prompt)
            except ValueError:
                workflow = None
            follower = PlanFollower(workflow, episode.registry) if workflow is not None and workflow.nodes else None
            cached = self._plans[prompt] = (workflow, follower)
            if len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(prompt)
        return cached


SCRIPTED_AGENTS = ("optimal", "plan", "names", "search")


def make_scripted_agent(kind: str) -> Agent:
    """A scripted agent by name: ``optimal``, ``plan``, or the text-only baselines ``names`` and ``search``
    (``resilibench.agents.text_baselines``)."""
    from resilibench.agents.text_baselines import NameReadingTextAgent, SearchTextAgent

    makers = {"optimal": OptimalTextAgent, "plan": PlanFollowingTextAgent, "names": NameReadingTextAgent,
              "search": SearchTextAgent}
    if kind not in makers:
        raise ValueError(f"scripted agent must be one of {sorted(SCRIPTED_AGENTS)}, got {kind!r}")
    return makers[kind]()


class PlannerTextAgent:
    """Any ``Planner`` (heuristics, ``OptimalPlanner``, a PPO policy) speaking the text protocol: each turn
    one ``<tool_call>`` of the planner's action, or the completion signal for FINISH.

    ``make(episode)`` builds the planner of a new episode (one per running env, so stateful planners do
    not share state); it is reset with an rng derived from the episode's random stream."""

    def __init__(self, make: Callable[[Episode], Any], name: str):
        self.make = make
        self.name = name
        self._planners: dict[int, tuple[Episode, Any]] = {}

    def respond(self, batch: Batch) -> list[str]:
        from resilibench.policies.runner import planner_rng

        replies = []
        for _, env in batch:
            episode = episode_of(env)
            held = self._planners.get(id(env))
            if held is None or held[0] is not episode:
                planner = self.make(episode)
                stream_seed = int.from_bytes(hashlib.sha256(episode.stream.tobytes()).digest()[:8], "little")
                planner.reset(episode.task, planner_rng(self.name, stream_seed))
                held = self._planners[id(env)] = (episode, planner)
            action = held[1].act(episode, None)
            replies.append(COMPLETION_MESSAGE if action == len(episode.registry)
                           else call_message(episode.registry.names[action]))
        return replies


AGENT_SPECS = ("scripted:optimal, scripted:plan, scripted:names, scripted:search, a planner name (random_legal, in_order, dependency_aware, "
                "optimal), ppo:CHECKPOINT_DIR, hf:PATH, vllm:PATH or openai:URL?model=NAME")


def check_agent_spec(spec: str) -> None:
    """Check an agent spec's form (and an ``hf:`` or ``ppo:`` directory) without loading anything;
    ValueError naming the problem."""
    from resilibench.agents.backends import BACKEND_KINDS, check_spec
    from resilibench.policies.runner import PLANNER_NAMES

    kind, _, target = spec.partition(":")
    if kind == "scripted":
        if target not in SCRIPTED_AGENTS:
            raise ValueError(f"scripted agent must be one of {sorted(SCRIPTED_AGENTS)}, got {target!r}")
    elif kind in BACKEND_KINDS:
        check_spec(spec)
    elif kind == "ppo":
        if not target or not Path(target).is_dir():
            raise ValueError(f"ppo:{target}: not a checkpoint directory")
    elif spec not in PLANNER_NAMES:
        raise ValueError(f"agent spec {spec!r} not understood")


def make_text_agent(spec: str, generation: GenerationConfig | None = None, batch_size: int = 8) -> Agent:
    """A text-env agent from a spec (``AGENT_SPECS``); ValueError naming the accepted forms."""
    from resilibench.agents.backends import BACKEND_KINDS, make_backend
    from resilibench.policies.runner import PLANNER_NAMES, make_planner

    kind, _, target = spec.partition(":")
    if kind == "scripted" and target in SCRIPTED_AGENTS:
        return make_scripted_agent(target)
    if kind in BACKEND_KINDS:
        return LLMAgent(make_backend(spec, batch_size=batch_size), generation)
    if kind == "ppo" and target:
        from resilibench.policies.ppo.evaluation import PPOPlanner

        planner = PPOPlanner(target)  # deterministic and stateless: shared by every episode
        return PlannerTextAgent(lambda episode: planner, f"ppo:{target}")
    if spec in PLANNER_NAMES:
        return PlannerTextAgent(lambda episode: make_planner(spec, episode.config), f"planner:{spec}")
    raise ValueError(f"agent spec {spec!r} not understood; forms: {AGENT_SPECS}")
