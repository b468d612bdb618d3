"""PPO training of ResiliBench-v1 planners with RLlib (new API stack), resumable, with checkpoints.

``PPOTrainConfig`` holds every hyperparameter in one place (defaults tuned on a 2-core machine, see
docs/policies/ppo.md); ``build_ppo_config`` turns it into an RLlib ``PPOConfig``; ``train`` runs iterations into an
output directory:

    DIR/training.json            config and metadata (resilibench.results.run_metadata)
    DIR/progress.jsonl           one row per iteration (iteration, env steps, return, full success, ...)
    DIR/checkpoints/iter_NNNNNN  RLlib checkpoints (Algorithm.save_to_path) with state.json beside them
    DIR/checkpoints/latest.json  the newest checkpoint; ``resume=True`` continues from it
    DIR/learning_curve.png       full success of the greedy policy on held-out validation tasks vs minutes

With a behaviour-cloning warm start (``warm_start``; the default in worlds with failure processes) the
network is first fitted to the exact optimal policy's decisions (``warm_start.behaviour_clone``) and PPO
fine-tunes it; training.json then records the cloning (decisions, agreement, minutes, validation), and
checkpoints/iter_000000 holds the cloned policy (kept beside the ``keep_checkpoints`` newest ones).

A checkpoint holds the algorithm (learner, optimizer, env-runner connectors, iteration count); state.json
adds what RLlib does not know about: the curriculum stage, env steps and the training time so far.
"""

from __future__ import annotations

__all__ = [
    "REWARDS", "ENV_NAME", "TRAINING_FILE", "PROGRESS_FILE", "STATE_FILE", "RESUMABLE_CHANGES",
    "MONTE_CARLO_EPISODES", "PPOTrainConfig", "failure_processes", "build_ppo_config", "RayClusterError", "required_cpus", "probe_ray_head",
    "check_cluster_resources", "init_ray", "bound_iii_mean", "TrainingState", "read_state",
    "training_directory", "format_progress", "train", "restore_algorithm", "load_weights", "save_checkpoint",
]

import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigError, RunDirectoryError
from resilibench.results import run_metadata, write_json_atomic
from resilibench.rundir import RunDirectory
from resilibench.settings import AT_LEAST_ONE, UNIT, Settings, from_dict, setting

from ...core.config import WorldConfig
from ...core.tasks.library import SPLITS, TASK_TYPE_NAMES, Task
from ...core.world import load_tasks
from ...envs.planner.observation import OBSERVATION_FEATURES
from . import (
    CHECKPOINTS,
    DEFAULT_MODEL_CONFIG,
    ENCODERS,
    LATEST,
    latest_checkpoint,
    quiet_logs,
    require_rl,
)
from .curriculum import CurriculumConfig, stage_pools
from .warm_start import WARM_STARTS

REWARDS = ("sparse", "shaped")
MONTE_CARLO_EPISODES = 100  # validation episodes per task in worlds with several failure processes
ENV_NAME = "ResiliBenchMasked-v0"  # MaskedPlannerEnv over ResiliBench-v1, registered with Ray Tune
TRAINING_FILE, PROGRESS_FILE, STATE_FILE = "training.json", "progress.jsonl", "state.json"
CLONED = "iter_000000"  # the checkpoint of the cloned policy, kept whatever keep_checkpoints says
# Fields that may differ between a run and its resumption (resources and stopping rules).
# The learner count may not change: it splits the batch and shapes the optimizer state in the checkpoint.
RESUMABLE_CHANGES = frozenset({"iterations", "time_budget_min", "num_env_runners", "num_envs_per_env_runner",
                               "num_gpus_per_learner", "num_torch_threads", "checkpoint_every", "keep_checkpoints"})


