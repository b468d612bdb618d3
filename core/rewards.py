"""Rewards of the planner env: ``sparse`` (1 on full success) and ``shaped`` (paper D.3, two phases).

The shaped reward switches from the coverage phase to the sequence phase once the running full-success
rate over the last ``success_rate_window`` episodes reaches ``adapt_threshold``; ``phase`` can pin it.
"""

from __future__ import annotations

__all__ = ["REWARD_MODES", "PHASES", "ShapedRewarder"]

from collections import deque

from .config import ShapedReward
from .evaluator import Evaluation
from .simulator import CallRecord, Episode

REWARD_MODES = ("sparse", "shaped")
PHASES = ("adaptive", "coverage", "sequence")


class ShapedRewarder:
    """Per-env state of the shaped reward: the running success rate that selects the phase."""

    def __init__(self, config: ShapedReward, phase: str = "adaptive"):
        if phase not in PHASES:
            raise ValueError(f"reward phase must be one of {PHASES}, got {phase!r}")
        self.config = config
        self.pinned_phase = phase
        self.recent: deque[bool] = deque(maxlen=config.success_rate_window)

    @property
    def success_rate(self) -> float:
        return sum(self.recent) / len(self.recent) if self.recent else 0.0

    @property
    def phase(self) -> str:
        if self.pinned_phase != "adaptive":
            return self.pinned_phase
        return "coverage" if self.success_rate < self.config.adapt_threshold else "sequence"

    def _error_penalty(self) -> float:
        rate = self.success_rate
        for upper, penalty in self.config.error_penalty_by_success_rate:
            if rate < upper:
                return penalty
        return self.config.error_penalty_by_success_rate[-1][1]

    def step_reward(self, episode: Episode, record: CallRecord, progress_before: float, prefix_before: int) -> float:
        """Reward of one tool call, given progress and in-order prefix before it."""
        c = self.config
        tool = episode.registry.id_of(record.tool)
        n_calls = episode.calls[tool]
        reward = c.attempt + (c.novel if n_calls == 1 and not record.replayed else 0.0)
        completion = c.progress * (episode.progress - progress_before) + c.milestone * (
            episode.next_required - prefix_before
        )
        position = episode.required_position.get(tool)
        first_success = record.success and not record.replayed
        if self.phase == "coverage":
            if first_success and position is not None:
                reward += c.required_success
            repetition = c.repetition_coverage
        else:
            if first_success and position is not None:
                reward += c.order_correct if position == prefix_before else c.order_misplaced * abs(
                    position - prefix_before)
            repetition = c.repetition_sequence
        reward += completion
        if not record.success:
            reward += self._error_penalty()
        if n_calls >= 2:
            reward -= repetition * (n_calls - 1)
        return reward * c.scale

    def terminal_reward(self, episode: Episode, evaluation: Evaluation) -> float:
        """Reward at episode end; also records the outcome for the running success rate."""
        c = self.config
        if evaluation.level == "full_success":
            if self.phase == "coverage":
                reward = c.terminal_coverage[0] + c.terminal_coverage[1] * evaluation.coverage
            else:
                in_order = episode.next_required / max(len(episode.required), 1)
                limit = episode.config.rules.turn_limit
                reward = (c.terminal_sequence[0] + c.terminal_sequence[1] * in_order
                          + c.step_efficiency * max(0, limit - episode.turns_used) / limit
                          + (c.error_free if episode.n_failures == 0 else 0.0))
        else:
            reward = max(0.0, c.terminal_failure * episode.progress)
        self.recent.append(evaluation.level == "full_success")
        return reward * c.scale
