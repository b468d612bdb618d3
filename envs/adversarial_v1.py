"""``adversarial_v1`` (PettingZoo): the flaw injector against the executor, played on world v1 (its task
library and grading); the game is ``resilibench.envs.adversarial.game``.

```python
from resilibench.envs import adversarial_v1

game = adversarial_v1.parallel_env(split="test")
```
"""

from .adversarial.game import ADVERSARY, EXECUTOR, NO_FLAW, AdversarialParallelEnv, versioned

raw_env, env, parallel_env = versioned("v1")

__all__ = ["ADVERSARY", "EXECUTOR", "NO_FLAW", "AdversarialParallelEnv", "env", "parallel_env", "raw_env"]
