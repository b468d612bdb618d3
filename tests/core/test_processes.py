"""Failure processes (docs/core/processes.md): the branch function, the Episode's sampling of
it, each process's semantics, and the v1 world left bit for bit as it was when every process is off."""

import itertools
import json
import math
from collections import Counter

import pytest

from helpers import make_task
from resilibench.core import stream as rs
from resilibench.core.config import FailureModel, FailureProcesses, WorldConfig
from resilibench.core.processes import (
    FRESH,
    RATE_LIMIT_ERROR,
    SERVICE_UNAVAILABLE,
    STAGE_CODE,
    STAGE_LATENCY,
    STAGE_OUTAGE,
    STAGE_RATE,
    STAGE_STREAMS,
    STAGE_SUCCESS,
    TIMEOUT,
    CallOutcome,
    ToolState,
    call_outcomes,
    down_probability,
    latency_probabilities,
    sample_outcome,
    select,
    tool_bases,
)
from resilibench.core.registry import default_registry
from resilibench.core.simulator import OUT_OF_TIME, OUT_OF_TURNS, Episode
from resilibench.errors import ConfigError

REG = default_registry()
READER, PARSER = "file_operations_reader", "data_processing_parser"
CODES = ("INVALID_INPUT", "OPERATION_FAILED", "TIMEOUT")


def world(**processes) -> WorldConfig:
    return WorldConfig().replace(processes=processes)


# --- the branch function --------------------------------------------------------------------------------

EVERY_PROCESS = FailureProcesses(outage_start=0.2, outage_end=0.5, rate_limit_probability=0.1, rate_limit_wait=2,
                                 latency_seconds=(0.5, 2.0, 9.0), latency_weights=(2, 1, 1),
                                 call_timeout_seconds=5.0)


@pytest.mark.parametrize("state", [FRESH, ToolState(True, 0), ToolState(False, 0), ToolState(None, 2)])
def test_branches_sum_to_one_and_follow_the_stage_order(state):
    branches = call_outcomes(EVERY_PROCESS, state, 0.6, CODES)
    assert math.isclose(sum(w for w, _ in branches), 1.0)
    by_code: dict[str | None, float] = {}
    for w, o in branches:
        by_code[o.error_code] = by_code.get(o.error_code, 0.0) + w
    if state.blocked:
        assert branches == [(1.0, CallOutcome(False, RATE_LIMIT_ERROR, 0.0, ToolState(None, 1), False))]
        return
    down = down_probability(EVERY_PROCESS, state.down)
    assert math.isclose(by_code[RATE_LIMIT_ERROR], 0.1)
    assert math.isclose(by_code[SERVICE_UNAVAILABLE], 0.9 * down)
    served = 0.9 * (1 - down)
    # TIMEOUT: the 9 s latency (weight 1/4) exceeds the 5 s timeout, plus the formula's TIMEOUT code.
    assert math.isclose(by_code[TIMEOUT], served * (0.25 + 0.75 * 0.4 / 3))
    assert math.isclose(by_code[None], served * 0.75 * 0.6)


def test_stationary_and_chain_probabilities():
    processes = FailureProcesses(outage_start=0.1, outage_end=0.3)
    assert math.isclose(down_probability(processes, None), 0.1 / 0.4)
    assert down_probability(processes, False) == 0.1
    assert math.isclose(down_probability(processes, True), 0.7)


def test_processes_off_give_the_formula_branches():
    branches = call_outcomes(FailureProcesses(), FRESH, 0.8, CODES)
    assert [(round(w, 12), o.success, o.error_code, o.drew) for w, o in branches] == [
        (0.8, True, None, True), *((round(0.2 / 3, 12), False, c, True) for c in CODES)]


class Unset(Exception):
    """A stage's draw was read before the enumeration fixed it."""


