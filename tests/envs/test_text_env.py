"""ResiliBenchText-v1: the chat protocol over the shared Episode core."""

from __future__ import annotations

import dataclasses
import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import resilibench  # noqa: F401  (registers the env ids)
from helpers import PIPELINE, make_task
from resilibench.core.bounds import reference_workflow
from resilibench.core.config import WorldConfig
from resilibench.core.registry import DEPENDENCY_ERROR, INVALID_INPUT, default_registry
from resilibench.core.simulator import RETRY_LIMIT_ERROR, env_episode
from resilibench.core.text.prompts import (
    PLAN_HEADING,
    Prompt,
    PromptSettings,
    build_prompt,
    parse_plan,
    with_arguments,
)
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.workflow import Workflow
from resilibench.envs.planner.env import ResiliBenchEnv
from resilibench.envs.text.env import (
    CHARSET,
    MAX_QUERY_CHARS,
    MAX_REQUESTS,
    RESET_OPTIONS,
    ResiliBenchTextEnv,
    flaw_seed,
)

NAMES = default_registry().names


def call(name: str, arguments: str = "") -> str:
    return f"<tool_call>{name} {arguments}</tool_call>"


def make_env(outcomes=None, **kwargs) -> ResiliBenchTextEnv:
    """A text env over the pipeline task; ``outcomes`` scripts the episode's draws (True = success)."""
    kwargs.setdefault("search", SearchSettings(method="lexical"))
    env = ResiliBenchTextEnv(tasks=[make_task()], **kwargs)
    env.reset(seed=0)
    if outcomes is not None:
        stream = np.ones_like(env.episode.stream)
        stream[: len(outcomes), 0] = [0.0 if ok else 1.0 for ok in outcomes]
        stream[:, 1] = 0.0
        env.episode.stream = stream
    return env


# --- API ----------------------------------------------------------------------------------------------


def test_check_env_and_text_spaces():
    env = ResiliBenchTextEnv(split="test", search=SearchSettings(method="lexical"))
    check_env(env, skip_render_check=True)
    env.action_space.seed(0)
    sample = env.action_space.sample()
    assert env.action_space.contains(sample) and set(sample) <= CHARSET
    assert {"<", ">", "{", "}", '"', " ", "\n"} <= CHARSET  # the protocol's characters can be sampled
    obs, _ = env.reset(seed=1)
    assert env.observation_space.contains(obs)
    obs, *_ = env.step(sample)
    assert env.observation_space.contains(obs)


def test_gym_make_and_render_shows_the_conversation():
    env = gym.make("ResiliBenchText-v1", render_mode="ansi", search=SearchSettings(method="lexical"))
    prompt, info = env.reset(seed=3)
    assert prompt == env.unwrapped.prompt.text and info["prompt"] == "baseline"
    assert info["level"] is None and info["trace"] == [] and info["turn"] == 0
    env.step("<tool_search>read a file</tool_search>")
    shown = env.render()
    assert shown.startswith("[user]\n" + prompt[:50])
    assert "[assistant]\n<tool_search>read a file</tool_search>" in shown
    assert "Tool search results for 'read a file': file_operations_reader" in shown
    assert [m["role"] for m in env.unwrapped.messages] == ["user", "assistant", "user"]


def test_observations_stay_in_the_space():
    task = dataclasses.replace(make_task(), description="Café – résumé → 数据 " + "x" * 2000)
    env = ResiliBenchTextEnv(tasks=[task], max_length=1024, search=SearchSettings(method="lexical"))
    prompt, _ = env.reset(seed=0)
    assert env.observation_space.contains(prompt) and len(prompt) == 1024
    assert "Café – résumé → ?? x" in prompt and "characters cut ...]" in prompt  # cut in the middle
    assert prompt.endswith("Use appropriate tools to complete the task.")
    # Three searches: longer than the limit; the cut keeps the end, where progress and turns left are.
    obs, *_ = env.step("".join(f"<tool_search>{q}</tool_search>" for q in ("file", "parse data", "network")))
    assert env.observation_space.contains(obs) and len(obs) == 1024 and "characters cut ...]" in obs
    assert obs.endswith("Progress: 0/5 required tools done; 9 turns left.")
    cut = int(obs.split("[... ")[1].split(" characters")[0])
    assert len(obs) - len("\n[...  characters cut ...]\n") - len(str(cut)) + cut > 1024  # the count is exact


