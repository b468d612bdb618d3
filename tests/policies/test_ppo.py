"""PPO planners with real RLlib: training, checkpoints, resume, masking, curriculum, eval policy, CLI errors.

One local Ray instance (2 CPUs) serves the module's training tests, which are in the slow lane (Ray's
start alone takes seconds); the wrappers, the masked module, the curriculum rule and the CLI's checks of
its arguments run without Ray in the fast lane.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("ray.rllib")
torch = pytest.importorskip("torch")

from helpers import make_task  # noqa: E402
from resilibench.cli import main  # noqa: E402
from resilibench.core.bounds import exact_bound, exact_policy_success, optimal_success  # noqa: E402
from resilibench.core.config import WorldConfig  # noqa: E402
from resilibench.core.registry import default_registry  # noqa: E402
from resilibench.core.world import load_tasks  # noqa: E402
from resilibench.envs.planner.env import ResiliBenchEnv  # noqa: E402
from resilibench.errors import ConfigChanged  # noqa: E402
from resilibench.policies.optimal import OptimalPlanner  # noqa: E402
from resilibench.policies.ppo import latest_checkpoint  # noqa: E402
from resilibench.policies.ppo.curriculum import (  # noqa: E402
    STAGES,
    CurriculumConfig,
    CurriculumTracker,
    next_stage,
    stage_pools,
    stage_success,
)
from resilibench.policies.ppo.evaluation import (  # noqa: E402
    PPOPlanner,
    compare_workflows,
    policy_workflow,
    resolve_checkpoint,
)
from resilibench.policies.ppo.training import (  # noqa: E402
    PPOTrainConfig,
    build_ppo_config,
    read_state,
    restore_algorithm,
    train,
    training_directory,
)
from resilibench.policies.ppo.wrappers import ACTION_MASK, OBSERVATIONS, MaskedPlannerEnv, episode_observation  # noqa: E402
from resilibench.results import read_jsonl  # noqa: E402

TYPE = "simple_data_transformation"  # small pool, few distinct bound problems: fast bounds
TINY = {"d_model": 16, "n_heads": 2, "n_layers": 1, "ff_dim": 32, "value_hiddens": (16,),
        "train_batch_size": 256, "minibatch_size": 128, "num_epochs": 1, "num_env_runners": 0,
        "num_envs_per_env_runner": 4, "task_types": (TYPE,), "checkpoint_every": 1, "validation_tasks": 0}
TINY_FLAGS = ["--task-type", TYPE, "--num-env-runners", "0", "--num-envs-per-env-runner", "4",
              "--checkpoint-every", "1", *[x for k in ("d_model", "n_heads", "n_layers", "ff_dim", "train_batch_size",
                                                          "minibatch_size", "num_epochs")
                                          for x in ("--set", f"{k}={TINY[k]}")],
              "--set", "value_hiddens=[16]", "--set", "validation_tasks=0"]


@pytest.fixture(scope="module")
def ray_session():
    """A local Ray instance for the module (never a `ray start` cluster on the machine), shut down after."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def trained(ray_session, tmp_path_factory) -> Path:
    """Two real PPO iterations through the CLI (checkpoint after each)."""
    out = tmp_path_factory.mktemp("ppo") / "run"
    assert main(["train", "ppo", "--iterations", "2", "--output-dir", str(out), *TINY_FLAGS]) == 0
    return out


def _masked_steps(env: gym.Env, planner, seeds):
    """(observation, action mask, chosen action) of greedy episodes of ``planner``."""
    out = []
    for seed in seeds:
        obs, info = env.reset(seed=seed)
        planner.reset(env.unwrapped.episode.task, np.random.default_rng(seed))
        done = False
        while not done:
            action = planner.act(env.unwrapped.episode, obs)
            out.append((obs, info["action_mask"].copy(), action))
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
    return out


# --- wrapper and observation ---------------------------------------------------------------------------


