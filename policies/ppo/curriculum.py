"""The five-stage training curriculum (paper appendix D.4.2 and its Table 12).

Stages select the tasks an env samples (by complexity: easy first, then medium, then all) and set how
strict an episode must be to count as a success of the stage (Table 12: minimum in-order progress,
maximum failed calls, minimum coverage). The stage advances when the success rate over the last
episodes played in the stage exceeds 0.7 and at least 50 episodes were played; it falls back when the
rate drops below 0.3 (over at least 50 episodes too, so a fresh stage is not judged on a handful).

The reward is the env's (sparse or shaped) at every stage: the curriculum changes what is practised,
not what is rewarded. This module is pure logic; ``resilibench.policies.ppo.callbacks`` runs it inside
RLlib.
"""

from __future__ import annotations

__all__ = [
    "Stage", "STAGES", "CurriculumConfig", "stage_success", "next_stage", "stage_pools", "CurriculumTracker",
]

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from resilibench.settings import AT_LEAST_ONE, UNIT, Settings, setting

from ...core.tasks.library import Task


@dataclass(frozen=True)
class Stage:
    """One row of Table 12 plus the task complexities the stage trains on."""

    complexities: tuple[str, ...]
    min_progress: float  # share of required tools succeeded in required order
    max_errors: int  # failed calls in the episode
    required_coverage: float  # share of required tools succeeded


STAGES: tuple[Stage, ...] = (
    Stage(("easy",), 0.1, 50, 0.2),
    Stage(("easy", "medium"), 0.3, 30, 0.4),
    Stage(("easy", "medium", "hard"), 0.5, 20, 0.7),
    Stage(("easy", "medium", "hard"), 0.7, 15, 0.9),
    Stage(("easy", "medium", "hard"), 0.7, 10, 1.0),
)


@dataclass(frozen=True)
class CurriculumConfig(Settings):
    """Stage transitions of D.4.2: advance above ``advance`` after ``min_episodes``, regress below ``regress``."""

    advance: float = setting(0.7, bounds=UNIT, help="success rate above which the stage advances")
    regress: float = setting(0.3, bounds=UNIT, help="success rate below which the stage falls back")
    min_episodes: int = setting(50, bounds=AT_LEAST_ONE, help="episodes of a stage before it is judged")
    window: int = setting(200, bounds=AT_LEAST_ONE, help="the success rate is over at most the last "
                          "``window`` episodes of the stage")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0.0 <= self.regress < self.advance <= 1.0:
            raise ValueError(f"need 0 <= regress < advance <= 1, got regress={self.regress}, advance={self.advance}")
        if self.min_episodes < 1 or self.window < self.min_episodes:
            raise ValueError(f"need 1 <= min_episodes <= window, got {self.min_episodes} and {self.window}")


def stage_success(stage: int, progress: float, coverage: float, errors: int) -> bool:
    """Whether an episode counts as a success at ``stage`` (Table 12's thresholds)."""
    s = STAGES[stage]
    return progress >= s.min_progress and coverage >= s.required_coverage and errors <= s.max_errors


def next_stage(stage: int, successes: int, episodes: int, config: CurriculumConfig = CurriculumConfig()) -> int:
    """The stage after an update event, given the successes among the last ``episodes`` of ``stage``."""
    if episodes < config.min_episodes:
        return stage
    rate = successes / episodes
    if rate > config.advance:
        return min(stage + 1, len(STAGES) - 1)
    if rate < config.regress:
        return max(stage - 1, 0)
    return stage


def stage_pools(tasks: Sequence[Task]) -> list[list[Task]]:
    """The task pool of each stage; a stage whose complexities select nothing trains on all ``tasks``."""
    pools = []
    for stage in STAGES:
        pool = [t for t in tasks if t.complexity in stage.complexities]
        pools.append(pool or list(tasks))
    return pools


class CurriculumTracker:
    """The curriculum's state: the stage and the outcomes (stage successes) of its recent episodes."""

    def __init__(self, stage: int = 0, config: CurriculumConfig = CurriculumConfig()):
        if not 0 <= stage < len(STAGES):
            raise ValueError(f"stage must be in [0, {len(STAGES)}), got {stage}")
        self.config = config
        self.stage = stage
        self.outcomes: deque[bool] = deque(maxlen=config.window)

    def record(self, stage: int, success: bool) -> None:
        """One finished episode that was started under ``stage`` (episodes of other stages are ignored)."""
        if stage == self.stage:
            self.outcomes.append(bool(success))

    @property
    def rate(self) -> float | None:
        return sum(self.outcomes) / len(self.outcomes) if self.outcomes else None

    def update(self) -> bool:
        """Apply the transition rule; True when the stage changed (its outcome window then restarts)."""
        new = next_stage(self.stage, sum(self.outcomes), len(self.outcomes), self.config)
        if new == self.stage:
            return False
        self.stage = new
        self.outcomes.clear()
        return True
