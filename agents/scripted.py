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

Protocols: an agent lists the protocols it speaks in ``protocols`` (tags only when absent).
``LLMAgent`` speaks both; ``for_protocol(agent, "tools")`` lets a tags-only agent (every scripted one)
play the native tool-calling protocol: it reads the conversation as the tags protocol would have it
(``tag_view``) and its tag messages are sent as tool calls (``tool_message``), so the same decisions
meet the same episode under either protocol.
"""

from __future__ import annotations

__all__ = [
    "COMPLETION_MESSAGE", "Batch", "Agent", "call_message", "episode_of", "LLMAgent", "tool_message",
    "tag_view", "TagsAgentWithTools", "for_protocol", "OptimalTextAgent", "PlanFollowingTextAgent",
    "PlannerTextAgent",
]

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from resilibench.llm import Backend, BackendError, GenerationConfig, InfraError, Message, PartialFailure

from ..core.simulator import Episode
from ..core.workflow import Workflow

COMPLETION_MESSAGE = "Task completed."

# One (conversation, env) pair per running episode; the env is the unwrapped ResiliBenchTextEnv.
Batch = Sequence[tuple[Sequence[Message], Any]]


class Agent(Protocol):
    """Answers every running episode of a batch; ``name`` is the model column of results. A reply is a
    message (a string with tags; an assistant message dict with tool calls in the tools protocol) or an
    ``InfraError`` when the infrastructure could not produce it (the harness ends that episode as an
    infrastructure error)."""

    name: str

    def respond(self, batch: Batch) -> list[Any]: ...


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
    """An LLM behind a ``Backend``: one batched call per round of the harness, ``generate`` in the tags
    protocol, ``generate_with_tools`` with the env's function schemas in the tools protocol. A
    conversation the backend could not answer for a reason of its own (``InfraError``: too long, timed
    out) gets that error as its reply; any other backend error is raised."""

    protocols = ("tags", "tools")

    def __init__(self, backend: Backend, config: GenerationConfig | None = None, name: str | None = None):
        self.backend = backend
        self.config = config or GenerationConfig()
        self.name = name or backend.name

    def respond(self, batch: Batch) -> list[Any]:
        if not batch:
            return []
        conversations = [conversation for conversation, _ in batch]
        tools = getattr(getattr(batch[0][1], "unwrapped", batch[0][1]), "tools", None)
        try:
            if tools is None:
                replies = self.backend.generate(conversations, self.config)
            else:
                replies = self.backend.generate_with_tools(conversations, self.config, tools)
        except PartialFailure as exc:
            stopping = [a for a in exc.answers if isinstance(a, BackendError) and not isinstance(a, InfraError)]
            if stopping:
                raise stopping[0] from None
            replies = exc.answers
        if len(replies) != len(batch):
            raise RuntimeError(f"backend {self.backend.name} returned {len(replies)} messages for {len(batch)} "
                               "conversations")
        return replies


def tool_message(text: str) -> Message:
    """A tags-protocol message as the tools protocol's assistant message: its searches, info requests and
    calls as tool calls (in that order), its completion signal as the content."""
    from ..core.text.toolbox import INFO_FUNCTION, SEARCH_FUNCTION, parse_message

    parsed = parse_message(text)
    calls = ([(SEARCH_FUNCTION, {"query": q}) for q in parsed.searches]
             + [(INFO_FUNCTION, {"name": n}) for n in parsed.infos]
             + [(c.name, c.arguments or {}) for c in parsed.calls])
    message: Message = {"role": "assistant",
                        "content": COMPLETION_MESSAGE if parsed.completes else ("" if calls else text)}
    if calls:
        message["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                                  "function": {"name": name, "arguments": json.dumps(arguments, sort_keys=True)}}
                                 for i, (name, arguments) in enumerate(calls)]
    return message


def tag_view(conversation: Sequence[Message]) -> list[Message]:
    """A tools-protocol conversation as the tags protocol would have it: each assistant message's tool
    calls written as tags after its content, the feedback messages that follow it as one user message."""
    from ..core.text.toolbox import INFO_FUNCTION, SEARCH_FUNCTION

    out: list[Message] = []
    for m in conversation:
        if m["role"] == "assistant":
            tags = []
            for call in m.get("tool_calls", ()):
                name, arguments = call["function"]["name"], json.loads(call["function"]["arguments"] or "{}")
                if name in (SEARCH_FUNCTION, INFO_FUNCTION):
                    value = arguments.get("query" if name == SEARCH_FUNCTION else "name", "")
                    tags.append(f"<{name}>{value}</{name}>")
                else:
                    tags.append(call_message(name, arguments))
            out.append({"role": "assistant", "content": "".join(tags) + m["content"]})
        elif out and out[-1]["role"] == "user" and m["role"] in ("tool", "user") and len(out) > 1:
            out[-1] = {"role": "user", "content": out[-1]["content"] + "\n\n" + m["content"]}
        else:
            out.append({"role": "user" if m["role"] == "tool" else m["role"], "content": m["content"]})
    return out


class TagsAgentWithTools:
    """A tags-only agent playing the tools protocol (``tag_view`` in, ``tool_message`` out)."""

    protocols = ("tools",)

    def __init__(self, agent: Agent):
        self.agent = agent
        self.name = agent.name

    def respond(self, batch: Batch) -> list[Any]:
        replies = self.agent.respond([(tag_view(conversation), env) for conversation, env in batch])
        return [r if isinstance(r, BackendError) else tool_message(r) for r in replies]


def for_protocol(agent: Agent, protocol: str) -> Agent:
    """``agent`` when it speaks ``protocol``; a tags-only agent wrapped to play the tools protocol."""
    if protocol in getattr(agent, "protocols", ("tags",)):
        return agent
    if protocol == "tools":
        return TagsAgentWithTools(agent)
    raise ValueError(f"agent {agent.name} does not speak the {protocol} protocol")


class OptimalTextAgent:
    """The bound-(iii) optimal policy speaking the text protocol (reads ``env.unwrapped.episode``)."""

    name = "scripted:optimal"

    def respond(self, batch: Batch) -> list[str]:
        return [self.message(episode_of(env)) for _, env in batch]

    @staticmethod
    def message(episode: Episode) -> str:
        """The optimal policy's next message for ``episode``: one tool call, or the completion signal."""
        from ..policies.optimal import OptimalPlanner

        planner = OptimalPlanner(episode.config)  # the episode's own rules (strict dependencies, turns)
        planner.reset(episode.task, None)
        action = planner.act(episode, None)
        if action == len(episode.registry):
            return COMPLETION_MESSAGE
        return call_message(episode.registry.names[action])


class PlanFollowingTextAgent:
    """Follows the plan written in the prompt (the first message of the conversation), step by step.

    The plan is parsed from the prompt text with ``core.text.prompts.parse_plan``; the episode state
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
        assert workflow is not None  # there is a follower only for a plan
        node = workflow.nodes[step]
        return call_message(node.tool, node.arguments if node.params else None)

    def _plan(self, prompt: str, episode: Episode) -> tuple[Workflow | None, Any]:
        """(plan, PlanFollower) of a prompt text, cached: every turn of an episode reads the same prompt."""
        from ..core.plan_follower import PlanFollower
        from ..core.text.prompts import parse_plan

        cached = self._plans.get(prompt)
        if cached is None:
            try:
                workflow = parse_plan(prompt, episode.registry.names)
            except ValueError:
                workflow = None
            follower = PlanFollower(workflow, episode.registry) if workflow is not None and workflow.nodes else None
            cached = self._plans[prompt] = (workflow, follower)
            if len(self._plans) > self._cache_size:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(prompt)
        return cached


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
        from ..policies.runner import planner_rng

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