def test_episode_observation_matches_the_env_step_for_step():
    env = ResiliBenchEnv(split="test")
    rng = np.random.default_rng(0)
    for seed in range(20):
        obs, info = env.reset(seed=seed)
        while True:
            assert np.array_equal(episode_observation(env.episode), obs)
            legal = np.flatnonzero(info["action_mask"])
            obs, _, terminated, truncated, info = env.step(int(rng.choice(legal)))
            if terminated or truncated:
                break


def test_observation_without_dependency_hints_keeps_the_task_and_drops_the_hints():
    """The ablation's observation: the required order in place of the next-required one-hot (fixed for the
    episode), the dependency task features zero, everything else as the full observation; and
    ``episode_observation`` recomputes it step for step."""
    from resilibench.envs.planner.observation import DEPENDENCY_TASK_FEATURES
    from resilibench.policies.heuristics import DependencyAwarePlanner

    full, ablated = ResiliBenchEnv(split="test"), ResiliBenchEnv(split="test", features="no_dependency_hints")
    lay = full.layout
    hint_cells = [*range(lay.next_required, lay.progress), *(lay.task + i for i in DEPENDENCY_TASK_FEATURES)]
    planner = DependencyAwarePlanner()
    dependency_features_seen = 0
    for seed in range(30):
        obs_f, info = full.reset(seed=seed)
        obs_a, _ = ablated.reset(seed=seed)
        episode = ablated.episode
        required = episode.required
        order = np.zeros(lay.n_tools, dtype=np.float32)
        order[list(required)] = (np.arange(len(required)) + 1) / len(required)
        dependency_features_seen += obs_f[[lay.task + i for i in DEPENDENCY_TASK_FEATURES]].any()
        planner.reset(episode.task, np.random.default_rng(seed))
        while True:
            assert np.array_equal(np.delete(obs_a, hint_cells), np.delete(obs_f, hint_cells))
            assert np.array_equal(obs_a[lay.next_required:lay.progress], order)
            assert not obs_a[[lay.task + i for i in DEPENDENCY_TASK_FEATURES]].any()
            assert np.array_equal(episode_observation(episode, features="no_dependency_hints"), obs_a)
            action = planner.act(episode, None)
            obs_f, _, terminated, truncated, info = full.step(action)
            obs_a, _, _, _, _ = ablated.step(action)
            if terminated or truncated:
                break
    assert dependency_features_seen > 0  # the full observation did carry them
    with pytest.raises(ValueError, match="features must be one of"):
        ResiliBenchEnv(features="no_hints")


def test_masked_env_keeps_the_contract_and_moves_the_mask_into_the_observation():
    inner, wrapped = ResiliBenchEnv(split="test"), MaskedPlannerEnv(ResiliBenchEnv(split="test"))
    assert wrapped.observation_space[ACTION_MASK].shape == (31,)
    obs_a, info_a = inner.reset(seed=3)
    obs_b, info_b = wrapped.reset(seed=3)
    assert np.array_equal(obs_a, obs_b[OBSERVATIONS]) and wrapped.observation_space.contains(obs_b)
    while True:
        action = int(np.flatnonzero(info_a["action_mask"])[0])
        assert np.array_equal(obs_b[ACTION_MASK], info_a["action_mask"].astype(np.float32))
        obs_a, r_a, t_a, tr_a, info_a = inner.step(action)
        obs_b, r_b, t_b, tr_b, info_b = wrapped.step(action)
        assert np.array_equal(obs_a, obs_b[OBSERVATIONS]) and (r_a, t_a, tr_a) == (r_b, t_b, tr_b)
        if t_a or tr_a:
            break
    assert info_b["level"] == info_a["level"] and info_b["stage"] == -1
    assert 0.0 <= info_b["progress"] <= info_b["coverage"] <= 1.0


