"""``adversarial_v1`` (PettingZoo): the flaw injector against the executor of ``adversarial_v0``, played on
world v1 (its task library and grading). The game, its spaces and its rules are ``adversarial_v0``'s.

```python
from resilibench.envs import adversarial_v1

game = adversarial_v1.parallel_env(split="test")
```
"""

from __future__ import annotations

from pettingzoo import AECEnv

from resilibench.envs import adversarial_v0
from resilibench.envs.adversarial_v0 import ADVERSARY, EXECUTOR, NO_FLAW, AdversarialParallelEnv

WORLD = "v1"


def raw_env(**kwargs) -> adversarial_v0.raw_env:
    """The AEC env without wrappers, in world v1 unless ``world`` is given."""
    return adversarial_v0.raw_env(**{"world": WORLD, **kwargs})


def env(**kwargs) -> AECEnv:
    """The AEC env with PettingZoo's standard checks, in world v1 unless ``world`` is given."""
    return adversarial_v0.env(**{"world": WORLD, **kwargs})


def parallel_env(**kwargs) -> AdversarialParallelEnv:
    """The native parallel env, in world v1 unless ``world`` is given."""
    return adversarial_v0.parallel_env(**{"world": WORLD, **kwargs})


__all__ = ["ADVERSARY", "EXECUTOR", "NO_FLAW", "AdversarialParallelEnv", "env", "parallel_env", "raw_env"]
