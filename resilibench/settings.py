"""The settings machinery every configuration shares: frozen dataclasses whose fields check themselves.

Each settings object (the world's sections in ``resilibench.core.config``, PPO training, evaluation runs,
...) is a dataclass deriving from ``Settings`` whose fields are declared with ``setting(default, help=...,
bounds=..., choices=...)``: the field's type, range, accepted values and help text live on the field, once.
``Settings.__post_init__`` checks every field when the object is built, whichever way (``from_dict`` of a
file, ``WorldConfig.replace``, code, the command line): the type from the annotation (lists become tuples
of the annotated shape, integers become floats where a float is expected; booleans must be booleans,
numbers finite, strings non-empty; ``X | None`` accepts null), then the range and the choices. A bad value
or an unknown key raises ``ConfigError`` (a ``ValueError``) naming the field by its dotted name, e.g.
``rules.turn_limit``. The command line builds its options from the same metadata
(``resilibench.cli.options``).
"""

from __future__ import annotations

__all__ = [
    "settings_argument",
    "UNIT", "AT_LEAST_ONE", "setting", "Settings", "field_name", "type_hints", "without_none", "check_value",
    "short_repr", "from_dict",
]

import dataclasses
import math
import numbers
import types
import typing
from functools import cache
from typing import Any, ClassVar, TypeVar

from resilibench.errors import ConfigError, InputError

T = TypeVar("T", bound="Settings")
A = TypeVar("A")  # a settings-like argument of a front end

UNIT = (0, 1)  # bounds of a probability
AT_LEAST_ONE = (1, None)


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
        raise ConfigError(name, f"{name} must be {_describe(hint)}, got {short_repr(value)}") from None
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
        raise ConfigError(name, f"{name} must be {what}{each} {accepted}{reason}, got {short_repr(number)}")
    above = meta.get("above")
    if above is not None:
        low = next((v for v in _numbers(value) if v <= above), None)
        if low is not None:
            raise ConfigError(name, f"{name} must be {what}{each} > {above}{reason}, got {short_repr(low)}")
    choices = meta.get("choices")
    if choices is not None:
        wrong = [v for v in (value if isinstance(value, tuple) else (value,)) if v not in choices]
        if wrong:
            raise ConfigError(name, f"{name} must be one of {tuple(choices)}{each and ' (each)'}, got "
                              f"{short_repr(wrong[0])}")
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


def short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


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
                raise ConfigError(key, f"{key} must be a mapping of fields, got {short_repr(value)}")
            kwargs[key] = from_dict(type(inner), value or {}, base=inner)
        else:
            kwargs[key] = value
    return dataclasses.replace(current, **kwargs)  # type: ignore[type-var]


def settings_argument(name: str, value: Any, cls: type[A]) -> A | None:
    """A front end's argument that takes a ``cls`` settings object or None, returned as it is; ``InputError``
    naming ``name`` for anything else (a bare string or dict, say)."""
    if value is not None and not isinstance(value, cls):
        raise InputError(name, f"must be a {cls.__name__} ({cls.__module__}) or None, got {type(value).__name__}")
    return value