def test_balanced_task_types_are_drawn_uniformly_and_reproducibly():
    from collections import Counter

    def types(seed: int) -> list[str]:
        env = MaskedPlannerEnv(ResiliBenchEnv(split="train"), balance_task_types=True)
        drawn = [env.reset(seed=seed)[1]["task_type"]]
        drawn += [env.reset()[1]["task_type"] for _ in range(999)]
        return drawn

    drawn = types(7)
    assert drawn == types(7) and drawn != types(8)
    counts = Counter(drawn)
    assert len(counts) == 5 and min(counts.values()) > 150  # uniform: 200 each; uniform over tasks: 64 simple
    env = MaskedPlannerEnv(ResiliBenchEnv(split="train"), balance_task_types=True)
    pinned = load_tasks(split="train")[5]
    assert env.reset(seed=0, options={"task_id": pinned.instance_id})[1]["task_type"] == pinned.task_type


# --- curriculum ----------------------------------------------------------------------------------------


def test_curriculum_transition_rule():
    config = CurriculumConfig()
    assert next_stage(0, 49, 49, config) == 0  # too few episodes, however good
    assert next_stage(0, 36, 50, config) == 1  # 0.72 > 0.7
    assert next_stage(1, 35, 50, config) == 1  # 0.70 is not above 0.7
    assert next_stage(2, 14, 50, config) == 1  # 0.28 < 0.3
    assert next_stage(0, 0, 60, config) == 0 and next_stage(4, 60, 60, config) == 4  # clamped
    tracker = CurriculumTracker(0, CurriculumConfig(min_episodes=3, window=4))
    for success in (True, True, False):
        tracker.record(0, success)
    tracker.record(1, False)  # an episode of another stage does not count
    assert tracker.rate == pytest.approx(2 / 3) and not tracker.update()
    tracker.record(0, True)
    assert tracker.update() and tracker.stage == 1 and tracker.rate is None  # 3/4 > 0.7; window restarts


def test_table_12_thresholds_and_stage_pools():
    assert [s.required_coverage for s in STAGES] == [0.2, 0.4, 0.7, 0.9, 1.0]
    assert [s.max_errors for s in STAGES] == [50, 30, 20, 15, 10]
    assert stage_success(0, progress=0.1, coverage=0.2, errors=50)
    assert not stage_success(4, progress=1.0, coverage=0.9, errors=0)
    assert not stage_success(3, progress=0.6, coverage=1.0, errors=0)
    tasks = load_tasks(split="train")
    pools = stage_pools(tasks)
    assert {t.complexity for t in pools[0]} == {"easy"} and {t.complexity for t in pools[1]} == {"easy", "medium"}
    assert len(pools[4]) == len(tasks)
    hard_only = [t for t in tasks if t.complexity == "hard"]
    assert stage_pools(hard_only)[0] == hard_only  # nothing easy: the stage trains on what there is
    with pytest.raises(ValueError, match="regress < advance"):
        CurriculumConfig(advance=0.2, regress=0.3)


@pytest.mark.slow
def test_curriculum_callback_advances_on_a_real_iteration(ray_session):
    cfg = PPOTrainConfig(**TINY, curriculum=True, curriculum_config={"advance": 0.05, "regress": 0.0,
                                                                     "min_episodes": 5, "window": 50})
    algo = build_ppo_config(cfg).build_algo()
    try:
        env = algo.env_runner.env.unwrapped.envs[0]
        assert env.get_wrapper_attr("stage") == 0
        assert {t.complexity for t in env.unwrapped.tasks} == {"easy"}
        result = algo.train()
        summary = result["resilibench"]
        # Stage 0 counts an episode as a success with one required tool done: a random policy clears 0.05.
        assert summary["stage"] == 1 and summary["episodes"] > 5
        assert env.get_wrapper_attr("stage") == 1
    finally:
        algo.stop()