@dataclass
class PPOTrainConfig(Settings):
    """Everything a PPO training run depends on. Defaults: tuned for ResiliBench-v0 on 2 CPU cores.

    Every field is checked when the config is built (``resilibench.core.config.Settings``); ``train ppo``
    builds its options from the fields' metadata."""

    # What to train on.
    task_types: tuple[str, ...] | None = setting(None, choices=TASK_TYPE_NAMES, flag="--task-type",
                                                 metavar="TYPE", help="task types to train on (default all five)")
    split: str = setting("train", choices=SPLITS, help="tasks to train on")
    tasks_path: str | None = setting(None, help="a task library file (default: the shipped one)")
    reward: str = setting("sparse", choices=REWARDS, help="sparse: 1 on full success; shaped: paper D.3")
    features: str = setting("full", choices=OBSERVATION_FEATURES,
                            help="observation features; no_dependency_hints: without the next required tool "
                            "and the dependency features (the ablation of docs/policies/ppo.md)")
    curriculum: bool = setting(True, help="the five-stage curriculum of paper D.4.2")
    curriculum_config: dict[str, Any] = setting(factory=dict, help="CurriculumConfig overrides")
    balance_task_types: bool = setting(True, help="draw a task type uniformly, then a task of it "
                                       "(else tasks uniformly)")
    world: dict[str, Any] = setting(factory=dict, help="WorldConfig overrides (sections as mappings)")
    # Policy network (resilibench.policies.ppo.module).
    encoder: str = setting("pooled", choices=ENCODERS, help="policy network")
    d_model: int = setting(16, bounds=AT_LEAST_ONE, help="token width (with the transformer a multiple of n_heads)")
    n_heads: int = setting(2, bounds=AT_LEAST_ONE)
    n_layers: int = setting(1, bounds=AT_LEAST_ONE)
    ff_dim: int = setting(32, bounds=AT_LEAST_ONE)
    mlp_hiddens: tuple[int, ...] = setting((256, 256), bounds=AT_LEAST_ONE, help="mlp trunk widths")
    value_hiddens: tuple[int, ...] = setting((64,), bounds=AT_LEAST_ONE, help="value head widths")
    # PPO.
    lr: float = setting(1e-3, above=0)
    lr_end: float | None = setting(1e-4, above=0, help="linear decay from lr to lr_end over lr_decay_steps env "
                                   "steps (null: constant)")
    lr_decay_steps: int = setting(800_000, bounds=AT_LEAST_ONE)
    gamma: float = setting(0.99, above=0, bounds=(None, 1), help="below 1 so that finishing as soon as the "
                           "task is done pays")
    lambda_: float = setting(0.95, bounds=UNIT)
    clip_param: float = setting(0.2, above=0)
    vf_clip_param: float = setting(10.0, above=0)
    vf_loss_coeff: float = setting(0.5, bounds=(0, None))
    entropy_coeff: float = setting(0.01, bounds=(0, None))
    use_kl_loss: bool = False
    kl_coeff: float = setting(0.2, bounds=(0, None))
    grad_clip: float = setting(0.5, above=0, help="paper D.5.1")
    train_batch_size: int = setting(4000, bounds=AT_LEAST_ONE,
                                    help="env steps per iteration, split evenly across the learners")
    minibatch_size: int = setting(500, bounds=AT_LEAST_ONE,
                                  help="samples per SGD step, split across the learners like the batch")
    num_epochs: int = setting(4, bounds=AT_LEAST_ONE)
    # Resources.
    num_env_runners: int = setting(2, bounds=(0, None), metavar="N", help="sampling processes (0: sample in "
                                   "the driver); on 2 cores 2 give 1.1-1.4x the env steps/s of 1 (bench_ppo)")
    num_envs_per_env_runner: int = setting(32, bounds=AT_LEAST_ONE, metavar="N", help="envs stepped as a batch")
    num_learners: int = setting(0, bounds=(0, None), metavar="N", help="learner processes (0: the driver)")
    num_gpus_per_learner: float = setting(0.0, bounds=(0, None), metavar="X", help="GPUs per learner")
    num_torch_threads: int = setting(1, bounds=AT_LEAST_ONE, help="torch threads of the driver (env runners "
                                     "get Ray's default, 1 per CPU)")
    # Warm start: behaviour cloning from the exact optimal policy (resilibench.policies.ppo.warm_start).
    warm_start: str = setting("auto", choices=WARM_STARTS, help="bc: clone the optimal policy before PPO; "
                              "auto: bc in worlds with failure processes")
    bc_tasks: int = setting(200, bounds=AT_LEAST_ONE, help="training tasks the expert plays (task types in turn)")
    bc_seeds: int = setting(4, bounds=AT_LEAST_ONE, help="expert episodes per task")
    bc_epochs: int = setting(30, bounds=AT_LEAST_ONE)
    bc_lr: float = setting(1e-3, above=0)
    finetune_lr: float = setting(1e-4, above=0, help="PPO's constant learning rate after a bc warm start")
    # Held-out validation for the learning curve.
    validation_tasks: int = setting(30, bounds=(0, None), help="validation tasks of the learning curve (0: none)")
    validation_every_min: float = setting(2.0, above=0, help="minutes of training between validations")
    validation_episodes: int | None = setting(
        None, bounds=(0, None), help="episodes per validation task when the curve is scored by Monte Carlo (0: "
        f"exact; null: exact, or {MONTE_CARLO_EPISODES} in worlds with several failure processes at once, where "
        "enumerating a policy's states is intractable)")
    # Run.
    seed: int = setting(0, bounds=(0, None), metavar="N", help="seed of the envs and the network")
    iterations: int | None = setting(None, bounds=AT_LEAST_ONE, metavar="N", help="stop at iteration N (total)")
    time_budget_min: float | None = setting(None, above=0, flag="--time-budget", metavar="MIN",
                                            help="stop after MIN minutes of cloning, PPO iterations and "
                                            "validations, all sessions together")
    checkpoint_every: int = setting(10, bounds=AT_LEAST_ONE, metavar="K",
                                    help="iterations between checkpoints (one is also written at the end)")
    keep_checkpoints: int = setting(3, bounds=AT_LEAST_ONE, help="the newest ones are kept, older ones deleted")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.task_types == ():
            raise ConfigError("task_types", f"task_types must name at least one of {TASK_TYPE_NAMES}, got []")
        checks = [
            ("d_model", self.d_model % self.n_heads == 0, "a positive multiple of n_heads"),
            ("train_batch_size", self.train_batch_size >= self.minibatch_size, ">= minibatch_size"),
            ("train_batch_size", self.train_batch_size % self.learner_count == 0
             and self.minibatch_size % self.learner_count == 0,
             f"a multiple of the learner count ({self.learner_count}), as is minibatch_size"),
        ]
        for name, ok, accepted in checks:
            if not ok:
                raise ConfigError(name, f"{name}: must be {accepted}, got {getattr(self, name)!r}")
        for name, cls in (("world", WorldConfig), ("curriculum_config", CurriculumConfig)):
            try:
                from_dict(cls, getattr(self, name))
            except ConfigError as exc:
                raise ConfigError(f"{name}.{exc.field}", f"{name}: {exc}") from None
            except ValueError as exc:  # a rule across fields
                raise ConfigError(name, f"{name}: {exc}") from None

    @property
    def learner_count(self) -> int:
        """The learners that split each batch (0 learners: the driver's own learner)."""
        return max(self.num_learners, 1)

    @property
    def cloning(self) -> bool:
        """Whether training starts with behaviour cloning (``warm_start``)."""
        return self.warm_start == "bc" or (self.warm_start == "auto" and self.world_config().processes.active)

    @property
    def validation_scoring(self) -> int:
        """Episodes per task of the validation's Monte Carlo scoring (0: exact), ``validation_episodes``
        resolved: Monte Carlo by default in worlds with several failure processes (decision 171)."""
        if self.validation_episodes is not None:
            return self.validation_episodes
        return MONTE_CARLO_EPISODES if len(failure_processes(self.world_config())) > 1 else 0

    def world_config(self) -> WorldConfig:
        """The world the envs run (``world`` applied to the defaults)."""
        return WorldConfig().replace(**self.world) if self.world else WorldConfig()

    def to_dict(self) -> dict[str, Any]:
        """Plain data, as written into training.json."""
        return dataclasses.asdict(self)

    def model_config(self) -> dict[str, Any]:
        """``PlannerModule``'s model_config."""
        config = {k: getattr(self, k) for k in DEFAULT_MODEL_CONFIG}
        config["mlp_hiddens"], config["value_hiddens"] = list(self.mlp_hiddens), list(self.value_hiddens)
        return config

    def training_tasks(self) -> list[Task]:
        """The tasks the envs draw from (before any curriculum stage narrows them)."""
        tasks = load_tasks(self.tasks_path, self.split, self.task_types)
        if not tasks:
            raise ValueError(f"no tasks for split={self.split!r}, task_types={self.task_types!r}")
        return tasks

    def env_config(self, stage: int = 0) -> dict[str, Any]:
        """RLlib's env_config for ``wrappers.make_env`` and the training callback."""
        return {"tasks_path": self.tasks_path, "split": self.split,
                "task_types": list(self.task_types) if self.task_types else None, "reward": self.reward,
                "features": self.features,
                "world": self.world, "curriculum": self.curriculum, "curriculum_config": self.curriculum_config,
                "balance_task_types": self.balance_task_types,
                "stage": stage if self.curriculum else -1}


