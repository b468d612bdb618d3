"""YAML for files a user hands in (world configs, task files, OpenAPI documents): PyYAML's safe loader
without aliases, so that a few hundred bytes of ``&a [*b, *b, ...]`` cannot grow into gigabytes."""

from __future__ import annotations

__all__ = ["load_yaml"]

from typing import Any

import yaml


class _NoAliasLoader(yaml.SafeLoader):
    """The safe loader, refusing every alias (``*name``) with the line it is on."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise yaml.YAMLError(f"line {mark.line + 1}: YAML aliases (*{self.peek_event().anchor}) are not "
                                 "accepted; write the value out")
        return super().compose_node(parent, index)


def load_yaml(text: str) -> Any:
    """The document in ``text``; ``yaml.YAMLError`` when it is not YAML or uses an alias."""
    return yaml.load(text, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader subclass
