"""The failure model (paper app. B.3) and the episode rules (docs/core/rules.md)."""

import itertools
import math

import numpy as np
import pytest

from helpers import make_task, scripted_episode
from resilibench.core.config import WorldConfig
from resilibench.core.registry import DEPENDENCY_ERROR, INVALID_INPUT, default_registry
from resilibench.core.simulator import RETRY_LIMIT_ERROR, Episode

REG = default_registry()
READER, PARSER, TRANSFORMER = "file_operations_reader", "data_processing_parser", "data_processing_transformer"


def call_after(task, calls: dict[str, bool], tool: str, config: WorldConfig | None = None):
    """The record of calling ``tool`` after the calls of ``calls`` (tool: outcome, in order), their outcomes
    scripted; the call of ``tool`` itself meets a failing draw."""
    episode = scripted_episode(task, list(calls.values()), config)
    for t, ok in calls.items():
        assert episode.call(t).success == ok
    return episode.call(tool)


# The success formula, exactly: p = base * uncalled**N_u * failed**N_f * history**N_h with the defaults
# 0.8, 0.5, 0.7, 0.9 (the products below are computed in the formula's order, so == is exact).


def test_no_dependencies_base_rate():
    assert call_after(make_task(), {}, READER).probability == 0.8


def test_uncalled_dependency_halves():
    task = make_task()
    assert call_after(task, {}, TRANSFORMER).probability == 0.8 * 0.5
    assert call_after(task, {}, "computation_analyzer").probability == 0.8 * 0.25  # two uncalled dependencies


def test_failed_dependency_and_history():
    task = make_task()
    assert call_after(task, {PARSER: True}, TRANSFORMER).probability == 0.8  # dependency met, no history
    # Dependency called but failed, and that failure is one in the history.
    assert call_after(task, {PARSER: False}, TRANSFORMER).probability == 0.8 * 0.7 * 0.9


def test_history_factor_per_failure():
    """Every outcome of two earlier calls: each failure multiplies by the history factor."""
    task = make_task()
    for first, second in itertools.product((True, False), repeat=2):
        record = call_after(task, {"utility_logger": first, "utility_cache": second}, READER)
        assert record.probability == 0.8 * 0.9 ** [first, second].count(False)


def test_a_call_succeeds_iff_its_draw_is_below_its_probability():
    """The sampling rule draw by draw: success draw u succeeds iff u < p (the boundary value itself fails),
    for calls of several probabilities."""
    task = make_task()
    for calls, tool in (({}, READER), ({}, TRANSFORMER), ({"utility_logger": False}, READER)):
        p = call_after(task, calls, tool).probability
        below, top = math.nextafter(p, 0.0), math.nextafter(1.0, 0.0)
        for u, success in ((0.0, True), (below, True), (p, False), (top, False)):
            episode = scripted_episode(task, list(calls.values()))
            for t in calls:
                episode.call(t)
            episode.stream[len(calls), 0] = u
            record = episode.call(tool)
            assert (record.success, record.probability) == (success, p), (tool, u)


def test_error_code_is_the_draws_share_of_the_tool_list():
    """A failed call's code is codes[int(u * n)] for its error-code draw u: every code of the list is
    taken, each on the n-th of [0, 1) that the rule gives it."""
    codes = REG["network_fetcher"].error_codes
    n = len(codes)
    for j, code in enumerate(codes):
        for u in ((j + 0.001) / n, (j + 0.5) / n, (j + 0.999) / n):
            episode = scripted_episode(make_task(), [False])
            episode.stream[0, 1] = u
            assert episode.call("network_fetcher").error_code == code
    episode = scripted_episode(make_task(), [False])
    episode.stream[0, 1] = math.nextafter(1.0, 0.0)
    assert episode.call("network_fetcher").error_code == codes[-1]