def selection_measure(processes: FailureProcesses, state: ToolState, p: float, codes) -> dict[CallOutcome, float]:
    """{outcome: the measure of the draw vectors for which ``sample_outcome`` returns it}. Each stage's
    [0, 1) is cut where its option changes by the documented rule (cumulative probabilities; the code
    stage at j / n) and every piece is tried with one draw inside it, stage by stage as the call reads them."""
    down = down_probability(processes, state.down)
    latency = latency_probabilities(processes)
    cuts = {STAGE_RATE: [processes.rate_limit_probability], STAGE_OUTAGE: [down],
            STAGE_LATENCY: list(itertools.accumulate(latency[:-1])), STAGE_SUCCESS: [p],
            STAGE_CODE: [j / len(codes) for j in range(1, len(codes))]}
    measure: dict[CallOutcome, float] = {}

    def explore(fixed: dict[str, float], weight: float) -> None:
        def draw(stage: str) -> float:
            if stage not in fixed:
                raise Unset(stage)
            return fixed[stage]

        try:
            outcome = sample_outcome(processes, state, p, codes, draw)
        except Unset as unset:
            stage = unset.args[0]
            for lo, hi in itertools.pairwise([0.0, *cuts[stage], 1.0]):
                explore({**fixed, stage: (lo + hi) / 2}, weight * (hi - lo))
            return
        measure[outcome] = measure.get(outcome, 0.0) + weight

    explore({}, 1.0)
    return measure


@pytest.mark.parametrize("state", [FRESH, ToolState(True, 0), ToolState(False, 0), ToolState(None, 2)])
def test_sampling_takes_the_branch_its_draws_select(state):
    """Exactly: the draws that select each outcome of ``sample_outcome`` have the measure ``call_outcomes``
    gives that branch, and it samples no other outcome, so enumerating the branches is exact for the
    simulator."""
    expected: dict[CallOutcome, float] = {}
    for w, o in call_outcomes(EVERY_PROCESS, state, 0.6, CODES):
        expected[o] = expected.get(o, 0.0) + w
    measure = selection_measure(EVERY_PROCESS, state, 0.6, CODES)
    assert measure.keys() == expected.keys()
    for outcome, w in expected.items():
        assert math.isclose(measure[outcome], w, abs_tol=1e-12), outcome


def test_select_matches_v1_for_the_formula_draws():
    assert select(STAGE_SUCCESS, 0.79, (0.8, 0.2)) == 0 and select(STAGE_SUCCESS, 0.8, (0.8, 0.2)) == 1
    for u in (0.0, 0.33, 0.34, 0.999999):
        assert select(STAGE_CODE, u, (1 / 3,) * 3) == min(int(u * 3), 2)


def test_process_streams_are_pinned():
    """The process stages' keys (docs/core/processes.md): subkey(k, tag) = mix(k ^ tag * MUL)."""
    k = rs.key(0)
    assert [hex(rs.subkey(k, tag)) for tag in (1, 2, 3)] == [
        "0x927a7c57dc016e42", "0x92141e68bb0f9dd3", "0xb53aa4065a211020"]
    assert rs.subkey(k, 1) == rs.mix(k ^ ((1 * rs.SUBKEY_MUL) & rs.M64))
    assert rs.uniform(rs.subkey(k, 1), 0) == 0.826027878428408


# --- the Episode --------------------------------------------------------------------------------------


def test_a_real_call_bypasses_the_simulated_processes():
    """``outcome=`` (the real-API mode) replaces the draw: no refusal, outage or latency is simulated."""
    config = world(rate_limit_probability=1.0, rate_limit_wait=3, outage_start=1.0, latency_seconds=(9.0,),
                   latency_weights=(1,), call_timeout_seconds=1.0)
    episode = Episode.start(make_task(), 0, config)
    asked = []
    record = episode.call(READER, outcome=lambda tool: (asked.append(tool), (True, None))[1])
    assert record.success and asked == [REG.id_of(READER)] and episode.time_used == 0.0
    assert record.duration == 0.0 and record.retry_after is None and record.probability is None


