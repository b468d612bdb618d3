"""World config files: one validating loader (types, ranges, shapes, known keys), naming the field."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from resilibench.core.config import MAX_TURN_LIMIT, WorldConfig, load_config
from resilibench.core.evaluator import signals_completion
from resilibench.errors import ConfigError
from resilibench.settings import Settings, field_name, from_dict, type_hints, without_none


def _load(tmp_path, text: str, suffix: str = ".yaml") -> WorldConfig:
    path = tmp_path / f"world{suffix}"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("failure:\n  base_success: 1.5\n", "failure.base_success must be a finite number in [0, 1], got 1.5"),
        ("failure:\n  base_success: -0.1\n", "failure.base_success"),
        ("failure:\n  base_success: '0.8'\n", "failure.base_success must be a finite number, got '0.8'"),
        ("failure:\n  base_success: .nan\n", "failure.base_success must be a finite number"),
        ("failure:\n  base_success: true\n", "failure.base_success must be a finite number"),
        ("failure:\n  base_success:\n", "failure.base_success must be a finite number, got None"),
        ("rules:\n  turn_limit: 10.0\n", "rules.turn_limit must be an integer"),
        ("rules:\n  turn_limit: 0\n", "rules.turn_limit must be an integer in [1, 1000]"),
        ("rules:\n  turn_limit: 1000000000\n", "in [1, 1000] (the batched env tabulates every call count"),
        ("rules:\n  strict_dependencies: 'yes'\n", "rules.strict_dependencies must be true or false"),
        ("rules:\n  strict_dependencies: 1\n", "rules.strict_dependencies must be true or false"),
        ("rules:\n  profile: fast\n", "rules.profile must be one of ('test', 'training')"),
        ("rules:\n  max_consecutive_failures: 0\n", "rules.max_consecutive_failures"),
        ("evaluator:\n  min_coverage: 0.5\n", "evaluator.min_coverage must be a mapping"),
        ("evaluator:\n  min_coverage:\n    basic_file_processing: 2\n", "evaluator.min_coverage"),
        ("evaluator:\n  completion_phrases: task completed\n",
         "evaluator.completion_phrases must be a list of non-empty strings"),
        ("evaluator:\n  completion_phrases: ['']\n", "evaluator.completion_phrases"),
        ("evaluator:\n  completion_phrases: [1]\n", "evaluator.completion_phrases"),
        ("evaluator:\n  partial_conditions_needed: 5\n", "evaluator.partial_conditions_needed"),
        ("training:\n  base_by_success_rate: [[0.1]]\n", "training.base_by_success_rate"),
        ("training:\n  semantic_factor_range: [1.0, 1.3, 2.0]\n", "training.semantic_factor_range"),
        ("training:\n  base_by_success_rate: [[0.1, 1.5]]\n", "training.base_by_success_rate"),
        ("reward:\n  success_rate_window: 0\n", "reward.success_rate_window"),
        ("reward:\n  adapt_threshold: 2\n", "reward.adapt_threshold"),
        ("rules: 5\n", "rules must be a mapping"),
        ("rules:\n  turn: 5\n", "unknown EpisodeRules field(s) ['turn']"),
    ],
)
def test_invalid_values_are_refused_naming_the_field(tmp_path, text, needle):
    with pytest.raises(ValueError) as error:
        _load(tmp_path, text)
    message = str(error.value)
    assert needle in message, message
    assert len(message.splitlines()) == 1


def test_nan_in_json_is_refused(tmp_path):
    with pytest.raises(ValueError, match="reward.scale must be a finite number"):
        _load(tmp_path, '{"reward": {"scale": NaN}}', ".json")


def test_a_null_section_reads_as_its_defaults(tmp_path):
    assert _load(tmp_path, "rules:\nfailure: null\n") == WorldConfig()


def test_valid_files_load_with_lists_as_tuples_and_integers_as_floats(tmp_path):
    config = _load(tmp_path, "failure:\n  base_success: 1\nrules:\n  turn_limit: 12\n"
                             "evaluator:\n  completion_phrases: [all done]\n"
                             "training:\n  base_by_success_rate: [[0.5, 0.9], [1.01, 0.8]]\n")
    assert config.failure.base_success == 1.0 and isinstance(config.failure.base_success, float)
    assert config.rules.turn_limit == 12
    assert config.evaluator.completion_phrases == ("all done",)
    assert config.training.base_by_success_rate == ((0.5, 0.9), (1.01, 0.8))
    assert signals_completion("all done here", config.evaluator)
    assert not signals_completion("a", config.evaluator)


def test_to_dict_round_trips_through_json(tmp_path):
    config = WorldConfig().replace(rules={"turn_limit": 15}, failure={"base_success": 0.7})
    assert _load(tmp_path, json.dumps(config.to_dict()), ".json") == config


def test_replace_validates_too():
    with pytest.raises(ValueError, match="rules.turn_limit must be an integer"):
        WorldConfig().replace(rules={"turn_limit": "10"})
    with pytest.raises(ValueError, match="failure.base_success"):
        WorldConfig().replace(failure={"base_success": math.inf})


def test_every_field_is_type_checked():
    """No field escapes the loader: a value of a wrong type is refused naming it, whatever the field."""
    for section in dataclasses.fields(WorldConfig):
        for item in dataclasses.fields(section.type if isinstance(section.type, type)
                                       else type(getattr(WorldConfig(), section.name))):
            with pytest.raises(ValueError, match=rf"{section.name}\.{item.name} must be"):
                WorldConfig().replace(**{section.name: {item.name: object()}})


def test_the_turn_limit_bound_is_documented():
    assert MAX_TURN_LIMIT == 1000
    WorldConfig().replace(rules={"turn_limit": MAX_TURN_LIMIT})


# --- the settings machinery every config shares ---------------------------------------------------------


@pytest.mark.parametrize(("text", "field"), [
    ("rules:\n  turn_limit: 10.5\n", "rules.turn_limit"),
    ("failure:\n  base_success: '0.8'\n", "failure.base_success"),
    ("rules:\n  turn: 5\n", "rules.turn"),
    ("rules: 5\n", "rules"),
])
def test_bad_values_raise_config_error_with_the_dotted_field(tmp_path, text, field):
    """Rejected at load (not later in Episode.start), as a library exception carrying the field's name."""
    with pytest.raises(ConfigError) as error:
        _load(tmp_path, text)
    assert isinstance(error.value, ValueError) and error.value.field == field
    assert str(error.value).startswith(field) or f"[{field.split('.')[-1]!r}]" in str(error.value)


