"""The adversarial game (PettingZoo): a flaw injector against an executor; ``resilibench.envs.adversarial_v1``
and ``adversarial_v0`` are its versions. Names are imported on first use."""

__all__ = ["ADVERSARY", "EXECUTOR", "NO_FLAW", "AdversarialParallelEnv", "env", "parallel_env", "raw_env"]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

if TYPE_CHECKING:
    from .game import ADVERSARY, EXECUTOR, NO_FLAW, AdversarialParallelEnv, env, parallel_env, raw_env


__getattr__, __dir__ = lazy_exports(__name__, {
    ".game": ("ADVERSARY", "EXECUTOR", "NO_FLAW", "AdversarialParallelEnv", "env", "parallel_env", "raw_env"),
})