def test_sampled_outcomes_follow_their_probabilities():
    """Statistical smoke test of sampling itself, on the episodes' own streams: over 3,000 seeds, a first
    call of p = 0.4 succeeds with frequency 0.4 and its failures spread evenly over the tool's error codes
    (5 standard errors, fixed seeds)."""
    task, config, n = make_task(), WorldConfig(), 3000
    records = [Episode.start(task, seed, config).call(TRANSFORMER) for seed in range(n)]
    assert all(r.probability == 0.8 * 0.5 for r in records)
    successes = sum(r.success for r in records)
    assert abs(successes / n - 0.4) < 5 * math.sqrt(0.4 * 0.6 / n), successes / n
    codes = REG[TRANSFORMER].error_codes
    failed = n - successes
    for code in codes:
        share = 1 / len(codes)
        hits = sum(r.error_code == code for r in records)
        assert abs(hits / failed - share) < 5 * math.sqrt(share * (1 - share) / failed), (code, hits / failed)


def test_probability_matches_formula_and_config():
    config = WorldConfig().replace(failure={"base_success": 0.6, "failure_history_factor": 0.5})
    episode = scripted_episode(make_task(), [False], config)
    episode.call("utility_logger")
    assert episode.probability(REG.id_of("file_operations_reader")) == pytest.approx(0.6 * 0.5)
    assert episode.probability(REG.id_of("data_processing_transformer")) == pytest.approx(0.6 * 0.5 * 0.5)


def test_each_call_consumes_one_stream_row():
    task = make_task()
    a, b = Episode.start(task, 7), Episode.start(task, 7)
    assert np.array_equal(a.stream, b.stream)
    for t in ("file_operations_reader", "data_processing_parser", "data_processing_validator"):
        before = a.draws_used
        ra, rb = a.call(t), b.call(t)
        assert ra == rb and a.draws_used == before + 1
        assert ra.success == (a.stream[before, 0] < ra.probability)


def test_strict_dependencies_fail_without_draw():
    config = WorldConfig().replace(rules={"strict_dependencies": True})
    episode = scripted_episode(make_task(), [True] * 10, config)
    record = episode.call("data_processing_transformer")
    assert not record.success and record.error_code == DEPENDENCY_ERROR
    assert record.unmet_dependencies == ("data_processing_parser",)
    assert episode.draws_used == 0 and episode.n_failures == 1 and episode.turns_used == 1
    assert episode.call("data_processing_parser").success
    assert episode.probability(REG.id_of("data_processing_transformer")) == pytest.approx(0.8 * 0.9)


def test_invalid_input_fails_without_draw_and_counts():
    episode = scripted_episode(make_task(), [True] * 10)
    record = episode.call("file_operations_reader", invalid_input=True)
    assert not record.success and record.error_code == INVALID_INPUT and record.probability is None
    assert episode.draws_used == 0 and episode.n_failures == 1 and episode.turns_used == 1
    assert episode.calls[REG.id_of("file_operations_reader")] == 1
    assert episode.call("file_operations_reader").success  # valid arguments: a normal draw
    assert episode.draws_used == 1


def test_consecutive_failure_termination():
    episode = scripted_episode(make_task(), [False] * 10)
    for tool in ("utility_logger", "utility_cache", "utility_logger", "utility_cache"):
        episode.call(tool)
    assert not episode.done
    episode.call("utility_tracker")
    assert episode.end_reason == "consecutive_failures" and episode.evaluation.level == "failure"


def test_same_tool_repetition_termination():
    episode = scripted_episode(make_task(), [False] * 10)
    episode.call("utility_logger")
    episode.call("utility_logger")
    assert not episode.done
    episode.call("utility_logger")
    assert episode.end_reason == "repetition_loop"


def test_success_resets_consecutive_count():
    episode = scripted_episode(make_task(), [False, False, False, False, True, False, False, False, False])
    for tool in ("utility_logger", "utility_cache", "utility_tracker", "utility_helper", "file_operations_reader",
                 "utility_logger", "utility_cache", "utility_tracker", "utility_helper"):
        episode.call(tool)
    assert not episode.done and episode.consecutive_failures == 4


