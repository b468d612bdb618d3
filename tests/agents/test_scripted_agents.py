"""The scripted reference agents in the text env: the text world is the planner world.

* The optimal text agent plays, call for call, the episode ``OptimalPlanner`` plays in ``ResiliBench-v1``
  under the same rules and seed, so its success is exactly bound (iii) (the planner attains it:
  tests/core/test_bounds.py).
* The plan follower, reading plans from prompt text only, plays, call for call, the episode ``PlanFollower``
  plays with the plan the prompt showed, so its success is exactly that plan's ``workflow_success``
  (tests/core/test_plan_follower.py); on optimal plans that is close to bound (iii), on flawed plans it drops.
"""

from __future__ import annotations

import pytest

from resilibench.agents.harness import eval_jobs, run_eval
from resilibench.agents.scripted import (
    COMPLETION_MESSAGE,
    OptimalTextAgent,
    PlanFollowingTextAgent,
    call_message,
)
from resilibench.core.bounds import optimal_success
from resilibench.core.plan_follower import PlanFollower, workflow_success
from resilibench.core.simulator import task_seed
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.flaws import FLAW_TYPES
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.workflow import Workflow
from resilibench.core.world import get_task, get_world, load_tasks
from resilibench.envs.planner.env import ResiliBenchEnv
from resilibench.policies.optimal import OptimalPlanner

TEXT_CONFIG = get_world().with_rules(strict_dependencies=True).config  # the text env's rules: strict dependencies


def tasks_of_every_type(count: int):
    tasks = load_tasks(split="test")
    return [t for name in TASK_TYPE_NAMES for t in [t for t in tasks if t.task_type == name][:count]]


def planner_episode(row, envs: dict):
    """The planner env's episode of a row's task and run seed (the text env's rules), freshly reset."""
    task = get_task(row["task_id"])
    env = envs.setdefault(task.instance_id, ResiliBenchEnv(tasks=[task], split=None,
                                                           rules={"strict_dependencies": True}))
    env.reset(seed=task_seed(task.instance_id, row["seed"]), options={"task_id": task.instance_id})
    return env


@pytest.fixture(scope="module")
def optimal_rows():
    jobs = eval_jobs(tasks_of_every_type(2), ["baseline"], seeds=range(10))
    return run_eval(OptimalTextAgent(), jobs, batch_size=64, progress=False)


def test_optimal_text_agent_plays_the_planner_episode(optimal_rows):
    """Same seed, same rules (strict dependencies): the same calls with the same outcomes, the same level."""
    envs: dict = {}
    for r in optimal_rows:
        env = planner_episode(r, envs)
        planner = OptimalPlanner(env.config)
        planner.reset(env.episode.task, None)
        done = False
        while not done:
            _, _, terminated, truncated, info = env.step(planner.act(env.episode, None))
            done = terminated or truncated
        assert [c.to_dict() for c in env.episode.trace] == r["trace"]
        assert info["level"] == r["level"]


def test_optimal_text_agent_rows_carry_bound_iii_and_end_properly(optimal_rows):
    """Every row's bound (iii) is the exact optimum under the text env's rules; the agent finishes every
    episode it can no longer win by signalling completion itself."""
    assert len(optimal_rows) == 10 * 10
    for r in optimal_rows:
        assert r["bound_iii"] == pytest.approx(optimal_success(get_task(r["task_id"]), TEXT_CONFIG), abs=1e-12)
    assert all(r["end_reason"] in ("finished", "consecutive_failures", "repetition_loop") for r in optimal_rows)
    assert all(r["completed"] or r["end_reason"] != "finished" for r in optimal_rows)


@pytest.fixture(scope="module")
def plan_rows():
    jobs = eval_jobs(tasks_of_every_type(1), ["optimal", "flawed"], seeds=range(5), flaw_types=FLAW_TYPES)
    return run_eval(PlanFollowingTextAgent(), jobs, batch_size=64, progress=False)


def plan_value(row) -> float:
    """Exact full-success probability of following the plan the row's prompt showed."""
    return workflow_success(get_task(row["task_id"]), Workflow.from_dict(row["plan"]), TEXT_CONFIG)


def test_plan_follower_plays_the_plan_it_was_shown(plan_rows):
    """Reading plans from prompt text loses nothing: every episode, optimal or flawed plan, is the one
    ``PlanFollower`` plays with that plan (same calls, same outcomes, same level)."""
    envs: dict = {}
    assert {r["prompt"] for r in plan_rows} == {"optimal", "flawed"}
    for r in plan_rows:
        env = planner_episode(r, envs)
        evaluation = PlanFollower(Workflow.from_dict(r["plan"])).play(env.episode)
        assert [c.to_dict() for c in env.episode.trace] == r["trace"], (r["task_id"], r["flaw_type"])
        assert evaluation.level == r["level"]


