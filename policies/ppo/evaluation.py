"""Trained PPO policies as planners: greedy evaluation, exact success, and workflow export.

``PPOPlanner(checkpoint)`` loads the RLModule of a training checkpoint (no Ray cluster needed) and acts
greedily (argmax of the masked logits), so it runs through ``resilibench.policies.runner`` like every
other planner and its exact full-success probability comes from ``core.bounds.exact_policy_success``.
``policy_workflow`` rolls the policy out on the happy path (every call succeeds) and returns the
``Workflow`` it follows; ``compare_workflows`` sets it beside ``reference_workflow`` (the bound-(iii)
policy's) for a list of tasks.
"""

from __future__ import annotations

__all__ = [
    "MODULE_PATH", "CHECKPOINT_MARKER", "resolve_checkpoint", "checkpoint_digest", "load_module",
    "PPOPlanner", "policy_workflow", "policy_key", "compare_workflows", "registered_planner",
]

import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.bounds import path_workflow
from ...core.config import WorldConfig
from ...core.simulator import Episode
from ...core.tasks.library import Task
from ...core.workflow import Workflow
from ...envs.planner.observation import ObservationLayout, initial_observation
from . import CHECKPOINTS, latest_checkpoint, quiet_logs, require_rl
from .wrappers import episode_observation

if TYPE_CHECKING:
    from .module import PlannerModule

MEMO_LIMIT = 1_000_000  # decisions a PPOPlanner memoises
MODULE_PATH = Path("learner_group") / "learner" / "rl_module" / "default_policy"
CHECKPOINT_MARKER = "rllib_checkpoint.json"


def resolve_checkpoint(path: str | Path) -> Path:
    """A checkpoint directory, given it or a training output directory (then its newest checkpoint)."""
    path = Path(path)
    if (path / CHECKPOINT_MARKER).is_file():
        return path
    if (path / CHECKPOINTS).is_dir():
        latest = latest_checkpoint(path)
        if latest is not None:
            return latest
    raise ValueError(f"{path} is neither an RLlib checkpoint (no {CHECKPOINT_MARKER}) nor a training output "
                     f"directory with checkpoints (make one with `resilibench train ppo --output-dir DIR`)")


def checkpoint_digest(checkpoint: Path) -> str:
    """sha256 of the policy's weights file: identifies the policy in results metadata."""
    return hashlib.sha256((checkpoint / MODULE_PATH / "module_state.pkl").read_bytes()).hexdigest()


def load_module(checkpoint: str | Path) -> PlannerModule:
    """The trained ``PlannerModule`` of a checkpoint, in eval mode on the CPU."""
    require_rl()
    from ray.rllib.core.rl_module.rl_module import RLModule

    from .module import PlannerModule

    quiet_logs()
    path = resolve_checkpoint(checkpoint) / MODULE_PATH
    if not path.is_dir():
        raise ValueError(f"{path.parent.parent.parent.parent} has no policy module at {MODULE_PATH}")
    module = RLModule.from_checkpoint(str(path.resolve()))
    if not isinstance(module, PlannerModule):
        raise ValueError(f"{path} holds a {type(module).__name__}, not a PlannerModule")
    module.eval()
    return module


class PPOPlanner:
    """A trained policy as a ``Planner``: the greedy (argmax) action of the masked policy logits.

    It reads only the observation and the legal actions; decisions are memoised per (observation, mask),
    as the policy is deterministic. The observation is recomputed from the episode when none is given or
    when the policy was trained on other observation features than the env's "full" ones (the module's
    ``model_config["features"]``). ``act_batch`` decides many episodes with one network call (the exact
    enumeration's frontiers); the network runs on one torch thread (small batches: more threads only
    contend)."""

    name = "ppo"

    def __init__(self, checkpoint: str | Path, module: Any | None = None):
        self.checkpoint = resolve_checkpoint(checkpoint) if module is None else Path(checkpoint)
        self.module = module if module is not None else load_module(self.checkpoint)
        self.n_actions = int(self.module.action_space.n)
        self.layout = getattr(self.module, "layout", None) or ObservationLayout(self.n_actions - 1)
        self.features = (getattr(self.module, "model_config", None) or {}).get("features", "full")
        self._memo: dict[bytes, int] = {}
        self._start: tuple[Task, np.ndarray] | None = None  # a task's first observation, reused

    def reset(self, task: Task, rng: np.random.Generator) -> None:
        """Nothing to prepare: the policy sees the task through the observation."""

    def act(self, episode: Episode, observation: np.ndarray | None) -> int:
        return self._decide([episode], [observation])[0]

    def act_batch(self, episodes: Sequence[Episode]) -> list[int]:
        """The actions of several running episodes (observations from the episodes), one network call
        for those not memoised."""
        return self._decide(episodes, [None] * len(episodes))

    def _decide(self, episodes: Sequence[Episode], observations: Sequence[np.ndarray | None]) -> list[int]:
        keys, pending = [], {}
        for episode, obs in zip(episodes, observations, strict=True):
            if obs is None or self.features != "full":
                obs = self._observation(episode)
            mask = episode.action_mask
            key = obs.tobytes() + mask.tobytes()
            keys.append(key)
            if key not in self._memo and key not in pending:
                pending[key] = (obs, mask)
        decided: dict[bytes, int] = {}
        if pending:
            obs_batch, mask_batch = zip(*pending.values(), strict=True)
            decided = dict(zip(pending, self.actions(np.stack(obs_batch), np.stack(mask_batch)), strict=True))
            if len(self._memo) < MEMO_LIMIT:
                self._memo.update(decided)
        return [decided[key] if key in decided else self._memo[key] for key in keys]

    def _observation(self, episode: Episode) -> np.ndarray:
        if self._start is None or self._start[0] is not episode.task:
            self._start = (episode.task, initial_observation(episode.task, episode.registry, self.layout,
                                                             self.features))
        return episode_observation(episode, self.layout, self.features, start=self._start[1])

    def actions(self, observations: np.ndarray, masks: np.ndarray) -> list[int]:
        """Greedy actions for a batch of flat observations and action masks."""
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                out = self.module.greedy_actions(torch.as_tensor(observations, dtype=torch.float32),
                                                 torch.as_tensor(masks, dtype=torch.float32))
        finally:
            torch.set_num_threads(threads)
        return [int(a) for a in out]


