"""The GRPO adapter (envs.text.trl): the text env's rules behind TRL's tool methods."""

from __future__ import annotations

import inspect
import json

import pytest

from resilibench.core.evaluator import LEVELS
from resilibench.core.registry import default_registry
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.envs.text.env import ResiliBenchTextEnv
from resilibench.envs.text.trl import GRPOReward, grpo_environment_class, task_prompt, task_rows

pytest.importorskip("transformers")


def tool_methods(env) -> dict:
    """The methods TRL exposes as tools: public functions of the class but reset and get_reward."""
    return {name: getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward")}


@pytest.fixture(scope="module")
def env_class():
    return grpo_environment_class(search=SearchSettings(method="lexical"))


def test_every_tool_is_a_method_whose_schema_is_the_registry_schema(env_class):
    from transformers.utils import get_json_schema

    methods = tool_methods(env_class())
    registry = default_registry()
    assert set(methods) == set(registry.names) | {"tool_search", "tool_info"}
    for tool in registry.tools:
        schema = get_json_schema(methods[tool.name])["function"]
        expected = tool.input_schema()
        assert schema["name"] == tool.name and schema["description"] == tool.description
        assert set(schema["parameters"].get("required", ())) == set(expected.get("required", ()))
        for name, spec in expected["properties"].items():
            got = schema["parameters"]["properties"][name]
            assert got["type"] == spec["type"] and got["description"] == spec["description"]
            assert got.get("enum") == spec.get("enum")


SAMPLES = {"string": "data/input.json", "integer": 3, "number": 2.0, "boolean": True, "object": {}, "array": []}


def valid_arguments(name: str) -> dict:
    """A value of the right type for each required parameter of a tool."""
    schema = default_registry()[name].input_schema()
    return {p: SAMPLES[schema["properties"][p]["type"]] for p in schema.get("required", ())}


def _play_both(env_class, task, seed, actions):
    """Play ``actions`` through the adapter and, as tag messages, through the text env; return both."""
    adapter = env_class()
    prompt = adapter.reset(task_id=task.instance_id, seed=seed, prompt=[])
    text_env = ResiliBenchTextEnv(split=None, search=SearchSettings(method="lexical"))
    text_env.reset(seed=seed, options={"task_id": task.instance_id})
    methods = tool_methods(adapter)
    for kind, name, arguments in actions:
        if text_env.episode.done:
            break
        if kind == "search":
            answer, message = methods["tool_search"](query=name), f"<tool_search>{name}</tool_search>"
        else:
            answer = methods[name](**arguments)
            message = f"<tool_call>{name} {json.dumps(arguments)}</tool_call>"
        feedback, *_ = text_env.step(message)
        assert answer.splitlines()[0] == feedback.splitlines()[0]
    reward = adapter.get_reward()
    if not text_env.episode.done:
        text_env.step("Task completed.")
    return prompt, adapter, reward, text_env


@pytest.mark.parametrize("seed", [0, 3])
def test_same_calls_and_seed_give_the_text_envs_episode(env_class, seed):
    for task in load_tasks(split="test")[:4]:
        required = list(task.required_tools)
        actions = [("search", "read a file", None), ("call", required[0], {"bogus": 1})]
        actions += [("call", name, valid_arguments(name)) for name in required for _ in range(2)]
        prompt, adapter, reward, text_env = _play_both(env_class, task, seed, actions)
        assert task.description in prompt and "tool_search" in prompt
        episode, reference = adapter._env.episode, text_env.episode
        assert [r.to_dict() for r in episode.trace] == [r.to_dict() for r in reference.trace]
        assert episode.evaluation.level == reference.evaluation.level
        assert reward == GRPOReward().levels[LEVELS.index(reference.evaluation.level)]
        assert episode.trace[0].error_code == "INVALID_INPUT"
        assert any(r.success for r in episode.trace)


def test_a_call_after_the_last_turn_ends_the_episode_unfinished(env_class):
    adapter = env_class()
    task = load_tasks(split="train")[0]
    adapter.reset(task_id=task.instance_id, seed=1)
    limit = adapter._env.config.rules.turn_limit
    for _ in range(limit):
        adapter.tool_info(name="utility_logger")
    episode = adapter._env.episode
    assert episode.turns_left == 0 and not episode.done
    answer = adapter.utility_logger()
    assert answer.startswith("No turns left") and episode.done and episode.end_reason != "finished"
    assert adapter.utility_logger().startswith("Not executed: the episode has ended")
    assert len(episode.trace) == 0
    assert adapter.get_reward() == 0.0


def test_progress_shaping_adds_the_share_of_required_tools_done():
    outcomes = []
    shaped = grpo_environment_class(reward=GRPOReward(progress_weight=0.5), outcomes=outcomes,
                                    search=SearchSettings(method="lexical"))()
    task = next(t for t in load_tasks(split="train") if len(t.required_tools) >= 2)
    shaped.reset(task_id=task.instance_id, seed=0)
    first = task.required_tools[0]
    for _ in range(3):
        getattr(shaped, first)()
    episode = shaped._env.episode
    reward = shaped.get_reward()
    level = episode.evaluation.level
    assert reward == pytest.approx(GRPOReward().levels[LEVELS.index(level)] + 0.5 * episode.progress)
    assert outcomes == [{"task_id": task.instance_id, "seed": 0, "level": level, "reward": reward,
                         "turns": episode.turns_used, "progress": episode.progress,
                         "end_reason": episode.end_reason}]


def test_rows_and_prompt():
    tasks = load_tasks(split="test")[:2]
    rows = task_rows(tasks, [0, 5])
    assert [(r["task_id"], r["seed"]) for r in rows] == [(t.instance_id, s) for s in (0, 5) for t in tasks]
    assert rows[0]["prompt"][-1] == {"role": "user", "content": ""}
    text = task_prompt(tasks[0], 10)
    assert "10 turns" in text and "<tool_call>" not in text


@pytest.mark.parametrize("kwargs, field", [({"levels": (0.0, 1.0)}, "levels"),
                                           ({"progress_weight": -1}, "progress_weight")])
def test_bad_reward_settings_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        GRPOReward(**kwargs)


def test_the_search_surface_calls_tools_by_name_with_the_text_envs_answers():
    from transformers.utils import get_json_schema

    adapter = grpo_environment_class(surface="search", search=SearchSettings(method="lexical", k=2))()
    assert set(tool_methods(adapter)) == {"tool_search", "tool_info", "call_tool"}
    assert get_json_schema(adapter.call_tool)["function"]["parameters"]["required"] == ["name"]
    task = load_tasks(split="test")[1]
    adapter.reset(task_id=task.instance_id, seed=2)
    text_env = ResiliBenchTextEnv(split=None, search=SearchSettings(method="lexical", k=2))
    text_env.reset(seed=2, options={"task_id": task.instance_id})
    first = task.required_tools[0]
    for answer, message in [
        (adapter.tool_search(query="parse records"), "<tool_search>parse records</tool_search>"),
        (adapter.call_tool(name="no_such_tool"), "<tool_call>no_such_tool</tool_call>"),
        (adapter.call_tool(name=first, arguments=valid_arguments(first)),
         f"<tool_call>{first} {json.dumps(valid_arguments(first))}</tool_call>"),
    ]:
        feedback, *_ = text_env.step(message)
        assert answer == feedback
    assert adapter._env.episode.turns_used == text_env.episode.turns_used == 3
    with pytest.raises(ValueError, match="surface"):
        grpo_environment_class(surface="some")
