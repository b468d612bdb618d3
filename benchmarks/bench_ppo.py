"""PPO planners on ResiliBench-v1: training throughput, env-runner scaling, and test success vs bound (iii).

One command reproduces the figures of docs/policies/ppo.md, in one process with one local Ray instance:

(a) Anchors, measured in the same run: the raw single env (``ResiliBench-v1``, random legal actions, no
    policy) in steps/s, and RLlib PPO on ``CartPole-v1`` (RLlib's default module) with the same env-runner,
    batch, minibatch and epoch settings as ours (1 env runner), its training iterations interleaved with
    those of PPO with the default ``PPOTrainConfig`` (and with ``--compare JSON``, the config with some fields
    changed; one iteration of each in turn, so all see the same machine load). For each: env
    steps per second of an iteration, and per CPU second (the driver's and the env runner's processes:
    with one runner, sampling and learning take turns, so on an idle machine an iteration lasts about its
    CPU time), the share of learning (inside ``LearnerGroup.update``; the rest is sampling, connectors and
    weight sync) in both, and the ratios to CartPole.
(b) Scaling: PPO with the default ``PPOTrainConfig`` at 0 (sampling in the driver), 1 and 2 env runners:
    env steps per second of training iterations (sampling and learning) and the learning share.
(c) Training for a time budget (default 20 minutes) with the default config on the train split, then the
    greedy policy on every test task: full success over 3 seeds with the episodes and seeds of
    ``resilibench run``, and its exact expected full success (``exact_policy_success``), each beside bound
    (iii) per task type, with the ratio; and how often its happy-path workflow equals the reference one.

Run: ``python benchmarks/bench_ppo.py`` (``--time-budget MIN``, ``--scaling-iterations N``,
``--compare JSON``, ``--set KEY=VALUE``, ``--skip-scaling``, ``--skip-training``; ``--output-dir DIR`` keeps the training run, default runs/bench_ppo).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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


def _runner_cpu_seconds(runner) -> float:
    return time.process_time()


class TimedAlgorithm:
    """An RLlib algorithm whose training iterations are timed, in wall seconds and in CPU seconds (the
    driver's and the remote env runners' processes together), each split into learning (inside
    ``LearnerGroup.update``, in the driver) and sampling (the rest: sampling, connectors, weight sync)."""

    def __init__(self, config):
        self.algo = config.build_algo()
        # per iteration: (env steps, wall s, learning wall s, CPU s, learning CPU s)
        self.iterations: list[tuple[int, float, float, float, float]] = []
        self._learning = (0.0, 0.0)  # wall s, CPU s of the last update
        update = self.algo.learner_group.update

        def timed_update(*args, **kwargs):
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return update(*args, **kwargs)
            finally:
                self._learning = (time.perf_counter() - wall, time.process_time() - cpu)

        self.algo.learner_group.update = timed_update

    def _cpu(self) -> float:
        runners = self.algo.env_runner_group.foreach_env_runner(_runner_cpu_seconds, local_env_runner=False)
        return time.process_time() + sum(runners)

    def train(self, record: bool = True) -> None:
        cpu = self._cpu()
        wall = time.perf_counter()
        result = self.algo.train()
        wall = time.perf_counter() - wall
        cpu = self._cpu() - cpu
        if record:
            steps = result["env_runners"]["num_env_steps_sampled"]
            self.iterations.append((steps, wall, self._learning[0], cpu, self._learning[1]))

    def steps_per_s(self, cpu: bool = False) -> float:
        """Median env steps per wall second (or per CPU second) of the recorded iterations."""
        return statistics.median(row[0] / row[3 if cpu else 1] for row in self.iterations)

    def summary(self) -> str:
        """Env steps/s per iteration and per CPU second, each with the iteration's time and learning share."""
        def median(column: int) -> float:
            return statistics.median(row[column] for row in self.iterations)

        wall_share = statistics.median(row[2] / row[1] for row in self.iterations)
        cpu_share = statistics.median(row[4] / row[3] for row in self.iterations)
        return (f"{self.steps_per_s():,.0f} env steps/s per iteration ({median(1):.2f} s, learning {wall_share:.0%}); "
                f"{self.steps_per_s(cpu=True):,.0f} per CPU second ({median(3):.2f} CPU s, learning {cpu_share:.0%})")

    def stop(self) -> None:
        self.algo.stop()


