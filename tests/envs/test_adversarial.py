"""adversarial_v0: PettingZoo API, determinism, masks, zero-sum rewards, agreement with ResiliBench-v0."""

from __future__ import annotations

import numpy as np
import pytest
from pettingzoo.test import api_test, parallel_api_test, parallel_seed_test, seed_test

from resilibench.core.plan_follower import PlanFollower
from resilibench.core.text.flaws import applicable_positions
from resilibench.core.world import get_task
from resilibench.envs import adversarial_v0
from resilibench.envs.adversarial.game import ADVERSARY, EXECUTOR, FLAW_CHOICES, NO_FLAW
from resilibench.envs.planner.env import ResiliBenchEnv

# Basic file processing tasks (2-3 required tools): their reference plans are quick to compute.
TASK_IDS = ("task_e7144374", "task_c435fb64", "task_fbbbec17", "task_f94ed1f1")
N_TOOLS, FINISH = 30, 30
PLANNER_SIZE = 204


@pytest.fixture(scope="module")
def tasks():
    return [get_task(t, world="v0") for t in TASK_IDS]


def make(tasks, **kwargs):
    return adversarial_v0.raw_env(tasks=tasks, **{"matcher": "lexical", **kwargs})


def random_action(rng: np.random.Generator, mask: np.ndarray) -> int:
    legal = np.flatnonzero(mask)
    return int(legal[rng.integers(len(legal))])


def play(env, rng: np.random.Generator, adversary=None) -> list:
    """Play an AEC episode with random legal actions (``adversary`` fixes the adversary's actions);
    returns everything observed."""
    seen = []
    fixed = list(adversary) if adversary is not None else None
    for agent in env.agent_iter():
        obs, reward, terminated, truncated, info = env.last()
        seen.append((agent, obs, reward, terminated, truncated, info))
        if terminated or truncated:
            action = None
        elif agent == ADVERSARY and fixed is not None:
            action = fixed.pop(0)
        else:
            action = random_action(rng, obs["action_mask"])
        env.step(action)
    return seen


def same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("budget", [1, 2])
def test_pettingzoo_api_and_seed_tests(tasks, budget):
    api_test(adversarial_v0.env(tasks=tasks, matcher="lexical", budget=budget), num_cycles=200)
    parallel_api_test(adversarial_v0.parallel_env(tasks=tasks, matcher="lexical", budget=budget), num_cycles=200)
    seed_test(lambda: adversarial_v0.env(tasks=tasks, matcher="lexical", budget=budget), num_cycles=200)
    parallel_seed_test(lambda: adversarial_v0.parallel_env(tasks=tasks, matcher="lexical", budget=budget))


def test_metadata_and_spaces(tasks):
    env = make(tasks, max_plan_length=8)
    assert env.metadata["name"] == "adversarial_v0"
    assert "is_parallelizable" in env.metadata
    assert env.possible_agents == [ADVERSARY, EXECUTOR]
    for agent in env.possible_agents:
        assert env.observation_space(agent) is env.observation_space(agent)
        assert env.action_space(agent) is env.action_space(agent)
    assert env.action_space(ADVERSARY).n == 1 + 14 * 8
    assert env.action_space(EXECUTOR).n == N_TOOLS + 1
    assert env.observation_space(EXECUTOR)["observation"].shape == (PLANNER_SIZE + 8 * 33 + N_TOOLS,)
    for k, (flaw_type, method) in enumerate(FLAW_CHOICES):
        action = env.adversary_action(flaw_type, method, 5)
        assert action == 1 + k * 8 + 5
        assert env.describe_adversary_action(action) == (flaw_type, method, 5)
    assert env.describe_adversary_action(NO_FLAW) is None


def test_same_seed_same_game_and_seeds_differ(tasks):
    runs = []
    for seed in (7, 7, 8):
        env = make(tasks, budget=2)
        env.reset(seed=seed)
        runs.append(play(env, np.random.default_rng(0)))
    assert same(runs[0], runs[1])
    assert not same(runs[0], runs[2])
    # A second reset with the same seed on the same env replays the game too.
    env = make(tasks, budget=2)
    env.reset(seed=7)
    play(env, np.random.default_rng(0))
    env.reset(seed=7)
    assert same(play(env, np.random.default_rng(0)), runs[0])


