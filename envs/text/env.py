"""``ResiliBenchText-v1``: LLM agents play the ResiliBench world through chat messages (docs/envs/text.md)."""

from __future__ import annotations

__all__ = [
    "CHARSET", "RESET_OPTIONS", "PROMPT_FIELDS", "TEXT_RULES", "TRUNCATION_MARK", "TAIL_CHARS",
    "MAX_REQUESTS", "MAX_QUERY_CHARS", "REMINDER", "TOOLS_REMINDER", "flaw_seed", "ResiliBenchTextEnv",
    "read_tool_calls", "episode_record",
]

import dataclasses
import json
import re
import string
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from resilibench.settings import settings_argument

from ...core.config import WorldConfig
from ...core.frontend import choose_task, select_tasks, task_by_id
from ...core.registry import ToolRegistry, default_registry
from ...core.rewards import ShapedRewarder
from ...core.simulator import EnvEpisodes, Episode
from ...core.tasks.library import SPLITS, Task
from ...core.text.flaws import flaw_applies
from ...core.text.prompts import Prompt, PromptSettings, build_prompt, shown_plan
from ...core.text.toolbox import (
    FUNCTION_SEARCH_HINT,
    INFO_FUNCTION,
    SEARCH_FUNCTION,
    TAG_SEARCH_HINT,
    ParsedMessage,
    SearchSettings,
    UnknownToolError,
    call_tool,
    call_with_arguments,
    describe_text,
    describe_tool,
    end_text,
    feedback_text,
    function_schemas,
    message_completes,
    no_calls_left,
    parse_message,
    progress_text,
    resolve_tool,
    search_text,
    search_tools,
)
from ...core.workflow import Workflow
from ...core.world import DEFAULT_WORLD, World, get_world
from ..real_api.client import HttpExecutor
from ..real_api.live_apis import RealApi, task_workflow

# The characters of observations: printable ASCII, Latin-1 letters and signs, typographic quotes, dashes,
# ellipsis, bullet and arrow; any other character of a prompt becomes "?". ``step`` accepts any string.
CHARSET = (frozenset(string.printable) | frozenset(map(chr, range(0xA0, 0x100)))
           | frozenset("\u2013\u2014\u2018\u2019\u201c\u201d\u2026\u2022\u2192"))
_OUTSIDE_CHARSET = re.compile(f"[^{re.escape(''.join(sorted(CHARSET)))}]")  # one such character, found in C
RESET_OPTIONS = ("task_id", "prompt", "flaw_type", "severity", "plan_style", "workflow", "shown_prompt")
PROMPT_FIELDS = {"prompt": "variant"}  # reset options named otherwise in PromptSettings
TEXT_RULES = {"strict_dependencies": True}  # the text protocol's episode rules, unless ``rules`` changes them
TRUNCATION_MARK = "\n[... {n} characters cut ...]\n"
TAIL_CHARS = 1000  # a text cut to fit keeps its last TAIL_CHARS characters (the progress line is there)
# The work of one message is capped, whatever its length: at most MAX_REQUESTS searches and info requests
# are answered (in order; the rest are counted as not answered), and a search query is cut to
# MAX_QUERY_CHARS characters (MiniLM reads at most 256 word pieces of it anyway).
MAX_REQUESTS = 5
MAX_QUERY_CHARS = 2000

REMINDER = (
    "No tool request found in your message. Write one of these, with your own text in place of the dots:\n"
    "- <tool_search>...</tool_search> to find tools for what you need\n"
    "- <tool_info>...</tool_info> to read a tool's parameters (its name in place of the dots)\n"
    "- <tool_call>...</tool_call> to run one tool: its name, then optionally its arguments as a JSON object\n"
    "The progress line below says how much of the task is left."
)

TOOLS_REMINDER = (
    "No tool call found in your message. Call tool_search to find tools, tool_info to read a tool's "
    "parameters, or one of the tools to run it (one tool call per message)."
)


def _with_options(settings: PromptSettings, options: dict[str, Any]) -> PromptSettings:
    """``settings`` with a reset's prompt options, kept per value: an evaluation resets with the same few
    option sets again and again, and building settings checks every field."""
    key = tuple((k, type(v), v) for k, v in options.items())  # the type too: 1, 1.0 and True are equal keys
    try:
        return _settings_with(settings, key)
    except TypeError:  # an unhashable value (which the settings' check refuses)
        return _settings_with.__wrapped__(settings, key)


