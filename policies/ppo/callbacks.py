"""RLlib callbacks of PPO training: episode metrics and the curriculum (``resilibench.policies.ppo.curriculum``).

On the env runners, ``on_episode_end`` logs each finished episode: a count, whether it ended in full
success, and (with the curriculum on) its stage outcome. On the algorithm, ``on_train_result`` adds
``result["resilibench"]`` (episodes, full-success rate, stage and stage success rate of the iteration) and,
with the curriculum on, applies the stage transition rule and moves every env runner's envs to the new
stage. The curriculum is configured through ``env_config``: ``curriculum`` (bool), ``stage`` (the
starting stage) and ``curriculum_config`` (``CurriculumConfig`` fields).
"""

from __future__ import annotations

__all__ = ["METRICS", "EPISODES", "FULL_SUCCESS", "OUTCOMES", "set_env_runner_stage", "TrainingCallbacks"]

from typing import Any

from ray.rllib.callbacks.callbacks import RLlibCallback

from .curriculum import CurriculumConfig, CurriculumTracker, stage_success

METRICS = "resilibench"
EPISODES, FULL_SUCCESS, OUTCOMES = "episodes", "full_success", "curriculum_outcomes"


def set_env_runner_stage(env_runner: Any, stage: int) -> None:
    """Move the envs of one env runner to curriculum ``stage`` (from their next episode on)."""
    if getattr(env_runner, "env", None) is not None:
        env_runner.env.unwrapped.call("set_stage", stage)


class TrainingCallbacks(RLlibCallback):
    """Episode metrics for the progress line, and the curriculum (when ``env_config["curriculum"]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.tracker: CurriculumTracker | None = None

    # --- env runners ---------------------------------------------------------------------------------

    def on_episode_end(self, *, episode, metrics_logger=None, **kwargs) -> None:
        info = episode.get_infos(-1)
        if metrics_logger is None or "level" not in info:
            return
        metrics_logger.log_value((METRICS, EPISODES), 1, reduce="sum")
        metrics_logger.log_value((METRICS, FULL_SUCCESS), float(info["level"] == "full_success"), reduce="sum")
        stage = info["stage"]
        if stage >= 0:
            success = stage_success(stage, info["progress"], info["coverage"], info["errors"])
            metrics_logger.log_value((METRICS, OUTCOMES), 2 * stage + int(success), reduce="item_series")

    # --- algorithm -----------------------------------------------------------------------------------

    def on_algorithm_init(self, *, algorithm, metrics_logger=None, **kwargs) -> None:
        assert algorithm.config is not None  # an initialised algorithm has its config
        env_config = algorithm.config.env_config
        if env_config.get("curriculum"):
            self.tracker = CurriculumTracker(int(env_config.get("stage", 0)),
                                             CurriculumConfig(**env_config.get("curriculum_config", {})))

    def on_train_result(self, *, algorithm, metrics_logger=None, result: dict, **kwargs) -> None:
        mine = result.get("env_runners", {}).get(METRICS, {})
        episodes = int(mine.get(EPISODES, 0))
        summary: dict[str, Any] = {
            "episodes": episodes,
            "full_success": mine.get(FULL_SUCCESS, 0.0) / episodes if episodes else None,
            "stage": -1,
        }
        tracker = self.tracker
        if tracker is not None:
            for code in _items(mine.get(OUTCOMES)):
                tracker.record(int(code) // 2, bool(int(code) % 2))
            summary["stage_success"] = tracker.rate
            if tracker.update():
                stage = tracker.stage
                assert algorithm.env_runner_group is not None  # PPO samples with env runners
                algorithm.env_runner_group.foreach_env_runner(lambda runner: set_env_runner_stage(runner, stage),
                                                              local_env_runner=True)
            summary["stage"] = tracker.stage
        result[METRICS] = summary


def _items(value: Any) -> list[Any]:
    """The items of an ``item_series`` metric (a list, or one item when a single one was logged)."""
    if value is None:
        return []
    return list(value) if isinstance(value, list | tuple) else [value]