def test_bad_use_is_rejected():
    env = ResiliBenchTextEnv(search=SearchSettings(method="lexical"))
    with pytest.raises(RuntimeError, match="reset"):
        env.step("hi")
    with pytest.raises(ValueError, match="accepted: \\['task_id'"):
        env.reset(seed=0, options={"task": "x"})
    env.reset(seed=0)
    with pytest.raises(ValueError, match="string"):
        env.step(3)
    env.step("task completed")
    with pytest.raises(RuntimeError, match="ended"):
        env.step("task completed")
    for kwargs, field in [({"split": "dev"}, "split"), ({"render_mode": "rgb"}, "render_mode"),
                          ({"search": "x"}, "search"), ({"max_length": 10}, "max_length")]:
        with pytest.raises(ValueError, match=field):
            ResiliBenchTextEnv(**kwargs)


# --- the protocol -------------------------------------------------------------------------------------


def test_reminder_costs_the_turn():
    env = make_env()
    obs, reward, terminated, truncated, info = env.step("I will now read the file.")
    assert "No tool request found" in obs and "<tool_call>" in obs
    assert info["turn"] == 1 and info["trace"] == [] and not (terminated or truncated)
    assert info["parsed"] == {"searches": [], "infos": [], "calls": [], "completes": False}


def test_search_and_info_cost_a_turn_without_a_draw():
    env = make_env()
    obs, *_, info = env.step("<tool_search>parse json</tool_search><tool_info>data_processing_validator</tool_info>")
    assert obs.startswith("Tool search results for 'parse json': data_processing_parser")
    assert "data_processing_validator\n  Category: data_processing" in obs
    assert "Requires: data_processing_parser" in obs
    assert info["turn"] == 1 and env.episode.draws_used == 0
    obs, *_, info = env.step("<tool_info>data_procesing_validatr</tool_info>")
    assert "did you mean data_processing_validator" in obs and info["turn"] == 2


def test_invalid_arguments_name_the_argument():
    env = make_env()
    obs, *_, info = env.step(call("file_operations_reader", '{"path": "data/a.csv"}'))
    assert info["trace"][0]["error_code"] == INVALID_INPUT and info["trace"][0]["probability"] is None
    assert "'path' was unexpected" in obs and "accepted arguments: options, source" in obs
    obs, *_, info = env.step(call("file_operations_reader", '{"source": "data/a.csv"'))
    assert info["trace"][1]["error_code"] == INVALID_INPUT and "malformed JSON" in obs
    assert env.episode.draws_used == 0
    obs, *_, info = env.step(call("file_operations_reader", '{"source": "data/a.csv"}'))
    assert env.episode.draws_used == 1 and info["trace"][2]["probability"] is not None


def test_unknown_tool_costs_the_turn_but_is_no_call():
    env = make_env()
    obs, *_, info = env.step(call("file_reader"))
    assert "Tool call not executed: unknown tool 'file_reader'" in obs
    assert info["turn"] == 1 and info["trace"] == [] and env.episode.n_failures == 0
    obs, *_, info = env.step("<tool_call></tool_call>")
    assert "no tool name" in obs and info["turn"] == 2 and info["trace"] == []


def test_one_call_per_turn():
    env = make_env([True, True])
    obs, *_, info = env.step(call(PIPELINE[0]) + "\n" + call(PIPELINE[1]) + call("data_processing_parser"))
    assert [r["tool"] for r in info["trace"]] == [PIPELINE[0]]
    assert f"not executed: {PIPELINE[1]}, data_processing_parser" in obs
    assert info["parsed"]["calls"][1]["name"] == PIPELINE[1] and info["turn"] == 1


