"""The front ends of the world, one folder per front end (``planner``, ``text``, ``workflowgen``,
``adversarial``, ``mcp``, ``real_api``); ``adversarial_v1`` and ``adversarial_v0`` are the game's versions.

The names below are imported on first use: importing ``resilibench.envs`` loads no front end.
"""

__all__ = [
    "AdversarialParallelEnv", "LiveApi", "RealApi", "ResiliBenchEnv", "ResiliBenchTextEnv", "ResiliBenchVectorEnv",
    "WorkflowGenEnv", "WorkflowReward", "build_server", "load_live_api", "register_envs",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .adversarial.game import AdversarialParallelEnv
    from .mcp.server import build_server
    from .planner.env import ResiliBenchEnv
    from .planner.vector import ResiliBenchVectorEnv
    from .real_api.live_apis import LiveApi, RealApi, load_live_api
    from .registration import register_envs
    from .text.env import ResiliBenchTextEnv
    from .workflowgen.env import WorkflowGenEnv, WorkflowReward


__getattr__, __dir__ = lazy_exports(__name__, {
    ".adversarial.game": ("AdversarialParallelEnv",),
    ".mcp.server": ("build_server",),
    ".planner.env": ("ResiliBenchEnv",),
    ".planner.vector": ("ResiliBenchVectorEnv",),
    ".real_api.live_apis": ("LiveApi", "RealApi", "load_live_api"),
    ".registration": ("register_envs",),
    ".text.env": ("ResiliBenchTextEnv",),
    ".workflowgen.env": ("WorkflowGenEnv", "WorkflowReward"),
})
