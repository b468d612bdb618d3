"""Worlds: one object per world, chosen once; its grading rule cannot be contradicted by a config."""

from __future__ import annotations

import gymnasium as gym
import pytest

import resilibench  # noqa: F401  (registers the env ids)
from resilibench.core.config import EvaluatorConfig, WorldConfig
from resilibench.core.tasks.generator_v0 import generate_tasks_v0
from resilibench.core.tasks.generator_v1 import generate_tasks_v1
from resilibench.core.world import DEFAULT_WORLD, WORLDS, World, get_task, get_world, load_tasks
from resilibench.errors import ConfigError


def test_each_world_is_one_object_with_its_library_generator_and_grading():
    assert DEFAULT_WORLD == "v1" and set(WORLDS) == {"v0", "v1"}
    v0, v1 = get_world("v0"), get_world()
    assert (v0.generator, v0.grading, v1.generator, v1.grading) == (generate_tasks_v0, "v0", generate_tasks_v1, "v1")
    assert v1 is WORLDS["v1"] and get_world(v1) is v1
    assert v0.library_path.name == "tasks_v0.jsonl.gz" and v1.library_path.is_file()
    assert v0.config.evaluator.partial_rule == "v0" and v1.config == WorldConfig()
    test = v1.tasks("test")
    assert len(test) == 756 and {t.split for t in test} == {"test"}
    assert v1.task(test[0].instance_id) is test[0]
    assert load_tasks(split="test", world="v0") == v0.tasks("test") and get_task(test[0].instance_id) is test[0]
    with pytest.raises(KeyError, match="in world v0"):
        v0.task(test[0].instance_id)  # the ids of one library are not the other's
    with pytest.raises(ConfigError, match=r"world must be one of \('v0', 'v1'\), got 'v2'"):
        get_world("v2")


def test_a_config_given_to_a_world_takes_the_worlds_grading_rule():
    """Whatever rule a config carries, the world grades by its own; the rest of the config is kept."""
    config = WorldConfig(evaluator=EvaluatorConfig(partial_rule="v1")).replace(rules={"turn_limit": 12})
    v0 = get_world("v0", config)
    assert v0.config.evaluator.partial_rule == "v0" and v0.config.rules.turn_limit == 12
    assert World("v0", grading="v0", generator=generate_tasks_v0, config=config) == v0
    assert get_world("v1", v0.config).config == config  # and back
    assert v0.with_rules(strict_dependencies=True).config.rules.strict_dependencies is True
    with pytest.raises(ConfigError, match=r"unknown EpisodeRules field\(s\) \[.turns.\]"):
        v0.with_rules(turns=3)


def test_a_config_file_that_sets_another_grading_rule_is_refused(tmp_path):
    agrees, disagrees = tmp_path / "agrees.yaml", tmp_path / "disagrees.yaml"
    agrees.write_text("evaluator:\n  partial_rule: v0\nrules:\n  turn_limit: 8\n")
    disagrees.write_text("evaluator:\n  partial_rule: v1\n")
    assert get_world("v0").load_config(agrees).config.rules.turn_limit == 8
    assert get_world("v0").load_config(None) is get_world("v0")
    with pytest.raises(ConfigError, match="grading rule 'v0'.*choose the world") as caught:
        get_world("v0").load_config(disagrees)
    assert caught.value.field == "evaluator.partial_rule"


@pytest.mark.parametrize("env_id", ["ResiliBench", "ResiliBenchText", "WorkflowGen"])
def test_an_env_id_chooses_the_world_once_and_its_env_holds_it(env_id):
    for version in ("v0", "v1"):
        env = gym.make(f"{env_id}-{version}").unwrapped
        assert env.world.name == version and env.config is env.world.config
        assert env.config.evaluator.partial_rule == version
        assert {t.instance_id for t in env.tasks} <= {t.instance_id for t in get_world(version).tasks()}
