"""Throughput of ResiliBenchText-v1 played by the scripted optimal agent, against anchors in one process.

The same episodes (tasks x seeds, paired seeds ``task_seed``) are played by:

(a) ``OptimalPlanner`` in ``ResiliBench-v1`` with strict dependencies (the anchor: the same policy and the
    same random streams in the planner MDP); figure: env steps/s (tool calls and FINISH);
(b) ``OptimalTextAgent`` in ``ResiliBenchText-v1``, one env, one message per step: turns/s, where a turn
    is one ``env.step`` (an assistant message: a tool call, or the completion signal), resets included
    (they build the prompt);
(c) the same agent through the batched harness ``run_eval`` (a pool of envs, one agent call per round,
    result rows built) on optimal prompts: turns/s and episodes/s, against (a);
(d) the harness against CartPole-v1 with random actions, a second, external anchor.

Each figure is the median of
interleaved repeats after a warm-up (``compare`` of ``bench_env.py``), so load changes on a shared
machine hit both sides alike. Run: ``python benchmarks/bench_text_env.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_env import SingleEnvLoop, compare, machine  # noqa: E402

from resilibench.agents.harness import EvalJob, run_eval
from resilibench.agents.scripted import OptimalTextAgent
from resilibench.core.simulator import task_seed
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.world import load_tasks
from resilibench.envs.planner.env import ResiliBenchEnv
from resilibench.envs.text.env import ResiliBenchTextEnv
from resilibench.policies.optimal import OptimalPlanner


class PlannerLoop:
    """``OptimalPlanner`` in ``ResiliBench-v1`` (strict dependencies) over a list of (task, seed) episodes."""

    def __init__(self, tasks, episodes):
        self.env = ResiliBenchEnv(tasks=tasks, split=None, rules={"strict_dependencies": True})
        self.planner = OptimalPlanner(self.env.config)
        self.actions = episodes
        self.steps = 0
        self.run(episodes[: max(1, len(episodes) // 10)])  # warm-up (and the bound DP tables)

    def run(self, episodes) -> float:
        env, planner, steps = self.env, self.planner, 0
        start = time.perf_counter()
        for task, seed in episodes:
            env.reset(seed=task_seed(task.instance_id, seed), options={"task_id": task.instance_id})
            planner.reset(task, None)
            done = False
            while not done:
                _, _, terminated, truncated, _ = env.step(planner.act(env.episode, None))
                steps += 1
                done = terminated or truncated
        self.steps = steps
        return steps / (time.perf_counter() - start)


class TextLoop:
    """``OptimalTextAgent`` in one ``ResiliBenchText-v1`` over the same episodes; turns/s."""

    def __init__(self, tasks, episodes, prompt: str):
        self.env = ResiliBenchTextEnv(tasks=tasks, split=None, prompt=PromptSettings(variant=prompt))
        self.agent = OptimalTextAgent()
        self.actions = episodes
        self.turns = 0
        self.run(episodes[: max(1, len(episodes) // 10)])

    def run(self, episodes) -> float:
        env, message, turns = self.env, self.agent.message, 0
        start = time.perf_counter()
        for task, seed in episodes:
            env.reset(seed=task_seed(task.instance_id, seed), options={"task_id": task.instance_id})
            done = False
            while not done:
                _, _, terminated, truncated, _ = env.step(message(env.episode))
                turns += 1
                done = terminated or truncated
        self.turns = turns
        return turns / (time.perf_counter() - start)


class HarnessLoop:
    """``OptimalTextAgent`` through ``run_eval`` (a pool of ``batch_size`` envs) on optimal prompts; turns/s,
    a turn being one agent message (the completion signal included, as in the loops above)."""

    def __init__(self, tasks, episodes, batch_size: int = 64):
        self.jobs = [EvalJob(task, "optimal", None, seed) for task, seed in episodes]
        self.batch_size = batch_size
        self.actions = self.jobs
        self.turns = 0
        self.run(self.jobs[: max(1, len(self.jobs) // 10)])

    def run(self, jobs) -> float:
        start = time.perf_counter()
        rows = run_eval(OptimalTextAgent(), jobs, batch_size=self.batch_size, progress=False)
        seconds = time.perf_counter() - start
        self.turns = sum(r["turns"] + (r["end_reason"] == "finished") for r in rows)
        self.episodes_per_s = len(jobs) / seconds
        return self.turns / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short run (noisier figures)")
    args = parser.parse_args(argv)
    per_type, seeds, repeats = (2, 10, 3) if args.quick else (4, 50, 5)
    library = load_tasks(split="test")
    tasks = [t for name in TASK_TYPE_NAMES for t in [t for t in library if t.task_type == name][:per_type]]
    episodes = [(t, s) for t in tasks for s in range(seeds)]

    print(f"machine: {machine()}")
    print(f"{len(tasks)} test tasks ({per_type} per type) x {seeds} seeds = {len(episodes)} episodes, paired seeds; "
          f"{repeats} interleaved repeats (medians)")
    planner = PlannerLoop(tasks, episodes)
    for prompt in ("baseline", "optimal"):
        text = TextLoop(tasks, episodes, prompt)
        planner_rate, text_rate, ratio = compare(planner, text, repeats)
        print(f"(a/b) prompt={prompt}: OptimalPlanner in ResiliBench-v1 {planner_rate:10,.0f} steps/s "
              f"({planner.steps} steps); OptimalTextAgent in ResiliBenchText-v1 {text_rate:10,.0f} turns/s "
              f"({text.turns} turns); ratio text/planner = {ratio:.3f}")

    harness = HarnessLoop(tasks, episodes)
    planner_rate, harness_rate, ratio = compare(planner, harness, repeats)
    print(f"(c) run_eval (batch 64, optimal prompts, rows with bound (iii)): {harness_rate:10,.0f} turns/s "
          f"({harness.episodes_per_s:,.0f} episodes/s); OptimalPlanner {planner_rate:10,.0f} steps/s; "
          f"ratio harness/planner = {ratio:.3f}")
    cartpole = SingleEnvLoop("CartPole-v1", 20_000)
    cartpole_rate, harness_rate, ratio = compare(cartpole, harness, repeats)
    print(f"(d) anchor CartPole-v1 (random actions) {cartpole_rate:10,.0f} steps/s; run_eval {harness_rate:10,.0f} "
          f"turns/s; ratio harness/CartPole = {ratio:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