def failure_processes(world: WorldConfig) -> list[str]:
    """The names of the failure processes ``world`` turns on."""
    p = world.processes
    return [name for name, on in (("per-tool bases", bool(p.tool_base_success)), ("outages", p.outage_start > 0),
                                  ("rate limits", p.rate_limit_probability > 0), ("latency", bool(p.latency_seconds)))
            if on]


def build_ppo_config(cfg: PPOTrainConfig, stage: int = 0, cluster: bool = False):
    """The RLlib ``PPOConfig`` of a training config (curriculum starting at ``stage``). On a ``cluster``
    failed env runners are restarted; locally they are not (Ray warns about restartable actors)."""
    require_rl()
    from ray.rllib.algorithms.ppo import PPOConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec
    from ray.tune.registry import register_env

    from .callbacks import TrainingCallbacks
    from .module import PlannerModule
    from .wrappers import make_env

    quiet_logs()
    register_env(ENV_NAME, make_env)
    return (
        PPOConfig()
        .environment(ENV_NAME, env_config=cfg.env_config(stage), disable_env_checking=True)
        .env_runners(num_env_runners=cfg.num_env_runners, num_envs_per_env_runner=cfg.num_envs_per_env_runner,
                     rollout_fragment_length="auto")
        .learners(num_learners=cfg.num_learners, num_gpus_per_learner=cfg.num_gpus_per_learner)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=PlannerModule, model_config=cfg.model_config()))
        .training(lr=_learning_rate(cfg), gamma=cfg.gamma, lambda_=cfg.lambda_, clip_param=cfg.clip_param,
                  vf_clip_param=cfg.vf_clip_param, vf_loss_coeff=cfg.vf_loss_coeff,
                  entropy_coeff=cfg.entropy_coeff, use_kl_loss=cfg.use_kl_loss, kl_coeff=cfg.kl_coeff,
                  grad_clip=cfg.grad_clip,
                  train_batch_size_per_learner=cfg.train_batch_size // cfg.learner_count,
                  minibatch_size=cfg.minibatch_size // cfg.learner_count, num_epochs=cfg.num_epochs)
        .callbacks(TrainingCallbacks)
        .fault_tolerance(restart_failed_env_runners=cluster)
        .debugging(seed=cfg.seed, log_level="ERROR")
        .reporting(metrics_num_episodes_for_smoothing=100)
    )


