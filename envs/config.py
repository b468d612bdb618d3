"""Every constant of the world as frozen configuration; defaults are the paper's values.

Configs load from YAML or JSON (``load_config``), and ``to_dict`` writes them into results files. Every
section checks its fields when it is built, whichever way (file, ``WorldConfig.replace``, code): the type
from the field's annotation (lists become tuples of the annotated shape, integers become floats where a
float is expected; booleans must be booleans, numbers finite, strings non-empty), then the ranges and
choices of ``RANGES`` and ``CHOICES``. A bad value raises ``ValueError`` naming ``section.field``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

T = TypeVar("T")

# The largest turn limit: an episode draws its random stream for every turn up front (the batched env holds
# num_envs x turn_limit draws), and no task can use more than 30 tools x (1 + max_retries) calls.
MAX_TURN_LIMIT = 1000
_UNIT = (0, 1)
_AT_LEAST_ONE = (1, None)
# Ranges (low, high; None = open) of numbers by "section.field"; for a field of pairs, one range per place.
# The range applies to every number the field holds (mapping values, list items).
RANGES: dict[str, Any] = {
    "failure.base_success": _UNIT,
    "failure.uncalled_dependency_factor": _UNIT,
    "failure.failed_dependency_factor": _UNIT,
    "failure.failure_history_factor": _UNIT,
    "training.base_by_success_rate": ((0, None), _UNIT),
    "training.dependency_factor": _UNIT,
    "training.retry_factor": _UNIT,
    "training.semantic_factor_range": (0, None),
    "rules.turn_limit": (1, MAX_TURN_LIMIT),
    "rules.max_consecutive_failures": _AT_LEAST_ONE,
    "rules.max_same_tool_failures": _AT_LEAST_ONE,
    "evaluator.min_coverage": _UNIT,
    "evaluator.partial_conditions_needed": (1, 4),  # of the 4 conditions of SPEC 4
    "reward.adapt_threshold": _UNIT,
    "reward.error_penalty_by_success_rate": ((0, None), (None, None)),
    "reward.success_rate_window": _AT_LEAST_ONE,
    "reward.scale": (0, None),
}
REASONS = {"rules.turn_limit": "an episode draws its random stream for every turn up front"}
CHOICES = {"rules.profile": ("test", "training"), "evaluator.partial_rule": ("v0", "v1")}


class _Section:
    """Base of the config sections: ``__post_init__`` checks every field (see the module docstring)."""

    section: ClassVar[str]  # the section's name in WorldConfig and in error messages

    def __post_init__(self) -> None:
        hints = _hints(type(self))
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            name = f"{self.section}.{item.name}"
            object.__setattr__(self, item.name, check_value(getattr(self, item.name), hints[item.name], name))


@cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


class _Mismatch(Exception):
    """A value that does not have the annotated type (reported by ``check_value`` for the whole field)."""


def _describe(hint: Any) -> str:
    """What a value of type ``hint`` is, in words: 'a finite number', 'a list of 2 finite numbers'..."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        if len(set(args)) == 1:
            return f"a list of {len(args)} {_plural(args[0])}"
        return f"a list of ({', '.join(_describe(a) for a in args)})"
    if typing.get_origin(hint) is dict:
        return f"a mapping of names to {_plural(args[1])}"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a non-empty string"}[hint]


def _plural(hint: Any) -> str:
    if hint is str:
        return "non-empty strings"
    words = _describe(hint)
    return words.replace("a list of ", "lists of ", 1) if words.startswith("a list") else words[2:] + "s"


