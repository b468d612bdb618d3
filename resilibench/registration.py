"""Gymnasium registration of the ResiliBench environments."""

import gymnasium as gym


def register_envs() -> None:
    """Register every ResiliBench env id with Gymnasium (idempotent)."""
    if "ResiliBench-v0" not in gym.registry:
        gym.register(
            id="ResiliBench-v0",
            entry_point="resilibench.envs.planner_env:ResiliBenchEnv",
            vector_entry_point="resilibench.envs.planner_vector_env:ResiliBenchVectorEnv",
        )
    if "ResiliBenchText-v0" not in gym.registry:
        gym.register(id="ResiliBenchText-v0", entry_point="resilibench.envs.text_env:ResiliBenchTextEnv")
    if "WorkflowGen-v0" not in gym.registry:
        gym.register(id="WorkflowGen-v0", entry_point="resilibench.envs.workflowgen_env:WorkflowGenEnv")
