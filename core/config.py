"""Every constant of the world as frozen configuration: the sections of ``WorldConfig``.

Each section is a ``resilibench.settings.Settings`` dataclass: its fields carry their type, range, accepted
values and help text, and check themselves when built. World configs load from YAML or JSON
(``load_config``), and ``to_dict`` writes them into results files; defaults are the paper's values.
"""

from __future__ import annotations

__all__ = [
    "MAX_TURN_LIMIT", "FailureModel", "TrainingDynamics", "EpisodeRules", "EvaluatorConfig", "ShapedReward",
    "FailureProcesses", "WorldConfig", "load_config",
]

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from resilibench.errors import ConfigError
from resilibench.settings import AT_LEAST_ONE, UNIT, Settings, from_dict, setting, short_repr, type_hints

# The largest turn limit: the batched env tabulates success probabilities and draw offsets per call count
# (turn_limit + 1 rows), and no task can use more than 30 tools x (1 + max_retries) calls.
MAX_TURN_LIMIT = 1000


@dataclass(frozen=True)
class FailureModel(Settings):
    """Test profile: p = base * uncalled**N_u * failed**N_f * history**N_h (docs/core/rules.md, "The rules")."""

    section = "failure"

    base_success: float = setting(0.8, bounds=UNIT, help="success probability of a call with no penalty")
    uncalled_dependency_factor: float = setting(0.5, bounds=UNIT, help="factor per dependency not yet called")
    failed_dependency_factor: float = setting(0.7, bounds=UNIT, help="factor per dependency whose last call failed")
    failure_history_factor: float = setting(0.9, bounds=UNIT, help="factor per earlier failure of this tool")


@dataclass(frozen=True)
class TrainingDynamics(Settings):
    """Paper D.4: the optional training profile (base rate set by the running success rate)."""

    section = "training"
    base_by_success_rate: tuple[tuple[float, float], ...] = setting(
        ((0.1, 0.95), (0.3, 0.90), (1.01, 0.85)), bounds=((0, None), UNIT),
        help="(success rate below, base success) steps, in order")
    dependency_factor: float = setting(0.8, bounds=UNIT, help="factor per missing dependency")
    retry_factor: float = setting(0.95, bounds=UNIT, help="factor per retry of the same tool")
    semantic_factor_range: tuple[float, float] = setting((1.0, 1.3), bounds=(0, None),
                                                         help="range of the semantic-match factor")

    def base_success(self, success_rate: float) -> float:
        for upper, base in self.base_by_success_rate:
            if success_rate < upper:
                return base
        return self.base_by_success_rate[-1][1]


@dataclass(frozen=True)
class EpisodeRules(Settings):
    """How an episode runs and ends: one rule set for every front end (docs/core/rules.md, "The rules")."""

    section = "rules"
    turn_limit: int = setting(10, bounds=(1, MAX_TURN_LIMIT), help="tool calls per episode",
                              reason="the batched env tabulates every call count up to it")
    max_consecutive_failures: int = setting(5, bounds=AT_LEAST_ONE, help="failures in a row that end an episode")
    max_same_tool_failures: int = setting(3, bounds=AT_LEAST_ONE,
                                          help="failures in a row of one tool that end an episode")
    strict_dependencies: bool = setting(False, help="a call whose dependencies have not succeeded fails")
    profile: str = setting("test", choices=("test", "training"),
                           help="failure profile: test (the failure model) or training (paper D.4)")


