"""``WorkflowGen-v1``: workflow generation as an MDP, rewarded by exact success and structural consistency.
Names are imported on first use."""

__all__ = ["WorkflowGenEnv", "WorkflowReward"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .env import WorkflowGenEnv, WorkflowReward


__getattr__, __dir__ = lazy_exports(__name__, {".env": ("WorkflowGenEnv", "WorkflowReward")})