def test_no_flaw_executor_matches_resilibench_v0(tasks):
    """With "no flaw", the executor's episode is ResiliBench-v0's for the same seed and calls: observations,
    masks, traces, levels, ends and rewards (masked calls and calls past the turn limit included)."""
    rng = np.random.default_rng(1)
    single = ResiliBenchEnv(tasks=tasks, split=None, world="v0")
    ends = set()
    for seed in range(12):
        env = make(tasks)
        env.reset(seed=seed)
        env.step(NO_FLAW)
        obs, info = single.reset(seed=seed)
        assert env.task is single.episode.task
        done = False
        while not done:
            mine = env.observe(EXECUTOR)
            assert np.array_equal(mine["observation"][:PLANNER_SIZE], obs)
            assert np.array_equal(mine["action_mask"], info["action_mask"])
            r, tools = rng.random(), mine["action_mask"][:-1]
            if r < 0.1:
                action = FINISH
            elif r < 0.3 or not tools.any():  # any action, masked ones and calls past the turn limit too
                action = int(rng.integers(N_TOOLS + 1))
            else:
                action = random_action(rng, tools)
            env.step(action)
            obs, reward, terminated, truncated, info = single.step(action)
            done = terminated or truncated
            assert env.infos[EXECUTOR]["trace"] == info["trace"]
            assert env.terminations[EXECUTOR] == terminated and env.truncations[EXECUTOR] == truncated
        assert env.infos[EXECUTOR]["level"] == info["level"]
        assert env.infos[EXECUTOR]["end_reason"] == info["end_reason"]
        assert env.rewards[EXECUTOR] == reward
        ends.add(info["end_reason"])
    assert len(ends) >= 2  # the comparison covered more than one way to end


def test_adversary_mask_is_the_applicable_positions(tasks):
    env = make(tasks, max_plan_length=12)
    env.reset(seed=3)
    mask = env.observe(ADVERSARY)["action_mask"]
    assert not env.observe(EXECUTOR)["action_mask"].any()  # not the executor's turn
    assert mask[NO_FLAW] == 1
    plan = env.plan
    for flaw_type, method in FLAW_CHOICES:
        positions = applicable_positions(plan, flaw_type, method, matcher="lexical")
        legal = [p for p in range(12) if mask[env.adversary_action(flaw_type, method, p)]]
        assert legal == positions
    assert mask.sum() > 1 + len(FLAW_CHOICES)  # several flaws at several positions apply
    # Every legal injection changes the plan.
    for action in np.flatnonzero(mask)[1:]:
        env.reset(seed=3)
        env.step(int(action))
        assert env.injections[0]["applied"] and env.injections[0]["changes"]
        assert env.plan != env.clean_plan


def test_masked_adversary_action_injects_nothing(tasks):
    env = make(tasks, budget=2)
    env.reset(seed=3)
    mask = env.observe(ADVERSARY)["action_mask"]
    illegal = int(np.flatnonzero(mask == 0)[0])
    env.step(illegal)
    assert env.plan == env.clean_plan
    assert env.injections[0]["applied"] is False and env.injections[0]["changes"] is None
    assert env.agent_selection == ADVERSARY  # the injection was used; one is left
    env.step(NO_FLAW)
    assert env.agent_selection == EXECUTOR


def test_budget_and_turn_order(tasks):
    env = make(tasks, budget=3)
    env.reset(seed=4)
    order = []
    rng = np.random.default_rng(2)
    while env.agent_selection == ADVERSARY:
        order.append(ADVERSARY)
        mask = env.observe(ADVERSARY)["action_mask"].copy()
        mask[NO_FLAW] = 0
        env.step(random_action(rng, mask))
    assert order == [ADVERSARY] * 3 and len(env.injections) == 3
    assert env.observe(ADVERSARY)["observation"][-1] == 0.0  # no budget left
    env.reset(seed=4)
    assert env.observe(ADVERSARY)["observation"][-1] == 1.0
    env.step(NO_FLAW)  # "no flaw" ends the adversary's turn at once
    assert env.agent_selection == EXECUTOR and env.injections == []


