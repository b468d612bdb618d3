"""Self-play on ``adversarial_v1`` (``world="v0"``: ``adversarial_v0``) with RLlib PPO (new API stack): a flaw injector against an executor.

Both agents learn at once, each with its own PPO module, on the native parallel env through RLlib's
``ParallelPettingZooEnv``. The executor's full-success rate on clean plans (adversary forced to "no flaw")
and on flawed plans (the adversary's greedy choice) is measured before and after training, on the same
held-out tasks and seeds (common random numbers), with greedy actions of the modules. Beside it, the
same plans are played by a literal plan follower (``PlanFollower``), which shows how much the
adversary's flaws hurt an executor that trusts its plan.

    python -m resilibench.policies.selfplay --iterations 20

Needs the ``rl`` extra (``pip install 'resilibench[rl]'``).
"""

from __future__ import annotations

__all__ = [
    "ENV_NAME", "AGENTS", "SelfPlayConfig", "require_rl", "make_env", "build_algorithm", "greedy_policy",
    "evaluate", "SelfPlayResult", "run_selfplay", "format_report", "main",
]

import argparse
import logging
import sys
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..core.plan_follower import PlanFollower
from ..envs.adversarial.game import ADVERSARY, EXECUTOR, NO_FLAW, AdversarialParallelEnv
from ..envs.adversarial_v0 import parallel_env

ENV_NAME = "resilibench_adversarial"
AGENTS = (ADVERSARY, EXECUTOR)


@dataclass(frozen=True)
class SelfPlayConfig:
    """Everything a self-play run depends on. The defaults took 8 minutes on a busy 2-core machine."""

    iterations: int = 20
    seed: int = 0
    # The game: easy task types (plans of 1-4 steps) so that a few iterations show learning.
    task_types: tuple[str, ...] = ("simple_data_transformation", "basic_file_processing")
    split: str = "train"
    eval_split: str = "test"
    budget: int = 1
    severity: float = 0.5
    hide_required: bool = True  # the plan is the executor's only guide to the required tools
    matcher: str = "auto"  # tool similarity of the flaws (see adversarial_v1)
    world: str = "v1"  # the task library and grading of the game
    # Evaluation: episodes on held-out tasks, seeds seed * 1_000_003 + i.
    eval_episodes: int = 200
    # PPO.
    train_batch_size: int = 1000
    minibatch_size: int = 250
    num_epochs: int = 6
    lr: float = 1e-3
    gamma: float = 0.99
    entropy_coeff: float = 0.01
    hiddens: tuple[int, ...] = (64, 64)
    num_cpus: int = 2
    torch_threads: int = 1  # small networks: more threads only contend for the CPUs

    def __post_init__(self) -> None:
        for name in ("iterations", "eval_episodes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("train_batch_size", "minibatch_size", "num_epochs", "num_cpus", "budget", "torch_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.minibatch_size > self.train_batch_size:
            raise ValueError(f"minibatch_size ({self.minibatch_size}) must be <= train_batch_size "
                             f"({self.train_batch_size})")
        if not self.hiddens or any(h < 1 for h in self.hiddens):
            raise ValueError(f"hiddens must be positive layer widths, got {self.hiddens}")

    def env_config(self, split: str) -> dict[str, Any]:
        return {"split": split, "task_types": list(self.task_types), "budget": self.budget,
                "severity": self.severity, "hide_required": self.hide_required, "matcher": self.matcher,
                "world": self.world}


def require_rl() -> None:
    """Fail with a message naming the extra when ray[rllib] or torch is missing."""
    try:
        import ray.rllib  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"self-play needs the rl extra: pip install 'resilibench[rl]' ({exc})") from None


def make_env(env_config: dict[str, Any]):
    """The RLlib multi-agent env: the adversarial game's parallel env in ``ParallelPettingZooEnv``."""
    from ray.rllib.env.wrappers.pettingzoo_env import ParallelPettingZooEnv

    return ParallelPettingZooEnv(parallel_env(**env_config))


