"""The worlds tasks are played in: a shipped task library, the generator that made it and a grading rule,
under a world config.

Two worlds ship: ``v1`` (the default) and ``v0`` (the first library and grading, kept so that earlier figures
can be reproduced; docs/core/worlds.md). A world is chosen once, where a user chooses it (an env id's
version such as ``ResiliBench-v0``, a ``--world`` flag, a settings field), and resolved there into a
``World`` by ``get_world``; what lies below takes the ``World`` or its config, never the name.

The grading rule (the evaluator's partial-success rule) is the world's: a config given to a world takes
the world's rule, and a config file that sets another one is refused (``World.load_config``).
"""

from __future__ import annotations

__all__ = ["DEFAULT_WORLD", "World", "WORLDS", "get_world", "load_tasks", "get_task"]

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigError

from .config import WorldConfig, load_config
from .registry import ToolRegistry
from .tasks.generator_v0 import generate_tasks_v0
from .tasks.generator_v1 import generate_tasks_v1
from .tasks.library import DEFAULT_SEED, Task, filter_tasks, find_task, read_tasks

DEFAULT_WORLD = "v1"


@cache
def _library(path: Path) -> tuple[Task, ...]:
    return tuple(read_tasks(path))


@cache
def _library_index(path: Path) -> dict[str, Task]:
    return {t.instance_id: t for t in _library(path)}


@dataclass(frozen=True)
class World:
    """A world: ``name``, its ``grading`` rule, the ``generator`` of its library and the ``config`` it runs
    under (``WorldConfig()`` by default; the grading rule is always the world's)."""

    name: str
    grading: str
    generator: Callable[..., list[Task]] = field(repr=False)
    config: WorldConfig = field(default_factory=WorldConfig)

    def __post_init__(self) -> None:
        if self.config.evaluator.partial_rule != self.grading:
            object.__setattr__(self, "config", self.config.replace(evaluator={"partial_rule": self.grading}))

    @property
    def library_path(self) -> Path:
        """The task library this world ships with (JSONL, gzipped)."""
        return Path(str(resources.files("resilibench.core.tasks") / "data" / f"tasks_{self.name}.jsonl.gz"))

    def tasks(self, split: str | None = None, task_types: Sequence[str] | str | None = None) -> list[Task]:
        """The shipped library's tasks of ``split`` and ``task_types`` (None: all), read once per process."""
        return filter_tasks(_library(self.library_path), split, task_types)

    def task(self, task_id: str) -> Task:
        """A task of the shipped library by id; KeyError naming the world otherwise."""
        task = _library_index(self.library_path).get(task_id)
        return task if task is not None else find_task(task_id, (), f"world {self.name}")

    def generate(self, seed: int = DEFAULT_SEED, matcher=None, registry: ToolRegistry | None = None) -> list[Task]:
        """The world's library generated afresh from ``seed`` and ``matcher`` (same inputs, same bytes)."""
        return self.generator(seed=seed, matcher=matcher, registry=registry)

    def configured(self, config: WorldConfig | None) -> World:
        """This world under ``config`` (with the world's grading rule); itself when ``config`` is None."""
        return self if config is None else dataclasses.replace(self, config=config)

    def with_rules(self, **rules: Any) -> World:
        """This world with the given episode rules changed (``turn_limit=12``; ``ConfigError`` naming an
        unknown or bad one)."""
        return self.configured(self.config.replace(rules=rules)) if rules else self

    def load_config(self, path: str | Path | None) -> World:
        """This world under the config file at ``path`` (YAML or JSON; fields it leaves out keep this world's
        values); itself for None. A file that sets another grading rule is refused: choose that world."""
        if path is None:
            return self
        config = load_config(path, base=self.config)
        if config.evaluator.partial_rule != self.grading:
            raise ConfigError("evaluator.partial_rule", (
                f"{path}: evaluator.partial_rule {config.evaluator.partial_rule!r} is not world {self.name}'s "
                f"grading rule {self.grading!r}: the grading rule is the world's, choose the world instead"))
        return self.configured(config)


WORLDS: dict[str, World] = {
    "v0": World("v0", grading="v0", generator=generate_tasks_v0),
    "v1": World("v1", grading="v1", generator=generate_tasks_v1),
}


def get_world(world: str | World = DEFAULT_WORLD, config: WorldConfig | None = None) -> World:
    """The ``World`` a choice names (a world name, or a World as it is), under ``config`` when given;
    ``ConfigError`` naming the accepted worlds otherwise."""
    if not isinstance(world, World):
        if world not in WORLDS:
            raise ConfigError("world", f"world must be one of {tuple(WORLDS)}, got {world!r}")
        world = WORLDS[world]
    return world.configured(config)


def load_tasks(path: str | Path | None = None, split: str | None = None,
               task_types: Sequence[str] | str | None = None, world: str | World = DEFAULT_WORLD) -> list[Task]:
    """Tasks from the task file at ``path``, else from ``world``'s shipped library, of ``split`` and
    ``task_types`` (None: all)."""
    if path is None:
        return get_world(world).tasks(split, task_types)
    return filter_tasks(read_tasks(path), split, task_types)


def get_task(task_id: str, tasks: Sequence[Task] | None = None, world: str | World = DEFAULT_WORLD) -> Task:
    """A task by id from ``tasks``, else from ``world``'s shipped library; KeyError with a hint otherwise."""
    if tasks is None:
        return get_world(world).task(task_id)
    return find_task(task_id, tasks, "the given tasks")
