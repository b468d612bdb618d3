"""``ResiliBench-v1``: the planner MDP (``env``), its natively batched vector env (``vector``) and its
observation layout (``observation``). Names are imported on first use."""

__all__ = ["ObservationLayout", "ResiliBenchEnv", "ResiliBenchVectorEnv", "task_features"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .env import ResiliBenchEnv
    from .observation import ObservationLayout, task_features
    from .vector import ResiliBenchVectorEnv


__getattr__, __dir__ = lazy_exports(__name__, {
    ".env": ("ResiliBenchEnv",),
    ".observation": ("ObservationLayout", "task_features"),
    ".vector": ("ResiliBenchVectorEnv",),
})
