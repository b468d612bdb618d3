"""``adversarial_v1`` (PettingZoo): the adversarial game (``resilibench.envs.adversarial.game``) on world v1,
the default."""

from .adversarial.game import ADVERSARY, EXECUTOR, NO_FLAW, AdversarialParallelEnv, versioned

__all__ = ["ADVERSARY", "EXECUTOR", "NO_FLAW", "AdversarialParallelEnv", "env", "parallel_env", "raw_env"]

raw_env, env, parallel_env = versioned("v1")