def interleaved(configs: dict[str, object], iterations: int) -> dict[str, TimedAlgorithm]:
    """Build every config, one warm-up iteration each, then ``iterations`` rounds of one iteration of each
    in turn."""
    algos: dict[str, TimedAlgorithm] = {}
    try:
        for name, config in configs.items():
            algos[name] = TimedAlgorithm(config)
            algos[name].train(record=False)
        for _ in range(iterations):
            for algo in algos.values():
                algo.train()
    finally:
        for algo in algos.values():
            algo.stop()
    return algos


def cartpole_config(cfg, num_env_runners: int):
    """RLlib PPO on CartPole-v1 (default module) with our env-runner, batch, minibatch and epoch settings."""
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
    parser.add_argument("--compare", action="append", default=[], metavar="JSON",
                        help='in (a), also the config with these fields changed, e.g. \'{"encoder": "mlp"}\' '
                        "(repeatable)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a PPOTrainConfig field for every run (value as JSON), as train ppo's --set")
    parser.add_argument("--skip-scaling", action="store_true", help="leave out (b)")
    parser.add_argument("--skip-training", action="store_true", help="only (a) and (b)")
    parser.add_argument("--output-dir", default="runs/bench_ppo", metavar="DIR")
    args = parser.parse_args(argv)

    import ray
    import torch

    from resilibench.policies.ppo import quiet_logs
    from resilibench.policies.ppo.training import PPOTrainConfig, build_ppo_config, train

    quiet_logs()
    torch.set_num_threads(1)
    overrides = {key: json.loads(value) for key, _, value in (item.partition("=") for item in args.set)}
    cfg = PPOTrainConfig(**overrides)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python "
          f"{platform.python_version()}, torch {torch.__version__}, ray {ray.__version__}; load average "
          f"{load_average()}")
    print(f"config: {cfg.encoder} d_model {cfg.d_model} ff_dim {cfg.ff_dim} x {cfg.n_layers} layer(s), batch {cfg.train_batch_size}, "
          f"minibatch {cfg.minibatch_size}, {cfg.num_epochs} epochs, {cfg.num_envs_per_env_runner} envs per runner")

    print("\n(a) anchors")
    raw = raw_env_steps_per_s()
    print(f"ResiliBench-v1 alone (random legal actions): {raw:,.0f} steps/s")
    # one CPU per env runner of the algorithms built at once (they train in turn)
    ray.init(address="local", num_cpus=max(2, os.cpu_count() or 1, 2 + len(args.compare)), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    try:
        configs = {"CartPole-v1 (RLlib PPO)": cartpole_config(cfg, 1),
                   "ResiliBench-v1 (defaults)": build_ppo_config(dataclasses.replace(cfg, num_env_runners=1))}
        for changes in args.compare:
            configs[f"ResiliBench-v1 {changes}"] = build_ppo_config(
                dataclasses.replace(cfg, num_env_runners=1, **json.loads(changes)))
        anchor = interleaved(configs, args.scaling_iterations)
        cartpole = anchor.pop("CartPole-v1 (RLlib PPO)")
        print(f"CartPole-v1 (RLlib PPO), 1 env runner: {cartpole.summary()}")
        for name, timed in anchor.items():
            print(f"{name}, 1 env runner: {timed.summary()}")
            print(f"  ratio to CartPole: {timed.steps_per_s() / cartpole.steps_per_s():.2f} per iteration (wall), "
                  f"{timed.steps_per_s(cpu=True) / cartpole.steps_per_s(cpu=True):.2f} per CPU second")
        print(f"(load {load_average()})")

        if not args.skip_scaling:
            print("\n(b) scaling: PPO on ResiliBench-v1 (default config)")
            measured = {}
            for runners in (0, 1, 2):
                (measured[runners],) = interleaved({"ours": build_ppo_config(dataclasses.replace(cfg, num_env_runners=runners))},
                                                   args.scaling_iterations).values()
                print(f"{runners} env runner(s): {measured[runners].summary()} (load {load_average()})")
            print(f"ratio 2 runners / 1 runner: {measured[2].steps_per_s() / measured[1].steps_per_s():.2f} per "
                  "iteration")

        if not args.skip_training:
            out = Path(args.output_dir)
            if out.exists():
                shutil.rmtree(out)
            budget = dataclasses.replace(cfg, time_budget_min=args.time_budget)
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