@lru_cache(maxsize=1024)
def _settings_with(settings: PromptSettings, options: tuple[tuple[str, type, Any], ...]) -> PromptSettings:
    return dataclasses.replace(settings, **{PROMPT_FIELDS.get(k, k): v for k, _, v in options})


def flaw_seed(seed: int) -> int:
    """The seed of an episode's prompt (flaw injection) from its episode seed: deterministic and
    independent of the episode's failure stream, which ``seed`` itself seeds."""
    return int(np.random.SeedSequence([seed, 1]).generate_state(1)[0])


class ResiliBenchTextEnv(gym.Env):
    """
    ## Description

    An LLM agent completes a ResiliBench task by chatting: it reads a prompt (task, inputs, expected
    outputs, tool protocol and, depending on the variant, a workflow plan), then sends one assistant
    message per turn. Messages may search the 30 tools, read a tool's schema and call one tool; the env
    answers each message with a feedback message. Tool calls are played on the same seeded ``Episode``
    as ``ResiliBench-v1`` (same failure model, same rules), so the same seed and the same calls give the
    same outcomes in both envs. The evaluator grades the episode as ``full_success``,
    ``partial_success`` or ``failure``.

    ## Action Space

    ``Text(max_length, charset=CHARSET)``: an assistant message. Understood in it (tags are
    case-insensitive, may sit in code fences, and a missing closing tag runs to the next tag):

    * ``<tool_search>query</tool_search>``: the 5 closest tools (MiniLM embeddings, or a lexical match
      without the ``embed`` extra) with their schemas;
    * ``<tool_info>tool_name</tool_info>``: one tool's parameters, returns, errors and dependencies;
    * ``<tool_call>tool_name {"arg": value}</tool_call>``: call a tool; the JSON arguments are optional,
      and given ones are checked against the tool's input schema (a violation or malformed JSON is an
      ``INVALID_INPUT`` failure without a draw, naming the argument). ``name({...})`` and
      ``{"name": ..., "arguments": {...}}`` are accepted too, and text after the JSON is not part of
      the call. Only the first call of a message runs; the feedback says which were not executed.
    * a completion phrase ("task completed", ...) stated as the agent's own sentence (not in code or
      quotes, not a rule, condition, plan, negation or question): ends the episode after the
      message's call, if any.

    Identical requests of one message are answered once. ``step`` accepts any string (the charset only
    shapes ``sample()``). With ``protocol="tools"`` an action is an assistant message dict whose
    ``tool_calls`` call ``tool_search``, ``tool_info`` or a tool (``env.tools`` holds their function
    schemas), or a string (a message without calls); each call is answered in a tool message.

    ## Observation Space

    ``Text(max_length, charset=CHARSET)``: the prompt after ``reset`` (from
    ``resilibench.core.text.prompts.build_prompt``), then the feedback to each message: search results,
    tool information, the call's result or error code with its description, dependency problems,
    progress ("k/n required tools done") and turns left; a protocol reminder for a message without a
    tag. Texts longer than ``max_length`` are cut in the middle with a mark (the closing progress line
    stays). ``env.unwrapped.messages`` holds the whole conversation as chat messages (with tool calls
    and tool messages under the tools protocol).

    ## Rewards

    1.0 when the episode ends in full success, else 0.0.

    ## Starting State

    A task sampled uniformly from the pool with the env's generator (exactly as ``ResiliBench-v1``
    samples it), or the task of ``options["task_id"]``; every tool not attempted.

    ## Episode End

    Each message is one turn (searches and info requests included); the turn limit is 10. A tool that
    already succeeded returns its earlier result (the turn is spent, no draw); a tool called 1 +
    ``max_retries`` times answers ``RETRY_LIMIT_EXCEEDED``. With strict dependencies (the default) a call
    with an unmet dependency fails with ``DEPENDENCY_ERROR`` without a draw. Terminated on the completion
    signal, after 5 consecutive failed calls or 3 failures of the same tool in a row. After the last
    turn only the completion signal is accepted: any other message ends the episode as truncated. At the
    end ``info["level"]`` and ``info["evaluation"]`` are set.

    ``info`` always holds: ``task_id``, ``task_type``, ``prompt`` (variant), ``flaw_type``,
    ``injection`` (what the flaw changed, or None), ``turn`` (turns used), ``turns_left``, ``trace``
    (calls as dicts), ``level`` and ``evaluation`` (None until the end), ``end_reason`` and ``parsed``
    (what was understood in the last message).

    ## Arguments

    ```python
    import gymnasium as gym
    import resilibench

    from resilibench.core.text.prompts import PromptSettings

    env = gym.make("ResiliBenchText-v1", split="test", prompt=PromptSettings(variant="optimal"))
    prompt, info = env.reset(seed=0)
    feedback, reward, terminated, truncated, info = env.step("<tool_search>read a file</tool_search>")
    ```

    * ``split``: "test" (default), "train", "validation" or None; ``task_types``: a type or list of
      types; ``tasks``: explicit ``Task`` objects instead of the shipped library.
    * ``prompt``: a ``PromptSettings`` (``resilibench.core.text.prompts``): the variant ("baseline" by
      default, "cot", "optimal" or "flawed"), ``flaw_type`` and ``severity`` of a flawed prompt,
      ``plan_style`` (how a plan is written), ``protocol`` ("tags", the paper's, or "tools": native
      function calls), ``wording`` of the tag protocol ("plain": no live example tag, or "paper"), and
      ``matcher``: how flaw injection finds similar tools (pin it to reproduce flaws on any install).
    * ``search``: a ``SearchSettings`` (``resilibench.core.text.toolbox``): the search ``method``
      ("auto", "semantic", "lexical") and ``k``, the tools a search shows (5).
    * ``config``: a ``WorldConfig`` (default: the world's); ``rules``: episode rules changed on top of it
      (``{"turn_limit": 12}``); the text protocol's rule, strict dependencies, applies unless ``rules``
      says otherwise (``{"strict_dependencies": False}``). ``world``: "v1" (the env id's) or a ``World``.
    * ``max_length``: the length limit of both Text spaces (default 16384 characters).
    * ``registry``: a ``ToolRegistry`` (default: the shared one); ``render_mode``: "ansi" or "human".
    * ``api``: real-API mode, a ``RealApi`` (``resilibench.envs.real_api.live_apis``; docs/envs/real_apis.md).
      Where the simulator would draw, the tool is called over HTTP (``envs.real_api.client.HttpExecutor``)
      and the agent reads the real response body; the rules and the evaluator stay the world's. Against
      our tool service each episode opens the service's episode of the same task and seed, so the outcomes
      are the simulator's; a live API brings its tools, tasks and endpoints.

    ``reset(options=...)`` accepts ``task_id``, ``prompt``, ``flaw_type``, ``severity``, ``plan_style``
    and ``workflow`` (a ``Workflow`` used as the plan instead of the optimal one) for one episode, or
    ``shown_prompt``: a ``Prompt`` built elsewhere (``core.text.prompts.build_prompt``), shown as it is.

    ## Version History

    * v0: initial release (rules of docs/core/rules.md; any change to them bumps the version).
    * v1: world v1 (its task library and grading, docs/core/worlds.md); the default.
    """

    metadata = {"render_modes": ["ansi", "human"], "render_fps": 1}

    def __init__(
        self,
        split: str | None = "test",
        task_types: Sequence[str] | str | None = None,
        tasks: Sequence[Task] | None = None,
        prompt: PromptSettings | None = None,
        search: SearchSettings | None = None,
        config: WorldConfig | None = None,
        rules: Mapping[str, Any] | None = None,
        world: str | World = DEFAULT_WORLD,
        registry: ToolRegistry | None = None,
        render_mode: str | None = None,
        max_length: int = 16384,
        api: RealApi | None = None,
    ):
        self.prompt_settings = settings_argument("prompt", prompt, PromptSettings) or PromptSettings()
        self.search = settings_argument("search", search, SearchSettings) or SearchSettings()
        api = settings_argument("api", api, RealApi)
        if split is not None and split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS} or None, got {split!r}")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}")
        if not isinstance(max_length, int) or max_length < 256:
            raise ValueError(f"max_length must be an integer >= 256, got {max_length!r}")
        chosen = get_world(world, config)
        live = api and api.live
        if live is not None:  # its tools, tasks and task types unless given
            chosen, registry = chosen.configured(live.world_config(chosen.config)), registry or live.registry
            tasks = live.tasks if tasks is None else tasks
        self.world = chosen.with_rules(**{**TEXT_RULES, **(rules or {})})
        self.config = self.world.config
        self.registry = registry or default_registry()
        # Real-API mode: tool calls go through this client (None: the simulator draws).
        self.client = None if api is None else api.client(self.registry)
        self._owns_client = api is None or self.client is not api.target
        self.executor: HttpExecutor | None = None
        self.protocol = self.prompt_settings.protocol
        self._search_hint = TAG_SEARCH_HINT if self.protocol == "tags" else FUNCTION_SEARCH_HINT
        # The function schemas offered to a model of the tools protocol (None with tags).
        self.tools = function_schemas(self.registry) if self.protocol == "tools" else None
        self.tasks = select_tasks(tasks, split, task_types, self.world)
        self.render_mode = render_mode
        self.max_length = max_length
        self.action_space = spaces.Text(max_length, min_length=0, charset=CHARSET)
        self.observation_space = spaces.Text(max_length, min_length=0, charset=CHARSET)
        self.episode: Episode | None = None
        self._episodes = EnvEpisodes()
        self.task: Task | None = None
        # The Prompt of the episode (text, variant, plan, injection, plan_style).
        self.prompt: Prompt | None = None
        self.messages: list[dict[str, Any]] = []
        self._parsed: ParsedMessage | None = None
        self._injection: dict[str, Any] | None = None  # the prompt's flaw injection as a dict
        # The running full-success rate read by the training profile, kept as ResiliBench-v1 keeps it.
        self._success_tracker = ShapedRewarder(self.config.reward)

    # --- Gymnasium API -------------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        settings, workflow = self.prompt_settings, None
        task_id, shown = None, None
        if options:
            unknown = sorted(set(options) - set(RESET_OPTIONS))
            if unknown:
                raise ValueError(f"unknown reset option(s) {unknown}; accepted: {list(RESET_OPTIONS)}")
            options = dict(options)
            task_id = options.pop("task_id", None)
            shown = options.pop("shown_prompt", None)
            workflow = options.pop("workflow", None)
            _check_option("workflow", workflow, Workflow)
            _check_option("shown_prompt", shown, Prompt)
            if options:  # the prompt's settings for this episode ("prompt" is the variant)
                settings = _with_options(settings, options)
        super().reset(seed=seed)
        task, seed_of_episode = choose_task(self.tasks, self._episodes, seed, {"task_id": task_id}, self.world)
        prompt = shown or build_prompt(
            task, settings, seed=flaw_seed(seed_of_episode),
            workflow=task_workflow(task) if workflow is None else workflow,  # a live task's: its own steps
            config=self.config, registry=self.registry)
        self.task, self.prompt = task, prompt
        self._injection = None if prompt.injection is None else prompt.injection.to_dict()
        self.episode = Episode.start(task, seed_of_episode, self.config, self.registry,
                                     success_rate=self._success_tracker.success_rate)
        # Against our tool service the executor opens the service's episode of this task and seed.
        self.executor = None if self.client is None else HttpExecutor(self.client, self.episode)
        self._parsed = None
        observation = self._fit(prompt.text)
        self.messages = [{"role": "user", "content": observation}]
        if self.render_mode == "human":
            print(_blocks(self.messages))
        return observation, self.info()

    def flaw_applies(self, task_id: str, flaw_type: str) -> bool:
        """Whether a flawed prompt of task ``task_id`` can carry ``flaw_type`` (else ``reset`` raises
        ``FlawNotApplicable``); it depends on the task's plan only, not on the seed or the severity."""
        task = task_by_id(self.tasks, task_id, self.world)
        plan = shown_plan(task, task_workflow(task), self.config, self.registry)
        return flaw_applies(plan, flaw_type, self.registry, self.prompt_settings.matcher)

    def step(self, action):
        episode = self.episode
        if episode is None:
            raise RuntimeError("call reset() before step()")
        if episode.done:
            raise RuntimeError("episode has ended; call reset()")
        parsed, assistant, ids = self._read(action, episode)
        self._parsed = parsed
        truncated = False
        parts: list[tuple[Any, str]] = []  # (request key or None, text)
        no_more = no_calls_left(episode)  # a spent time budget ends calls as the turn limit does
        if episode.turns_left == 0:
            if parsed.calls:
                parts.append((None, f"{no_more}: the tool call was not executed."))
            if parsed.completes:
                episode.finish()
            else:
                episode.end_out_of_turns()
                truncated = True
                parts.append((None, f"{no_more} and no completion signal."))
        elif parsed.completes and not parsed.has_tags:
            episode.finish()  # the completion signal alone costs no turn, as FINISH in ResiliBench-v1
        else:
            parts = self._play(parsed, episode)
            if parsed.completes and not episode.done:
                episode.finish()
            elif not episode.done and episode.turns_left == 0:
                parts.append((None, f"{no_calls_left(episode)}: reply \"task completed\" to finish, or the episode ends "
                                    "unfinished."))
        if self._over_length(action):
            parts.append((None, f"Your message is longer than {self.max_length} characters: only its first "
                                f"{self.max_length} were read."))
        end = end_text(episode) if episode.done else None
        if end is not None and not any(end in text for _, text in parts):  # a call's feedback may hold it
            parts.append((None, end))
        replies = self._replies(parts, ids)
        self.messages += [assistant, *replies]
        observation = "\n\n".join(m["content"] for m in replies)
        evaluation = episode.evaluation
        full = evaluation is not None and evaluation.level == "full_success"
        if evaluation is not None:
            self._success_tracker.recent.append(full)
        if self.render_mode == "human":
            print(_blocks([assistant, *replies]))
        return observation, 1.0 if full else 0.0, episode.done and not truncated, truncated, self.info()

    def close(self):
        if self.client is not None and self._owns_client:
            self.client.close()
        super().close()

    def render(self):
        if self.render_mode == "ansi":
            return self.render_text()
        if self.render_mode == "human":
            print(self.render_text())
        return None

    # --- helpers -------------------------------------------------------------------------------------

    def render_text(self) -> str:
        """The conversation so far, one block per message."""
        if self.episode is None:
            return "(not reset)"
        return _blocks(self.messages)

    def _read(self, action: Any, episode: Episode
              ) -> tuple[ParsedMessage, dict[str, Any], dict[tuple[str, int], str]]:
        """(what the message asks, the assistant message as kept in ``messages``, the tool call id of each
        request). Tags: a string whose tags are read. Tools: an assistant message with ``tool_calls``
        (or a string, a message without calls) whose ``content`` is read for completion only."""
        if self.protocol == "tags":
            if not isinstance(action, str):
                raise ValueError(f"action must be a string (an assistant message), got {type(action).__name__}")
            action = action[:self.max_length]
            return parse_message(action, self.config.evaluator), {"role": "assistant", "content": action}, {}
        return read_tool_calls(action, self.config.evaluator, f"call_{episode.turns_used}", self.max_length)

    def _over_length(self, action: Any) -> bool:
        """Whether the action's text (tags: the message; tools: its content) is cut at ``max_length``."""
        content = action.get("content") if isinstance(action, dict) else action
        return isinstance(content, str) and len(content) > self.max_length

    def _replies(self, parts: list[tuple[Any, str]], ids: dict[tuple[str, int], str]) -> list[dict[str, Any]]:
        """The feedback messages: with tags one user message; with tools one tool message per tool call
        (its requests' answers; the message-wide parts go to the last one) or a user message when the
        assistant made no call."""
        if self.protocol == "tags":
            return [{"role": "user", "content": self._fit("\n\n".join(text for _, text in parts))}]
        answers: dict[Any, list[str]] = {key: [] for key in ids}
        general = []
        for key, text in parts:
            (answers[key] if key is not None else general).append(text)
        replies = [{"role": "tool", "tool_call_id": call_id, "content": "\n\n".join(answers[key]) or "Not executed."}
                   for key, call_id in ids.items()]
        if replies and general:
            replies[-1]["content"] += "\n\n" + "\n\n".join(general)
        elif general or not replies:
            replies.append({"role": "user", "content": "\n\n".join(general)})
        for reply in replies:
            reply["content"] = self._fit(reply["content"])
        return replies

    def _play(self, parsed: ParsedMessage, episode: Episode) -> list[tuple[Any, str]]:
        """Answer a message's searches and info requests, run its first tool call (or spend the turn
        when it has none) and return the feedback parts, each keyed by its request (None: the message's)."""
        parts: list[tuple[Any, str]] = []
        requests, repeated, seen = [], [], set()  # identical requests of one message are answered once
        for key, text in ([(("search", i), q) for i, q in enumerate(parsed.searches)]
                          + [(("info", i), n) for i, n in enumerate(parsed.infos)]):
            same = (key[0], " ".join(text.lower().split()))
            (repeated if same in seen else requests).append((key, text))
            seen.add(same)
        if self.protocol == "tools":
            parts += [(key, "The same request as an earlier one of this message: answered there.")
                      for key, _ in repeated]
        unanswered = requests[MAX_REQUESTS:]
        if unanswered and self.protocol == "tags":  # said first, so that a cut of the feedback never hides it
            parts.append((None, f"Only {MAX_REQUESTS} searches and info requests are answered per message: "
                                f"{len(unanswered)} not answered."))
        for key, text in requests[:MAX_REQUESTS]:
            parts.append((key, self._search(text) if key[0] == "search" else self._tool_info(text)))
        if self.protocol == "tools":
            parts += [(key, f"Not answered: at most {MAX_REQUESTS} searches and info requests are answered "
                            "per message.") for key, _ in unanswered]
        if not parsed.calls:
            episode.spend_turn()
            if not parsed.has_tags:
                parts.append((None, REMINDER if self.protocol == "tags" else TOOLS_REMINDER))
            parts.append((None, progress_text(episode)))
            return parts
        call = parsed.calls[0]
        try:
            if call.name:
                resolve_tool(call.name, self.registry, self._search_hint)  # unknown: said in the protocol's words
            result = (call_tool(episode, call.name, call.arguments, call.problem, self.executor) if call.name
                      else None)
        except UnknownToolError as exc:
            result, problem = None, f"Tool call not executed: {exc}"
        else:
            problem = None if result is not None else f"Tool call not executed: {call.problem}"
        if result is None:
            episode.spend_turn()
            parts += [(("call", 0), problem), (None, progress_text(episode))]
        else:
            parts.append((("call", 0), feedback_text(result, episode)))
        if len(parsed.calls) > 1 and self.protocol == "tags":
            skipped = ", ".join(c.name or "(no name)" for c in parsed.calls[1:])
            parts.append((None, f"Only one tool call per turn: not executed: {skipped}."))
        elif len(parsed.calls) > 1:
            parts += [(("call", i), "Not executed: only one tool call per turn.") for i in range(1, len(parsed.calls))]
        return parts

    def _search(self, query: str) -> str:
        """The answer to one ``<tool_search>`` (the query cut to ``MAX_QUERY_CHARS``)."""
        query = query[:MAX_QUERY_CHARS]
        if not any(c.isalnum() for c in query):  # empty, or a placeholder such as "..." copied from the prompt
            if self.protocol == "tools":
                return "Empty tool search: give tool_search a query saying what you need."
            return "Empty tool search: write what you need in place of the dots of <tool_search>...</tool_search>."
        return search_text(query, search_tools(query, self.search.k, self.registry, self.search.method),
                           self.registry)

    def _tool_info(self, name: str) -> str:
        """The answer to one ``<tool_info>``."""
        try:
            resolve_tool(name, self.registry, self._search_hint)
            return describe_text(describe_tool(name, self.registry))
        except UnknownToolError as exc:
            return f"Tool info: {exc}"

    def _fit(self, text: str) -> str:
        """``text`` within the observation space: at most ``max_length`` characters of the charset."""
        if _OUTSIDE_CHARSET.search(text):
            text = _OUTSIDE_CHARSET.sub("?", text)
        if len(text) > self.max_length:  # cut in the middle: the end holds progress and turns left
            tail = min(TAIL_CHARS, self.max_length // 4)
            head = self.max_length - len(TRUNCATION_MARK.format(n=len(text))) - tail
            mark = TRUNCATION_MARK.format(n=len(text) - head - tail)
            text = text[:head] + mark + text[len(text) - tail:]
        return text

    def info(self) -> dict[str, Any]:
        """The info dict of the current state (what reset and step return)."""
        episode, task, prompt = self.episode, self.task, self.prompt
        if episode is None or task is None or prompt is None:
            raise RuntimeError("call reset() before info()")
        evaluation = episode.evaluation
        return {
            "task_id": task.instance_id,
            "task_type": task.task_type,
            "prompt": prompt.variant,
            "flaw_type": getattr(prompt.injection, "flaw_type", None),
            "injection": self._injection,
            "turn": episode.turns_used,
            "turns_left": episode.turns_left,
            "trace": [r.to_dict() for r in episode.trace],
            "level": evaluation.level if evaluation is not None else None,
            "evaluation": evaluation.to_dict() if evaluation is not None else None,
            "end_reason": episode.end_reason,
            "parsed": self._parsed.to_dict() if self._parsed is not None else None,
        }


def read_tool_calls(message: Any, config: Any = None, id_prefix: str = "call", max_length: int | None = None
                    ) -> tuple[ParsedMessage, dict[str, Any], dict[tuple[str, int], str]]:
    """Read an assistant message of the tools protocol (a string is a message without calls): its
    ``tool_search``/``tool_info`` calls and tool calls, in order, and the completion signal of its content.
    Returns (parsed, the message as kept, the tool call id of each request key). An empty arguments
    object is no arguments (the call is played as is, as a tag call without JSON); ValueError for a
    message that is neither a string nor an assistant message. ``max_length``: the content is read up to
    it, and a call whose arguments are longer (as JSON) is refused as malformed."""
    if isinstance(message, str):
        message = {"role": "assistant", "content": message}
    if not isinstance(message, dict) or not isinstance(message.get("content") or "", str) \
            or not isinstance(message.get("tool_calls") or [], list):
        raise ValueError("action must be a string or an assistant message {'role': 'assistant', 'content': str, "
                         f"'tool_calls': [...]}}, got {message!r:.200}")
    content = (message.get("content") or "")[:max_length]
    searches, infos, calls, ids, kept = [], [], [], {}, []
    for j, raw in enumerate(message.get("tool_calls") or []):
        raw = raw if isinstance(raw, dict) else {}
        function = raw.get("function")
        function = function if isinstance(function, dict) else raw
        name = function.get("name")
        name = name if isinstance(name, str) else ""
        arguments = function.get("arguments")
        text = arguments if isinstance(arguments, str) else json.dumps(arguments if arguments is not None else {},
                                                                       default=repr)
        if max_length is not None and len(text) > max_length:
            arguments = text = text[:max_length]  # cut: read as malformed JSON, the call's problem
        call = call_with_arguments(name.strip(), arguments)
        if call.arguments == {}:
            call = dataclasses.replace(call, arguments=None)
        values = call.arguments or {}
        if call.name == SEARCH_FUNCTION:
            key = ("search", len(searches))
            searches.append(str(values.get("query", "")))
        elif call.name == INFO_FUNCTION:
            key = ("info", len(infos))
            infos.append(str(values.get("name", "")))
        else:
            key = ("call", len(calls))
            calls.append(call)
        ids[key] = str(raw.get("id") or f"{id_prefix}_{j}")
        kept.append({"id": ids[key], "type": "function", "function": {"name": name, "arguments": text}})
    parsed = ParsedMessage(tuple(searches), tuple(infos), tuple(calls), message_completes(content, config))
    assistant: dict[str, Any] = {"role": "assistant", "content": content}
    if kept:
        assistant["tool_calls"] = kept
    return parsed, assistant, ids


def episode_record(info: Mapping[str, Any]) -> dict[str, Any]:
    """What a framework's adapter records of a step (from ``info``): the episode's task, turn, level, end
    reason and trace, and ``faults``, the failures the world injected (the trace's error codes)."""
    return {"task_id": info["task_id"], "turn": info["turn"], "level": info["level"],
            "end_reason": info["end_reason"], "trace": info["trace"],
            "faults": [r["error_code"] for r in info["trace"] if not r["success"]]}


def _check_option(name: str, value: Any, cls: type) -> None:
    """A reset option that must be a ``cls`` or None; ``ValueError`` naming it otherwise."""
    if value is not None and not isinstance(value, cls):
        raise ValueError(f"reset option {name} must be a {cls.__module__}.{cls.__name__} or None, "
                         f"got {type(value).__name__}")


def _blocks(messages: list[dict[str, Any]]) -> str:
    """Chat messages as text, one block per message (tool calls as ``name(arguments)`` lines)."""
    blocks = []
    for m in messages:
        calls = [f"{c['function']['name']}({c['function']['arguments']})" for c in m.get("tool_calls", ())]
        blocks.append("\n".join([f"[{m['role']}]", *([m["content"]] if m["content"] else []), *calls]))
    return "\n\n".join(blocks)