def test_options_off_are_v1_bit_for_bit():
    """The default world and an explicitly empty processes section play the same episodes, records and
    dicts included; the config's dict has no processes section."""
    task = make_task()
    for seed in range(50):
        plain = Episode.start(task, seed)
        empty = Episode.start(task, seed, world())
        for tool in task.required_tools * 2:
            if plain.done or plain.turns_left == 0:
                break
            assert plain.call(tool) == empty.call(tool)
        assert [r.to_dict() for r in plain.trace] == [r.to_dict() for r in empty.trace]
        assert "duration" not in plain.trace[0].to_dict() and plain.time_used == 0.0
    assert "processes" not in WorldConfig().to_dict()
    assert world(outage_start=0.1).to_dict()["processes"]["outage_start"] == 0.1


def test_process_draws_leave_the_formula_draws_alone():
    """With a process on that never fires, every call meets v1's success and error-code draws."""
    task, config = make_task(), world(rate_limit_probability=1e-300, latency_seconds=(1.0,), latency_weights=(1,))
    for seed in range(50):
        plain, on = Episode.start(task, seed), Episode.start(task, seed, config)
        for tool in task.required_tools:
            if plain.done:
                break
            a, b = plain.call(tool), on.call(tool)
            assert (a.success, a.error_code, a.probability) == (b.success, b.error_code, b.probability)
            assert b.duration == 1.0 and b.retry_after is None
        assert on.time_used == len(on.trace)


def stage_draw(seed: int, stage: str, turn: int) -> float:
    """The draw of process stage ``stage`` in the call at ``turn`` of the episode of ``seed``:
    ``uniform(subkey(key(seed), STAGE_STREAMS[stage]), turn - 1)`` (docs/core/processes.md)."""
    return rs.uniform(rs.subkey(rs.key(seed), STAGE_STREAMS[stage]), turn - 1)


def test_the_outage_chain_decides_each_call_by_its_draw():
    """Draw by draw on the episodes' own streams: a first call finds the tool down iff its outage draw is
    below start / (start + end); the tool's next call, iff below 1 - end after a down call and below start
    after an up one (bursts persist). A down call makes no success draw. Every case is met."""
    task = make_task(max_retries=5)
    config = world(outage_start=0.2, outage_end=0.4).replace(
        rules={"max_same_tool_failures": 10, "max_consecutive_failures": 10})
    cases: Counter[tuple[bool, bool]] = Counter()
    for seed in range(1000):
        episode = Episode.start(task, seed, config)
        a = episode.call(READER)
        down = stage_draw(seed, STAGE_OUTAGE, 1) < 0.2 / (0.2 + 0.4)
        assert (a.error_code == SERVICE_UNAVAILABLE) == down and (a.probability is None) == down
        if a.success:
            continue  # a succeeded tool is not called again
        again = stage_draw(seed, STAGE_OUTAGE, 2) < (1.0 - 0.4 if down else 0.2)
        assert (episode.call(READER).error_code == SERVICE_UNAVAILABLE) == again
        cases[down, again] += 1
    assert min(cases[c] for c in itertools.product((True, False), repeat=2)) >= 10, cases


def test_first_calls_are_down_iff_their_draw_is_below_the_stationary_probability():
    config, task, downs = world(outage_start=0.05, outage_end=0.45), make_task(), 0
    for seed in range(300):
        down = Episode.start(task, seed, config).call(READER).error_code == SERVICE_UNAVAILABLE
        assert down == (stage_draw(seed, STAGE_OUTAGE, 1) < 0.05 / (0.05 + 0.45))
        downs += down
    assert 0 < downs < 300