# --- masking -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("encoder", ["pooled", "transformer", "mlp"])
def test_masked_logits_never_sample_illegal_actions(encoder):
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.distribution.torch.torch_distribution import TorchCategorical

    from resilibench.policies.ppo.module import PlannerModule

    env = MaskedPlannerEnv(ResiliBenchEnv(split="test"))
    module = PlannerModule(observation_space=env.observation_space, action_space=env.action_space,
                           model_config={"encoder": encoder, "d_model": 16, "n_heads": 2, "n_layers": 1})
    rng = np.random.default_rng(0)
    masks = (rng.random((256, 31)) < 0.2).astype(np.float32)
    masks[:, 30] = 1.0
    masks[:8] = 0.0
    masks[:8, 5] = 1.0  # a single legal action
    batch = {Columns.OBS: {OBSERVATIONS: torch.rand(256, 204), ACTION_MASK: torch.as_tensor(masks)}}
    for forward in (module.forward_exploration, module.forward_inference, module.forward_train):
        with torch.no_grad():
            logits = forward(batch)[Columns.ACTION_DIST_INPUTS]
        dist = TorchCategorical(logits=logits)
        samples = torch.stack([dist.sample() for _ in range(50)]).numpy()
        assert masks[np.arange(256), samples].all()
        assert masks[np.arange(256), logits.argmax(-1).numpy()].all()
        assert torch.isfinite(dist.entropy()).all()
    assert (logits[:8].argmax(-1) == 5).all()


def test_a_checkpoint_of_the_earlier_default_network_still_loads(tmp_path):
    """A module saved with the transformer of the earlier defaults (d_model 32, ff_dim 64) loads with its own
    model_config and plays legal actions; its weights in a module of the new default (pooled) are refused
    with a clear error instead of being skipped silently."""
    from ray.rllib.core.rl_module.rl_module import RLModule

    from resilibench.policies.ppo.module import PlannerModule

    env = MaskedPlannerEnv(ResiliBenchEnv(split="test"))
    earlier = {"encoder": "transformer", "d_model": 32, "n_heads": 2, "n_layers": 1, "ff_dim": 64,
               "mlp_hiddens": [256, 256], "value_hiddens": [64], "features": "full"}
    module = PlannerModule(observation_space=env.observation_space, action_space=env.action_space,
                           model_config=earlier)
    module.save_to_path(str(tmp_path))
    loaded = RLModule.from_checkpoint(str(tmp_path))  # as PPOPlanner loads a checkpoint's module
    assert isinstance(loaded, PlannerModule)
    assert loaded.model_config["encoder"] == "transformer"
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), module.state_dict().values(),
                                                 strict=True))
    steps = _masked_steps(ResiliBenchEnv(split="test"), PPOPlanner("earlier", module=loaded), range(3))
    assert steps and all(mask[action] == 1 for _obs, mask, action in steps)
    for config, message in (({}, "missing"), ({"encoder": "transformer"}, "size mismatch")):
        fresh = PlannerModule(observation_space=env.observation_space, action_space=env.action_space,
                              model_config=config)
        with pytest.raises(ValueError, match=f"do not fit this PlannerModule.*{message}"):
            fresh.set_state(module.get_state())


def test_training_bound_is_left_out_under_failure_processes():
    """The progress lines' bound (iii) mean is the v1 DP's; under failure processes it is None (the
    process DP takes seconds per task), and the row's full/iii is then None too."""
    from resilibench.policies.ppo.training import bound_iii_mean

    tasks = load_tasks(split="train")[:5]
    assert 0 < bound_iii_mean(tasks, PPOTrainConfig()) <= 1
    assert bound_iii_mean(tasks, PPOTrainConfig(world={"processes": {"outage_start": 0.1}})) is None


