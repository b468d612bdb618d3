"""Throughput of ResiliBench-v1 against Gymnasium's CartPole-v1, measured in one process.

(a) Single env: ``gymnasium.make`` of each env (default wrappers included), driven by the same loop:
    step with the next action of a precomputed action list, reset when the episode ends. CartPole gets
    uniform random actions in {0, 1}; ResiliBench-v1 gets uniform random actions in [0, 31) (tools and
    FINISH, masked ones included: the env executes them under the episode rules), so the loop measures
    the env, not a policy. Resets are inside the timed loop for both.
(b) Vector env: ``gymnasium.make_vec(..., num_envs=1024, vectorization_mode="vector_entry_point")`` of
    each env (CartPoleVectorEnv and ResiliBenchVectorEnv), stepped with precomputed random action
    batches (same distributions as above); both autoreset (NEXT_STEP) inside the timed loop. The figure
    is env-steps/s = vector steps x num_envs / seconds. Each env is reset once, so the repeats time the
    steady state.
(c) For context, ResiliBench-v1 through Gymnasium's ``SyncVectorEnv`` (N single envs in a Python loop).

Times are CPU seconds of this process (``time.process_time``), so other jobs on a shared machine inflate
them less than wall time. Each figure is the median of several timed repeats after a warm-up; the repeats
of the two envs are interleaved and the ratio is the median of the per-repeat ratios, so load changes hit
both sides alike. Targets: (a) >= 0.7, (b) >= 0.5 (aim 1.0), against the gymnasium version printed in
the first line (CI installs 1.2.2). Run:
``python benchmarks/bench_env.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time

import gymnasium as gym
import numba
import numpy as np

import resilibench  # noqa: F401  (registers ResiliBench-v1)


class SingleEnvLoop:
    """``gymnasium.make(env_id)`` stepped with a precomputed list of random actions, reset on episode end."""

    def __init__(self, env_id: str, n_steps: int, seed: int = 0):
        self.env = gym.make(env_id)
        self.seed = seed
        self.actions = np.random.default_rng(seed).integers(self.env.action_space.n, size=n_steps).tolist()
        self.run(self.actions[: max(1, n_steps // 10)])  # warm-up

    def run(self, actions) -> float:
        """Steps per CPU second over ``actions`` (resets included)."""
        step, reset = self.env.step, self.env.reset
        reset(seed=self.seed)
        start = time.process_time()
        for a in actions:
            _, _, terminated, truncated, _ = step(a)
            if terminated or truncated:
                reset()
        return len(actions) / (time.process_time() - start)


class VectorEnvLoop:
    """``gymnasium.make_vec(env_id, num_envs, mode)`` stepped with precomputed random action batches; the env
    autoresets (NEXT_STEP) inside the loop. Reset once: repeats continue the same run, so work that is
    amortised over many episodes (ResiliBenchVectorEnv's episodes computed ahead) is timed in steady state."""

    def __init__(self, env_id: str, num_envs: int, n_steps: int, seed: int = 0,
                 mode: str = "vector_entry_point"):
        self.env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode)
        self.num_envs = num_envs
        n_actions = self.env.single_action_space.n
        self.actions = np.random.default_rng(seed).integers(n_actions, size=(n_steps, num_envs))
        self.env.reset(seed=seed)
        self.run(self.actions[: max(1, n_steps // 10)])  # warm-up

    def run(self, actions) -> float:
        """Env-steps per CPU second (vector steps x num_envs / s)."""
        step = self.env.step
        start = time.process_time()
        for a in actions:
            step(a)
        return len(actions) * self.num_envs / (time.process_time() - start)


def compare(anchor, ours, repeats: int) -> tuple[float, float, float]:
    """Interleaved repeats (anchor, ours, anchor, ours, ...) so that load changes hit both alike:
    (median anchor rate, median our rate, median of the per-repeat ratios)."""
    anchor_rates, our_rates, ratios = [], [], []
    for _ in range(repeats):
        a = anchor.run(anchor.actions)
        o = ours.run(ours.actions)
        anchor_rates.append(a)
        our_rates.append(o)
        ratios.append(o / a)
    return statistics.median(anchor_rates), statistics.median(our_rates), statistics.median(ratios)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{os.cpu_count()} CPUs ({cpu}); Python {platform.python_version()}; numpy {np.__version__}; "
            f"numba {numba.__version__}; gymnasium {gym.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (noisier figures)")
    parser.add_argument("--num-envs", type=int, default=1024, help="batch size of part (b) (default 1024)")
    args = parser.parse_args(argv)
    single_steps, vector_steps, repeats = (20_000, 300, 3) if args.quick else (200_000, 1_000, 5)

    print(f"machine: {machine()}")
    print(f"(a) single env, gymnasium.make (default wrappers), random actions from a precomputed list, reset on "
          f"episode end; {single_steps} steps x {repeats} interleaved repeats (medians)")
    cartpole, ours, ratio = compare(SingleEnvLoop("CartPole-v1", single_steps),
                                    SingleEnvLoop("ResiliBench-v1", single_steps), repeats)
    print(f"    CartPole-v1      {cartpole:12,.0f} steps/s")
    print(f"    ResiliBench-v1   {ours:12,.0f} steps/s")
    print(f"    ratio ResiliBench/CartPole = {ratio:.2f}  (target >= 0.7)")

    n = args.num_envs
    print(f"(b) vector env, make_vec(num_envs={n}, vectorization_mode='vector_entry_point'), random action "
          f"batches, NEXT_STEP autoreset; {vector_steps} steps x {repeats} interleaved repeats (medians)")
    cartpole_vec, ours_vec, ratio_vec = compare(VectorEnvLoop("CartPole-v1", n, vector_steps),
                                                VectorEnvLoop("ResiliBench-v1", n, vector_steps), repeats)
    print(f"    CartPoleVectorEnv      {cartpole_vec:14,.0f} env-steps/s")
    print(f"    ResiliBenchVectorEnv   {ours_vec:14,.0f} env-steps/s")
    print(f"    ratio ResiliBench/CartPole = {ratio_vec:.2f}  (target >= 0.5, aim 1.0)")

    sync_envs, sync_steps = 64, (30 if args.quick else 200)
    sync = VectorEnvLoop("ResiliBench-v1", sync_envs, sync_steps, mode="sync")
    sync_rate = statistics.median(sync.run(sync.actions) for _ in range(repeats))
    print(f"(c) context: ResiliBench-v1 through SyncVectorEnv (num_envs={sync_envs}): {sync_rate:,.0f} env-steps/s; "
          f"the batched env is {ours_vec / sync_rate:.0f}x that")
    return 0


if __name__ == "__main__":
    sys.exit(main())
