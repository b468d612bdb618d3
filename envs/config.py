"""Every constant of the world as frozen configuration; defaults are the paper's values.

Configs load from YAML or JSON (``load_config``), and ``to_dict`` writes them into results files.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class FailureModel:
    """SPEC 2: p = base * uncalled**N_u * failed**N_f * history**N_h."""

    base_success: float = 0.8
    uncalled_dependency_factor: float = 0.5
    failed_dependency_factor: float = 0.7
    failure_history_factor: float = 0.9


@dataclass(frozen=True)
class TrainingDynamics:
    """Paper D.4: the optional training profile (base rate set by the running success rate)."""

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
class EpisodeRules:
    """SPEC 2b: one rule set for every front end."""

    turn_limit: int = 10
    max_consecutive_failures: int = 5
    max_same_tool_failures: int = 3
    strict_dependencies: bool = False
    profile: str = "test"  # "test" (SPEC 2 formula) or "training" (paper D.4)

    def __post_init__(self) -> None:
        if self.turn_limit < 1:
            raise ValueError(f"turn_limit must be >= 1, got {self.turn_limit}")
        if self.profile not in ("test", "training"):
            raise ValueError(f"profile must be 'test' or 'training', got {self.profile!r}")
        if self.max_consecutive_failures < 1 or self.max_same_tool_failures < 1:
            raise ValueError("failure limits must be >= 1")


@dataclass(frozen=True)
class EvaluatorConfig:
    """SPEC 4: thresholds of the success levels."""

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
class ShapedReward:
    """Paper D.3: weights of the two-phase (coverage, sequence) shaped reward."""

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
    """Build a config dataclass from a dict, naming unknown keys and recursing into sections."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown {cls.__name__} field(s) {unknown}; accepted: {sorted(known)}")
    base = base if base is not None else cls()
    kwargs = {}
    for key, value in data.items():
        current = getattr(base, key)
        if dataclasses.is_dataclass(current) and isinstance(value, dict):
            kwargs[key] = _from_dict(type(current), value, base=current)
        elif isinstance(current, tuple) and isinstance(value, list):
            kwargs[key] = tuple(tuple(v) if isinstance(v, list) else v for v in value)
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