def _learning_rate(cfg: PPOTrainConfig) -> float | list[list[float]]:
    """PPO's learning rate: constant ``finetune_lr`` after cloning, else ``lr`` (decaying to ``lr_end``)."""
    if cfg.cloning:
        return cfg.finetune_lr
    return cfg.lr if cfg.lr_end is None else [[0, cfg.lr], [cfg.lr_decay_steps, cfg.lr_end]]


class RayClusterError(ValueError):
    """The Ray cluster of ``address`` cannot be reached or cannot run the job (one line, naming the field)."""


def required_cpus(cfg: PPOTrainConfig) -> int:
    """CPUs the job's Ray actors reserve: one per env runner and one per CPU learner (a GPU learner takes
    none, as in RLlib). The driver, where learning happens with 0 learners, reserves none."""
    return cfg.num_env_runners + (cfg.num_learners if cfg.num_gpus_per_learner == 0 else 0)


def probe_ray_head(address: str, timeout_s: float = 5.0) -> None:
    """Raise ``RayClusterError`` at once when no Ray head node answers at ``address`` (``auto``, HOST:PORT
    or ray://HOST[:PORT]), or when it refuses this process's credentials (token authentication), instead
    of Ray's minutes of retries. ray:// needs the Ray Client dependencies (``ray[client]``)."""
    import socket

    from ray._private.services import canonicalize_bootstrap_address

    client = address.startswith("ray://")
    if client:
        try:
            import grpc  # noqa: F401 (what ray[client] adds)
        except ImportError:
            import ray

            raise RayClusterError(f"address {address}: ray:// addresses need the Ray Client: "
                                  f"pip install 'ray[client]=={ray.__version__}'") from None
        host, _, port = address.removeprefix("ray://").partition(":")
        target = f"{host}:{port or 10001}"
    else:
        try:
            target = canonicalize_bootstrap_address(address)
        except (ConnectionError, ValueError) as exc:
            raise RayClusterError(f"address {address}: {exc}") from None
        if target is None:  # "local": Ray starts an instance itself
            return
    host, _, port = target.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as exc:
        raise RayClusterError(f"address {address}: no Ray head node answers at {target} ({exc}); start one with "
                              "`ray start --head` or check the address") from None
    if client:
        return
    # ray's _raylet.pyi leaves out the compiled GcsClient.
    from ray._raylet import GcsClient  # pyright: ignore[reportAttributeAccessIssue]
    from ray.exceptions import AuthenticationError

    try:
        GcsClient(address=target)
    except AuthenticationError:
        raise RayClusterError(f"address {address}: the Ray cluster at {target} uses token authentication and "
                              "refused this process: set RAY_AUTH_MODE=token and the cluster's token "
                              "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token)") from None