def test_the_chain_advances_only_when_its_tool_is_called():
    """Calls of other tools in between leave a down tool's chain where it was: its next call (turn 6) is
    down again iff that turn's outage draw is below 1 - end, however many turns passed."""
    config = world(outage_start=0.5, outage_end=0.2).replace(
        rules={"max_consecutive_failures": 10, "turn_limit": 12})
    task, met = make_task(), 0
    for seed in range(300):
        episode = Episode.start(task, seed, config)
        if episode.call(READER).error_code != SERVICE_UNAVAILABLE:
            continue
        for tool in ("utility_logger", "utility_cache", "utility_tracker", "utility_notifier"):
            episode.call(tool)
        met += 1
        down = episode.call(READER).error_code == SERVICE_UNAVAILABLE
        assert down == (stage_draw(seed, STAGE_OUTAGE, 6) < 1.0 - 0.2), seed
    assert met > 150


def test_rate_limit_blocks_without_draws_and_counts_down_the_wait():
    config = world(rate_limit_probability=1.0, rate_limit_wait=3).replace(
        rules={"max_same_tool_failures": 10, "max_consecutive_failures": 10})
    episode = Episode.start(make_task(max_retries=9), 0, config)
    first = episode.call(READER)
    assert (first.error_code, first.retry_after, first.probability) == (RATE_LIMIT_ERROR, 3, None)
    waits = [episode.call(READER).retry_after for _ in range(3)]
    assert waits == [2, 1, 0] and episode.tool_state(REG.id_of(READER)).blocked == 0
    assert episode.call(READER).retry_after == 3  # the wait is over: a new draw, refused again
    assert episode.draws_used == 0 and episode.n_failures == 5 and episode.calls[REG.id_of(READER)] == 5
    # Another tool's turns count down the block too.
    episode.call(PARSER)
    assert episode.tool_state(REG.id_of(READER)).blocked == 2
    assert episode.trace[-1].to_dict()["retry_after"] == 3


def test_rate_limit_refuses_iff_its_draw_is_below_its_probability():
    """Draw by draw: a call is refused iff its rate-limit draw is below the probability; a refused call
    makes no success draw."""
    config, task, refused = world(rate_limit_probability=0.3), make_task(), 0
    for seed in range(300):
        record = Episode.start(task, seed, config).call(READER)
        hit = stage_draw(seed, STAGE_RATE, 1) < 0.3
        assert (record.error_code == RATE_LIMIT_ERROR) == hit and (record.probability is None) == hit
        refused += hit
    assert 0 < refused < 300


def test_timeouts_cost_the_timeout_and_latency_adds_up():
    """Draw by draw: latency 8 s (weight 1 of 4, past the 4 s timeout) is taken iff the latency draw is at
    least 3/4; it costs the timeout and makes no success draw; 1 s calls draw the formula."""
    config = world(latency_seconds=(1.0, 8.0), latency_weights=(3, 1), call_timeout_seconds=4.0)
    task, timeouts = make_task(), 0
    for seed in range(300):
        episode = Episode.start(task, seed, config)
        record = episode.call(READER)
        timeout = stage_draw(seed, STAGE_LATENCY, 1) >= 0.75
        assert episode.time_used == record.duration == (4.0 if timeout else 1.0)
        if timeout:
            assert (record.error_code, record.probability) == (TIMEOUT, None)
        else:
            assert record.probability == 0.8
        timeouts += timeout
    assert 0 < timeouts < 300


def test_time_budget_ends_calls_like_the_turn_limit():
    config = world(latency_seconds=(2.0,), latency_weights=(1,), time_budget_seconds=5.0)
    episode = Episode.start(make_task(), 1, config)
    for tool in (READER, PARSER, "utility_logger"):
        assert episode.turns_left > 0
        episode.call(tool)
    assert episode.time_used == 6.0 and episode.time_left == 0.0
    assert episode.turns_left == 0 and not episode.action_mask[:-1].any() and episode.action_mask[-1]
    with pytest.raises(RuntimeError, match="time budget is spent"):
        episode.call(PARSER)
    assert episode.end_out_of_turns().level in ("failure", "partial_success") and episode.end_reason == OUT_OF_TIME
    plain = Episode.start(make_task(), 1)
    while plain.turns_left:
        plain.call(READER)
    plain.end_out_of_turns()
    assert plain.end_reason == OUT_OF_TURNS