def test_plan_follower_optimal_close_to_bound_and_flawed_plans_hurt(plan_rows):
    """By the exact values of the plans shown: optimal plans come close to bound (iii), flawed ones lose,
    and some flaw type loses badly."""
    optimal = [r for r in plan_rows if r["prompt"] == "optimal"]
    flawed = [r for r in plan_rows if r["prompt"] == "flawed"]
    value = lambda rows: sum(map(plan_value, rows)) / len(rows)  # noqa: E731
    bound = sum(r["bound_iii"] for r in optimal) / len(optimal)
    assert value(optimal) >= bound - 0.05, (value(optimal), bound)
    assert value(flawed) < value(optimal) - 0.1, (value(flawed), value(optimal))
    by_flaw = {f: value([r for r in flawed if r["flaw_type"] == f]) for f in FLAW_TYPES}
    shown = ", ".join(f"{f} {v:.3f}" for f, v in by_flaw.items())
    print(f"\nplan follower exact full success: optimal {value(optimal):.3f} (bound iii {bound:.3f}); "
          f"flawed {value(flawed):.3f}; by flaw type: {shown}")
    assert min(by_flaw.values()) < value(optimal) - 0.2, "some flaw type should hurt a literal follower badly"


def test_messages_speak_the_protocol():
    from resilibench.core.text.toolbox import parse_message

    parsed = parse_message(call_message("data_processing_parser", {"source": "a.json"}))
    assert [(c.name, c.arguments, c.problem) for c in parsed.calls] == [
        ("data_processing_parser", {"source": "a.json"}, None)]
    assert not parsed.completes
    assert parse_message(COMPLETION_MESSAGE).completes and not parse_message(COMPLETION_MESSAGE).has_tags


def test_plan_follower_without_a_plan_signals_completion():
    jobs = eval_jobs(tasks_of_every_type(1)[:2], ["baseline"], seeds=[0])
    rows = run_eval(PlanFollowingTextAgent(), jobs, progress=False)
    assert all(r["turns"] == 0 and r["completed"] and r["level"] == "failure" for r in rows)


# --- text-only baselines -------------------------------------------------------------------------------


def baseline_rows(agent, world: str, count: int = 4, seeds=range(3), keep_messages: bool = False):
    tasks = load_tasks(split="test", world=world)
    tasks = [t for name in TASK_TYPE_NAMES for t in [t for t in tasks if t.task_type == name][:count]]
    config = get_world(world).with_rules(strict_dependencies=True).config
    return run_eval(agent, eval_jobs(tasks, ["baseline"], seeds=seeds, config=config), progress=False,
                    keep_messages=keep_messages, env={"config": config, "world": world, "prompt": PromptSettings(matcher="lexical"),
                         "search": SearchSettings(method="lexical")})


def full_rate(rows) -> float:
    return sum(r["level"] == "full_success" for r in rows) / len(rows)


def test_name_reading_agent_copies_v0_and_finds_nothing_in_v1():
    """The copy baseline: on world v0, whose descriptions name their tools in order, reading names off the
    prompt does well; on world v1 it has nothing to read and scores zero."""
    from resilibench.agents.text_baselines import NameReadingTextAgent

    agent = NameReadingTextAgent()
    v0 = baseline_rows(agent, "v0")
    v1 = baseline_rows(agent, "v1")
    assert full_rate(v0) > 0.5
    assert full_rate(v1) == 0.0
    assert all(r["level"] == "failure" for r in v1)  # "task completed" with nothing done


def test_search_agent_finds_tools_from_the_description_alone():
    from resilibench.agents.text_baselines import SearchTextAgent, clauses, task_text

    prompt = ("Execute a task.\n\nTask: A small job. To begin, load the sales records from data/s.csv. Then "
              "keep only the rows with a non-zero amount.\n\nInput Data:\n- source: \"data/s.csv\"\n")
    assert task_text(prompt).startswith("A small job.")
    assert clauses(task_text(prompt)) == ["A small job", "load the sales records from data/s.csv",
                                          "keep only the rows with a non-zero amount"]
    assert SearchTextAgent.searches(prompt) == clauses(task_text(prompt))[1:]
    rows = baseline_rows(SearchTextAgent(), "v1")
    assert any(r["level"] == "full_success" for r in rows)  # it does find tools
    assert full_rate(rows) < full_rate(baseline_rows(OptimalTextAgent(), "v1"))  # and is no oracle


def test_search_optimal_expert_searches_as_the_baseline_then_plays_the_optimal_policy():
    """The warm start's grounded teacher: the search baseline's search messages, word for word, then only
    tool calls and the completion signal. It succeeds more often than the baseline, and less often than the
    optimal policy: its searches spend turns of the 10 (on long tasks, 0.58 against 0.78 here)."""
    from resilibench.agents.text_baselines import SearchingOptimalTextAgent, SearchTextAgent

    expert = baseline_rows(SearchingOptimalTextAgent(), "v1", keep_messages=True)
    search = baseline_rows(SearchTextAgent(), "v1", keep_messages=True)
    optimal = baseline_rows(OptimalTextAgent(), "v1")
    for row, baseline in zip(expert, search, strict=True):
        said = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        searches = [m for m in said if "<tool_search>" in m]
        assert searches and searches == [m["content"] for m in baseline["messages"]
                                         if m["role"] == "assistant" and "<tool_search>" in m["content"]]
        assert said[:len(searches)] == searches  # the searches come first, then calls only
        assert all(m.startswith("<tool_call>") for m in said[len(searches):-1]) and said[-1] == COMPLETION_MESSAGE
    assert full_rate(search) < full_rate(expert) <= full_rate(optimal)
