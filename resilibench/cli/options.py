"""Command-line options built from settings dataclasses: one source for each option's name, type, range,
choices, default and help (the field's ``resilibench.core.config.setting`` metadata).

    add_options(parser, PPOTrainConfig, ("lr", "seed"))       # --lr X, --seed N, checked as the field is
    PPOTrainConfig(**option_values(args, PPOTrainConfig, ("lr", "seed")))  # only the options given

An option's value is checked by the field's own rule as it is parsed, so a bad one is a one-line argparse
error naming the option; options left out keep the dataclass's defaults.
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Iterable
from typing import Any

from resilibench.errors import ConfigError
from resilibench.settings import check_value, field_name, type_hints, without_none


def _item_type(hint: Any) -> tuple[Any, bool]:
    """(the type of one value on the command line, whether the option repeats) for a field's type."""
    hint, _ = without_none(hint)
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0], True
    return hint, False


def _converter(cls: type, item: dataclasses.Field, hint: Any) -> Callable[[str], Any]:
    """argparse's ``type`` for the field ``item``: the text as ``hint``, checked by the field's rule."""
    meta = {**item.metadata, "choices": None}  # argparse checks and lists the choices itself
    words = {int: "an integer", float: "a number"}

    def convert(text: str) -> Any:
        try:
            value = hint(text) if hint in words else text
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {words[hint]}, got {text!r}") from None
        try:
            return check_value(value, hint, field_name(cls, item.name), meta)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = hint.__name__  # argparse names the type in some messages
    return convert


def _default_text(item: dataclasses.Field, defaults: object | None) -> str:
    if defaults is not None:
        value = getattr(defaults, item.name)
    else:
        value = item.default_factory() if item.default_factory is not dataclasses.MISSING else item.default
    if isinstance(value, bool):
        return "on" if value else "off"
    return " ".join(map(str, value)) if isinstance(value, tuple) else str(value)


def add_options(parser: argparse.ArgumentParser, cls: type, names: Iterable[str], defaults: object | None = None) -> None:
    """Add an option to ``parser`` for each field ``names`` of the settings dataclass ``cls``.

    The option is the field's ``flag`` (default ``--field-name``); booleans get ``--x/--no-x``, tuples a
    repeatable option; the help is the field's, with its choices and default (the class's, or that of the
    instance ``defaults`` when the command starts from one). Every option defaults to None (not given), so
    ``option_values`` passes on only what was given."""
    hints = type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for name in names:
        item = fields[name]
        meta = item.metadata
        hint, repeats = _item_type(hints[name])
        parts = ["repeatable"] if repeats and not meta.get("several") else []
        parts.append(meta.get("help", ""))
        if meta.get("choices") and meta.get("metavar"):  # a metavar hides argparse's list of choices
            parts.append(f"one of {', '.join(meta['choices'])}")
        text = "; ".join(p for p in parts if p)
        shown = _default_text(item, defaults)
        if "default" not in text and shown not in ("None", ""):
            text += f" (default {shown})"
        options: dict[str, Any] = {"dest": name, "default": None, "help": text.strip()}
        if hint is bool:
            options["action"] = argparse.BooleanOptionalAction
        else:
            metavar = meta.get("metavar") or {int: "N", float: "X"}.get(hint)
            options.update(type=_converter(cls, item, hint), choices=meta.get("choices"), metavar=metavar)
            if repeats and meta.get("several"):
                options.update(action="extend", nargs="+")
            elif repeats:
                options["action"] = "append"
        flags = meta.get("flag") or "--" + name.replace("_", "-")
        parser.add_argument(*((flags,) if isinstance(flags, str) else flags), **options)


def option_values(args: argparse.Namespace, cls: type, names: Iterable[str]) -> dict[str, Any]:
    """The fields ``names`` of ``cls`` given on the command line (repeated values deduplicated, in order)."""
    values = {}
    for name in names:
        value = getattr(args, name)
        if value is not None:
            values[name] = tuple(dict.fromkeys(value)) if isinstance(value, list) else value
    return values