def test_tool_base_success_replaces_the_base_of_the_named_tools():
    config = world(tool_base_success={READER: 0.5})
    episode = Episode.start(make_task(), 0, config)
    assert episode.probability(REG.id_of(READER)) == 0.5
    assert episode.probability(REG.id_of(PARSER)) == 0.8
    bases = tool_bases(config.processes, FailureModel(), REG)
    assert bases[REG.id_of(READER)] == 0.5 and bases.count(0.8) == len(REG) - 1


# --- bad values --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("values", "field"), [
    ({"outage_start": 1.5}, "processes.outage_start"),
    ({"rate_limit_wait": -1}, "processes.rate_limit_wait"),
    ({"latency_seconds": (1.0, 2.0), "latency_weights": (1.0,)}, "processes.latency_weights"),
    ({"latency_seconds": (1.0,), "latency_weights": (0.0,)}, "processes.latency_weights"),
    ({"call_timeout_seconds": 0}, "processes.call_timeout_seconds"),
    ({"tool_base_success": {READER: 2.0}}, "processes.tool_base_success"),
    ({"bursts": 1}, "processes.bursts"),
])
def test_bad_values_are_named(values, field):
    with pytest.raises(ConfigError) as error:
        world(**values)
    assert error.value.field == field and field.split(".")[-1] in str(error.value)


def test_unknown_tool_names_are_refused_when_an_episode_starts():
    config = world(tool_base_success={"file_operations_raeder": 0.5})
    with pytest.raises(ConfigError, match=r"processes.tool_base_success names unknown tool\(s\) "
                                          r"\['file_operations_raeder'\]") as error:
        Episode.start(make_task(), 0, config)
    assert error.value.field == "processes.tool_base_success"


def test_processes_load_from_yaml(tmp_path):
    from resilibench.core.config import load_config

    path = tmp_path / "world.yaml"
    path.write_text("processes:\n  outage_start: 0.05\n  outage_end: 0.5\n  latency_seconds: [0.2, 3]\n"
                    "  latency_weights: [9, 1]\n")
    processes = load_config(path).processes
    assert processes.active and processes.latency_seconds == (0.2, 3.0)


# --- front ends -----------------------------------------------------------------------------------------

BURSTY = {"outage_start": 0.3, "outage_end": 0.5, "rate_limit_probability": 0.3, "rate_limit_wait": 2,
          "latency_seconds": (1.0, 3.0), "latency_weights": (1, 1), "time_budget_seconds": 12.0}


def test_planner_env_shows_the_process_state():
    import numpy as np

    from resilibench.envs.planner.env import ResiliBenchEnv
    from resilibench.envs.planner.observation import ObservationLayout

    plain = ResiliBenchEnv(tasks=[make_task()])
    assert plain.observation_space.shape == (ObservationLayout(30).size,) == (204,)
    env = ResiliBenchEnv(tasks=[make_task(max_retries=5)], config=world(**BURSTY))
    layout = env.layout
    assert env.observation_space.shape == (layout.size,) == (265,)
    seen = {"blocked": False, "down": False}
    for seed in range(30):
        obs, _ = env.reset(seed=seed)
        assert obs[layout.time_left] == 1.0 and not obs[layout.blocked:layout.time_left].any()
        done = False
        while not done:
            legal = np.flatnonzero(env.episode.action_mask[:-1])
            action = int(legal[0]) if len(legal) else env.finish_action
            obs, _, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            ep = env.episode
            for tool in range(30):
                state = ep.tool_state(tool)
                assert obs[layout.blocked + tool] == np.float32(min(state.blocked / 2, 1.0))
                assert obs[layout.down + tool] == float(bool(state.down))
                seen["blocked"] |= state.blocked > 0
                seen["down"] |= bool(state.down)
            assert obs[layout.time_left] == np.float32(ep.time_left / 12.0)
            assert env.observation_space.contains(obs)
        if ep.end_reason == "out_of_time":
            assert truncated or info["level"]
    assert seen == {"blocked": True, "down": True}