def test_flaw_changes_the_plan_the_executor_sees(tasks):
    p = 12
    width = N_TOOLS + 3

    def executor_view(action):
        env = make(tasks, max_plan_length=p)
        env.reset(seed=5, options={"task_id": "task_c435fb64"})  # reader, parser, filter
        before = env.observe(EXECUTOR)["observation"]
        env.step(action)
        return env, before, env.observe(EXECUTOR)["observation"]

    env, before, clean = executor_view(NO_FLAW)
    assert not before[PLANNER_SIZE:].any()  # no plan before the adversary is done
    rows = clean[PLANNER_SIZE:PLANNER_SIZE + p * width].reshape(p, width)
    tools = [env.registry.names[int(np.argmax(r[:N_TOOLS]))] for r in rows if r[:N_TOOLS].any()]
    assert tools == [n.tool for n in env.clean_plan.nodes]
    assert not rows[:, N_TOOLS + 1].any()  # the clean plan's arguments are valid
    next_tool = clean[PLANNER_SIZE + p * width:]
    assert np.flatnonzero(next_tool).tolist() == [env.registry.id_of(env.clean_plan.nodes[0].tool)]

    swapped, _, flawed = executor_view(env.adversary_action("order", "adjacent_swap", 0))
    assert not np.array_equal(flawed, clean)
    assert np.array_equal(flawed[:PLANNER_SIZE], clean[:PLANNER_SIZE])
    # A plan follower would now start with the plan's second tool.
    assert np.flatnonzero(flawed[PLANNER_SIZE + p * width:]).tolist() == [env.registry.id_of(env.clean_plan.nodes[1].tool)]

    for flaw in (("missing_step", "middle_removal", 1), ("tool_misuse", "category_mismatch", 2),
                 ("parameter", "wrong_type", 0)):
        flawed_env, _, flawed = executor_view(env.adversary_action(*flaw))
        assert not np.array_equal(flawed, clean), flaw
    flawed_rows = flawed[PLANNER_SIZE:PLANNER_SIZE + p * width].reshape(p, width)
    assert flawed_rows[0, N_TOOLS + 1] == 1.0  # the wrong-type step is flagged


def test_executor_observation_follows_the_plan(tasks):
    """Calling the observation's next-planned tool (FINISH when none) is the literal plan follower: the same
    calls as ``PlanFollower.play`` on an Episode with the same seed; the done flags track successes."""
    p, width = 12, N_TOOLS + 3
    single = ResiliBenchEnv(tasks=tasks, split=None, world="v0")
    for seed in range(6):
        env = make(tasks, max_plan_length=p)
        env.reset(seed=seed)
        env.step(NO_FLAW)
        while env.agents and not env.terminations[EXECUTOR] and not env.truncations[EXECUTOR]:
            obs = env.observe(EXECUTOR)["observation"]
            rows = obs[PLANNER_SIZE:PLANNER_SIZE + p * width].reshape(p, width)
            for row in rows[:len(env.plan.nodes)]:
                assert row[N_TOOLS + 2] == float(env.episode.succeeded[int(np.argmax(row[:N_TOOLS]))])
            hint = np.flatnonzero(obs[PLANNER_SIZE + p * width:])
            env.step(int(hint[0]) if len(hint) else FINISH)
        single.reset(seed=seed)
        PlanFollower(env.plan).play(single.episode)
        assert env.infos[EXECUTOR]["trace"] == [r.to_dict() for r in single.episode.trace]


def test_zero_sum_rewards(tasks):
    rng = np.random.default_rng(3)
    outcomes = set()
    for seed in range(16):
        env = make(tasks, budget=2)
        env.reset(seed=seed)
        follow = seed % 2 == 0  # half the executors follow their plan, so both outcomes occur
        while not (env.terminations[EXECUTOR] or env.truncations[EXECUTOR]):
            assert env.rewards == {ADVERSARY: 0.0, EXECUTOR: 0.0}
            agent = env.agent_selection
            obs = env.observe(agent)
            if agent == EXECUTOR and follow:
                hint = np.flatnonzero(obs["observation"][-N_TOOLS:])
                env.step(int(hint[0]) if len(hint) else FINISH)
            else:
                env.step(random_action(rng, obs["action_mask"]))
        full = float(env.infos[EXECUTOR]["level"] == "full_success")
        assert env.rewards == {EXECUTOR: full, ADVERSARY: -full}
        outcomes.add(full)
        for agent in env.agent_iter():  # both end together and see their reward
            _, reward, terminated, truncated, _ = env.last()
            assert terminated or truncated
            assert reward == (full if agent == EXECUTOR else -full)
            env.step(None)
    assert outcomes == {0.0, 1.0}


def test_parallel_env_plays_the_same_game(tasks):
    rng = np.random.default_rng(4)
    aec, par = make(tasks, budget=2), adversarial_v0.parallel_env(tasks=tasks, matcher="lexical", budget=2)
    aec.reset(seed=9)
    obs, infos = par.reset(seed=9)
    assert set(obs) == {ADVERSARY, EXECUTOR}
    while par.agents:
        agent = par.agent_on_turn
        assert agent == aec.agent_selection
        other = EXECUTOR if agent == ADVERSARY else ADVERSARY
        assert not obs[other]["action_mask"].any()
        assert same(obs[agent], aec.observe(agent))
        action = random_action(rng, obs[agent]["action_mask"])
        aec.step(action)
        obs, rewards, terminations, truncations, infos = par.step({agent: action, other: 0})
        assert sum(rewards.values()) == 0.0
    assert terminations == aec.terminations and rewards == aec.rewards
    assert par.agent_on_turn is None
    with pytest.raises(RuntimeError, match="reset"):
        par.step({ADVERSARY: 0})
    par.reset(seed=9)
    with pytest.raises(ValueError, match="'adversary'"):
        par.step({EXECUTOR: 0})


