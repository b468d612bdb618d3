"""ResiliBench: seeded environments for tool use under failure.

Importing the package registers the Gymnasium environments (``ResiliBench-v1`` and the other ids of both
worlds).
"""

from pathlib import Path

# pyproject.toml maps resilibench.envs, .agents, ... to folders beside this one. An installed package (wheel, or
# the strict editable install's link tree) holds them inside; a checkout imported directly (its root first on
# sys.path, as with `python -m pytest` or `python -m resilibench` run there) finds them beside.
_CHECKOUT = Path(__file__).parent.parent
if not (Path(__file__).parent / "envs").is_dir() and (_CHECKOUT / "pyproject.toml").is_file():
    __path__.append(str(_CHECKOUT))

from resilibench.envs.registration import register_envs  # noqa: E402
from resilibench.version import __version__  # noqa: E402

register_envs()

__all__ = ["__version__", "register_envs"]
