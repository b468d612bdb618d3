"""Lazy public names of a package (PEP 562): a package declares which of its modules defines each name, and
the module is imported on the name's first use, so importing the package stays light."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def lazy_exports(package: str, modules: Mapping[str, Sequence[str]]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` (its ``__name__``) exporting, for each module in
    ``modules`` (a name relative to the package, such as ``".config"``), the names it lists. A name is
    imported from its module when first used and then kept in the package's namespace."""
    where = {name: module for module, names in modules.items() for name in names}
    namespace = sys.modules[package].__dict__

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name], package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(where))

    return __getattr__, __dir__
