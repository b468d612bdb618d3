"""Gymnasium registration of the ResiliBench environments.

Each id's version suffix is its world: ``-v1`` (the default world: the v1 task library and grading) and
``-v0`` (the first library and grading, kept so that earlier figures can be reproduced).
"""

__all__ = ["register_envs"]

import gymnasium as gym

from ..core.world import WORLDS


def register_envs() -> None:
    """Register every ResiliBench env id with Gymnasium (idempotent)."""
    for world in WORLDS:
        if f"ResiliBench-{world}" not in gym.registry:
            gym.register(
                id=f"ResiliBench-{world}",
                entry_point="resilibench.envs.planner.env:ResiliBenchEnv",
                vector_entry_point="resilibench.envs.planner.vector:ResiliBenchVectorEnv",
                kwargs={"world": world},
            )
        if f"ResiliBenchText-{world}" not in gym.registry:
            gym.register(id=f"ResiliBenchText-{world}", entry_point="resilibench.envs.text.env:ResiliBenchTextEnv",
                         kwargs={"world": world})
        if f"WorkflowGen-{world}" not in gym.registry:
            gym.register(id=f"WorkflowGen-{world}", entry_point="resilibench.envs.workflowgen.env:WorkflowGenEnv",
                         kwargs={"world": world})
