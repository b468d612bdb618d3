"""Behaviour cloning from the optimal policy as PPO's warm start: the expert data, a real RLlib run that
starts from the cloned weights, the learning curve, and `train ppo --warm-start` (default on in worlds with
failure processes)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
torch = pytest.importorskip("torch")

from resilibench.cli import build_parser  # noqa: E402
from resilibench.cli.train import _train_config  # noqa: E402
from resilibench.core.bounds import monte_carlo_success  # noqa: E402
from resilibench.core.config import load_config  # noqa: E402
from resilibench.core.tasks.library import interleave_task_types  # noqa: E402
from resilibench.core.world import load_tasks  # noqa: E402
from resilibench.policies.heuristics import HEURISTICS  # noqa: E402
from resilibench.policies.ppo.evaluation import PPOPlanner  # noqa: E402
from resilibench.policies.ppo.training import (  # noqa: E402
    MONTE_CARLO_EPISODES,
    PPOTrainConfig,
    latest_checkpoint,
    read_state,
    train,
)
from resilibench.policies.ppo.warm_start import Validation, expert_samples  # noqa: E402

PROCESSES = Path(__file__).parents[2] / "examples" / "processes"
OUTAGES = PROCESSES / "outages.yaml"
TYPE = "simple_data_transformation"


def test_expert_samples_are_the_optimal_policys_legal_decisions():
    config = load_config(OUTAGES)
    tasks = load_tasks(None, "train", [TYPE])[:2]
    samples = expert_samples(tasks, 2, config)
    n = len(samples["action"])
    assert n >= 4 and samples["obs"].shape == (n, 265) and samples["mask"].shape == (n, 31)
    assert all(samples["mask"][i, a] == 1 for i, a in enumerate(samples["action"]))
    assert samples["ret"].min() >= 0.0 and samples["ret"].max() <= 1.0  # discounted sparse returns
    assert (samples["action"] == 30).sum() >= 1  # the expert finishes


def test_warm_start_flag_and_its_default():
    def config(*args):
        return _train_config(build_parser().parse_args(["train", "ppo", "--iterations", "1", *args]))

    assert config("--config", str(OUTAGES)).cloning  # worlds with failure processes: bc by default
    assert not config("--config", str(OUTAGES), "--warm-start", "none").cloning
    assert not config().cloning and config("--warm-start", "bc").cloning  # world v1: PPO alone
    assert not config("--features", "no_dependency_hints").cloning  # PPO alone learns the dependencies too
    assert config("--config", str(OUTAGES)).warm_start == "auto"


def test_validation_is_monte_carlo_by_default_only_with_several_processes():
    def scoring(world: str | None, *args: str) -> int:
        config = ["--config", str(PROCESSES / f"{world}.yaml")] if world else []
        return _train_config(build_parser().parse_args(["train", "ppo", "--iterations", "1", *config, *args])
                             ).validation_scoring

    assert scoring("combined") == MONTE_CARLO_EPISODES  # outages + rate limits + latency: exact is intractable
    assert scoring(None) == scoring("outages") == scoring("latency") == scoring("rate_limits") == 0  # exact
    assert scoring("combined", "--set", "validation_episodes=0") == 0
    assert scoring("outages", "--set", "validation_episodes=50") == 50


def test_monte_carlo_validation_estimates_the_exact_value():
    """With episodes the validation scores by the library's Monte Carlo estimate (the same episodes at
    every call), within sampling error of the exact value; bound (iii) stays exact."""
    config = load_config(OUTAGES).replace(rules={"profile": "test"})
    tasks = load_tasks(None, "validation", [TYPE])
    exact, sampled = Validation(tasks, 2, config), Validation(tasks, 2, config, episodes=300)
    assert sampled.bound == exact.bound and (exact.scoring, sampled.scoring) == (
        "exact", "Monte Carlo, 300 episodes per task")
    planner = HEURISTICS["in_order"]
    estimate = sampled.score(planner())
    assert estimate == sampled.score(planner()) == monte_carlo_success(planner(), sampled.tasks, config, 300)[0]
    assert abs(estimate - exact.score(planner())) < 0.06  # 600 episodes: about 3 standard errors
    assert abs(sampled.heuristic - exact.heuristic) < 0.06


@pytest.mark.slow
def test_ppo_starts_from_the_cloned_expert(tmp_path):
    """A real RLlib run (one iteration, a learning rate too small to move the weights much): its greedy
    policy, restored from the checkpoint, takes the expert's action on most of the expert's states, and
    the run draws its learning curve."""
    import ray

    config = load_config(OUTAGES)
    cfg = PPOTrainConfig(task_types=(TYPE,), world=config.to_dict(), iterations=1, d_model=16, n_heads=2,
                         ff_dim=32, value_hiddens=(16,), train_batch_size=128, minibatch_size=128, num_epochs=1,
                         num_env_runners=0, num_envs_per_env_runner=2, bc_tasks=6, bc_seeds=4, bc_epochs=80,
                         finetune_lr=1e-7, validation_tasks=2, keep_checkpoints=1)
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        train(cfg, tmp_path / "run", log=lambda line: None)
    finally:
        ray.shutdown()
    record = json.loads((tmp_path / "run" / "training.json").read_text())
    assert record["warm_start"]["agreement"] >= 0.8 and record["warm_start"]["decisions"] > 50
    assert record["validation"]["episodes"] == 0  # one failure process: scored exactly
    rows = [json.loads(line) for line in (tmp_path / "run" / "progress.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["validation_full"] is not None  # the last iteration validates
    assert last["validation_seconds"] > record["warm_start"]["validation_seconds"] > 0  # both count in the budget
    assert read_state(latest_checkpoint(tmp_path / "run")).budget_seconds == pytest.approx(
        last["train_seconds"] + last["validation_seconds"])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("iter_*")) == [
        "iter_000000", "iter_000001"]  # the cloned policy is kept beside the keep_checkpoints newest
    assert (tmp_path / "run" / "learning_curve.png").stat().st_size > 1000
    samples = expert_samples(interleave_task_types(cfg.training_tasks())[:6], 4, config)
    planner = PPOPlanner(tmp_path / "run")
    greedy = planner.actions(samples["obs"], samples["mask"])
    assert np.mean(np.asarray(greedy) == samples["action"]) >= 0.8