def test_episode_observation_matches_the_env_with_processes():
    """PPO's from-scratch observation (``episode_observation``) equals the env's step for step."""
    import numpy as np

    from resilibench.envs.planner.env import ResiliBenchEnv
    from resilibench.policies.ppo.wrappers import episode_observation

    env = ResiliBenchEnv(tasks=[make_task(max_retries=5)], config=world(**BURSTY))
    rng = np.random.default_rng(0)
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            assert np.array_equal(episode_observation(env.episode), obs)
            obs, _, terminated, truncated, info = env.step(int(rng.choice(np.flatnonzero(info["action_mask"]))))
            done = terminated or truncated


def test_planner_env_truncates_once_the_time_budget_is_spent():
    from resilibench.envs.planner.env import ResiliBenchEnv

    config = world(latency_seconds=(4.0,), latency_weights=(1,), time_budget_seconds=8.0)
    env = ResiliBenchEnv(tasks=[make_task()], config=config)
    env.reset(seed=0)
    for tool in (READER, PARSER):
        env.step(REG.id_of(tool))
    assert not env.episode.action_mask[:-1].any()
    _, _, terminated, truncated, info = env.step(REG.id_of("utility_logger"))
    assert truncated and not terminated and info["end_reason"] == OUT_OF_TIME
    assert info["trace"][0]["duration"] == 4.0 and "retry_after" in info["trace"][0]


def test_vector_env_refuses_processes_naming_the_section():
    from resilibench.envs.planner.vector import ResiliBenchVectorEnv

    with pytest.raises(ConfigError, match="^processes: .*the single env plays them") as error:
        ResiliBenchVectorEnv(num_envs=2, tasks=[make_task()], config=world(outage_start=0.1))
    assert error.value.field == "processes"
    ResiliBenchVectorEnv(num_envs=2, tasks=[make_task()], config=world(outage_end=0.5))  # no effect: accepted


def test_feedback_says_what_the_process_did():
    from resilibench.core.text.toolbox import call_tool, feedback_text

    config = world(rate_limit_probability=1.0, rate_limit_wait=2, time_budget_seconds=10.0,
                   latency_seconds=(1.0,), latency_weights=(1,))
    episode = Episode.start(make_task(), 0, config)
    result = call_tool(episode, READER)
    text = feedback_text(result, episode)
    assert "Rate limited; retry after 2 turns." in text and "s of time left." in text
    assert result.output["retry_after"] == 2 and result.output["time_left"] == 10.0
    assert "Rate limited; retry after 1 turn." in feedback_text(call_tool(episode, READER), episode)

    down = Episode.start(make_task(), 0, world(outage_start=1.0, outage_end=0.0))
    assert "service is unavailable" in feedback_text(call_tool(down, READER), down)
    slow = Episode.start(make_task(), 0, world(latency_seconds=(9.0,), latency_weights=(1,), call_timeout_seconds=2.5))
    text = feedback_text(call_tool(slow, READER), slow)
    assert "timed out after 2.5 s; 2.5 s of call time used" in text
    plain = Episode.start(make_task(), 0)
    assert "time left" not in feedback_text(call_tool(plain, READER), plain)