@pytest.mark.parametrize("encoder", ["pooled", "transformer", "mlp"])
def test_module_reads_the_failure_process_blocks(encoder):
    """Under failure processes the module takes the longer observation, its logits depend on the process
    blocks (rate-limit waits, outages), and its greedy policy plays legal actions in that world."""
    from ray.rllib.core.columns import Columns

    from resilibench.core.config import WorldConfig
    from resilibench.policies.ppo.module import PlannerModule

    config = WorldConfig().replace(processes={"rate_limit_probability": 0.3, "rate_limit_wait": 2,
                                              "outage_start": 0.2, "outage_end": 0.5})
    env = MaskedPlannerEnv(ResiliBenchEnv(split="test", config=config))
    module = PlannerModule(observation_space=env.observation_space, action_space=env.action_space,
                           model_config={"encoder": encoder, "d_model": 16, "n_heads": 2, "n_layers": 1})
    lay = module.layout
    assert lay.processes and env.observation_space[OBSERVATIONS].shape == (lay.size,) and lay.size > 204
    obs = torch.rand(4, lay.size)
    changed = obs.clone()
    changed[:, lay.blocked:lay.time_left] = 1.0 - changed[:, lay.blocked:lay.time_left]
    with torch.no_grad():
        before, after = (module.forward_inference({Columns.OBS: {OBSERVATIONS: o, ACTION_MASK: torch.ones(4, 31)}})
                         [Columns.ACTION_DIST_INPUTS] for o in (obs, changed))
    assert not torch.allclose(before, after)
    planner = PPOPlanner("untrained", module=module)
    steps = _masked_steps(ResiliBenchEnv(split="test", config=config), planner, range(5))
    assert steps and all(mask[action] == 1 for _obs, mask, action in steps)


@pytest.mark.slow
def test_rllib_sampling_and_restored_greedy_policy_stay_legal(trained):
    from ray.rllib.algorithms.algorithm import Algorithm

    checkpoint = resolve_checkpoint(trained)
    algo = Algorithm.from_checkpoint(str(checkpoint.resolve()))
    try:
        episodes = algo.env_runner.sample(num_timesteps=300, explore=True)
        steps = 0
        for episode in episodes:
            masks, actions = episode.get_observations()[ACTION_MASK], episode.get_actions()
            assert len(actions) == len(masks) - 1  # one observation more than actions
            assert (masks[np.arange(len(actions)), actions] == 1.0).all()
            steps += len(actions)
        assert steps >= 300
    finally:
        algo.stop()
    planner = PPOPlanner(trained)
    for _obs, mask, action in _masked_steps(ResiliBenchEnv(split="test"), planner, range(40)):
        assert mask[action] == 1


# --- training, checkpoints, resume ---------------------------------------------------------------------


@pytest.mark.slow
def test_training_writes_progress_config_and_checkpoints(trained):
    contents = read_jsonl(trained / "progress.jsonl")
    assert [r["iteration"] for r in contents.rows] == [1, 2]
    assert contents.rows[1]["env_steps"] > contents.rows[0]["env_steps"] >= 256
    for row in contents.rows:
        assert row["bound_iii"] == pytest.approx(np.mean([optimal_success(t) for t in load_tasks(split="train",
                                                                                                task_types=[TYPE])]))
        assert 0.0 <= row["full_success"] <= 1.0 and row["env_steps_per_s"] > 0
    record = json.loads((trained / "training.json").read_text())
    assert record["train"]["task_types"] == [TYPE] and record["train"]["d_model"] == 16
    assert record["sessions"][0]["packages"]["ray"] and contents.metadata[0]["git_revision"]
    assert latest_checkpoint(trained).name == "iter_000002"
    assert read_state(latest_checkpoint(trained)).iteration == 2
    assert (trained / "checkpoints" / "iter_000001" / "rllib_checkpoint.json").is_file()


@pytest.mark.slow
def test_checkpoint_round_trip_gives_the_same_greedy_actions(trained, tmp_path):
    from ray.rllib.algorithms.algorithm import Algorithm

    checkpoint = resolve_checkpoint(trained)
    planner = PPOPlanner(checkpoint)
    steps = _masked_steps(ResiliBenchEnv(split="test"), planner, range(10))
    obs = np.stack([s[0] for s in steps])
    masks = np.stack([s[1] for s in steps])
    algo = Algorithm.from_checkpoint(str(checkpoint.resolve()))
    try:
        live = algo.get_module()
        with torch.no_grad():
            live_actions = live.greedy_actions(torch.as_tensor(obs), torch.as_tensor(masks, dtype=torch.float32))
        assert live_actions.tolist() == [s[2] for s in steps]
        algo.save_to_path(str(tmp_path / "again"))
    finally:
        algo.stop()
    assert PPOPlanner(tmp_path / "again").actions(obs, masks) == [s[2] for s in steps]