def _conform(value: Any, hint: Any) -> Any:
    """``value`` as type ``hint`` (lists to tuples, integers to floats), or ``_Mismatch``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _Mismatch
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_conform(v, args[0]) for v in value)
        if len(value) != len(args):
            raise _Mismatch
        return tuple(_conform(v, a) for v, a in zip(value, args, strict=True))
    if origin is dict:
        if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
            raise _Mismatch
        return {k: _conform(v, args[1]) for k, v in value.items()}
    if hint is bool and isinstance(value, bool):
        return value
    if hint is str and isinstance(value, str) and value.strip():
        return value
    if hint in (int, float) and isinstance(value, int) and not isinstance(value, bool):
        return hint(value)
    if hint is float and isinstance(value, float) and math.isfinite(value):
        return value
    raise _Mismatch


def check_value(value: Any, hint: Any, name: str) -> Any:
    """``value`` checked and converted for the field ``name`` of type ``hint``: the type, then
    ``RANGES[name]`` and ``CHOICES[name]``; ``ValueError`` naming the field and what it accepts."""
    try:
        value = _conform(value, hint)
    except _Mismatch:
        raise ValueError(f"{name} must be {_describe(hint)}, got {_short(value)}") from None
    bounds = RANGES.get(name)
    bad = _outside(value, bounds) if bounds is not None else None
    if bad is not None:
        number, (low, high) = bad
        accepted = (f"in [{low}, {high}]" if low is not None and high is not None
                    else f">= {low}" if low is not None else f"<= {high}")
        each = ", each" if isinstance(value, tuple | dict) else ""
        reason = f" ({REASONS[name]})" if name in REASONS else ""
        raise ValueError(f"{name} must be {_describe(hint)}{each} {accepted}{reason}, got {_short(number)}")
    if name in CHOICES and value not in CHOICES[name]:
        raise ValueError(f"{name} must be one of {CHOICES[name]}, got {_short(value)}")
    return value


def _outside(value: Any, bounds: Any) -> tuple[Any, tuple] | None:
    """The first number of ``value`` outside ``bounds`` with the bounds it broke, or None."""
    if isinstance(value, dict):
        value = tuple(value.values())
    if isinstance(value, tuple):
        per_place = isinstance(bounds[0], tuple) and not any(isinstance(v, tuple) for v in value)
        for i, v in enumerate(value):
            bad = _outside(v, bounds[i] if per_place else bounds)
            if bad is not None:
                return bad
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        low, high = bounds
        if (low is not None and value < low) or (high is not None and value > high):
            return value, bounds
    return None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class FailureModel(_Section):
    """SPEC 2: p = base * uncalled**N_u * failed**N_f * history**N_h."""

    section = "failure"

    base_success: float = 0.8
    uncalled_dependency_factor: float = 0.5
    failed_dependency_factor: float = 0.7
    failure_history_factor: float = 0.9


@dataclass(frozen=True)
class TrainingDynamics(_Section):
    """Paper D.4: the optional training profile (base rate set by the running success rate)."""

    section = "training"
    base_by_success_rate: tuple[tuple[float, float], ...] = ((0.1, 0.95), (0.3, 0.90), (1.01, 0.85))
    dependency_factor: float = 0.8
    retry_factor: float = 0.95
    semantic_factor_range: tuple[float, float] = (1.0, 1.3)

    def base_success(self, success_rate: float) -> float:
        for upper, base in self.base_by_success_rate:
            if success_rate < upper:
                return base
        return self.base_by_success_rate[-1][1]


@dataclass(frozen=True)
class EpisodeRules(_Section):
    """SPEC 2b: one rule set for every front end."""

    section = "rules"
    turn_limit: int = 10
    max_consecutive_failures: int = 5
    max_same_tool_failures: int = 3
    strict_dependencies: bool = False
    profile: str = "test"  # "test" (SPEC 2 formula) or "training" (paper D.4)


@dataclass(frozen=True)
class EvaluatorConfig(_Section):
    """SPEC 4: thresholds of the success levels."""

    section = "evaluator"
    min_coverage: dict[str, float] = field(
        default_factory=lambda: {
            "basic_file_processing": 0.5,
            "simple_data_transformation": 0.5,
            "complex_validation_pipeline": 0.6,
            "complex_network_integration": 0.6,
            "advanced_computation_pipeline": 0.6,
        }
    )
    partial_conditions_needed: int = 2
    partial_rule: str = "v1"  # "v1": partial success needs real progress; "v0": any two conditions
    completion_phrases: tuple[str, ...] = (
        "task completed",
        "task complete",
        "task is complete",
        "finished executing",
        "all steps completed",
        "workflow completed",
    )


@dataclass(frozen=True)
class ShapedReward(_Section):
    """Paper D.3: weights of the two-phase (coverage, sequence) shaped reward."""

    section = "reward"
    adapt_threshold: float = 0.3
    attempt: float = 3.0
    novel: float = 30.0
    required_success: float = 50.0
    progress: float = 100.0
    milestone: float = 40.0
    order_correct: float = 15.0
    order_misplaced: float = -5.0
    step_efficiency: float = 10.0
    error_free: float = 10.0
    error_penalty_by_success_rate: tuple[tuple[float, float], ...] = ((0.1, 0.0), (0.3, -2.0), (1.01, -5.0))
    repetition_coverage: float = 1.0
    repetition_sequence: float = 5.0
    terminal_coverage: tuple[float, float] = (150.0, 50.0)
    terminal_sequence: tuple[float, float] = (100.0, 50.0)
    terminal_failure: float = 50.0
    success_rate_window: int = 100
    scale: float = 1.0


WORLD_PARTIAL_RULES = {"v0": "v0", "v1": "v1"}  # each world's evaluator rule for partial success


@dataclass(frozen=True)
class WorldConfig:
    """The whole world: failure model, episode rules, evaluator, rewards."""

    failure: FailureModel = field(default_factory=FailureModel)
    training: TrainingDynamics = field(default_factory=TrainingDynamics)
    rules: EpisodeRules = field(default_factory=EpisodeRules)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    reward: ShapedReward = field(default_factory=ShapedReward)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def for_world(cls, world: str = "v1") -> WorldConfig:
        """The default configuration of a world: v1, or v0 (whose evaluator used the v0 partial rule)."""
        if world not in WORLD_PARTIAL_RULES:
            raise ValueError(f"world must be one of {tuple(WORLD_PARTIAL_RULES)}, got {world!r}")
        return cls(evaluator=EvaluatorConfig(partial_rule=WORLD_PARTIAL_RULES[world]))

    def replace(self, **sections: Any) -> WorldConfig:
        """A copy with whole sections or single fields replaced, e.g. ``rules={"turn_limit": 12}``."""
        updates = {}
        for name, value in sections.items():
            current = getattr(self, name)
            updates[name] = _from_dict(type(current), value, base=current) if isinstance(value, dict) else value
        return dataclasses.replace(self, **updates)


def _from_dict(cls: type[T], data: dict[str, Any], base: T | None = None) -> T:
    """Build a config dataclass from a dict, naming unknown keys and recursing into sections (a null
    section keeps its defaults); the sections check their values when built."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; accepted: {sorted(known)}")
    base = base if base is not None else cls()
    kwargs = {}
    for key, value in data.items():
        current = getattr(base, key)
        if dataclasses.is_dataclass(current):
            if value is not None and not isinstance(value, dict):
                raise ValueError(f"{key} must be a mapping of fields, got {_short(value)}")
            kwargs[key] = _from_dict(type(current), value or {}, base=current)
        else:
            kwargs[key] = value
    return dataclasses.replace(base, **kwargs)


def load_config(path: str | Path | None = None, world: str = "v1") -> WorldConfig:
    """Load a WorldConfig from YAML (.yaml/.yml) or JSON (.json); missing fields keep the defaults of
    ``world``. Problems with the file raise FileNotFoundError or ValueError naming the file and the field."""
    base = WorldConfig.for_world(world)
    if path is None:
        return base
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ValueError(f"config file {path} must end in .yaml, .yml or .json, got {suffix or 'no suffix'!r}")
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ValueError(f"cannot parse config file {path}: {first}") from None
    if not isinstance(data, dict):
        sections = sorted(f.name for f in dataclasses.fields(WorldConfig))
        raise ValueError(f"config file {path} must hold a mapping of sections {sections}, got {type(data).__name__}")
    return _from_dict(WorldConfig, data, base=base)
