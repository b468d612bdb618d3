"""Task libraries: the ``Task`` type, task types and splits, task files, and the generators of worlds v1
and v0 (a world's shipped library: ``resilibench.core.world``). Names are imported on first use."""

__all__ = [
    "SPLITS", "TASK_TYPES", "TASK_TYPE_NAMES", "Task", "TaskType", "filter_tasks", "generate_tasks_v0",
    "generate_tasks_v1", "library_stats", "read_tasks", "write_tasks",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .generator_v0 import generate_tasks_v0
    from .generator_v1 import generate_tasks_v1
    from .library import (
        SPLITS,
        TASK_TYPE_NAMES,
        TASK_TYPES,
        Task,
        TaskType,
        filter_tasks,
        library_stats,
        read_tasks,
        write_tasks,
    )


__getattr__, __dir__ = lazy_exports(__name__, {
    ".generator_v0": ("generate_tasks_v0",),
    ".generator_v1": ("generate_tasks_v1",),
    ".library": ("SPLITS", "TASK_TYPES", "TASK_TYPE_NAMES", "Task", "TaskType", "filter_tasks", "library_stats",
                 "read_tasks", "write_tasks"),
})