def test_replay_of_a_succeeded_tool_costs_the_turn_without_a_draw():
    env = make_env([True])
    env.step(call(PIPELINE[0]))
    obs, *_, info = env.step(call(PIPELINE[0]))
    assert info["trace"][1]["replayed"] and info["trace"][1]["success"]
    assert env.episode.draws_used == 1 and info["turn"] == 2 and "already succeeded" in obs


def test_retry_cap_answers_without_a_draw():
    env = ResiliBenchTextEnv(tasks=[make_task(max_retries=1)], search=SearchSettings(method="lexical"))
    env.reset(seed=0)
    env.episode.stream[:] = 0.99  # every draw fails
    env.step(call(PIPELINE[0]))
    env.step(call("utility_logger"))  # breaks the same-tool streak
    env.step(call(PIPELINE[0]))
    obs, *_, info = env.step(call(PIPELINE[0]))
    assert info["trace"][-1]["error_code"] == RETRY_LIMIT_ERROR and info["trace"][-1]["probability"] is None
    assert env.episode.draws_used == 3 and "at most 2 times" in obs


def test_strict_dependencies_are_the_default():
    env = make_env()
    obs, *_, info = env.step(call("data_processing_transformer"))
    assert info["trace"][0]["error_code"] == DEPENDENCY_ERROR and "data_processing_parser must succeed first" in obs
    lenient = make_env(rules={"strict_dependencies": False})
    _, *_, info = lenient.step(call("data_processing_transformer"))
    assert info["trace"][0]["error_code"] != DEPENDENCY_ERROR and info["trace"][0]["probability"] == pytest.approx(0.4)


# --- episode end --------------------------------------------------------------------------------------


def test_full_success_with_completion_in_the_last_call_message():
    env = make_env([True] * 6)
    # strict dependencies: the validator, transformer and aggregator need the parser (not a required tool)
    for tool in (PIPELINE[0], "data_processing_parser", *PIPELINE[1:-1]):
        _, reward, terminated, truncated, info = env.step(call(tool))
        assert reward == 0.0 and not terminated and info["trace"][-1]["success"]
    obs, reward, terminated, truncated, info = env.step(call(PIPELINE[-1]) + " Task completed.")
    assert info["trace"][-1]["tool"] == PIPELINE[-1] and info["trace"][-1]["success"]
    assert reward == 1.0 and terminated and not truncated
    assert info["level"] == "full_success" and info["end_reason"] == "finished"
    assert info["evaluation"]["coverage"] == 1.0 and "result: full_success" in obs


def test_completion_alone_ends_without_a_turn():
    env = make_env()
    _, reward, terminated, truncated, info = env.step("All steps completed.")
    assert terminated and not truncated and reward == 0.0
    assert info["turn"] == 0 and info["level"] == "failure" and info["evaluation"]["completed"]


@pytest.mark.parametrize(("tools", "reason"), [
    (["file_operations_reader", "utility_logger"] * 3, "consecutive_failures"),
    (["utility_logger"] * 3, "repetition_loop"),
])
def test_failure_terminations(tools, reason):
    env = make_env([False] * 10)
    steps = 0
    while not env.episode.done:
        _, reward, terminated, truncated, info = env.step(call(tools[steps]))
        steps += 1
    assert steps == {"consecutive_failures": 5, "repetition_loop": 3}[reason] and terminated
    assert info["end_reason"] == reason and info["level"] == "failure" and reward == 0.0 and not truncated


@pytest.mark.parametrize(("last", "truncated_expected"), [
    ("Task completed.", False),
    ("one more search", True),
    (call("file_operations_reader") + " Task completed.", False),  # the call is not played
])
def test_turn_limit(last, truncated_expected):
    env = make_env(rules={"turn_limit": 4})
    for _ in range(3):
        env.step("<tool_search>reader</tool_search>")
    obs, *_ = env.step("<tool_search>writer</tool_search>")
    assert "No turns left" in obs and env.episode.turns_left == 0
    obs, reward, terminated, truncated, info = env.step(last)
    assert truncated is truncated_expected and terminated is not truncated_expected
    assert info["end_reason"] == ("out_of_turns" if truncated_expected else "finished")
    assert info["trace"] == [] and ("not executed" in obs) == ("tool_call" in last)


