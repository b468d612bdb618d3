"""ResiliBench: seeded environments for tool use under failure.

Importing the package registers the Gymnasium environments (``ResiliBench-v1`` and the other ids of both
worlds). The names a user needs are declared here and imported on first use, so ``import resilibench``
stays light: ``from resilibench import WorldConfig, load_tasks, optimal_success``.
"""

__all__ = [
    "Episode",
    "Node",
    "Planner",
    "PromptSettings",
    "RealApi",
    "ResiliBenchEnv",
    "ResiliBenchTextEnv",
    "ResiliBenchVectorEnv",
    "SearchSettings",
    "Task",
    "Workflow",
    "WorkflowGenEnv",
    "World",
    "WorldConfig",
    "__version__",
    "clairvoyant_success",
    "get_task",
    "get_world",
    "load_config",
    "load_tasks",
    "optimal_success",
    "reference_workflow",
    "register_envs",
]

from pathlib import Path
from typing import TYPE_CHECKING

# pyproject.toml maps resilibench.envs, .agents, ... to folders beside this one. An installed package (wheel, or
# the strict editable install's link tree) holds them inside; a checkout imported directly (its root first on
# sys.path, as with `python -m pytest` or `python -m resilibench` run there) finds them beside.
_CHECKOUT = Path(__file__).parent.parent
if not (Path(__file__).parent / "envs").is_dir() and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))

from resilibench.envs.registration import register_envs  # noqa: E402
from resilibench.lazy import lazy_exports  # noqa: E402
from resilibench.version import __version__  # noqa: E402

if TYPE_CHECKING:
    from resilibench.core.bounds import clairvoyant_success, optimal_success, reference_workflow
    from resilibench.core.config import WorldConfig, load_config
    from resilibench.core.planner import Planner
    from resilibench.core.simulator import Episode
    from resilibench.core.tasks.library import Task
    from resilibench.core.text.prompts import PromptSettings
    from resilibench.core.text.toolbox import SearchSettings
    from resilibench.core.workflow import Node, Workflow
    from resilibench.core.world import World, get_task, get_world, load_tasks
    from resilibench.envs.planner.env import ResiliBenchEnv
    from resilibench.envs.planner.vector import ResiliBenchVectorEnv
    from resilibench.envs.real_api.live_apis import RealApi
    from resilibench.envs.text.env import ResiliBenchTextEnv
    from resilibench.envs.workflowgen.env import WorkflowGenEnv

register_envs()


__getattr__, __dir__ = lazy_exports(__name__, {
    ".core.bounds": ("clairvoyant_success", "optimal_success", "reference_workflow"),
    ".core.config": ("WorldConfig", "load_config"),
    ".core.planner": ("Planner",),
    ".core.simulator": ("Episode",),
    ".core.tasks.library": ("Task",),
    ".core.text.prompts": ("PromptSettings",),
    ".core.text.toolbox": ("SearchSettings",),
    ".core.workflow": ("Node", "Workflow"),
    ".core.world": ("World", "get_task", "get_world", "load_tasks"),
    ".envs.planner.env": ("ResiliBenchEnv",),
    ".envs.planner.vector": ("ResiliBenchVectorEnv",),
    ".envs.real_api.live_apis": ("RealApi",),
    ".envs.text.env": ("ResiliBenchTextEnv",),
    ".envs.workflowgen.env": ("WorkflowGenEnv",),
})
