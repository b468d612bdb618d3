"""Every constant of the world as frozen configuration, and the settings machinery all configs share.

Each settings object (the world's sections here, PPO training, ...) is a dataclass deriving from ``Settings``
whose fields are declared with ``setting(default, help=..., bounds=..., choices=...)``: the field's type,
range, accepted values and help text live on the field, once. ``Settings.__post_init__`` checks every field
when the object is built, whichever way (``from_dict`` of a file, ``WorldConfig.replace``, code, the command
line): the type from the annotation (lists become tuples of the annotated shape, integers become floats
where a float is expected; booleans must be booleans, numbers finite, strings non-empty; ``X | None``
accepts null), then the range and the choices. A bad value or an unknown key raises ``ConfigError`` (a
``ValueError``) naming the field by its dotted name, e.g. ``rules.turn_limit``. The command line builds its
options from the same metadata (``resilibench.cli_options``).

World configs load from YAML or JSON (``load_config``), and ``to_dict`` writes them into results files;
defaults are the paper's values.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from resilibench.errors import InputError

T = TypeVar("T", bound="Settings")

# The largest turn limit: the batched env tabulates success probabilities and draw offsets per call count
# (turn_limit + 1 rows), and no task can use more than 30 tools x (1 + max_retries) calls.
MAX_TURN_LIMIT = 1000
UNIT = (0, 1)  # bounds of a probability
AT_LEAST_ONE = (1, None)


class ConfigError(InputError):
    """A setting with a bad value, or an unknown one; ``field`` is its dotted name (``rules.turn_limit``)
    and the message starts with it."""

    def __init__(self, field: str, message: str) -> None:
        ValueError.__init__(self, message)
        self.field = field
        self.message = message


def setting(default: Any = dataclasses.MISSING, *, factory: Any = dataclasses.MISSING, help: str = "",
            bounds: tuple | None = None, above: float | None = None, choices: tuple | None = None,
            reason: str = "", flag: str | tuple[str, ...] | None = None, metavar: str | None = None,
            several: bool = False) -> Any:
    """A dataclass field with what checks it and documents it.

    ``bounds``: (low, high) of every number the field holds, inclusive, None = open; for a field of pairs,
    one (low, high) per place. ``above``: an exclusive lower bound. ``choices``: the accepted values (of
    each item, for a tuple). ``reason``: why the bounds are what they are (shown in the error). ``flag`` and
    ``metavar``: the command-line option's name(s) (default ``--field-name``) and placeholder; ``several``:
    a tuple's option takes several values at once (``--seeds 0 1 2``) rather than repeating."""
    metadata = {"help": help, "bounds": bounds, "above": above, "choices": choices, "reason": reason,
                "flag": flag, "metavar": metavar, "several": several}
    return dataclasses.field(default=default, default_factory=factory, metadata=metadata)


class Settings:
    """Base of every settings dataclass: ``__post_init__`` checks every field (see the module docstring)."""

    section: ClassVar[str] = ""  # the prefix of its fields' names in error messages ("" at the top level)

    def __post_init__(self) -> None:
        hints = type_hints(type(self))
        for item in dataclasses.fields(self):  # type: ignore[arg-type]
            value = check_value(getattr(self, item.name), hints[item.name], field_name(type(self), item.name),
                                item.metadata)
            object.__setattr__(self, item.name, value)


def field_name(cls: type, name: str) -> str:
    """The dotted name of field ``name`` of ``cls`` in messages."""
    section = getattr(cls, "section", "")
    return f"{section}.{name}" if section else name


@cache
def type_hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a dataclass (strings under ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def without_none(hint: Any) -> tuple[Any, bool]:
    """(the type, whether None is accepted) of ``X | None``; ``(hint, False)`` for any other type."""
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(hint)) == 2:
            return args[0], True
    return hint, False


class _Mismatch(Exception):
    """A value that does not have the annotated type (reported by ``check_value`` for the whole field)."""


def _describe(hint: Any) -> str:
    """What a value of type ``hint`` is, in words: 'a finite number', 'a list of 2 finite numbers'..."""
    inner, optional = without_none(hint)
    if optional:
        return f"{_describe(inner)} or null"
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (types.UnionType, typing.Union):
        return " or ".join(_describe(a) for a in args)
    if isinstance(hint, type) and issubclass(hint, Settings):
        return hint.__name__
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_plural(args[0])}"
        if len(set(args)) == 1:
            return f"a list of {len(args)} {_plural(args[0])}"
        return f"a list of ({', '.join(_describe(a) for a in args)})"
    if typing.get_origin(hint) is dict:
        return f"a mapping of names to {_plural(args[1])}"
    return {bool: "true or false", int: "an integer", float: "a finite number", str: "a non-empty string",
            Any: "a value"}[hint]


def _plural(hint: Any) -> str:
    if hint is str:
        return "non-empty strings"
    words = _describe(hint)
    return words.replace("a list of ", "lists of ", 1) if words.startswith("a list") else words[2:] + "s"


def _conform(value: Any, hint: Any) -> Any:
    """``value`` as type ``hint`` (lists to tuples, integers to floats), or ``_Mismatch``."""
    inner, optional = without_none(hint)
    if optional:
        return None if value is None else _conform(value, inner)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return value
    if origin in (types.UnionType, typing.Union):  # the first type that fits
        for arm in args:
            try:
                return _conform(value, arm)
            except _Mismatch:
                pass
        raise _Mismatch
    if isinstance(hint, type) and issubclass(hint, Settings):
        if isinstance(value, hint):
            return value
        raise _Mismatch
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
    if hint in (int, float) and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return hint(value)  # numpy integers too
    if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    raise _Mismatch