def test_human_render_prints_each_exchange(capsys):
    env = ResiliBenchTextEnv(tasks=[make_task()], render_mode="human", search=SearchSettings(method="lexical"))
    env.reset(seed=0)
    assert capsys.readouterr().out.startswith("[user]\nExecute a")
    env.step("hello")
    printed = capsys.readouterr().out
    assert printed.startswith("[assistant]\nhello\n\n[user]\nNo tool request found")


# --- one core: same seed and same calls as ResiliBench-v1 -----------------------------------------------


def _scripted_actions(rng: np.random.Generator, episode) -> int:
    """A seeded policy mixing the next required tool, random tools (failures, dependency errors, replays,
    retry caps) and early finishing."""
    u = rng.random()
    if u < 0.08 and episode.trace:
        return len(NAMES)
    if u < 0.6 and episode.next_required < len(episode.required):
        return episode.required[episode.next_required]
    return int(rng.integers(len(NAMES)))


@pytest.mark.parametrize(("strict", "profile"), [(True, "test"), (False, "test"), (False, "training")])
def test_same_seed_and_calls_give_the_same_outcomes_as_the_planner_env(strict, profile):
    config = WorldConfig().replace(rules={"strict_dependencies": strict, "profile": profile})
    planner = ResiliBenchEnv(split="test", config=config)
    lexical = SearchSettings(method="lexical")
    text = ResiliBenchTextEnv(split="test", config=config, rules={"strict_dependencies": strict},
                              search=lexical)
    by_kwarg = ResiliBenchTextEnv(split="test", config=WorldConfig().replace(rules={"profile": profile}),
                                  rules={"strict_dependencies": strict}, search=lexical)
    ends = set()
    for seed in range(120):
        planner.reset(seed=seed)
        text.reset(seed=seed)
        by_kwarg.reset(seed=seed)
        assert text.task is planner.episode.task and by_kwarg.task is text.task
        rng = np.random.default_rng(seed)
        for _ in range(12):
            action = _scripted_actions(rng, planner.episode)
            message = "task completed" if action == len(NAMES) else call(NAMES[action])
            expected = planner.step(action)
            for env in (text, by_kwarg):
                _, reward, terminated, truncated, info = env.step(message)
                assert (reward, terminated, truncated) == expected[1:4]
                assert info["trace"] == expected[4]["trace"]
                assert info["level"] == expected[4].get("level")
            if terminated or truncated:
                ends.add(info["end_reason"])
                break
    # the scripted calls reach every kind of end (the training profile's high rates never fail 5 times)
    assert {"finished", "out_of_turns"} <= ends
    assert profile == "training" or {"consecutive_failures", "repetition_loop"} <= ends
    assert planner.rewarder.success_rate > 0  # the running rate the training profile reads moved, in step


def test_same_seed_same_conversation():
    messages = ["<tool_search>read</tool_search>", call("file_operations_reader", '{"source": "a"}'),
                call("data_processing_parser"), "hello", call("data_processing_validator"), "task completed"]

    def run(seed):
        env = ResiliBenchTextEnv(split="test", search=SearchSettings(method="lexical"))
        env.reset(seed=seed)
        for m in messages:
            if env.episode.done:
                break
            env.step(m)
        return env.messages, env.episode.trace

    assert run(5) == run(5)
    assert any(run(5) != run(s) for s in (6, 7))


