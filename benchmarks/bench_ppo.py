"""PPO planners on ResiliBench-v1: training throughput, env-runner scaling, and test success vs bound (iii).

One command reproduces the figures of docs/policies/ppo.md, in one process with one local Ray instance:

(a) Anchors, measured in the same run: the raw single env (``ResiliBench-v1``, random legal actions, no
    policy) in steps/s, and RLlib PPO on ``CartPole-v1`` (RLlib's default module) with the same env-runner,
    batch and epoch settings as ours, in env steps/s per training iteration.
(b) Scaling: PPO with the default ``PPOTrainConfig`` at 0 (sampling in the driver), 1 and 2 env runners:
    env steps per second of training iterations (sampling and learning) and of sampling alone (RLlib's
    sampling timer). Ratios: 2 runners over 1, and ours over the CartPole anchor at 1 runner.
(c) Training for a time budget (default 20 minutes) with the default config on the train split, then the
    greedy policy on every test task: full success over 3 seeds with the episodes and seeds of
    ``resilibench run``, and its exact expected full success (``exact_policy_success``), each beside bound
    (iii) per task type, with the ratio; and how often its happy-path workflow equals the reference one.

Run: ``python benchmarks/bench_ppo.py`` (``--time-budget MIN``, ``--scaling-iterations N``,
``--skip-training``; ``--output-dir DIR`` keeps the training run, default runs/bench_ppo).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def raw_env_steps_per_s(seconds: float = 3.0) -> float:
    """``ResiliBench-v1`` alone: random legal actions (precomputed choices), resets included."""
    import gymnasium as gym

    import resilibench  # noqa: F401

    env = gym.make("ResiliBench-v1", split="train")
    rng = np.random.default_rng(0)
    choices = rng.random(200_000).tolist()
    _, info = env.reset(seed=0)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for u in choices[steps % 100_000: steps % 100_000 + 1000]:
            legal = np.flatnonzero(info["action_mask"])
            _, _, terminated, truncated, info = env.step(int(legal[int(u * len(legal))]))
            if terminated or truncated:
                _, info = env.reset()
        steps += 1000
    return steps / (time.perf_counter() - start)


def iteration_throughput(config, iterations: int) -> tuple[float, float]:
    """(env steps/s of whole training iterations, env steps/s of sampling alone), medians over
    ``iterations`` after one warm-up iteration."""
    algo = config.build_algo()
    try:
        algo.train()
        whole, sampling = [], []
        for _ in range(iterations):
            start = time.perf_counter()
            result = algo.train()
            elapsed = time.perf_counter() - start
            steps = result["env_runners"]["num_env_steps_sampled"]
            whole.append(steps / elapsed)
            sampling.append(steps / result["timers"]["env_runner_sampling_timer"])
    finally:
        algo.stop()
    return statistics.median(whole), statistics.median(sampling)


def cartpole_config(cfg, num_env_runners: int):
    """RLlib PPO on CartPole-v1 (default module) with our env-runner, batch and epoch settings."""
    from ray.rllib.algorithms.ppo import PPOConfig

    return (PPOConfig().environment("CartPole-v1")
            .env_runners(num_env_runners=num_env_runners, num_envs_per_env_runner=cfg.num_envs_per_env_runner)
            .training(train_batch_size_per_learner=cfg.train_batch_size, minibatch_size=cfg.minibatch_size,
                      num_epochs=cfg.num_epochs, lr=cfg.lr)
            .debugging(seed=0, log_level="ERROR"))


def evaluate(checkpoint: Path) -> None:
    """Greedy policy on every test task: sampled (3 seeds, `resilibench run` episodes) and exact."""
    from resilibench.core.tasks.library import TASK_TYPE_NAMES
    from resilibench.core.world import load_tasks
    from resilibench.policies.ppo.evaluation import PPOPlanner, compare_workflows, registered_planner
    from resilibench.policies.runner import episode_jobs, run_jobs

    planner = PPOPlanner(checkpoint)
    tasks = load_tasks(split="test")
    start = time.perf_counter()
    with registered_planner(planner):
        rows = run_jobs(episode_jobs([planner.name], tasks, [0, 1, 2]), clairvoyant=False)
    sampled_s = time.perf_counter() - start
    start = time.perf_counter()
    exact = compare_workflows(planner, tasks)["summary"]
    exact_s = time.perf_counter() - start
    print(f"\n(c) greedy PPO policy on the test split ({len(tasks)} tasks; sampled: 3 seeds, {sampled_s:.0f} s; "
          f"exact: {exact_s:.0f} s)")
    header = (f"{'task_type':30s} {'tasks':>5s} {'bound_iii':>9s} {'full (3 seeds)':>14s} {'ratio':>6s} "
              f"{'exact':>7s} {'ratio':>6s} {'workflow=ref':>12s}")
    print(header)
    print("-" * len(header))
    for name in [*TASK_TYPE_NAMES, "all"]:
        mine = [r for r in rows if name in ("all", r["task_type"])]
        full = sum(r["level"] == "full_success" for r in mine) / len(mine)
        bound = float(np.mean([r["bound_iii"] for r in mine]))
        e = exact[name]
        print(f"{name:30s} {e['tasks']:5d} {bound:9.4f} {full:14.4f} {full / bound:6.3f} "
              f"{e['policy_success']:7.4f} {e['policy_over_bound_iii']:6.3f} {e['match_rate']:12.3f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-budget", type=float, default=20.0, metavar="MIN", help="training minutes (20)")
    parser.add_argument("--scaling-iterations", type=int, default=4, metavar="N",
                        help="timed iterations per scaling point, after one warm-up (4)")
    parser.add_argument("--skip-training", action="store_true", help="only (a) and (b)")
    parser.add_argument("--output-dir", default="runs/bench_ppo", metavar="DIR")
    args = parser.parse_args(argv)

    import ray
    import torch

    from resilibench.policies.ppo import quiet_logs
    from resilibench.policies.ppo.training import PPOTrainConfig, build_ppo_config, train

    quiet_logs()
    torch.set_num_threads(1)
    cfg = PPOTrainConfig()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}; load average "
          f"{load_average()}")
    print(f"config: {cfg.encoder} d_model {cfg.d_model} x {cfg.n_layers} layer(s), batch {cfg.train_batch_size}, "
          f"minibatch {cfg.minibatch_size}, {cfg.num_epochs} epochs, {cfg.num_envs_per_env_runner} envs per runner")

    print("\n(a) anchors")
    raw = raw_env_steps_per_s()
    print(f"ResiliBench-v1 alone (random legal actions): {raw:,.0f} steps/s")
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 1), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    try:
        cart_whole, cart_sampling = iteration_throughput(cartpole_config(cfg, 1), args.scaling_iterations)
        print(f"RLlib PPO on CartPole-v1, 1 env runner: {cart_whole:,.0f} env steps/s per iteration, "
              f"{cart_sampling:,.0f} while sampling")

        print("\n(b) scaling: PPO on ResiliBench-v1 (default config)")
        measured = {}
        for runners in (0, 1, 2):
            config = build_ppo_config(PPOTrainConfig(num_env_runners=runners))
            measured[runners] = iteration_throughput(config, args.scaling_iterations)
            whole, sampling = measured[runners]
            print(f"{runners} env runner(s): {whole:,.0f} env steps/s per iteration, {sampling:,.0f} while sampling"
                  f" (load {load_average()})")
        print(f"ratio 2 runners / 1 runner: {measured[2][0] / measured[1][0]:.2f} per iteration, "
              f"{measured[2][1] / measured[1][1]:.2f} while sampling")
        print(f"ratio ResiliBench / CartPole anchor (1 runner): {measured[1][0] / cart_whole:.2f} per iteration, "
              f"{measured[1][1] / cart_sampling:.2f} while sampling")
        print(f"ratio sampling at 1 runner / raw env: {measured[1][1] / raw:.3f}")

        if not args.skip_training:
            out = Path(args.output_dir)
            if out.exists():
                shutil.rmtree(out)
            budget = PPOTrainConfig(time_budget_min=args.time_budget)
            print(f"\n(c) training for {args.time_budget:g} minutes into {out} (progress every 10 iterations)")
            lines: list[str] = []

            def log(line: str) -> None:
                lines.append(line)
                if len(lines) % 10 == 0:
                    print(line, flush=True)

            start = time.perf_counter()
            row = train(budget, out, log=log)
            if len(lines) % 10:
                print(lines[-1])
            print(f"trained {row['iteration']} iterations, {row['env_steps']:,} env steps in "
                  f"{row['train_seconds'] / 60:.1f} min of training ({(time.perf_counter() - start) / 60:.1f} min "
                  f"wall, start-up and bounds included); load average {load_average()}")
    finally:
        ray.shutdown()
    if not args.skip_training:
        evaluate(Path(row["checkpoint"]))
    print(f"\nload average at the end: {load_average()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
