"""ResiliBench: seeded environments for tool use under failure.

Importing the package registers the Gymnasium environments (``ResiliBench-v0``).
"""

from resilibench.registration import register_envs

__version__ = "0.1.0"

register_envs()

__all__ = ["__version__", "register_envs"]