def test_reset_options_and_prompt_variants():
    assert set(RESET_OPTIONS) == {"task_id", "prompt", "flaw_type", "severity", "plan_style", "workflow",
                                  "shown_prompt"}
    env = ResiliBenchTextEnv(split="test", search=SearchSettings(method="lexical"))
    task = env.tasks[7]
    prompt, info = env.reset(seed=0, options={"task_id": task.instance_id})
    assert info["task_id"] == task.instance_id and env.task is task
    assert info["prompt"] == "baseline" and PLAN_HEADING not in prompt and info["injection"] is None
    assert task.description in prompt

    prompt, info = env.reset(seed=0, options={"task_id": task.instance_id, "prompt": "optimal"})
    assert info["prompt"] == "optimal" and PLAN_HEADING in prompt
    assert parse_plan(prompt).tools == env.prompt.plan.tools
    assert env.prompt.plan.tools == with_arguments(task, reference_workflow(task, env.config)).tools

    plan = Workflow.chain(["utility_logger", "file_operations_reader"])
    prompt, _ = env.reset(seed=0, options={"task_id": task.instance_id, "prompt": "optimal", "workflow": plan})
    assert parse_plan(prompt).tools == ("utility_logger", "file_operations_reader")

    # A prebuilt prompt is shown as it is: a dropped argument stays dropped (``workflow`` would refill it).
    flawed = build_prompt(task, PromptSettings(variant="flawed", flaw_type="parameter", severity=1.0), seed=3,
                          config=env.config)
    prompt, info = env.reset(seed=0, options={"task_id": task.instance_id, "shown_prompt": flawed})
    assert prompt == flawed.text and env.prompt is flawed and info["injection"] == flawed.injection.to_dict()

    with pytest.raises(ValueError, match="plan_style"):  # passed on to build_prompt, which checks it
        env.reset(seed=0, options={"prompt": "optimal", "plan_style": "bullets"})
    with pytest.raises(ValueError, match="flaw_type"):
        env.reset(seed=0, options={"prompt": "flawed"})


def test_flawed_prompt_is_seeded_by_the_episode_seed():
    env = ResiliBenchTextEnv(split="test",
                             prompt=PromptSettings(variant="flawed", flaw_type="missing_step", severity=0.8),
                             search=SearchSettings(method="lexical"))
    _, info = env.reset(seed=4)
    assert info["flaw_type"] == "missing_step" and info["injection"]["changes"]
    assert info["injection"]["severity"] == 0.8
    # the env's first episode of seed 4 (task index, episode seed); the flaw seed derives from the latter
    assert env.prompt.injection.seed == flaw_seed(env_episode(4, 0, len(env.tasks))[1])
    again, info_again = ResiliBenchTextEnv(
        split="test", prompt=PromptSettings(variant="flawed", flaw_type="missing_step", severity=0.8),
        search=SearchSettings(method="lexical")).reset(seed=4)
    assert again == env.prompt.text and info_again["injection"] == info["injection"]
    _, info = env.reset(seed=4, options={"prompt": "flawed", "flaw_type": "order"})
    assert info["flaw_type"] == "order"


# --- hostile messages (issue 12, items 13 and 15) ----------------------------------------------------


def test_hostile_tool_calls_are_feedback_not_exceptions():
    for message in ['<tool_call>file_operations_reader {"source": ' + "1" * 5000 + "}</tool_call>",
                    "<tool_call>file_operations_reader " + "[" * 3000 + "</tool_call>",
                    "<tool_search>read a file \ud800</tool_search>"]:
        env = make_env()
        obs, *_, info = env.step(message)
        assert info["turn"] == 1
        assert "Tool search results" in obs or "malformed JSON" in obs


def test_the_work_per_message_is_capped():
    env = make_env(search=SearchSettings(method="lexical", k=1), max_length=2_000_000)  # messages of 1.2 MB
    searches = "".join(f"<tool_search>read file number {i}</tool_search>" for i in range(1000))
    infos = "<tool_info>file_operations_reader</tool_info>" * 1000
    obs, *_, info = env.step(searches + infos)
    assert info["turn"] == 1
    assert obs.count("Tool search results") == MAX_REQUESTS
    # The 1000 identical info requests count once: 1001 distinct requests, 5 answered.
    assert f"Only {MAX_REQUESTS} searches and info requests are answered per message: 996 not answered." in obs
    long_query = "read a file " * 100_000  # 1.2 MB
    obs, *_ = env.step(f"<tool_search>{long_query}</tool_search>")
    head = obs.splitlines()[0]  # Tool search results for 'read a file read a ...': file_operations_reader
    assert head.startswith("Tool search results for") and len(head) < MAX_QUERY_CHARS + 100


