"""RLlib PPO planners for ResiliBench-v1 (new API stack).

* ``wrappers``: ``MaskedPlannerEnv`` (the action mask inside a Dict observation) and ``episode_observation``.
* ``module``: ``PlannerModule``, the masked policy network (tool-set Transformer or MLP).
* ``curriculum``: the five stages of paper D.4.2 / Table 12; ``callbacks``: the RLlib callback running it.
* ``training``: ``PPOTrainConfig`` (every hyperparameter) and ``train`` (checkpoints, resume).
* ``evaluation``: ``PPOPlanner`` (a checkpoint as a ``Planner``), workflow export and exact success.

This package needs the ``rl`` extra (ray[rllib], torch) for everything but the wrappers and the
curriculum logic; ``require_rl`` says so when they are missing. ``PPOTrainConfig``, ``train``,
``PPOPlanner``, ``policy_workflow`` and ``MaskedPlannerEnv`` import from here, each on first use.
"""

from __future__ import annotations

__all__ = [
    "CHECKPOINTS", "DEFAULT_MODEL_CONFIG", "ENCODERS", "LATEST", "MaskedPlannerEnv", "PPOPlanner", "PPOTrainConfig",
    "latest_checkpoint", "policy_workflow", "quiet_logs", "require_rl", "train",
]

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .evaluation import PPOPlanner, policy_workflow
    from .training import PPOTrainConfig, train
    from .wrappers import MaskedPlannerEnv


ENCODERS = ("pooled", "transformer", "mlp")
CHECKPOINTS, LATEST = "checkpoints", "latest.json"  # a training directory's checkpoints and its pointer
# The policy network's settings (``PlannerModule``'s model_config); PPOTrainConfig carries the same fields.
DEFAULT_MODEL_CONFIG: dict[str, Any] = {
    "encoder": "pooled",
    "d_model": 16,  # token width (pooled, transformer)
    "n_heads": 2,  # transformer attention heads
    "n_layers": 1,
    "ff_dim": 32,
    "mlp_hiddens": [256, 256],  # mlp trunk
    "value_hiddens": [64],  # value head (both encoders)
    "features": "full",  # the env's observation features; "no_dependency_hints" also drops the relational ones
}


def latest_checkpoint(directory: str | Path) -> Path | None:
    """The newest checkpoint of a training output directory (None when there is none)."""
    pointer = Path(directory) / CHECKPOINTS / LATEST
    if not pointer.is_file():
        return None
    path = Path(directory) / CHECKPOINTS / json.loads(pointer.read_text())["checkpoint"]
    return path if path.is_dir() else None


def require_rl() -> None:
    """Fail with a message naming the extra when ray[rllib] or torch is missing."""
    try:
        import ray.rllib  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"PPO planners need the rl extra: pip install 'resilibench[rl]' ({exc})") from None


def quiet_logs() -> None:
    """Keep RLlib's and Tune's notices (new API stack, deprecations inside RLlib, setup times, gputil) off
    the console. ``module`` calls it on import, so every Ray process that builds the policy is quiet."""
    for name in ("ray.rllib", "ray.tune", "ray._common.deprecation"):
        logging.getLogger(name).setLevel(logging.ERROR)


__getattr__, __dir__ = lazy_exports(__name__, {
    ".evaluation": ("PPOPlanner", "policy_workflow"),
    ".training": ("PPOTrainConfig", "train"),
    ".wrappers": ("MaskedPlannerEnv",),
})