@dataclass(frozen=True)
class EvaluatorConfig(Settings):
    """Thresholds of the success levels (docs/core/rules.md, "Grading")."""

    section = "evaluator"
    min_coverage: dict[str, float] = setting(
        factory=lambda: {
            "basic_file_processing": 0.5,
            "simple_data_transformation": 0.5,
            "complex_validation_pipeline": 0.6,
            "complex_network_integration": 0.6,
            "advanced_computation_pipeline": 0.6,
        },
        bounds=UNIT, help="share of the required tools called, by task type, for partial success")
    partial_conditions_needed: int = setting(2, bounds=(1, 4), help="of the 4 conditions of partial success")
    partial_rule: str = setting("v1", choices=("v0", "v1"),
                                help="the world's grading rule, set by its World (resilibench.core.world); "
                                     "v1: partial success needs real progress; v0: any two conditions")
    completion_phrases: tuple[str, ...] = setting(
        ("task completed", "task complete", "task is complete", "finished executing", "all steps completed",
         "workflow completed"),
        help="phrases by which an agent says it is done")


@dataclass(frozen=True)
class ShapedReward(Settings):
    """Paper D.3: weights of the two-phase (coverage, sequence) shaped reward."""

    section = "reward"
    adapt_threshold: float = setting(0.3, bounds=UNIT, help="success rate where the sequence phase starts")
    attempt: float = setting(3.0, help="every call")
    novel: float = setting(30.0, help="the first call of a tool")
    required_success: float = setting(50.0, help="coverage phase: first success of a required tool")
    progress: float = setting(100.0, help="times the gain in share of required tools succeeded")
    milestone: float = setting(40.0, help="per step the in-order prefix advances")
    order_correct: float = setting(15.0, help="sequence phase: first success of the next required tool")
    order_misplaced: float = setting(-5.0, help="sequence phase: per position a required tool is out of order")
    step_efficiency: float = setting(10.0, help="terminal, times the share of turns left")
    error_free: float = setting(10.0, help="terminal, when no call failed")
    error_penalty_by_success_rate: tuple[tuple[float, float], ...] = setting(
        ((0.1, 0.0), (0.3, -2.0), (1.01, -5.0)), bounds=((0, None), (None, None)),
        help="(success rate below, penalty per error) steps, in order")
    repetition_coverage: float = setting(1.0, help="coverage phase: subtracted per repeat of a tool")
    repetition_sequence: float = setting(5.0, help="sequence phase: subtracted per repeat of a tool")
    terminal_coverage: tuple[float, float] = setting((150.0, 50.0), help="full success, coverage phase: "
                                                     "a + b * coverage")
    terminal_sequence: tuple[float, float] = setting((100.0, 50.0), help="full success, sequence phase: "
                                                     "a + b * share in order")
    terminal_failure: float = setting(50.0, help="no full success: times the progress")
    success_rate_window: int = setting(100, bounds=AT_LEAST_ONE, help="episodes of the running success rate")
    scale: float = setting(1.0, bounds=(0, None), help="factor on every reward")


@dataclass(frozen=True)
class FailureProcesses(Settings):
    """Failure processes beyond the success formula (docs/core/processes.md): per-tool base
    reliability, bursty outages, rate limits with a known wait, latency with a time budget. The defaults
    switch every process off and leave the world exactly v1."""

    section = "processes"
    tool_base_success: dict[str, float] = setting(
        factory=dict, bounds=UNIT,
        help="per-tool base success replacing failure.base_success for the named tools (test profile)")
    outage_start: float = setting(0.0, bounds=UNIT, help="P that a tool up at its last call is down at this "
                                  "call (0: no outages)")
    outage_end: float = setting(1.0, bounds=UNIT, help="P that a tool down at its last call is up at this call")
    rate_limit_probability: float = setting(0.0, bounds=UNIT, help="P that a call is refused with "
                                            "RATE_LIMIT_ERROR (0: no rate limits)")
    rate_limit_wait: int = setting(0, bounds=(0, MAX_TURN_LIMIT), help="turns after a refusal in which every "
                                   "call of that tool is refused again, without a draw")
    latency_seconds: tuple[float, ...] = setting((), bounds=(0, None), help="call durations of the latency "
                                                 "distribution (empty: no latency)")
    latency_weights: tuple[float, ...] = setting((), bounds=(0, None), help="weights of latency_seconds, "
                                                 "one each")
    call_timeout_seconds: float | None = setting(None, above=0, help="a call lasting longer fails with TIMEOUT "
                                                 "and costs this time (null: no timeout)")
    time_budget_seconds: float | None = setting(None, above=0, help="seconds of calls per episode; once used, "
                                                "only finishing is possible (null: no budget)")

    active: ClassVar[bool]  # whether any process has an effect (else the world is exactly v1); set when built

    def __post_init__(self) -> None:
        super().__post_init__()
        seconds, weights = self.latency_seconds, self.latency_weights
        if len(weights) != len(seconds):
            raise ConfigError("processes.latency_weights", f"processes.latency_weights must hold one weight per "
                              f"latency_seconds value ({len(seconds)}), got {len(weights)}")
        if seconds and sum(weights) <= 0:
            raise ConfigError("processes.latency_weights", f"processes.latency_weights must have a positive "
                              f"sum, got {list(weights)}")
        # Read at every episode start, so computed once here. A timeout or a budget without latency never binds.
        object.__setattr__(self, "active", bool(self.tool_base_success) or self.outage_start > 0
                           or self.rate_limit_probability > 0 or bool(seconds))