def test_wrong_typed_reset_options_name_the_option():
    env = make_env()
    with pytest.raises(ValueError, match="reset option workflow must be a resilibench.core.workflow.Workflow"):
        env.reset(seed=0, options={"workflow": "str", "prompt": "optimal"})
    with pytest.raises(ValueError, match="reset option shown_prompt"):
        env.reset(seed=0, options={"shown_prompt": "hello"})
    with pytest.raises(ValueError, match="turn_limit must be an integer"):
        ResiliBenchTextEnv(rules={"turn_limit": "10"})


def test_a_call_that_ends_the_episode_prints_the_end_line_once():
    env = make_env([False] * 10)
    for _ in range(2):
        env.step(call("utility_logger"))
    obs, *_ = env.step(call("utility_logger"))  # the third failure in a row ends the episode
    assert env.episode.done and obs.count("Episode ended (repetition loop); result: failure.") == 1


# --- the tools protocol (native function calls) -------------------------------------------------------


def tool_call(name: str, arguments: dict | str | None = None, call_id: str | None = None) -> dict:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
    return {"id": call_id or f"id_{name}", "type": "function", "function": {"name": name, "arguments": text}}


def assistant(*calls: dict, content: str = "") -> dict:
    return {"role": "assistant", "content": content, "tool_calls": list(calls)}


def test_tools_protocol_offers_the_tools_as_function_schemas():
    env = make_env(prompt=PromptSettings(protocol="tools"))
    names = [t["function"]["name"] for t in env.tools]
    assert names == ["tool_search", "tool_info", *NAMES] and len(names) == 32
    reader = env.tools[2 + NAMES.index("file_operations_reader")]["function"]
    assert reader["parameters"] == default_registry()["file_operations_reader"].input_schema()
    assert "<tool_call>" not in env.prompt.text and "tool_search" in env.prompt.text
    assert make_env().tools is None and "<tool_call>" in make_env().prompt.text
    with pytest.raises(ValueError, match="protocol must be one of"):
        ResiliBenchTextEnv(prompt=PromptSettings(protocol="xml"))
    for name, value in (("prompt", "flawed"), ("search", "lexical"), ("api", "http://127.0.0.1:9")):
        with pytest.raises(ValueError, match=f"{name}: must be a"):  # a bare value where settings are meant
            ResiliBenchTextEnv(**{name: value})


def test_tools_protocol_answers_each_call_in_a_tool_message():
    env = make_env([True] * 10, prompt=PromptSettings(protocol="tools"))
    message = assistant(tool_call("tool_search", {"query": "read a file"}, "s1"),
                        tool_call("tool_info", {"name": "file_operations_reader"}, "i1"),
                        tool_call("file_operations_reader", {}, "c1"),
                        tool_call("data_processing_validator", None, "c2"))
    obs, reward, terminated, truncated, info = env.step(message)
    replies = env.messages[-4:]
    assert [m["role"] for m in replies] == ["tool"] * 4
    assert [m["tool_call_id"] for m in replies] == ["s1", "i1", "c1", "c2"]
    assert replies[0]["content"].startswith("Tool search results for 'read a file'")
    assert replies[1]["content"].startswith("file_operations_reader\n  Category")
    assert replies[2]["content"].startswith("file_operations_reader executed successfully")  # {} = no arguments
    assert "Progress: 1/5 required tools done; 9 turns left." in replies[2]["content"]
    assert replies[3]["content"] == "Not executed: only one tool call per turn."
    assert env.messages[-5] == message and info["turn"] == 1 and [r["tool"] for r in info["trace"]] == [
        "file_operations_reader"]
    assert obs == "\n\n".join(m["content"] for m in replies)
    # A message without calls: a reminder (no invitation to quit) in a user message; then completion.
    obs, *_ = env.step({"role": "assistant", "content": "I will now read the data."})
    assert env.messages[-1]["role"] == "user" and "No tool call found" in obs and "task completed" not in obs
    _, reward, terminated, _, info = env.step("Task completed.")
    assert terminated and info["evaluation"]["completed"] and info["turn"] == 2