def test_hide_required(tasks):
    lay_required, lay_progress = 4 * N_TOOLS, 6 * N_TOOLS
    shown, hidden = make(tasks), make(tasks, hide_required=True)
    for env in (shown, hidden):
        env.reset(seed=2)
        env.step(NO_FLAW)
    a, b = shown.observe(EXECUTOR)["observation"], hidden.observe(EXECUTOR)["observation"]
    assert a[lay_required:lay_progress + 1].any() and not b[lay_required:lay_progress + 1].any()
    assert np.array_equal(a[:lay_required], b[:lay_required]) and np.array_equal(a[lay_progress + 1:], b[lay_progress + 1:])


def test_bad_arguments_actions_and_options(tasks):
    for kwargs, field in (({"budget": 0}, "budget"), ({"severity": 0.0}, "severity"), ({"severity": 2}, "severity"),
                          ({"max_plan_length": 0}, "max_plan_length"), ({"matcher": "fuzzy"}, "matcher"),
                          ({"render_mode": "rgb_array"}, "render_mode")):
        with pytest.raises(ValueError, match=field):
            make(tasks, **kwargs)
    env = make(tasks)
    env.reset(seed=0)
    n = env.action_space(ADVERSARY).n
    for bad in (n, -1, 1.5, "3", None, True):
        with pytest.raises(ValueError, match=r"adversary action must be"):
            env.step(bad)
    assert env.agent_selection == ADVERSARY and env.injections == []  # nothing happened
    env.step(NO_FLAW)
    for bad in (N_TOOLS + 1, 3.7, "5", float("inf"), True):
        with pytest.raises(ValueError, match="action must be"):
            env.step(bad)
    assert env.episode.turns_used == 0
    with pytest.raises(ValueError, match="workflow"):
        env.reset(seed=0, options={"workflow": "1. file_operations_reader"})
    with pytest.raises(ValueError, match="task_id"):
        env.reset(seed=0, options={"task_id": 5})
    with pytest.raises(KeyError, match="no task"):
        env.reset(seed=0, options={"task_id": "task_nope"})
    with pytest.warns(UserWarning, match="unknown reset option"):
        env.reset(seed=0, options={"taskid": "x"})
    with pytest.raises(ValueError, match="flaw_type, method"):
        env.adversary_action("order", "similar_tool", 0)
    with pytest.raises(ValueError, match="position"):
        env.adversary_action("order", "adjacent_swap", 12)


def test_workflow_option_and_render(tasks):
    from resilibench.core.workflow import Workflow

    plan = Workflow.chain(["file_operations_reader", "data_processing_parser", "utility_logger"])
    env = make(tasks, render_mode="ansi")
    env.reset(seed=0, options={"task_id": "task_e7144374", "workflow": plan})
    assert env.clean_plan.tools == plan.tools
    assert all(node.params for node in env.clean_plan.nodes)  # valid arguments filled in, as in prompts
    env.step(env.adversary_action("missing_step", "middle_removal", 1))
    env.step(FINISH)
    text = env.render()
    assert "flaw missing_step/middle_removal at step 2: injected" in text
    assert "end: finished" in text


def test_adversarial_v1_is_the_same_game_in_world_v1():
    from resilibench.core.world import load_tasks
    from resilibench.envs import adversarial_v1

    tasks = load_tasks(split="test")[:4]
    api_test(adversarial_v1.env(tasks=tasks, matcher="lexical"), num_cycles=50)
    parallel_api_test(adversarial_v1.parallel_env(tasks=tasks, matcher="lexical"), num_cycles=50)
    game = adversarial_v1.parallel_env(split="test", matcher="lexical")
    assert game.game.planner.world.name == "v1" and game.game.config.evaluator.partial_rule == "v1"
    assert adversarial_v0.parallel_env(matcher="lexical").game.config.evaluator.partial_rule == "v0"
    _, infos = game.reset(seed=0)
    assert game.game.planner.tasks[0].metadata["world"] == "v1"