def check_cluster_resources(cfg: PPOTrainConfig) -> None:
    """Raise ``RayClusterError`` when the job asks for more CPUs or GPUs than the Ray cluster has (RLlib
    would wait for them forever, silently)."""
    import ray

    resources = ray.cluster_resources()
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    learners = cfg.learner_count
    needed = required_cpus(cfg)
    if needed > cpus:
        raise RayClusterError(f"num_env_runners: {cfg.num_env_runners} env runner(s) + "
                              f"{needed - cfg.num_env_runners} CPU learner(s) need {needed} CPU(s), "
                              f"the Ray cluster has {cpus:g}")
    if cfg.num_gpus_per_learner * learners > gpus:
        raise RayClusterError(f"num_gpus_per_learner: {cfg.num_gpus_per_learner} GPU(s) x {learners} "
                              f"learner(s) asked for, the Ray cluster has {gpus:g}")


def init_ray(cfg: PPOTrainConfig, address: str | None = None) -> bool:
    """Start a local Ray instance sized for the job (even when a `ray start` cluster runs on this machine:
    joining one takes ``address``), or join the cluster at ``address`` after probing it; quiet logs, no
    dashboard. Returns False when Ray was already initialised (then it is left as it is). Raises
    ``RayClusterError`` when the cluster cannot be reached or lacks the CPUs or GPUs the job asks for."""
    require_rl()
    import ray

    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.ERROR}
        if address:
            probe_ray_head(address)
            try:
                ray.init(address=address, **kwargs)
            except ConnectionError as exc:
                raise RayClusterError(f"address {address}: {exc}") from None
        else:
            ray.init(address="local", num_cpus=max(os.cpu_count() or 1, required_cpus(cfg), 1), **kwargs)
        started = True
    try:
        check_cluster_resources(cfg)
    except RayClusterError:
        if started:
            ray.shutdown()
        raise
    return started


@cache
def _bound_mean(task_ids: tuple[str, ...], config_json: str, tasks_path: str | None) -> float:
    from ...core.bounds import optimal_success

    # Bounds exist for the test failure profile, the one policies are measured on.
    config = WorldConfig().replace(**json.loads(config_json)).replace(rules={"profile": "test"})
    by_id = {t.instance_id: t for t in load_tasks(tasks_path)}
    return sum(optimal_success(by_id[i], config) for i in task_ids) / len(task_ids)


def bound_iii_mean(tasks: Sequence[Task], cfg: PPOTrainConfig) -> float | None:
    """Mean bound (iii) (exact optimal full success, test failure profile) over the task draw of the envs:
    uniform over ``tasks``, or with ``balance_task_types`` uniform over task types, then tasks. None under
    failure processes: their exact DP takes seconds per task, too long for thousands of training tasks at
    every start (``eval policy`` reports the bound per evaluated task)."""
    if WorldConfig().replace(**cfg.world).processes.active:
        return None
    config_json = json.dumps(cfg.world, sort_keys=True)  # the cache key of the config's bounds
    groups: dict[str, list[str]] = {}
    for t in tasks:
        groups.setdefault(t.task_type if cfg.balance_task_types else "", []).append(t.instance_id)
    return sum(_bound_mean(tuple(ids), config_json, cfg.tasks_path) for ids in groups.values()) / len(groups)


@dataclass
class TrainingState:
    """What a checkpoint adds to RLlib's own state (with the learner count and the batch it was trained
    with, which a resumed run must keep)."""

    iteration: int = 0
    env_steps: int = 0
    train_seconds: float = 0.0
    stage: int = 0
    num_learners: int | None = None  # None: a checkpoint written before these were recorded
    train_batch_size: int | None = None
    validation_seconds: float = 0.0  # the learning curve's validations (cloning's included): within the budget

    @property
    def budget_seconds(self) -> float:
        """The seconds ``time_budget_min`` counts: training (cloning and PPO iterations) and validations."""
        return self.train_seconds + self.validation_seconds


def read_state(checkpoint: Path) -> TrainingState:
    return TrainingState(**json.loads((checkpoint / STATE_FILE).read_text()))


def training_directory(directory: str | Path, cfg: PPOTrainConfig) -> RunDirectory:
    """The RunDirectory of a training run: ``progress.jsonl`` (one row per iteration, after a metadata record
    per session). Resuming with a different training config is refused (``errors.ConfigChanged``), except
    for ``RESUMABLE_CHANGES`` (resources and stopping rules)."""
    return RunDirectory(directory, {"train": cfg.to_dict()}, key=("iteration",), results=PROGRESS_FILE,
                        summary=None, may_change=[f"train.{key}" for key in sorted(RESUMABLE_CHANGES)],
                        restart="use another output directory")