@pytest.mark.slow
def test_resume_continues_the_iteration_count(trained, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    cfg = PPOTrainConfig(**TINY, iterations=3)
    lines = []
    row = train(cfg, copy, resume=True, log=lines.append)
    assert lines[0].startswith("resumed from") and row["iteration"] == 3
    rows = read_jsonl(copy / "progress.jsonl").rows
    assert [r["iteration"] for r in rows] == [1, 2, 3] and rows[2]["env_steps"] > rows[1]["env_steps"]
    assert latest_checkpoint(copy).name == "iter_000003"
    assert len(json.loads((copy / "training.json").read_text())["sessions"]) == 2
    # The env runners (one remote here) sample with the restored weights, not fresh ones.
    algo = build_ppo_config(PPOTrainConfig(**{**TINY, "num_env_runners": 1})).build_algo()
    try:
        restore_algorithm(algo, latest_checkpoint(copy))
        saved = PPOPlanner(copy).module.state_dict()
        for runner in algo.env_runner_group.foreach_env_runner(lambda r: r.module.state_dict(),
                                                              local_env_runner=False):
            assert set(runner) <= set(saved) and all(torch.equal(runner[k], saved[k]) for k in runner)
    finally:
        algo.stop()
    with pytest.raises(ConfigChanged, match=r"different config \(train\.lr: "):
        training_directory(copy, PPOTrainConfig(**TINY, lr=0.01)).check()
    training_directory(copy, PPOTrainConfig(**{**TINY, "num_env_runners": 2})).check()  # resources may change


@pytest.mark.slow
def test_the_batch_is_split_across_learners_and_the_learner_count_is_kept_on_resume(trained, tmp_path):
    """train_batch_size is the env steps of an iteration whatever the learner count (docs/policies/ppo.md); a resume
    with another learner count is refused with the change."""
    for learners in (0, 1, 2, 4):
        config = build_ppo_config(PPOTrainConfig(**{**TINY, "num_learners": learners}))
        assert config.total_train_batch_size == TINY["train_batch_size"]
        assert config.minibatch_size * max(learners, 1) == TINY["minibatch_size"]
    with pytest.raises(ValueError, match=r"train_batch_size: must be a multiple of the learner count \(3\)"):
        PPOTrainConfig(**{**TINY, "num_learners": 3})
    state = read_state(latest_checkpoint(trained))
    assert (state.num_learners, state.train_batch_size) == (0, TINY["train_batch_size"])
    copy = tmp_path / "run"
    shutil.copytree(trained, copy)
    with pytest.raises(ValueError, match="different config .*num_learners: 0 -> 2"):
        train(PPOTrainConfig(**{**TINY, "num_learners": 2, "iterations": 3}), copy, resume=True)


@pytest.mark.slow
def test_more_cpus_than_ray_has_are_refused_up_front(ray_session):
    from resilibench.policies.ppo.training import RayClusterError, init_ray

    with pytest.raises(RayClusterError, match=r"num_env_runners: 2 env runner\(s\) \+ 1 CPU learner\(s\) need "
                                              r"3 CPU\(s\), the Ray cluster has 2"):
        init_ray(PPOTrainConfig(**{**TINY, "num_env_runners": 2, "num_learners": 1}))
    assert init_ray(PPOTrainConfig(**{**TINY, "num_env_runners": 1, "num_learners": 1})) is False  # 2 fit


# --- evaluation ----------------------------------------------------------------------------------------


@pytest.mark.slow
def test_eval_policy_writes_the_run_files_and_workflows(trained, tmp_path, capsys):
    out, workflows = tmp_path / "eval", tmp_path / "workflows.json"
    args = ["eval", "policy", str(trained), "--task-type", TYPE, "--limit", "3", "--seeds", "0", "1",
            "--output-dir", str(out), "--export-workflows", str(workflows)]
    assert main(args) == 0
    contents = read_jsonl(out / "results.jsonl")
    assert len(contents.rows) == 6 and {r["planner"] for r in contents.rows} == {"ppo"}
    assert contents.metadata[0]["config"]["policy"]["sha256"]
    summary = json.loads((out / "summary.json").read_text())
    assert "ppo" in summary["overall"] and (out / "summary.png").stat().st_size > 0
    exported = json.loads(workflows.read_text())
    assert len(exported["tasks"]) == 3 and exported["metadata"]["config"]["policy"]["sha256"]
    for row in exported["tasks"]:
        assert 0.0 <= row["policy_success"] <= row["bound_iii"] + 1e-12
    assert "ppo exact" in capsys.readouterr().out
    assert main(args) == 0  # resumes: nothing new to run
    assert len(read_jsonl(out / "results.jsonl").rows) == 6


def test_workflow_export_of_the_optimal_planner_matches_the_reference():
    planner = OptimalPlanner()
    tasks = load_tasks(split="test", task_types=[TYPE])[:4] + [make_task()]
    comparison = compare_workflows(planner, tasks)
    assert comparison["summary"]["all"]["match_rate"] == 1.0
    assert comparison["summary"]["all"]["success_gap"] == pytest.approx(0.0, abs=1e-12)
    registry = default_registry()
    happy = tuple(registry.names[t] for t in exact_bound(tasks[-1]).happy_path())
    assert policy_workflow(planner, tasks[-1]).tools == happy and len(happy) > len(tasks[-1].required_tools)


@pytest.mark.slow
def test_training_without_dependency_hints_builds_and_plays_the_ablated_policy(ray_session, tmp_path):
    """`train ppo --features no_dependency_hints`: the config, the envs and the network drop the hints, and
    the trained planner computes its own ablated observations when an env hands it full ones."""
    from resilibench.envs.planner.observation import N_STATUS

    out = tmp_path / "run"
    assert main(["train", "ppo", "--iterations", "1", "--features", "no_dependency_hints", "--output-dir",
                 str(out), *TINY_FLAGS]) == 0
    assert json.loads((out / "training.json").read_text())["train"]["features"] == "no_dependency_hints"
    planner = PPOPlanner(out)
    assert planner.features == "no_dependency_hints"
    assert planner.module.net.tool_features.in_features == N_STATUS + 3  # no relational features
    seen = []
    original = planner.actions
    planner.actions = lambda obs, masks: seen.append(obs[0].copy()) or original(obs, masks)
    env = ResiliBenchEnv(split="test")
    for _obs, mask, action in _masked_steps(env, planner, range(5)):
        assert mask[action] == 1
    lay = env.layout
    assert seen and all(not o[[lay.task + 15, lay.task + 19]].any() for o in seen)
    assert PPOPlanner(resolve_checkpoint(out), module=planner.module).features == "no_dependency_hints"


@pytest.mark.slow
def test_ppo_planner_exact_success_is_bounded(trained):
    planner = PPOPlanner(trained)
    task = load_tasks(split="test", task_types=[TYPE])[0]
    assert 0.0 <= exact_policy_success(planner, task) <= optimal_success(task) + 1e-12


# --- CLI errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "message"), [
    (["train", "ppo", "--iterations", "0"], "--iterations: iterations must be an integer >= 1, got 0"),
    (["train", "ppo", "--encoder", "lstm"], "--encoder: invalid choice"),
    (["train", "ppo", "--features", "none"], "--features: invalid choice"),
    (["train", "ppo", "--set", "features=none"], "features must be one of ('full', 'no_dependency_hints')"),
    (["train", "ppo", "--time-budget", "-1"], "--time-budget: time_budget_min must be a finite number > 0"),
    (["train", "ppo", "--set", "bogus=1"], "--set bogus: unknown hyperparameter"),
    (["train", "ppo", "--set", "minibatch_size=9999"], "train_batch_size: must be >= minibatch_size"),
    (["eval", "policy", "/nonexistent/run"], "CHECKPOINT: /nonexistent/run is neither"),
    (["eval", "policy", ".", "--seeds", "x"], "--seeds: expected a non-negative integer"),
])
def test_cli_rejects_bad_arguments(args, message, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_train_refuses_an_existing_run_without_resume(trained, capsys):
    assert main(["train", "ppo", "--iterations", "1", "--output-dir", str(trained), *TINY_FLAGS]) == 2
    assert "already holds a training run: add --resume" in capsys.readouterr().err


@pytest.mark.slow
def test_ppo_policy_plays_the_text_protocol(trained, tmp_path, capsys):
    """`eval --agent ppo:DIR`: the trained policy as a text agent, greedy, so two runs play the same calls."""
    def run(out):
        assert main(["eval", "agent", "--agent", f"ppo:{trained}", "--prompts", "baseline", "--task-type", TYPE,
                     "--limit", "2", "--seeds", "0", "--output-dir", str(out)]) == 0
        return [(r["model"], r["task_id"], r["level"], [c["tool"] for c in r["trace"]])
                for r in read_jsonl(out / "results.jsonl").rows]

    first = run(tmp_path / "a")
    assert len(first) == 2 and {model for model, *_ in first} == {f"ppo:{trained}"}
    assert all(calls and set(calls) <= set(default_registry().names) for *_, calls in first)
    assert run(tmp_path / "b") == first


def test_train_ppo_world_v0_trains_on_world_v0():
    """`train ppo --world v0` takes world v0's library and grading (not only with --config)."""
    from resilibench.cli import build_parser
    from resilibench.cli.train import _train_config

    args = build_parser().parse_args(["train", "ppo", "--world", "v0", "--iterations", "1"])
    cfg = _train_config(args)
    assert cfg.tasks_path.endswith("tasks_v0.jsonl.gz") and cfg.world_config().evaluator.partial_rule == "v0"
    default = _train_config(build_parser().parse_args(["train", "ppo", "--iterations", "1"]))
    assert default.tasks_path is None and default.world_config().evaluator.partial_rule == "v1"


@pytest.mark.parametrize("encoder", ["pooled", "transformer", "mlp"])
def test_module_reads_the_failure_processes_blocks(encoder):
    """Under failure processes the observation has three more blocks; the module takes them (per tool into
    the tool tokens) and its logits depend on them."""
    from ray.rllib.core.columns import Columns

    from resilibench.policies.ppo.module import PlannerModule

    config = WorldConfig().replace(processes={"outage_start": 0.15, "outage_end": 0.4})
    env = MaskedPlannerEnv(ResiliBenchEnv(split="test", config=config))
    size = env.observation_space[OBSERVATIONS].shape[0]
    assert size == 204 + 61
    module = PlannerModule(observation_space=env.observation_space, action_space=env.action_space,
                           model_config={"encoder": encoder, "d_model": 16, "n_heads": 2, "n_layers": 1})
    obs = torch.rand(4, size)
    down = obs.clone()
    down[:, 204 + 30:204 + 60] = 1.0 - down[:, 204 + 30:204 + 60]  # the "last call found it down" block
    mask = torch.ones(4, 31)
    with torch.no_grad():
        logits = [module.forward_inference({Columns.OBS: {OBSERVATIONS: o, ACTION_MASK: mask}})[
            Columns.ACTION_DIST_INPUTS] for o in (obs, down)]
    assert logits[0].shape == (4, 31) and not torch.allclose(logits[0], logits[1])