def test_tools_protocol_bad_arguments_and_names():
    env = make_env([True] * 10, prompt=PromptSettings(protocol="tools"))
    env.step(assistant(tool_call("file_operations_reader", '{"source": 3')))  # malformed JSON
    assert env.info()["trace"][0]["error_code"] == INVALID_INPUT
    assert "malformed JSON arguments" in env.messages[-1]["content"]
    env.step(assistant(tool_call("file_reader", {"source": "a"})))
    assert "Tool call not executed: unknown tool 'file_reader'" in env.messages[-1]["content"]
    env.step(assistant(tool_call("qqq"), tool_call("tool_info", {"name": "zzz"}), tool_call("tool_search", {"q": 1})))
    unknown_call, unknown_info, empty_search = (m["content"] for m in env.messages[-3:])
    assert "unknown tool 'qqq'; call tool_search with what you need" in unknown_call
    assert unknown_info == "Tool info: unknown tool 'zzz'; call tool_search with what you need"
    assert empty_search.startswith("Empty tool search: give tool_search a query saying what you need.\n\nProgress")
    with pytest.raises(ValueError, match="assistant message"):
        env.step(["not", "a", "message"])
    requests = [tool_call("tool_search", {"query": f"q{i}"}, f"s{i}") for i in range(MAX_REQUESTS + 2)]
    env.step(assistant(*requests))
    assert [m["content"].startswith("Not answered") for m in env.messages[-len(requests):]] == [False] * 5 + [True] * 2


# --- robust reading of real models' messages (docs/envs/text.md, "Reading real models") -----------------


def protocol_section(prompt: str) -> str:
    """The part of a prompt that explains the protocol (what an echoing model copies)."""
    return prompt[prompt.index("Tool Search Available"):prompt.index("Instructions:")]


def test_an_echoed_prompt_runs_nothing_costly_and_does_not_complete():
    env = make_env([True] * 10)
    echo = protocol_section(env.prompt.text)
    assert 'say "task completed"' in echo  # the rule, restated: not the agent's own statement
    obs, _, terminated, truncated, info = env.step(echo + "\n" + echo)  # echoed twice
    assert not (terminated or truncated) and info["trace"] == [] and info["turn"] == 1
    assert "Empty tool search" in obs and "Tool search results" not in obs and len(obs) < 1000
    # The paper's wording writes its example searches as live tags: an echo runs every one of them.
    paper = make_env([True] * 10, prompt=PromptSettings(wording="paper"))
    obs, *_ = paper.step(protocol_section(paper.prompt.text))
    assert obs.count("Tool search results") == 4 and len(obs) > 5000


@pytest.mark.parametrize("message", [
    '```xml\n<tool_call>\n{"name": "file_operations_reader", "arguments": {"source": "in.csv"}}\n</tool_call>\n```',
    '<tool_call>file_operations_reader {"source": "in.csv"}\nThis loads the input; next I will validate it.',
    '<tool_call>file_operations_reader {"source": "in.csv"} (reads the file)</tool_call> Then the validator.',
    '<tool_call>{"name": "file_operations_reader", "arguments": {"source": "in.csv"}} and then more</tool_call>',
    '<tool_call>file_operations_reader({"source": "in.csv"}) to read the data</tool_call>',
])
def test_calls_are_read_where_their_meaning_is_plain(message):
    env = make_env([True] * 10)
    _, _, _, _, info = env.step(message)
    assert info["parsed"]["calls"] == [{"name": "file_operations_reader", "arguments": {"source": "in.csv"},
                                        "problem": None}]
    assert info["trace"][0]["success"] and not info["parsed"]["completes"]


def test_a_name_followed_by_prose_is_a_call_without_arguments():
    env = make_env([True] * 10)
    _, _, _, _, info = env.step("<tool_call>file_operations_reader to load the sensor data first")
    assert info["parsed"]["calls"] == [{"name": "file_operations_reader", "arguments": None, "problem": None}]