@dataclass(frozen=True)
class WorldConfig(Settings):
    """The whole world: failure model, episode rules, evaluator, rewards, failure processes."""

    failure: FailureModel = setting(factory=FailureModel)
    training: TrainingDynamics = setting(factory=TrainingDynamics)
    rules: EpisodeRules = setting(factory=EpisodeRules)
    evaluator: EvaluatorConfig = setting(factory=EvaluatorConfig)
    reward: ShapedReward = setting(factory=ShapedReward)
    processes: FailureProcesses = setting(factory=FailureProcesses)

    def __post_init__(self) -> None:
        for item in dataclasses.fields(self):
            if not isinstance(getattr(self, item.name), type_hints(WorldConfig)[item.name]):
                raise ConfigError(item.name, f"{item.name} must be a mapping of fields, got "
                                  f"{short_repr(getattr(self, item.name))}")

    def to_dict(self) -> dict[str, Any]:
        """Every section as plain data; ``processes`` only when it is not the default, so that a v1 world's dict
        (and the run identities built from it) stays what it was."""
        data = dataclasses.asdict(self)
        if self.processes == FailureProcesses():
            del data["processes"]
        return data

    def replace(self, **sections: Any) -> WorldConfig:
        """A copy with whole sections or single fields replaced, e.g. ``rules={"turn_limit": 12}``."""
        return from_dict(WorldConfig, sections, base=self)


def load_config(path: str | Path | None = None, base: WorldConfig | None = None) -> WorldConfig:
    """Load a WorldConfig from YAML (.yaml/.yml) or JSON (.json); missing fields keep the values of ``base``
    (default: the defaults). A missing file raises FileNotFoundError; a bad one, ConfigError naming the file
    or field. A world's config is loaded through its ``World`` (``resilibench.core.world``)."""
    base = base or WorldConfig()
    if path is None:
        return base
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"config file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix not in (".yaml", ".yml", ".json"):
        raise ConfigError("path", f"config file {path} must end in .yaml, .yml or .json, got "
                          f"{suffix or 'no suffix'!r}")
    text = path.read_text(encoding="utf-8")
    try:
        if suffix == ".json":
            data = json.loads(text)
        else:
            from resilibench.safe_yaml import load_yaml

            data = load_yaml(text) or {}
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError("path", f"cannot parse config file {path}: {first}") from None
    if not isinstance(data, dict):
        sections = sorted(f.name for f in dataclasses.fields(WorldConfig))
        raise ConfigError("path", f"config file {path} must hold a mapping of sections {sections}, got "
                          f"{type(data).__name__}")
    return from_dict(WorldConfig, data, base=base)