def check_value(value: Any, hint: Any, name: str, meta: typing.Mapping[str, Any]) -> Any:
    """``value`` checked and converted for the field ``name`` of type ``hint`` with the metadata ``meta`` of
    ``setting``: the type, the bounds, the choices; ``ConfigError`` naming the field and what it accepts."""
    try:
        value = _conform(value, hint)
    except _Mismatch:
        raise ConfigError(name, f"{name} must be {_describe(hint)}, got {_short(value)}") from None
    if value is None:
        return value
    what = _describe(without_none(hint)[0])
    each = ", each" if isinstance(value, tuple | dict) else ""
    reason = f" ({meta['reason']})" if meta.get("reason") else ""
    bad = _outside(value, meta["bounds"]) if meta.get("bounds") is not None else None
    if bad is not None:
        number, (low, high) = bad
        accepted = (f"in [{low}, {high}]" if low is not None and high is not None
                    else f">= {low}" if low is not None else f"<= {high}")
        raise ConfigError(name, f"{name} must be {what}{each} {accepted}{reason}, got {_short(number)}")
    above = meta.get("above")
    if above is not None:
        low = next((v for v in _numbers(value) if v <= above), None)
        if low is not None:
            raise ConfigError(name, f"{name} must be {what}{each} > {above}{reason}, got {_short(low)}")
    choices = meta.get("choices")
    if choices is not None:
        wrong = [v for v in (value if isinstance(value, tuple) else (value,)) if v not in choices]
        if wrong:
            raise ConfigError(name, f"{name} must be one of {tuple(choices)}{each and ' (each)'}, got "
                              f"{_short(wrong[0])}")
    return value


def _numbers(value: Any) -> list[Any]:
    """Every number ``value`` holds (itself, list items, mapping values)."""
    if isinstance(value, dict):
        value = tuple(value.values())
    if isinstance(value, tuple):
        return [n for v in value for n in _numbers(v)]
    return [value] if isinstance(value, int | float) and not isinstance(value, bool) else []


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
class FailureModel(Settings):
    """Test profile: p = base * uncalled**N_u * failed**N_f * history**N_h (docs/envs.md, the rules)."""

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
    """How an episode runs and ends: one rule set for every front end (docs/envs.md, the rules)."""

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
    """Thresholds of the success levels (docs/envs.md, grading)."""

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
                                help="v1: partial success needs real progress; v0: any two conditions")
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
    """Failure processes beyond the success formula (docs/envs.md, "Failure processes"): per-tool base
    reliability, bursty outages, rate limits with a known wait, latency with a time budget. The defaults
    switch every process off and leave the world exactly v1."""

    section = "processes"
    tool_base_success: dict[str, float] = setting(
        factory=dict, bounds=UNIT, help="per-tool base success replacing failure.base_success for the named tools")
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


WORLD_PARTIAL_RULES = {"v0": "v0", "v1": "v1"}  # each world's evaluator rule for partial success


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
                                  f"{_short(getattr(self, item.name))}")

    def to_dict(self) -> dict[str, Any]:
        """Every section as plain data; ``processes`` only when it is not the default, so that a v1 world's dict
        (and the run identities built from it) stays what it was."""
        data = dataclasses.asdict(self)
        if self.processes == FailureProcesses():
            del data["processes"]
        return data

    @classmethod
    def for_world(cls, world: str = "v1") -> WorldConfig:
        """The default configuration of a world: v1, or v0 (whose evaluator used the v0 partial rule)."""
        if world not in WORLD_PARTIAL_RULES:
            raise ConfigError("world", f"world must be one of {tuple(WORLD_PARTIAL_RULES)}, got {world!r}")
        return cls(evaluator=EvaluatorConfig(partial_rule=WORLD_PARTIAL_RULES[world]))

    def replace(self, **sections: Any) -> WorldConfig:
        """A copy with whole sections or single fields replaced, e.g. ``rules={"turn_limit": 12}``."""
        return from_dict(WorldConfig, sections, base=self)


def from_dict(cls: type[T], data: dict[str, Any], base: T | None = None) -> T:
    """A settings dataclass from a dict (over ``base``, else the defaults): unknown keys are refused naming
    the accepted ones, nested settings are read from mappings (a null one keeps its defaults), and the
    objects check their values when built. ``ConfigError`` names the field."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - known)
    if unknown:
        name = field_name(cls, unknown[0])
        raise ConfigError(name, f"unknown {cls.__name__} field(s) {unknown}; accepted: {sorted(known)}")
    current = base if base is not None else cls()
    kwargs = {}
    for key, value in data.items():
        inner = getattr(current, key)
        if isinstance(inner, Settings) and not isinstance(value, Settings):
            if value is not None and not isinstance(value, dict):
                raise ConfigError(key, f"{key} must be a mapping of fields, got {_short(value)}")
            kwargs[key] = from_dict(type(inner), value or {}, base=inner)
        else:
            kwargs[key] = value
    return dataclasses.replace(current, **kwargs)  # type: ignore[type-var]


def load_config(path: str | Path | None = None, world: str = "v1") -> WorldConfig:
    """Load a WorldConfig from YAML (.yaml/.yml) or JSON (.json); missing fields keep the defaults of
    ``world``. A missing file raises FileNotFoundError; a bad one, ConfigError naming the file or field."""
    base = WorldConfig.for_world(world)
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
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as exc:  # json.JSONDecodeError, yaml.YAMLError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError("path", f"cannot parse config file {path}: {first}") from None
    if not isinstance(data, dict):
        sections = sorted(f.name for f in dataclasses.fields(WorldConfig))
        raise ConfigError("path", f"config file {path} must hold a mapping of sections {sections}, got "
                          f"{type(data).__name__}")
    return from_dict(WorldConfig, data, base=base)
