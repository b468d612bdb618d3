"""Gymnasium registration of the ResiliBench environments.

Each id's version suffix is its world: ``-v1`` (the default world: the v1 task library and grading) and
``-v0`` (the first library and grading, kept so that earlier figures can be reproduced).
"""

import gymnasium as gym

WORLD_IDS = {"v0": "v0", "v1": "v1"}  # env id suffix -> world


def register_envs() -> None:
    """Register every ResiliBench env id with Gymnasium (idempotent)."""
    for suffix, world in WORLD_IDS.items():
        if f"ResiliBench-{suffix}" not in gym.registry:
            gym.register(
                id=f"ResiliBench-{suffix}",
                entry_point="resilibench.envs.planner_env:ResiliBenchEnv",
                vector_entry_point="resilibench.envs.planner_vector_env:ResiliBenchVectorEnv",
                kwargs={"world": world},
            )
        if f"ResiliBenchText-{suffix}" not in gym.registry:
            gym.register(id=f"ResiliBenchText-{suffix}", entry_point="resilibench.envs.text_env:ResiliBenchTextEnv",
                         kwargs={"world": world})
        if f"WorkflowGen-{suffix}" not in gym.registry:
            gym.register(id=f"WorkflowGen-{suffix}", entry_point="resilibench.envs.workflowgen_env:WorkflowGenEnv",
                         kwargs={"world": world})