def format_progress(row: dict[str, Any]) -> str:
    """The one-line progress report of an iteration."""
    def num(value: Any, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    stage = f"  stage {row['stage']}" if row.get("stage", -1) >= 0 else ""
    return (f"iter {row['iteration']:>4}  steps {row['env_steps']:>9,}  return {num(row['return_mean'], '.3f')}  "
            f"full {num(row['full_success'], '.3f')}  full/iii {num(row['full_over_bound_iii'], '.3f')}{stage}  "
            f"{num(row['env_steps_per_s'], ',.0f')} steps/s  {row['train_seconds'] / 60:.1f} min")


def train(cfg: PPOTrainConfig, output_dir: str | Path, resume: bool = False, address: str | None = None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train until ``cfg.iterations`` or ``cfg.time_budget_min`` (at least one must be set); returns the last
    progress row with ``checkpoint`` (the final checkpoint's path). With ``resume``, continue from the newest
    checkpoint in ``output_dir`` (iteration count, env steps, training time and curriculum stage carry on;
    iterations logged after that checkpoint are run again and logged again). The directory is locked while
    training (``rundir.RunDirectory``); Ctrl-C leaves it resumable (``errors.RunInterrupted``)."""
    if cfg.iterations is None and cfg.time_budget_min is None:
        raise ValueError("set iterations or time_budget_min (or both)")
    directory = Path(output_dir)
    record_path = directory / TRAINING_FILE
    record = json.loads(record_path.read_text()) if resume and record_path.is_file() else None
    if record is None and ((directory / CHECKPOINTS).exists() or record_path.exists()):
        raise RunDirectoryError(f"{directory} already holds a training run; resume it or use another directory")
    with training_directory(directory, cfg).session(resume=record is not None) as run:
        return _train(cfg, run, record, address, log)


def _train(cfg: PPOTrainConfig, run: RunDirectory, record: dict[str, Any] | None, address: str | None,
           log: Callable[[str], None]) -> dict[str, Any]:
    """``train`` in its locked directory (``record``: its training.json when resuming)."""
    import torch

    directory = run.path
    record_path = directory / TRAINING_FILE
    checkpoint = latest_checkpoint(directory) if record is not None else None
    state = read_state(checkpoint) if checkpoint else TrainingState()
    tasks = cfg.training_tasks()
    pools = stage_pools(tasks) if cfg.curriculum else None
    torch.set_num_threads(cfg.num_torch_threads)  # more threads than cores spin and stall on small batches
    started_ray = init_ray(cfg, address)
    algo = None
    row: dict[str, Any] = {}
    try:
        algo = build_ppo_config(cfg, state.stage, cluster=address is not None).build_algo()
        if checkpoint is not None:
            restore_algorithm(algo, checkpoint)
            log(f"resumed from {checkpoint} (iteration {algo.iteration}, {state.env_steps:,} env steps, "
                f"{state.train_seconds / 60:.1f} min)")
        session = run_metadata({"train": cfg.to_dict(), "world": cfg.world_config().to_dict(),
                                "task_count": len(tasks)}, [cfg.seed],
                               extra={"resumed_from": str(checkpoint) if checkpoint else None})
        record = record or {"train": cfg.to_dict(), "sessions": []}
        record["train"] = cfg.to_dict()
        record["sessions"].append(session)
        validation, module = _validation(cfg, record, log)
        if cfg.cloning and checkpoint is None:
            record["warm_start"] = _clone(cfg, algo, module, tasks, validation, log)
            state.train_seconds = record["warm_start"]["seconds"]
            state.validation_seconds = record["warm_start"]["validation_seconds"]
            save_checkpoint(algo, directory, state, cfg.keep_checkpoints)  # iter_000000: the cloned policy
            if validation is not None:  # the curve's first point, drawn even if cloning spends the budget
                _draw_curve(run, record, validation, cfg)
        write_json_atomic(record_path, record)
        run.open_results(session)

        bounds: dict[int, float | None] = {}

        def bound_for(stage: int) -> float | None:
            if stage not in bounds:
                bounds[stage] = bound_iii_mean(pools[stage] if pools and stage >= 0 else tasks, cfg)
            return bounds[stage]

        bound_for(state.stage if cfg.curriculum else -1)
        budget_s = cfg.time_budget_min * 60 if cfg.time_budget_min is not None else None
        last_saved, last_validated = algo.iteration, state.train_seconds

        def more() -> bool:
            return (cfg.iterations is None or algo.iteration < cfg.iterations) and (
                budget_s is None or state.budget_seconds < budget_s)

        while more():
            started = time.perf_counter()
            result = algo.train()
            elapsed = time.perf_counter() - started
            row = _progress_row(result, state, elapsed, bound_for(state.stage if cfg.curriculum else -1),
                                cfg.curriculum)
            state = TrainingState(row["iteration"], row["env_steps"], row["train_seconds"],
                                  result["resilibench"]["stage"] if cfg.curriculum else 0,
                                  cfg.num_learners, cfg.train_batch_size, state.validation_seconds)
            if validation is not None and (not more() or
                                           state.train_seconds - last_validated >= cfg.validation_every_min * 60):
                validating = time.perf_counter()
                row["validation_full"] = _validate(algo, module, validation)
                state.validation_seconds += time.perf_counter() - validating
                last_validated = state.train_seconds
            row["validation_seconds"] = state.validation_seconds
            run.write(row)
            log(format_progress(row))
            if validation is not None and "validation_full" in row:
                log(f"validation: full success {row['validation_full']:.3f} (bound (iii) {validation.bound:.3f}, "
                    f"process-aware heuristic {validation.heuristic:.3f}) on {len(validation.tasks)} tasks")
                _draw_curve(run, record, validation, cfg)
            if algo.iteration - last_saved >= cfg.checkpoint_every:
                save_checkpoint(algo, directory, state, cfg.keep_checkpoints)
                last_saved = algo.iteration
        if row or checkpoint is None:
            row["checkpoint"] = str(save_checkpoint(algo, directory, state, cfg.keep_checkpoints))
        else:  # nothing left to do
            row = {"iteration": state.iteration, "env_steps": state.env_steps, "train_seconds": state.train_seconds,
                   "validation_seconds": state.validation_seconds, "checkpoint": str(checkpoint)}
    finally:
        if algo is not None:
            algo.stop()
        if started_ray:
            import ray

            ray.shutdown()
    return row


def _validation(cfg: PPOTrainConfig, record: dict[str, Any], log: Callable[[str], None]) -> tuple[Any, Any]:
    """The held-out ``Validation`` of the learning curve and the module it evaluates (None, None without
    validation tasks); its baselines go into ``record``."""
    if not cfg.validation_tasks and not cfg.cloning:
        return None, None
    from .warm_start import Validation, build_module

    module = build_module(cfg.model_config(), cfg.env_config())
    if not cfg.validation_tasks:
        return None, module
    tasks = load_tasks(cfg.tasks_path, "validation", cfg.task_types)
    validation = Validation(tasks, cfg.validation_tasks, cfg.world_config().replace(rules={"profile": "test"}),
                            cfg.validation_scoring)
    record["validation"] = {"tasks": len(validation.tasks), "episodes": validation.episodes,
                            "bound_iii": validation.bound, "process_aware": validation.heuristic}
    log(f"validation tasks: {len(validation.tasks)} ({validation.scoring}), bound (iii) {validation.bound:.3f}, "
        f"process-aware heuristic {validation.heuristic:.3f}")
    return validation, module


def _clone(cfg: PPOTrainConfig, algo: Any, module: Any, tasks: list[Task], validation: Any,
           log: Callable[[str], None]) -> dict[str, Any]:
    """Behaviour cloning of the optimal policy into ``module``, then into the algorithm's learner and env
    runners; what training.json records of it."""
    from ...core.tasks.library import interleave_task_types
    from .warm_start import behaviour_clone, expert_samples

    started = time.perf_counter()
    samples = expert_samples(interleave_task_types(tasks)[:cfg.bc_tasks], cfg.bc_seeds, cfg.world_config(),
                             cfg.features, cfg.gamma)
    agreement = behaviour_clone(module, samples, cfg.bc_epochs, cfg.bc_lr, seed=cfg.seed)
    seconds = time.perf_counter() - started
    load_weights(algo, module.get_state())
    done = {"decisions": len(samples["action"]), "tasks": min(cfg.bc_tasks, len(tasks)), "seeds": cfg.bc_seeds,
            "agreement": agreement, "seconds": seconds,
            "validation_full": validation(module) if validation is not None else None}
    done["validation_seconds"] = time.perf_counter() - started - seconds
    log(f"behaviour cloning: {done['decisions']:,} optimal decisions ({done['tasks']} tasks x {cfg.bc_seeds} seeds), "
        f"greedy agreement {agreement:.3f}, {seconds / 60:.1f} min"
        + (f"; validation full success {done['validation_full']:.3f}" if validation is not None else ""))
    return done


def _validate(algo: Any, module: Any, validation: Any) -> float:
    """The validation full success of the learner's current policy."""
    module.set_state(_learner_weights(algo))
    return validation(module)


def _draw_curve(run: RunDirectory, record: dict[str, Any], validation: Any, cfg: PPOTrainConfig) -> None:
    """DIR/learning_curve.png from the progress rows so far (and the cloning's point)."""
    from .warm_start import plot_learning_curve

    points = [r for r in run.rows() if r.get("validation_full") is not None]
    cloned = record.get("warm_start")
    if cloned and cloned.get("validation_full") is not None:
        points.insert(0, {"train_seconds": cloned["seconds"], "validation_full": cloned["validation_full"]})
    world = ", ".join(failure_processes(cfg.world_config())) or "no failure processes"
    plot_learning_curve(points, run.path / "learning_curve.png", validation.bound, validation.heuristic,
                        f"{'BC + PPO' if cfg.cloning else 'PPO'} ({world}; features {cfg.features})",
                        validation.scoring)


def _progress_row(result: dict[str, Any], before: TrainingState, elapsed: float, bound: float | None,
                  curriculum: bool) -> dict[str, Any]:
    """The progress row of one iteration (``before``: the state at its start)."""
    mine = result.get("resilibench", {})
    runners = result["env_runners"]
    steps = int(runners.get("num_env_steps_sampled_lifetime", 0))
    full = mine.get("full_success")
    return {
        "iteration": int(result["training_iteration"]), "env_steps": steps,
        "return_mean": _finite(runners.get("episode_return_mean")),
        "episodes": mine.get("episodes"), "full_success": full,
        "bound_iii": bound, "full_over_bound_iii": None if full is None or bound is None else full / bound,
        "stage": before.stage if curriculum else -1, "stage_success": mine.get("stage_success"),
        "env_steps_per_s": (steps - before.env_steps) / elapsed if elapsed > 0 else None,
        "iteration_seconds": elapsed, "train_seconds": before.train_seconds + elapsed,
    }


def _finite(value: Any) -> float | None:
    import math

    return float(value) if value is not None and math.isfinite(float(value)) else None


def restore_algorithm(algo: Any, checkpoint: Path) -> None:
    """Load a checkpoint into a built algorithm and give every env runner the restored weights at once.

    ``Algorithm.restore_from_path`` sends the weights to remote env runners asynchronously, and RLlib
    drops that request while the build's own weight sync is still counted in flight: the runners would
    then sample with fresh random weights while the learner trains the restored ones."""
    algo.restore_from_path(str(checkpoint.resolve()))
    _push_to_env_runners(algo, _learner_weights(algo))


def _learner_weights(algo: Any) -> dict[str, Any]:
    """The learner's module weights (inference part)."""
    from ray.rllib.core import COMPONENT_LEARNER, COMPONENT_RL_MODULE, DEFAULT_MODULE_ID

    state = algo.learner_group.get_state(components=f"{COMPONENT_LEARNER}/{COMPONENT_RL_MODULE}",
                                         inference_only=True)
    return state[COMPONENT_LEARNER][COMPONENT_RL_MODULE][DEFAULT_MODULE_ID]


def _push_to_env_runners(algo: Any, weights: dict[str, Any]) -> None:
    def load(runner: Any) -> None:
        if getattr(runner, "module", None) is not None:
            runner.module.set_state(weights)

    algo.env_runner_group.foreach_env_runner(load, local_env_runner=True)


def load_weights(algo: Any, weights: dict[str, Any]) -> None:
    """Give the learner(s) and every env runner the module weights ``weights`` (a module's ``get_state``)."""
    from ray.rllib.core import DEFAULT_MODULE_ID

    algo.learner_group.foreach_learner(lambda learner: learner.module[DEFAULT_MODULE_ID].set_state(weights))
    _push_to_env_runners(algo, weights)


def save_checkpoint(algo: Any, directory: Path, state: TrainingState, keep: int = 3) -> Path:
    """Write an RLlib checkpoint with its state.json, point latest.json at it, and delete all but the
    ``keep`` newest checkpoints and ``iter_000000`` (the cloned policy of a warm start, "BC alone")."""
    import shutil

    name = f"iter_{state.iteration:06d}"
    path = directory / CHECKPOINTS / name
    algo.save_to_path(str(path.resolve()))
    write_json_atomic(path / STATE_FILE, dataclasses.asdict(state))
    write_json_atomic(directory / CHECKPOINTS / LATEST, {"checkpoint": name, "iteration": state.iteration})
    for old in sorted((directory / CHECKPOINTS).glob("iter_*"))[:-keep]:
        if old.name != CLONED:
            shutil.rmtree(old)
    return path