def _settings_classes():
    from resilibench.llm import GenerationConfig
    from resilibench.policies.ppo.curriculum import CurriculumConfig
    from resilibench.policies.ppo.training import PPOTrainConfig
    from resilibench.robust_train.pipeline import DemoSettings
    from resilibench.robust_train.scpo import ScPOSettings
    from resilibench.robust_train.training import LoraSettings, PreferenceSettings, SFTSettings

    sections = [type(getattr(WorldConfig(), f.name)) for f in dataclasses.fields(WorldConfig)]
    return [*sections, PPOTrainConfig, CurriculumConfig, LoraSettings, SFTSettings, PreferenceSettings,
            ScPOSettings, DemoSettings, GenerationConfig]


def _outside(meta):
    """A number just outside a field's declared range, or None when the field declares none."""
    bounds, above = meta.get("bounds"), meta.get("above")
    if above is not None:
        return above
    if bounds is None or isinstance(bounds[0], tuple):
        return None
    low, high = bounds
    return low - 1 if low is not None else (high + 1 if high is not None else None)


@pytest.mark.parametrize("cls", _settings_classes(), ids=lambda c: c.__name__)
def test_every_settings_field_is_checked_by_its_declared_rules(cls):
    """Each settings object refuses, naming the field, a value of the wrong type and a number outside the
    field's declared range or choices: the rules on the field are the ones enforced."""
    assert issubclass(cls, Settings)
    hints = type_hints(cls)
    for item in dataclasses.fields(cls):
        name = field_name(cls, item.name)
        with pytest.raises(ConfigError, match=rf"^{name} must be") as error:
            cls(**{item.name: object()})
        assert error.value.field == name
        bad = _outside(item.metadata)
        scalar = without_none(hints[item.name])[0]
        if bad is not None and scalar in (int, float):
            with pytest.raises(ConfigError, match=rf"^{name} must be .*, got {bad}"):
                cls(**{item.name: scalar(bad)})
        if item.metadata.get("choices") and scalar is str:
            with pytest.raises(ConfigError, match=rf"^{name} must be one of"):
                cls(**{item.name: "no-such-choice"})


def test_nested_settings_name_their_path():
    from resilibench.policies.ppo.training import PPOTrainConfig

    with pytest.raises(ConfigError) as error:
        PPOTrainConfig(world={"rules": {"turn_limit": 10.5}})
    assert error.value.field == "world.rules.turn_limit" and "rules.turn_limit must be an integer" in str(error.value)
    with pytest.raises(ConfigError) as error:
        PPOTrainConfig(curriculum_config={"windw": 5})
    assert error.value.field == "curriculum_config.windw"


def test_from_dict_builds_any_settings_and_refuses_unknown_keys():
    from resilibench.robust_train.scpo import ScPOSettings

    settings = from_dict(ScPOSettings, {"candidates": 5, "preference": {"beta": 0.5}})
    assert settings.candidates == 5 and settings.preference.beta == 0.5
    assert settings.preference.batch_size == ScPOSettings().preference.batch_size
    with pytest.raises(ConfigError, match=r"unknown ScPOSettings field\(s\) \['votes'\]"):
        from_dict(ScPOSettings, {"votes": "soft"})


def test_numpy_numbers_read_as_python_numbers():
    """Seeds and sizes computed with numpy are accepted and stored as plain ints and floats."""
    import numpy as np

    from resilibench.llm import GenerationConfig

    config = GenerationConfig(seed=np.uint32(7), top_p=np.float32(0.5))
    assert config.seed == 7 and type(config.seed) is int and type(config.top_p) is float
    with pytest.raises(ConfigError, match="seed must be an integer or null"):
        GenerationConfig(seed=np.bool_(True))


def test_every_world_field_is_documented():
    """The world's fields carry their help text (shown by tools built on the metadata)."""
    for section in dataclasses.fields(WorldConfig):
        for item in dataclasses.fields(getattr(WorldConfig(), section.name)):
            assert item.metadata.get("help"), f"{section.name}.{item.name}"