def test_text_env_says_when_time_is_out():
    from resilibench.envs.text.env import ResiliBenchTextEnv

    config = world(latency_seconds=(5.0,), latency_weights=(1,), time_budget_seconds=5.0)
    env = ResiliBenchTextEnv(tasks=[make_task()], config=config)
    env.reset(seed=0)
    obs, *_ = env.step(f"<tool_call>{READER}</tool_call>")
    assert "0 s of time left" in obs and "No time left" in obs
    obs, _, _, truncated, info = env.step(f"<tool_call>{PARSER}</tool_call>")
    assert truncated and info["end_reason"] == OUT_OF_TIME and "No time left and no completion signal" in obs


def test_run_writes_a_call_log(tmp_path):
    from resilibench.cli import main
    from resilibench.core.bounds import optimal_success
    from resilibench.core.config import load_config
    from resilibench.core.world import load_tasks
    from resilibench.envs.real_api.call_log import read_rows
    from resilibench.results import METADATA_KEY

    config = tmp_path / "world.yaml"
    config.write_text("processes:\n  rate_limit_probability: 0.2\n  rate_limit_wait: 1\n"
                      "  latency_seconds: [0.5, 2.0]\n  latency_weights: [1, 1]\n")
    log = tmp_path / "calls.jsonl"
    assert main(["run", "--limit", "3", "--seeds", "0", "1", "--planners", "in_order", "dependency_aware",
                 "--config", str(config), "--output-dir", str(tmp_path / "run"), "--call-log", str(log)]) == 0
    rows = list(read_rows(log))
    world, tasks = load_config(config), {t.instance_id: t for t in load_tasks(split="test")}
    lines = (json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines())
    results = [r for r in lines if METADATA_KEY not in r]
    assert len({r.episode for r in rows}) == len(results) == 12
    for result in results:
        mine = [r for r in rows if r.episode == f"{result['planner']}/{result['task_id']}/{result['seed']}"]
        assert [r.tool for r in mine] == result["tools"] and [r.turn for r in mine] == list(range(1, len(mine) + 1))
        assert result["bound_iii"] == optimal_success(tasks[result["task_id"]], world)  # bound (iii) of this world
        assert "bound_ii" not in result  # not defined under failure processes
    assert {r.source for r in rows} == {"simulator"} and all(r.latency_s in (0.0, 0.5, 2.0) for r in rows)
    refusals = [r for r in rows if r.error_code == RATE_LIMIT_ERROR]
    assert refusals and all(r.retry_after in (0, 1) and r.latency_s == 0.0 for r in refusals)
    assert all(r.retry_after is None for r in rows if r.error_code != RATE_LIMIT_ERROR)
    # Covariates before each call: the failed calls so far.
    for episode in {r.episode for r in rows}:
        mine = [r for r in rows if r.episode == episode]
        assert [r.n_history for r in mine] == [sum(not x.success for x in mine[:i]) for i in range(len(mine))]
    assert main(["run", "--limit", "1", "--output-dir", str(tmp_path / "r2"), "--call-log", str(tmp_path)]) == 2


def test_the_cli_names_an_unknown_tool_before_any_work(tmp_path, capsys):
    from resilibench.cli import main

    config = tmp_path / "world.yaml"
    config.write_text("processes:\n  tool_base_success: {network_fetchr: 0.5}\n")
    assert main(["run", "--limit", "1", "--config", str(config), "--output-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "processes.tool_base_success names unknown tool(s) ['network_fetchr']" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_run_call_log_of_the_v1_world_has_no_latency(tmp_path):
    from resilibench.core.world import load_tasks
    from resilibench.envs.real_api.call_log import read_rows
    from resilibench.policies.runner import episode_jobs, run_jobs

    log = tmp_path / "calls.jsonl"
    tasks = load_tasks(split="test")[:4]
    rows = run_jobs(episode_jobs(["random_legal"], tasks, [0]), clairvoyant=False, call_log=log)
    logged = list(read_rows(log))
    assert all(r.latency_s is None and r.retry_after is None for r in logged)
    assert len(logged) == sum(len(r["tools"]) for r in rows) and all("bound_iii" in r for r in rows)