@pytest.mark.parametrize(("message", "completes"), [
    ('When the task is completed, say "task completed".', False),
    ("I will say task completed once every step has succeeded.", False),
    ("```\nTask completed.\n```", False),
    ("The rule: `task completed` ends the episode.", False),
    ("Reminder noted: reply 'task completed' when done.", False),
    ("The task is not completed yet; task complete? Not yet.", False),
    ("The writer succeeded. Task completed.", True),
    ("All steps completed!", True),
    ("All steps completed for this task type; nothing more can be done.", True),
    ("<tool_call>file_operations_writer</tool_call>\nTask completed.", True),
])
def test_completion_is_the_agents_own_statement(message, completes):
    env = make_env()
    _, _, terminated, _, info = env.step(message)
    assert info["parsed"]["completes"] is completes and terminated is completes


def test_the_reminder_does_not_invite_quitting():
    env = make_env()
    obs, *_ = env.step("I am thinking about which tool to use.")
    assert "No tool request found" in obs and "task completed" not in obs.lower()
    assert obs.endswith("Progress: 0/5 required tools done; 9 turns left.")


def test_a_message_is_read_up_to_max_length():
    """10 MB of unclosed tags costs what max_length characters cost; the agent is told of the cut."""
    import time

    env = make_env()
    start = time.process_time()
    obs, *_, info = env.step("<tool_call>" * 1_000_000)
    assert time.process_time() - start < 1.0 and info["turn"] == 1
    assert f"longer than {env.max_length} characters" in obs
    assert len(env.messages[-2]["content"]) == env.max_length  # the message as kept: what was read
    tools = make_env(prompt=PromptSettings(protocol="tools"))
    big = {"role": "assistant", "content": "x" * 10_000_000,
           "tool_calls": [{"function": {"name": "file_operations_reader", "arguments": {"source": "y" * 10**6}}}]}
    obs, *_, info = tools.step(big)
    assert f"longer than {tools.max_length} characters" in tools.messages[-1]["content"]
    assert info["trace"] == [] or info["trace"][0]["error_code"] == INVALID_INPUT


def test_arguments_that_json_cannot_carry_are_the_calls_problem():
    env = make_env(prompt=PromptSettings(protocol="tools"))
    message = {"role": "assistant", "content": "",
               "tool_calls": [{"function": {"name": "file_operations_reader", "arguments": {"source": {1, 2}}}}]}
    obs, *_, info = env.step(message)
    assert info["turn"] == 1 and "JSON values only" in json.dumps(env.messages[-1])


def test_characters_outside_the_charset_become_question_marks():
    """The prompt shown fits the observation space: every character outside ``CHARSET`` (a CJK letter, an
    emoji, a control character) becomes "?", and every character in it stays as it is."""
    env = ResiliBenchTextEnv(split="test", search=SearchSettings(method="lexical"))
    task = env.tasks[0]
    kept = "".join(sorted(CHARSET))
    text = f"plan \u4e2d\u6587 {kept} \U0001f600\x00 end\u2192"
    shown = Prompt(text, "baseline", None, None, "numbered")
    prompt, _ = env.reset(seed=0, options={"task_id": task.instance_id, "shown_prompt": shown})
    assert prompt == f"plan ?? {kept} ?? end\u2192" and env.observation_space.contains(prompt)


def test_flaw_applies_matches_reset_and_reset_options_are_checked_every_time():
    from resilibench.core.text.flaws import FLAW_TYPES, FlawNotApplicable
    from resilibench.errors import ConfigError

    env = ResiliBenchTextEnv(split="test")
    seen = set()
    for task in env.tasks[:20]:
        for flaw in FLAW_TYPES:
            try:
                env.reset(seed=1, options={"task_id": task.instance_id, "prompt": "flawed", "flaw_type": flaw})
                applied = True
            except FlawNotApplicable:
                applied = False
            assert env.flaw_applies(task.instance_id, flaw) == applied
            seen.add(applied)
    assert seen == {True, False}
    options = {"task_id": env.tasks[0].instance_id, "prompt": "flawed", "flaw_type": "order"}
    env.reset(seed=0, options={**options, "severity": 1})  # kept per value and type: True is not 1
    with pytest.raises(ConfigError, match="severity"):
        env.reset(seed=0, options={**options, "severity": True})
    with pytest.raises(ConfigError, match="severity"):
        env.reset(seed=0, options={**options, "severity": [0.5]})  # unhashable: checked, not kept