def test_call_cap_and_replay_in_text_rules():
    task = make_task(max_retries=1)  # at most 2 calls of a tool
    episode = scripted_episode(task, [False, True, False, True, True])
    reader = REG.id_of("file_operations_reader")
    episode.call(reader)
    episode.call("utility_logger")
    episode.call(reader)
    assert episode.action_mask[reader] == 0  # capped: masked for the planner env
    draws = episode.draws_used
    record = episode.call(reader)
    assert record.error_code == RETRY_LIMIT_ERROR and episode.draws_used == draws
    episode.call("utility_cache")
    replay = episode.call("utility_cache")
    assert replay.success and replay.replayed and episode.draws_used == draws + 1


def test_turn_limit_leaves_only_finish():
    episode = scripted_episode(make_task(), [True] * 10)
    tools = [t for t in REG.names if not REG[t].dependencies][:10]
    for t in tools:
        episode.call(t)
    assert episode.turns_left == 0
    assert episode.action_mask[:-1].sum() == 0 and episode.action_mask[-1] == 1
    with pytest.raises(RuntimeError, match="no turns left"):
        episode.call("utility_helper")
    evaluation = episode.finish()
    assert evaluation.completed
    with pytest.raises(RuntimeError, match="already ended"):
        episode.finish()


def test_bad_tool_is_a_clear_error():
    episode = Episode.start(make_task(), 0)
    with pytest.raises(KeyError, match="unknown tool"):
        episode.call("no_such_tool")
    with pytest.raises(ValueError, match="tool id"):
        episode.call(99)


def test_training_profile():
    config = WorldConfig().replace(rules={"profile": "training"})
    episode = Episode.start(make_task(), 0, config, success_rate=0.5)
    transformer = REG.id_of("data_processing_transformer")
    # base 0.85 (success rate >= 0.3), one unmet dependency 0.8, required tool semantic factor 1.3
    assert episode.probability(transformer) == pytest.approx(min(1.0, 0.85 * 0.8 * 1.3))
    assert episode.probability(REG.id_of("utility_logger")) == pytest.approx(0.85)


def test_spend_turn_uses_a_turn_without_a_draw():
    episode = scripted_episode(make_task(), [True] * 10)
    episode.spend_turn()
    assert episode.turns_used == 1 and episode.draws_used == 0 and episode.trace == []
    assert episode.call("file_operations_reader").success and episode.draws_used == 1


@pytest.mark.parametrize("config", [
    WorldConfig(),
    WorldConfig().replace(rules={"profile": "training", "strict_dependencies": True}),
    WorldConfig().replace(processes={"outage_start": 0.1, "rate_limit_probability": 0.2,
                                     "tool_base_success": {READER: 0.5}}),
], ids=["default", "training_strict", "processes"])
def test_start_is_the_constructor_and_shares_no_mutable_state(config):
    """``Episode.start`` copies a prototype episode: it must equal the constructor's episode attribute for
    attribute, and two started episodes (or one and the prototype) must share no list or array, so playing
    one leaves the others as they were."""
    first, second = make_task(), make_task(required=[PARSER, TRANSFORMER])

    def state(episode: Episode) -> dict:
        return {k: v.tolist() if isinstance(v, np.ndarray) else v for k, v in vars(episode).items()}

    Episode.start(first, 1, config, REG)  # the prototype is made with another task and seed
    started, built = Episode.start(second, 7, config, REG, success_rate=0.25), Episode(second, config, REG, 7, 0.25)
    assert state(started) == state(built)
    again = Episode.start(second, 7, config, REG, success_rate=0.25)
    for name, value in vars(started).items():
        shared = ("required_position", "_probabilities", "_memo", "_fresh_mask")  # read-only tables and the memo
        if isinstance(value, list | dict | np.ndarray) and name not in shared:
            assert value is not vars(again)[name], name
    for tool in (READER, PARSER, TRANSFORMER, PARSER):
        started.call(tool)
    assert state(again) == state(built)  # untouched by the calls
    for tool in (READER, PARSER, TRANSFORMER, PARSER):
        built.call(tool)
    assert state(started) == state(built)
