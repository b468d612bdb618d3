"""``ResiliBenchText-v1``: LLM agents play the world through chat messages (``env``), and its environment
for TRL's GRPO trainer (``trl``). Names are imported on first use."""

__all__ = ["GRPOEnvironmentBase", "GRPOReward", "ResiliBenchTextEnv", "grpo_environment_class", "task_rows"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .env import ResiliBenchTextEnv
    from .trl import GRPOEnvironmentBase, GRPOReward, grpo_environment_class, task_rows


__getattr__, __dir__ = lazy_exports(__name__, {
    ".env": ("ResiliBenchTextEnv",),
    ".trl": ("GRPOEnvironmentBase", "GRPOReward", "grpo_environment_class", "task_rows"),
})