def policy_workflow(planner: Any, task: Task, config: WorldConfig | None = None) -> Workflow:
    """The workflow ``planner`` follows on the happy path: every call succeeds (in strict mode, a call
    with an unmet dependency still fails without a draw); the tools that succeeded, in call order."""
    episode = Episode.start(task, 0, config or WorldConfig())
    episode.stream = np.zeros_like(episode.stream)  # every draw 0: success whenever p > 0
    finish = len(episode.registry)
    planner.reset(task, np.random.default_rng(0))
    while not episode.done and episode.turns_left > 0:
        action = planner.act(episode, None)
        if action == finish:
            break
        episode.call(action)
    registry = episode.registry
    tools = [registry.id_of(r.tool) for r in episode.trace if r.success and not r.replayed]
    return path_workflow(task, tools, registry)


def policy_key(task: Task) -> tuple:
    """What a policy that reads only observations sees of a task, plus what drives its episodes: tasks
    with equal keys get identical behaviour (same actions, same exact success)."""
    from ...core.registry import default_registry
    from ...envs.planner.observation import initial_observation

    registry = default_registry()
    first = initial_observation(task, registry, ObservationLayout(len(registry)))
    return first.tobytes(), task.required_ids(registry), task.max_retries


def compare_workflows(planner: Any, tasks: Sequence[Task], config: WorldConfig | None = None,
                      exact: bool = True, on_task: Callable[[], object] | None = None) -> dict[str, Any]:
    """Per task: the policy's happy-path workflow, the reference (bound-(iii)) workflow, whether they
    coincide (equal canonical keys), bound (iii) and, with ``exact``, the policy's exact full-success
    probability and the gap; plus a summary (match rate, mean success gap) over ``tasks`` and per task
    type. ``on_task`` is called after each task (progress bars)."""
    from ...core.bounds import exact_policy_success, optimal_success, reference_workflow

    config = config or WorldConfig()
    rows = []
    seen: dict[tuple, tuple[Workflow, float | None]] = {}
    for task in tasks:
        # Tasks with the same first observation and dynamics get the same actions: evaluate them once.
        key = policy_key(task)
        if key not in seen:
            seen[key] = (policy_workflow(planner, task, config),
                         exact_policy_success(planner, task, config) if exact else None)
        mine, success = seen[key]
        reference = reference_workflow(task, config)
        row: dict[str, Any] = {
            "task_id": task.instance_id, "task_type": task.task_type,
            "match": mine.canonical_key() == reference.canonical_key(),
            "policy_workflow": mine.to_dict(), "reference_workflow": reference.to_dict(),
            "policy_tools": list(mine.tools), "reference_tools": list(reference.tools),
            "bound_iii": optimal_success(task, config),
        }
        if exact:
            row["policy_success"] = success
            row["success_gap"] = row["bound_iii"] - success
        rows.append(row)
        if on_task is not None:
            on_task()
    summary = _workflow_summary(rows)
    by_type = {}
    for name in dict.fromkeys(r["task_type"] for r in rows):
        by_type[name] = _workflow_summary([r for r in rows if r["task_type"] == name])
    return {"tasks": rows, "summary": {"all": summary, **by_type}}


def _workflow_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    out: dict[str, Any] = {"tasks": n, "match_rate": sum(r["match"] for r in rows) / n if n else None,
                           "bound_iii": sum(r["bound_iii"] for r in rows) / n if n else None}
    if n and "policy_success" in rows[0]:
        out["policy_success"] = sum(r["policy_success"] for r in rows) / n
        out["success_gap"] = out["bound_iii"] - out["policy_success"]
        out["policy_over_bound_iii"] = out["policy_success"] / out["bound_iii"] if out["bound_iii"] else None
    return out


@contextmanager
def registered_planner(planner: Any) -> Iterator[None]:
    """Make ``policies.runner.make_planner(planner.name)`` return ``planner`` while the block runs, so the
    runner (and ``resilibench run``'s results machinery) can play a planner built from a checkpoint."""
    from .. import heuristics

    table = heuristics.HEURISTICS
    previous = table.get(planner.name)
    table[planner.name] = lambda: planner
    try:
        yield
    finally:
        if previous is None:
            del table[planner.name]
        else:
            table[planner.name] = previous
