"""Upper bounds on success (docs/core/bounds.md): bound (iii) by two exact DPs behind one interface, bound (ii).

* ``base``: the problem, the state and the interface of a bound of one problem (``ExactBound``);
* ``plain``: the DP of a world without failure processes (``PlainBound``), and bound (ii);
* ``processes``: the DP of a world with failure processes (``ProcessBound``);
* ``api``: the bound of a task, chosen between the two (``exact_bound``), and what is derived from it;
* ``policy_success``: a planner's full-success probability, exact or by Monte Carlo.
"""

__all__ = [
    "FILLER",
    "ExactBound",
    "PlainBound",
    "Problem",
    "ProcessBound",
    "State",
    "bound_of",
    "branch_episode",
    "call_branches",
    "clairvoyant_success",
    "episode_state",
    "exact_bound",
    "exact_policy_success",
    "largest_turn_limit",
    "monte_carlo_success",
    "optimal_success",
    "path_workflow",
    "play_episode",
    "process_problem",
    "reference_workflow",
    "task_problem",
    "varied_tasks",
]

from typing import TYPE_CHECKING

from resilibench.lazy import lazy_exports

from .api import (
    bound_of,
    clairvoyant_success,
    exact_bound,
    optimal_success,
    path_workflow,
    reference_workflow,
    task_problem,
    varied_tasks,
)
from .base import FILLER, ExactBound, Problem, State, largest_turn_limit
from .plain import PlainBound
from .policy_success import (
    branch_episode,
    call_branches,
    episode_state,
    exact_policy_success,
    monte_carlo_success,
    play_episode,
)

if TYPE_CHECKING:
    from .processes import ProcessBound, process_problem

# The process DP compiles with numba (which imports scipy): imported on first use.
__getattr__, __dir__ = lazy_exports(__name__, {".processes": ("ProcessBound", "process_problem")})

