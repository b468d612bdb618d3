"""Throughput of ResiliBench-v1 against Gymnasium's CartPole-v1, measured in one process.

(a) Single env: ``gymnasium.make`` of each env (default wrappers included), driven by the same loop:
    step with the next action of a precomputed action list, reset when the episode ends. CartPole gets
    uniform random actions in {0, 1}; ResiliBench-v1 gets uniform random actions in [0, 31) (tools and
    FINISH, masked ones included: the env executes them under the episode rules), so the loop measures
    the env, not a policy. Resets are inside the timed loop for both.
(b) Vector env at each batch size of ``--num-envs`` (default 64, 1024 and 16384):
    ``gymnasium.make_vec(..., num_envs=N, vectorization_mode="vector_entry_point")`` of each env
    (CartPoleVectorEnv and ResiliBenchVectorEnv), stepped with precomputed random action batches (same
    distributions as above); both autoreset (NEXT_STEP) inside the timed loop. The figure is env-steps/s
    = vector steps x N / seconds (about a million env-steps per repeat). Each env is reset once, so the
    repeats time the steady state. ``--observation-dtype float32 float16 uint8`` times the compact
    observations too (each against the same CartPole loop).
(c) Memory per env at the largest N, two ways, each env first made (and stepped) once at 8 envs so that
    imports, compiled code and the task library are not counted (the env's own tables over the task pool
    are: 3,528 tasks in the train split): the peak of the memory Python allocates
    (``tracemalloc``, numpy arrays included) while ``make_vec`` builds the env, resets it and steps it 50
    times, over N; and the growth of the resident memory (``/proc/self/statm``) of a fresh process from
    before ``make_vec`` to after 200 steps, the env alive, over N.
(d) For context, ResiliBench-v1 through Gymnasium's ``SyncVectorEnv`` (N single envs in a Python loop).

Times are CPU seconds of this process (``time.process_time``), so other jobs on a shared machine inflate
them less than wall time. Each figure is the median of several timed repeats after a warm-up; the repeats
of the two envs are interleaved and the ratio is the median of the per-repeat ratios, so load changes hit
both sides alike. Targets: (a) >= 0.8; (b) >= 1.0 at 1024 envs and >= 0.7 at 16384 (aim 1.0 at every N),
throughput not falling as N grows; (c) at most 2x CartPole's memory per env; against the gymnasium version
printed in the first line (CI installs 1.2.2). Run:
``python benchmarks/bench_env.py`` (``--quick`` for a short run; ``--part vector`` for (b) and (c) only).
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc

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
                 mode: str = "vector_entry_point", **kwargs):
        self.env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode=mode, **kwargs)
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


def memory_per_env(env_id: str, num_envs: int, **kwargs) -> float:
    """Peak bytes allocated (``tracemalloc``) by make_vec + reset + 50 random steps, over ``num_envs``; the env
    is made once at 8 envs first, so that imports, compilation and the task library are not counted."""
    warm = gym.make_vec(env_id, num_envs=8, vectorization_mode="vector_entry_point", **kwargs)
    warm.reset(seed=0)
    warm.step(np.zeros(8, dtype=np.int64))  # loads the compiled step too
    actions = None
    tracemalloc.start()
    try:
        env = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="vector_entry_point", **kwargs)
        env.reset(seed=0)
        actions = np.random.default_rng(0).integers(env.single_action_space.n, size=num_envs)
        for _ in range(50):
            env.step(actions)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    return peak / num_envs


def resident_growth(env_id: str, num_envs: int, dtype: str) -> float:
    """Bytes per env by which a fresh process's resident memory grows while it makes, resets and steps (200
    times) a ``num_envs`` vector env, after the same at 8 envs (``--rss-child``)."""
    out = subprocess.run([sys.executable, __file__, "--rss-child", env_id, str(num_envs), dtype],
                         capture_output=True, text=True, check=True).stdout
    return float(out.split()[-2])


def rss_child(env_id: str, num_envs: int, dtype: str) -> None:
    def run(n: int, steps: int) -> gym.vector.VectorEnv:
        env = gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point", **dtype_option(dtype))
        env.reset(seed=0)
        for a in np.random.default_rng(0).integers(env.single_action_space.n, size=(steps, n)):
            env.step(a)
        return env

    def resident() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * resource.getpagesize()

    run(8, 20)
    before = resident()
    env = run(num_envs, 200)
    print((resident() - before) / num_envs, env.num_envs)


def dtype_option(dtype: str) -> dict:
    """make_vec's keyword for our observation dtype (none for the default, so the script also times earlier
    versions)."""
    return {} if dtype == "float32" else {"observation_dtype": dtype}


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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--rss-child"]:
        rss_child(argv[1], int(argv[2]), argv[3])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (noisier figures)")
    parser.add_argument("--num-envs", type=int, nargs="+", default=[64, 1024, 16384],
                        help="batch sizes of part (b) (default 64 1024 16384)")
    parser.add_argument("--observation-dtype", choices=("float32", "float16", "uint8"), nargs="+", default=["float32"],
                        help="our observation dtypes timed in (b) and (c) (default float32)")
    parser.add_argument("--part", choices=("all", "single", "vector"), default="all")
    args = parser.parse_args(argv)
    single_steps, env_steps, repeats = (20_000, 300_000, 3) if args.quick else (200_000, 1_000_000, 5)

    print(f"machine: {machine()}")
    if args.part in ("all", "single"):
        print(f"(a) single env, gymnasium.make (default wrappers), random actions from a precomputed list, reset "
              f"on episode end; {single_steps} steps x {repeats} interleaved repeats (medians)")
        cartpole, ours, ratio = compare(SingleEnvLoop("CartPole-v1", single_steps),
                                        SingleEnvLoop("ResiliBench-v1", single_steps), repeats)
        print(f"    CartPole-v1      {cartpole:12,.0f} steps/s")
        print(f"    ResiliBench-v1   {ours:12,.0f} steps/s")
        print(f"    ratio ResiliBench/CartPole = {ratio:.2f}  (target >= 0.8)")
    if args.part == "single":
        return 0

    print(f"(b) vector env, make_vec(vectorization_mode='vector_entry_point'), random action batches, NEXT_STEP "
          f"autoreset; about {env_steps:,} env-steps x {repeats} interleaved repeats (medians)")
    for n in args.num_envs:
        steps = max(20, env_steps // n)
        anchor = VectorEnvLoop("CartPole-v1", n, steps)
        for dtype in args.observation_dtype:
            cartpole_vec, ours_vec, ratio_vec = compare(
                anchor, VectorEnvLoop("ResiliBench-v1", n, steps, **dtype_option(dtype)), repeats)
            print(f"    N={n:6d} {dtype}: CartPoleVectorEnv {cartpole_vec:14,.0f}  ResiliBenchVectorEnv "
                  f"{ours_vec:14,.0f} env-steps/s  ratio {ratio_vec:.2f}")
    print("    targets: ratio >= 1.0 at 1024 and >= 0.7 at 16384 (aim 1.0 at every N)")

    n = max(args.num_envs)
    anchor_memory, anchor_rss = memory_per_env("CartPole-v1", n), resident_growth("CartPole-v1", n, "float32")
    print(f"(c) memory per env at N={n}: tracemalloc peak of make_vec + reset + 50 steps, over N; peak resident "
          f"memory growth of a fresh process, over N (target: ratio <= 2)")
    print(f"    CartPoleVectorEnv: {anchor_memory:,.0f} bytes allocated, {anchor_rss:,.0f} bytes resident")
    for dtype in args.observation_dtype:
        ours_memory = memory_per_env("ResiliBench-v1", n, **dtype_option(dtype))
        ours_rss = resident_growth("ResiliBench-v1", n, dtype)
        print(f"    ResiliBenchVectorEnv {dtype}: {ours_memory:,.0f} bytes allocated (ratio "
              f"{ours_memory / anchor_memory:.2f}), {ours_rss:,.0f} bytes resident (ratio {ours_rss / anchor_rss:.2f})")

    if args.part == "all":
        sync_envs, sync_steps = 64, (30 if args.quick else 200)
        sync = VectorEnvLoop("ResiliBench-v1", sync_envs, sync_steps, mode="sync")
        sync_rate = statistics.median(sync.run(sync.actions) for _ in range(repeats))
        print(f"(d) context: ResiliBench-v1 through SyncVectorEnv (num_envs={sync_envs}): {sync_rate:,.0f} "
              f"env-steps/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