def _module_class():
    """The masked PPO module class (defined on first use: it needs torch and RLlib)."""
    import torch
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.apis.value_function_api import ValueFunctionAPI
    from ray.rllib.core.rl_module.torch import TorchRLModule
    from torch import nn

    def mlp(sizes: Sequence[int], out: int) -> nn.Sequential:
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            layers += [nn.Linear(a, b), nn.Tanh()]
        return nn.Sequential(*layers, nn.Linear(sizes[-1], out))

    class MaskedMLPModule(TorchRLModule, ValueFunctionAPI):
        """Policy and value MLPs over the Dict observation's ``observation``, the policy with a linear skip
        from the observation to the logits (a one-hot hint such as "the plan's next tool" maps to its
        action in few updates). Illegal actions get the most negative logit. A row whose mask is all zeros
        (the agent is not on turn; its action is ignored) gets a uniform, constant distribution, so those
        steps add no policy gradient."""

        def setup(self) -> None:
            size = int(np.prod(self.observation_space["observation"].shape))
            hiddens = list(self.model_config.get("hiddens", (64, 64)))
            n_actions = int(self.action_space.n)
            self.pi = mlp([size, *hiddens], n_actions)
            self.skip = nn.Linear(size, n_actions, bias=False)
            self.vf = mlp([size, *hiddens], 1)

        def _forward(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
            obs = batch[Columns.OBS]
            mask = obs["action_mask"] > 0
            logits = self.pi(obs["observation"]) + self.skip(obs["observation"])
            logits = torch.where(mask, logits, torch.finfo(logits.dtype).min)
            idle = ~mask.any(dim=-1, keepdim=True)
            return {Columns.ACTION_DIST_INPUTS: torch.where(idle, torch.zeros_like(logits), logits)}

        def _forward_train(self, batch: dict[str, Any], **kwargs) -> dict[str, Any]:
            return self._forward(batch)

        def compute_values(self, batch: dict[str, Any], embeddings: Any = None):
            return self.vf(batch[Columns.OBS]["observation"]).squeeze(-1)

    return MaskedMLPModule


def build_algorithm(cfg: SelfPlayConfig):
    """The RLlib PPO algorithm: one module per agent, sampling in the driver process."""
    require_rl()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    logging.getLogger("ray.rllib").setLevel(logging.ERROR)
    register_env(ENV_NAME, make_env)
    module = _module_class()
    specs = {agent: RLModuleSpec(module_class=module, model_config={"hiddens": list(cfg.hiddens)}) for agent in AGENTS}
    config = (
        PPOConfig()
        .environment(ENV_NAME, env_config=cfg.env_config(cfg.split), disable_env_checking=True)
        # Short fragments: RLlib 2.60's multi-agent runner re-converts every finished episode of a fragment
        # at each step, so its cost grows with the square of the fragment length for short episodes.
        .env_runners(num_env_runners=0, num_envs_per_env_runner=1, rollout_fragment_length=100)
        .learners(num_learners=0)
        .multi_agent(policies=set(AGENTS), policy_mapping_fn=_agent_module)
        .rl_module(rl_module_spec=MultiRLModuleSpec(rl_module_specs=specs))
        .training(lr=cfg.lr, gamma=cfg.gamma, entropy_coeff=cfg.entropy_coeff,
                  train_batch_size_per_learner=cfg.train_batch_size, minibatch_size=cfg.minibatch_size,
                  num_epochs=cfg.num_epochs)
        .debugging(seed=cfg.seed, log_level="ERROR")
    )
    return config.build_algo()


def _agent_module(agent_id: Hashable, *args, **kwargs) -> str:
    """Each agent has its own module, named after it."""
    return str(agent_id)


def greedy_policy(module) -> Callable[[dict[str, np.ndarray]], int]:
    """The argmax action of an RLlib module for one Dict observation."""
    import torch
    from ray.rllib.core.columns import Columns

    def act(observation: dict[str, np.ndarray]) -> int:
        batch = {Columns.OBS: {k: torch.as_tensor(v[None]) for k, v in observation.items()}}
        with torch.no_grad():
            logits = module.forward_inference(batch)[Columns.ACTION_DIST_INPUTS]
        return int(logits[0].argmax())

    return act


def evaluate(adversary: Callable[[dict], int], executor: Callable[[dict], int], cfg: SelfPlayConfig) -> dict[str, Any]:
    """Full-success rates over ``cfg.eval_episodes`` held-out episodes of the executor (and of a literal plan
    follower, whose calls carry no arguments like every executor call here) on clean plans and on the
    plans the adversary flaws, with the flaws it chose. ``adversary`` and ``executor`` map a Dict
    observation to an action; every column plays the same seeds (paired episodes)."""
    env = parallel_env(**cfg.env_config(cfg.eval_split))
    wins = {(who, plans): 0 for who in ("executor", "follower") for plans in ("clean", "flawed")}
    flaws: Counter[str] = Counter()
    for i in range(cfg.eval_episodes):
        seed = cfg.seed * 1_000_003 + i
        for plans in ("clean", "flawed"):
            for who in ("executor", "follower"):
                level = _play(env, seed, adversary if plans == "flawed" else None,
                              executor if who == "executor" else None)
                wins[(who, plans)] += level == "full_success"
            if plans == "flawed":
                flaws.update(f"{r['flaw_type']}/{r['method']}" if r["applied"] else "not applicable"
                             for r in env.game.injections)
                flaws.update(["no flaw"] * (cfg.budget - len(env.game.injections)))
    n = max(cfg.eval_episodes, 1)
    return {"episodes": cfg.eval_episodes,
            **{f"{who}_{plans}": wins[(who, plans)] / n for who, plans in wins},
            "adversary_choices": dict(flaws.most_common())}


def _play(env: AdversarialParallelEnv, seed: int, adversary, executor) -> str:
    """One episode; ``adversary`` None = "no flaw", ``executor`` None = the literal plan follower."""
    obs, _ = env.reset(seed=seed)
    info: dict[str, Any] = {}
    while env.agents:
        agent = env.agent_on_turn
        assert agent is not None  # one is on turn while the game runs
        if agent == ADVERSARY:
            action = NO_FLAW if adversary is None else adversary(obs[ADVERSARY])
        elif executor is not None:
            action = executor(obs[EXECUTOR])
        else:
            game = env.game
            assert game.plan is not None and game.episode is not None  # reset() made them
            call = PlanFollower(game.plan, game.registry).next_call(game.episode)
            action = env.action_space(EXECUTOR).n - 1 if call is None else call[0]  # FINISH is the last
        obs, _, _, _, info = env.step({agent: action})
    return info[EXECUTOR]["level"]


@dataclass
class SelfPlayResult:
    """The numbers of a run: evaluation before and after training, and the training curve."""

    config: dict[str, Any]
    before: dict[str, Any]
    after: dict[str, Any]
    iterations: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0


def run_selfplay(cfg: SelfPlayConfig | None = None, progress: bool = True) -> SelfPlayResult:
    """Train both agents for ``cfg.iterations`` PPO iterations and evaluate before and after."""
    cfg = cfg or SelfPlayConfig()
    require_rl()
    import ray
    import torch

    started = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    own_ray = not ray.is_initialized()
    if own_ray:
        ray.init(address="local", num_cpus=cfg.num_cpus, include_dashboard=False, logging_level=logging.ERROR,
                 log_to_driver=False)
    try:
        algo = build_algorithm(cfg)
        try:
            before = _evaluate_algorithm(algo, cfg)
            curve = []
            from tqdm.auto import tqdm

            for _ in tqdm(range(cfg.iterations), desc="self-play", unit="it", file=sys.stderr,
                          disable=not progress, dynamic_ncols=True):
                result = algo.train()
                returns = result["env_runners"].get("agent_episode_returns_mean", {})
                curve.append({"executor_return": float(returns.get(EXECUTOR, float("nan"))),
                              "adversary_return": float(returns.get(ADVERSARY, float("nan"))),
                              "env_steps": int(result["env_runners"].get("num_env_steps_sampled_lifetime", 0))})
            after = _evaluate_algorithm(algo, cfg)
        finally:
            algo.stop()
    finally:
        torch.set_num_threads(threads)
        if own_ray:
            ray.shutdown()
    return SelfPlayResult(asdict(cfg), before, after, curve, time.perf_counter() - started)


def _evaluate_algorithm(algo, cfg: SelfPlayConfig) -> dict[str, Any]:
    return evaluate(greedy_policy(algo.get_module(ADVERSARY)), greedy_policy(algo.get_module(EXECUTOR)), cfg)


def format_report(result: SelfPlayResult) -> str:
    """The before/after table and the adversary's greedy choices after training."""
    from resilibench.console import format_table

    rows = [[stage, r["executor_clean"], r["executor_flawed"], r["follower_clean"], r["follower_flawed"]]
            for stage, r in (("before training", result.before), ("after training", result.after))]
    table = format_table(["", "executor clean", "executor flawed", "follower clean", "follower flawed"], rows)
    n_iter = len(result.iterations)
    choices = ", ".join(f"{k} {v}" for k, v in result.after["adversary_choices"].items())
    return (f"full-success rate over {result.after['episodes']} held-out episodes "
            f"(greedy actions, {n_iter} PPO iterations, {result.seconds:.0f} s)\n{table}\n"
            f"adversary's choices after training: {choices}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m resilibench.policies.selfplay", description=(__doc__ or "").partition("\n")[0])
    defaults = SelfPlayConfig()
    parser.add_argument("--iterations", type=int, default=defaults.iterations, help="PPO iterations")
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--eval-episodes", type=int, default=defaults.eval_episodes)
    parser.add_argument("--budget", type=int, default=defaults.budget, help="flaw injections per episode")
    parser.add_argument("--train-batch-size", type=int, default=defaults.train_batch_size)
    parser.add_argument("--show-required", action="store_true",
                        help="let the executor see the task's required tools (default: the plan only)")
    parser.add_argument("--num-cpus", type=int, default=defaults.num_cpus)
    args = parser.parse_args(argv)
    try:
        cfg = SelfPlayConfig(iterations=args.iterations, seed=args.seed, eval_episodes=args.eval_episodes,
                             budget=args.budget, train_batch_size=args.train_batch_size,
                             minibatch_size=min(defaults.minibatch_size, args.train_batch_size),
                             hide_required=not args.show_required, num_cpus=args.num_cpus)
    except ValueError as exc:
        parser.error(str(exc))
    print(format_report(run_selfplay(cfg)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
