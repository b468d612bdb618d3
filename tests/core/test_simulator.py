"""The failure model (paper app. B.3) and the episode rules (docs/core/rules.md)."""

import math

import numpy as np
import pytest

from helpers import make_task, scripted_episode
from resilibench.core.config import WorldConfig
from resilibench.core.registry import DEPENDENCY_ERROR, INVALID_INPUT, default_registry
from resilibench.core.simulator import RETRY_LIMIT_ERROR, Episode

REG = default_registry()
N = 20000


def assert_rate(successes: int, n: int, p: float) -> None:
    """Binomial check at 4.5 standard errors (false alarm rate ~ 1e-5)."""
    se = math.sqrt(p * (1 - p) / n)
    assert abs(successes / n - p) < 4.5 * se, (successes / n, p)


def first_call_rate(task, tool, prefix=(), n=N):
    """Empirical success rate of calling ``tool`` after the calls in ``prefix`` (all seeds), split by
    what happened in the prefix: returns {prefix outcomes: (successes, count)}."""
    out: dict[tuple[bool, ...], list[int]] = {}
    for seed in range(n):
        episode = Episode.start(task, seed)
        outcomes = tuple(episode.call(t).success for t in prefix)
        record = episode.call(tool)
        counts = out.setdefault(outcomes, [0, 0])
        counts[0] += record.success
        counts[1] += 1
    return out


def test_no_dependencies_base_rate():
    task = make_task()
    (succ, n), = first_call_rate(task, "file_operations_reader").values()
    assert_rate(succ, n, 0.8)


def test_uncalled_dependency_halves():
    task = make_task()
    (succ, n), = first_call_rate(task, "data_processing_transformer").values()
    assert_rate(succ, n, 0.8 * 0.5)
    (succ, n), = first_call_rate(task, "computation_analyzer").values()  # two uncalled dependencies
    assert_rate(succ, n, 0.8 * 0.25)


def test_failed_dependency_and_history():
    task = make_task()
    rates = first_call_rate(task, "data_processing_transformer", prefix=("data_processing_parser",))
    succ, n = rates[(True,)]
    assert_rate(succ, n, 0.8)  # dependency met, no history
    succ, n = rates[(False,)]
    assert_rate(succ, n, 0.8 * 0.7 * 0.9)  # dependency called but failed, one failure in history


def test_history_factor_per_failure():
    task = make_task()
    prefix = ("utility_logger", "utility_cache")
    rates = first_call_rate(task, "file_operations_reader", prefix=prefix)
    for outcomes, (succ, n) in rates.items():
        failures = outcomes.count(False)
        if n > 500:
            assert_rate(succ, n, 0.8 * 0.9**failures)


def test_probability_matches_formula_and_config():
    config = WorldConfig().replace(failure={"base_success": 0.6, "failure_history_factor": 0.5})
    episode = scripted_episode(make_task(), [False], config)
    episode.call("utility_logger")
    assert episode.probability(REG.id_of("file_operations_reader")) == pytest.approx(0.6 * 0.5)
    assert episode.probability(REG.id_of("data_processing_transformer")) == pytest.approx(0.6 * 0.5 * 0.5)


def test_error_codes_drawn_uniformly_from_tool_list():
    task = make_task()
    codes = REG["network_fetcher"].error_codes
    counts = dict.fromkeys(codes, 0)
    for seed in range(6000):
        record = Episode.start(task, seed).call("network_fetcher")
        if not record.success:
            counts[record.error_code] += 1
    total = sum(counts.values())
    for c in counts.values():
        assert_rate(c, total, 1 / len(codes))


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
