"""Behaviour cloning from the exact optimal policy (the warm start of PPO) and held-out validation.

``expert_samples`` plays ``OptimalPlanner`` (bound (iii)'s policy) on training tasks and records, per
decision, the observation a policy sees, the legal actions, the expert's action and the discounted return
that followed (1 at full success, else 0). ``behaviour_clone`` fits a ``PlannerModule`` to them: cross
entropy of the masked logits against the expert's action, plus the value head's squared error against the
return, so PPO starts from the expert's policy and a value function that already fits it.

``Validation`` measures a module's greedy policy on held-out tasks by its exact full-success probability
(``core.bounds.exact_policy_success``) or, where enumerating a policy's states is intractable, by its Monte
Carlo estimate (``core.bounds.monte_carlo_success``, the same episodes for every policy and the heuristic),
beside bound (iii) (exact) and the process-aware heuristic on the same tasks; ``plot_learning_curve`` draws
the measurements against minutes of training.
"""

from __future__ import annotations

__all__ = ["WARM_STARTS", "expert_samples", "build_module", "behaviour_clone", "Validation", "plot_learning_curve"]

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.bounds import exact_policy_success, monte_carlo_success, optimal_success
from ...core.config import WorldConfig
from ...core.planner import Planner
from ...core.simulator import Episode, task_seed
from ...core.tasks.library import Task, interleave_task_types
from ...envs.planner.observation import ObservationLayout
from ..heuristics import ProcessAwarePlanner
from ..optimal import OptimalPlanner
from .wrappers import ACTION_MASK, OBSERVATIONS, episode_observation

if TYPE_CHECKING:
    from .module import PlannerModule

WARM_STARTS = ("auto", "none", "bc")  # auto: bc in worlds with failure processes, none otherwise


def expert_samples(tasks: Sequence[Task], seeds: int, config: WorldConfig, features: str = "full",
                   gamma: float = 0.99) -> dict[str, np.ndarray]:
    """The optimal policy's decisions on ``seeds`` episodes of each task: arrays ``obs``, ``mask``,
    ``action`` and ``ret`` (the discounted sparse return from that decision on)."""
    obs, masks, actions, returns = [], [], [], []
    for task in tasks:
        expert = OptimalPlanner(config)
        expert.reset(task, None)
        for seed in range(seeds):
            episode = Episode.start(task, task_seed(task.instance_id, seed), config)
            layout = ObservationLayout(len(episode.registry), episode.processes_on)
            start = len(actions)
            while not episode.done:
                action = expert.act(episode, None)
                obs.append(episode_observation(episode, layout, features))
                masks.append(episode.action_mask.astype(np.float32))
                actions.append(action)
                if action == len(episode.registry):
                    episode.finish()
                elif episode.turns_left == 0:
                    episode.end_out_of_turns()
                else:
                    episode.call(action)
            assert episode.evaluation is not None  # played to its end
            full = float(episode.evaluation.level == "full_success")
            steps = len(actions) - start
            returns += [full * gamma ** (steps - 1 - k) for k in range(steps)]
    return {"obs": np.asarray(obs, np.float32), "mask": np.asarray(masks, np.float32),
            "action": np.asarray(actions, np.int64), "ret": np.asarray(returns, np.float32)}


def build_module(model_config: dict[str, Any], env_config: dict[str, Any]) -> PlannerModule:
    """A fresh ``PlannerModule`` for the envs of ``env_config`` (``wrappers.make_env``'s)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from .module import PlannerModule
    from .wrappers import make_env

    env = make_env({**env_config, "curriculum": False, "stage": -1})
    module = RLModuleSpec(module_class=PlannerModule, observation_space=env.observation_space,
                          action_space=env.action_space, model_config=model_config).build()
    env.close()
    assert isinstance(module, PlannerModule)
    return module


def behaviour_clone(module: PlannerModule, samples: dict[str, np.ndarray], epochs: int, lr: float = 1e-3,
                    batch_size: int = 256, seed: int = 0) -> float:
    """Fit ``module`` to the expert's actions (cross entropy) and returns (value head, squared error) for
    ``epochs`` passes in shuffled minibatches; returns the share of samples whose greedy action is the
    expert's after training."""
    import torch
    from ray.rllib.core.columns import Columns
    from torch.nn import functional as F

    torch.manual_seed(seed)
    data = {k: torch.as_tensor(v) for k, v in samples.items()}
    n = len(data["action"])
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    generator = torch.Generator().manual_seed(seed)
    module.train()
    for _ in range(epochs):
        for idx in torch.randperm(n, generator=generator).split(batch_size):
            batch = {Columns.OBS: {OBSERVATIONS: data["obs"][idx], ACTION_MASK: data["mask"][idx]}}
            out = module._forward_train(batch)
            logits = out[Columns.ACTION_DIST_INPUTS]
            values = module.compute_values(batch, out[Columns.EMBEDDINGS])
            loss = F.cross_entropy(logits, data["action"][idx]) + 0.5 * F.mse_loss(values, data["ret"][idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    module.eval()
    greedy = module.greedy_actions(data["obs"], data["mask"])
    return float((greedy == data["action"]).float().mean())


class Validation:
    """The greedy policy of a module on held-out tasks: its mean full-success probability, exact or with
    ``episodes`` its Monte Carlo estimate over that many episodes per task (run seeds 0..episodes-1, the
    same for every call, so successive values are paired), beside the mean bound (iii) (exact) and the
    process-aware heuristic's, scored the same way on the same tasks (computed once)."""

    def __init__(self, tasks: Sequence[Task], limit: int, config: WorldConfig, episodes: int = 0):
        self.tasks = interleave_task_types(tasks)[:limit]
        self.config = config
        self.episodes = episodes
        self.bound = float(np.mean([optimal_success(t, config) for t in self.tasks]))
        self.heuristic = self.score(ProcessAwarePlanner())

    @property
    def scoring(self) -> str:
        """How the policies are scored, in words."""
        return f"Monte Carlo, {self.episodes} episodes per task" if self.episodes else "exact"

    def score(self, planner: Planner) -> float:
        """``planner``'s mean full success on the tasks."""
        if self.episodes:
            return monte_carlo_success(planner, self.tasks, self.config, self.episodes)[0]
        return float(np.mean([exact_policy_success(planner, t, self.config) for t in self.tasks]))

    def __call__(self, module: PlannerModule) -> float:
        from .evaluation import PPOPlanner

        return self.score(PPOPlanner("validation", module))


def plot_learning_curve(rows: Sequence[dict[str, Any]], path: str | Path, bound: float, heuristic: float,
                        title: str, scoring: str = "exact") -> Path:
    """Validation full success (``rows``' ``validation_full`` against ``train_seconds``) as a PNG, with
    bound (iii) (exact) and the process-aware heuristic as lines; ``scoring`` says how the policy and the
    heuristic were scored (``Validation.scoring``)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    points = [(r["train_seconds"] / 60, r["validation_full"]) for r in rows if r.get("validation_full") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if points:
        minutes, values = zip(*points, strict=True)
        ax.plot(minutes, values, marker="o", label=f"policy (greedy, {scoring})")
    ax.axhline(bound, color="black", linestyle="--", label=f"bound (iii) {bound:.3f} (exact)")
    ax.axhline(heuristic, color="tab:red", linestyle=":", label=f"process-aware heuristic {heuristic:.3f} ({scoring})")
    ax.set_xlabel("minutes of training")
    ax.set_ylabel("full success, validation tasks")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
