"""Failure calibration (envs.real_api.failure_fit, `resilibench failures fit`): known parameters recovered from
logs the simulator writes, intervals, goodness of fit, the written config, bad input."""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from functools import cache

import numpy as np
import pytest
import yaml

from resilibench.cli import main
from resilibench.core.config import WorldConfig, load_config
from resilibench.core.processes import ToolState, call_outcomes, tool_bases
from resilibench.core.registry import default_registry
from resilibench.core.simulator import success_probability
from resilibench.core.world import load_tasks
from resilibench.envs.real_api.call_log import CallLogRow, read_rows, write_rows
from resilibench.envs.real_api.failure_fit import PROCESS_OPTIONS, drawing_calls, fit_failures, log_likelihood
from resilibench.errors import InputError
from resilibench.policies.runner import episode_jobs, run_jobs

FORMULA = {"base_success": 0.85, "uncalled_dependency_factor": 0.6, "failed_dependency_factor": 0.4,
           "failure_history_factor": 0.93}
PROCESSES = {"outage_start": 0.1, "outage_end": 0.5, "rate_limit_probability": 0.08, "rate_limit_wait": 2,
             "latency_seconds": [0.2, 1.0, 5.0], "latency_weights": [0.6, 0.3, 0.1], "call_timeout_seconds": 3.0}
# Unreliable tools among those the first tasks use most.
TOOL_BASES = {"network_router": 0.5, "computation_optimizer": 0.6, "integration_authenticator": 0.55,
              "file_operations_reader": 0.97, "integration_queue": 0.5}


@cache
def simulated_log(tmp: str, n_tasks: int, n_seeds: int, processes: str = "{}",
                  planner: str = "random_legal") -> list[CallLogRow]:
    """The call log of ``planner`` on the first ``n_tasks`` tasks and run seeds 0..n_seeds-1, in the
    world FORMULA with the processes of the JSON ``processes`` (the planner's choices repeat across tasks
    for one seed, so several seeds vary the tools and covariates)."""
    config = WorldConfig().replace(failure=FORMULA, processes=json.loads(processes))
    path = f"{tmp}/calls-{planner}-{n_tasks}-{n_seeds}-{zlib.crc32(processes.encode())}.jsonl"
    run_jobs(episode_jobs([planner], load_tasks()[:n_tasks], range(n_seeds)), config, call_log=path,
             bounds=False)
    return list(read_rows(path))


@pytest.fixture(scope="module")
def tmp(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("logs"))


def _inside(fit, name: str, truth: float) -> bool:
    estimate = fit.estimate(name)
    return estimate.identified and estimate.low <= truth <= estimate.high


def _width(fit, name: str) -> float:
    estimate = fit.estimate(name)
    return estimate.high - estimate.low


def test_formula_parameters_are_recovered_and_intervals_shrink_with_more_data(tmp):
    rows = simulated_log(tmp, 150, 8)
    episodes = sorted({r.episode for r in rows})
    first = set(episodes[:len(episodes) // 5])
    small = fit_failures([r for r in rows if r.episode in first])
    large = fit_failures(rows)
    assert large.calls > 4 * small.calls > 1500
    for field, truth in FORMULA.items():
        name = f"failure.{field}"
        assert _inside(large, name, truth) and large.estimate(name).method == "fisher-logit", large.estimate(name)
        if small.estimate(name).identified:  # failed dependencies are rare: the small log may have too few
            assert _inside(small, name, truth) and _width(large, name) < 0.75 * _width(small, name)
    assert sum(e.identified for e in small.estimates) >= 3
    # Three checks at 0.05 would flag about one well-specified log in seven; well specified means none at 0.01.
    assert all(test.passed(0.01) for test in large.tests), large.table()


def test_per_tool_bases_one_base_fails_the_tool_check_and_per_tool_passes(tmp):
    rows = simulated_log(tmp, 100, 8, json.dumps({"tool_base_success": TOOL_BASES}))
    one = fit_failures(rows)
    by_tool = {t.name: t for t in one.tests}["by tool (shared base)"]
    assert by_tool.p_value < 1e-3  # misspecified: the tools do not share one base
    per_tool = fit_failures(rows, per_tool=True, min_rows=60)
    assert all(test.passed(0.01) is not False for test in per_tool.tests), per_tool.table()
    for tool, truth in TOOL_BASES.items():
        assert _inside(per_tool, f"processes.tool_base_success.{tool}", truth), per_tool.estimate(
            f"processes.tool_base_success.{tool}")
    # Tools with too few calls share the global base, fitted on them alone.
    shared = per_tool.estimate("failure.base_success")
    assert shared.identified and shared.low <= FORMULA["base_success"] <= shared.high
    for field in ("uncalled_dependency_factor", "failure_history_factor"):
        assert _inside(per_tool, f"failure.{field}", FORMULA[field])


def test_processes_are_recovered_through_the_simulators_branches(tmp):
    rows = simulated_log(tmp, 100, 8, json.dumps(PROCESSES))
    # Eleven intervals at once: at 95% each, all would hold in about 57% of logs; at 99%, in about 90%.
    fit = fit_failures(rows, processes=PROCESS_OPTIONS, level=0.99)
    for field in ("outage_start", "outage_end", "rate_limit_probability"):
        assert _inside(fit, f"processes.{field}", PROCESSES[field]), fit.estimate(f"processes.{field}")
    for field, truth in FORMULA.items():
        assert _inside(fit, f"failure.{field}", truth), fit.estimate(f"failure.{field}")
    for k, truth in enumerate(PROCESSES["latency_weights"]):
        assert _inside(fit, f"processes.latency_weights[{k}]", truth)
    assert fit.estimate("processes.rate_limit_wait").value == 2
    processes = fit.config()["processes"]
    assert processes["call_timeout_seconds"] == 3.0 and processes["latency_seconds"][:2] == [0.2, 1.0]
    assert processes["latency_seconds"][2] > 3.0  # the timed-out mass: any duration above the timeout
    assert all(test.passed(0.01) for test in fit.tests), fit.table()
    # Without the processes the formula alone misreads the refusals and outages as failures.
    plain = fit_failures(rows)
    assert not _inside(plain, "failure.base_success", FORMULA["base_success"])
    assert any(test.p_value < 1e-3 for test in plain.tests if test.p_value is not None)


def test_http_logs_wire_times_and_retry_after_in_seconds(tmp):
    """Rows as the HTTP client writes them: latency the wire's (jittered, refusals too), Retry-After in
    seconds. The Retry-After says nothing of the wait in turns; the durations are binned onto a grid."""
    processes = {**PROCESSES, "rate_limit_wait": 0}
    rng = np.random.default_rng(0)
    rows = []
    for row in simulated_log(tmp, 100, 8, json.dumps(processes)):
        timed_out = row.error_code == "TIMEOUT" and row.latency_s == 3.0
        wire = row.latency_s + (rng.uniform(0, 0.05) if timed_out else rng.uniform(0.001, 0.02))
        rows.append(dataclasses.replace(row, source="http", latency_s=round(wire, 6),
                                        retry_after=1.0 if row.error_code == "RATE_LIMIT_ERROR" else None))
    fit = fit_failures(rows, processes=PROCESS_OPTIONS, level=0.99)
    for field in ("outage_start", "outage_end", "rate_limit_probability"):
        assert _inside(fit, f"processes.{field}", processes[field]), fit.estimate(f"processes.{field}")
    for field, truth in FORMULA.items():
        assert _inside(fit, f"failure.{field}", truth), fit.estimate(f"failure.{field}")
    assert not fit.estimate("processes.rate_limit_wait").identified
    settings = fit.config()["processes"]
    assert 3.0 <= settings["call_timeout_seconds"] < 3.01 and "rate_limit_wait" not in settings
    assert len(settings["latency_seconds"]) <= 11  # ten quantiles and the timed-out mass
    assert settings["latency_weights"][-1] == pytest.approx(0.1, abs=0.02)
    assert load_config_from(fit, tmp)


def load_config_from(fit, tmp: str) -> WorldConfig:
    path = f"{tmp}/fitted.yaml"
    with open(path, "w") as out:
        out.write(yaml.safe_dump(fit.config()))
    return load_config(path)


def _branch_log_likelihood(rows: list[CallLogRow], config: WorldConfig) -> float:
    """The log likelihood of simulator rows by walking ``call_outcomes`` as the Episode does: per episode
    and tool a distribution over (down, blocked until), updated with every branch that shows the row."""
    registry = default_registry()
    bases = tool_bases(config.processes, config.failure, registry)
    total, states = 0.0, {}
    for row in rows:
        before = states.get((row.episode, row.tool), {(None, 0): 1.0})
        p = success_probability(bases[registry.id_of(row.tool)], row.n_uncalled, row.n_failed, row.n_history,
                                config.failure)
        after: dict = {}
        for (down, until), weight in before.items():
            state = ToolState(down, max(until - row.turn + 1, 0))
            for q, o in call_outcomes(config.processes, state, p, registry[row.tool].error_codes):
                shown = (o.success, o.error_code, o.retry_after, o.duration if row.latency_s is not None else None)
                if shown == (row.success, row.error_code, row.retry_after, row.latency_s):
                    key = (o.state.down, row.turn + o.state.blocked)
                    after[key] = after.get(key, 0.0) + weight * q
        norm = sum(after.values())
        total += math.log(norm)
        states[(row.episode, row.tool)] = {k: v / norm for k, v in after.items()}
    return total


def test_the_likelihood_is_the_simulators_branches(tmp):
    processes = {**PROCESSES, "tool_base_success": {"network_router": 0.5, "integration_queue": 0.6}}
    rows = simulated_log(tmp, 30, 2, json.dumps(processes), "in_order")  # it retries: blocked calls
    assert {"RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT"} <= {r.error_code for r in rows}
    assert any(r.retry_after == 1 for r in rows)  # a refusal while blocked
    truth = WorldConfig().replace(failure=FORMULA, processes=processes)
    other = truth.replace(failure={"base_success": 0.7}, processes={"outage_start": 0.3, "outage_end": 0.2,
                                                                     "rate_limit_probability": 0.2})
    for config in (truth, other):
        assert log_likelihood(rows, config) == pytest.approx(_branch_log_likelihood(rows, config), rel=1e-9)
    assert log_likelihood(rows, truth) > log_likelihood(rows, other)
    # A code that neither the tool nor a process gives cannot be explained with processes.
    odd = [CallLogRow("http", "t", "e", 1, "utility_logger", 0, 0, 0, False, "NETWORK_ERROR")]
    with pytest.raises(InputError, match="neither a code of utility_logger"):
        fit_failures(odd, processes=("outages",))


def test_the_forward_backward_gradient_is_the_likelihoods_slope(tmp):
    from resilibench.envs.real_api import failure_fit

    rows = simulated_log(tmp, 30, 2, json.dumps(PROCESSES), "in_order")
    model = failure_fit._ProcessModel(drawing_calls(rows), default_registry(), True, 20, "log", PROCESS_OPTIONS,
                                      0.95)
    theta = np.random.default_rng(1).uniform(0.3, 0.9, len(model.parameters))
    gradient = model.gradient(theta)
    for j in range(theta.size):
        up, down = theta.copy(), theta.copy()
        up[j], down[j] = theta[j] + 1e-6, theta[j] - 1e-6
        slope = (model.log_likelihood(up) - model.log_likelihood(down)) / 2e-6
        assert gradient[j] == pytest.approx(slope, rel=1e-4, abs=1e-3), model.parameters[j].name


def test_a_parameter_at_a_bound_gets_a_one_sided_profile_interval():
    # Calls without penalties that all succeed: the base's estimate is 1.
    rows = [CallLogRow("http", "t", f"e{i}", 1, "network_fetcher", 0, 0, 0, True) for i in range(40)]
    fit = fit_failures(rows)
    base = fit.estimate("failure.base_success")
    assert base.method == "profile" and base.value == pytest.approx(1.0) and base.high == 1.0
    # 40 successes in 40: the one-sided 95% bound solves 40 log(1/p) = 2.71 / 2.
    assert base.low == pytest.approx(0.9667, abs=1e-3)
    for field in ("uncalled_dependency_factor", "failed_dependency_factor", "failure_history_factor"):
        estimate = fit.estimate(f"failure.{field}")
        assert not estimate.identified and estimate.method == "default" and "not identified" in estimate.note
    assert fit.config() == {"failure": {"base_success": 1.0}}


def test_drawing_calls_leave_out_replays_and_drawless_rules():
    row = CallLogRow("simulator", "t", "e", 1, "network_fetcher", 0, 0, 0, True)
    replay = CallLogRow("simulator", "t", "e", 2, "network_fetcher", 0, 0, 0, True)
    capped = CallLogRow("simulator", "t", "e", 3, "network_poster", 0, 0, 0, False, "RETRY_LIMIT_EXCEEDED")
    assert drawing_calls([capped, replay, row]) == [row]
    with pytest.raises(InputError) as error:
        drawing_calls([row, row], "calls.jsonl")
    assert error.value.field == "turn" and "calls.jsonl" in str(error.value) and "turn 1" in str(error.value)


def test_command_writes_a_config_that_run_accepts(tmp, tmp_path, capsys):
    log = tmp_path / "calls.jsonl"
    write_rows(log, simulated_log(tmp, 150, 8))
    assert main(["failures", "fit", str(log), "--level", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "failure.base_success" in out and "by predicted probability" in out
    config_path = tmp_path / "calls.world.yaml"
    config = load_config(config_path)
    report = json.loads((tmp_path / "calls.world.report.json").read_text())
    assert report["level"] == 0.9 and report["config"]["failure"]["base_success"] == config.failure.base_success
    assert abs(config.failure.base_success - FORMULA["base_success"]) < 0.05
    assert main(["run", "--limit", "1", "--seeds", "0", "--planners", "in_order", "--config", str(config_path),
                 "--output-dir", str(tmp_path / "run")]) == 0


def test_bad_input_is_named(tmp_path, capsys):
    log = tmp_path / "calls.jsonl"
    log.write_text(json.dumps(CallLogRow("http", "t", "e", 1, "network_fetcher", 0, 0, 0, True).to_dict())
                   + "\n" + '{"source": "http", "task_id": "t"}\n')
    assert main(["failures", "fit", str(log)]) == 2
    assert f"{log}:2" in capsys.readouterr().err
    log.write_text(json.dumps(CallLogRow("http", "t", "e", 1, "no_such_tool", 0, 0, 0, True).to_dict()) + "\n")
    assert main(["failures", "fit", str(log)]) == 2
    err = capsys.readouterr().err
    assert "unknown tool 'no_such_tool'" in err and err.count("\n") == 1
    assert main(["failures", "fit", str(log), "--level", "1.5"]) == 2
    assert "--level" in capsys.readouterr().err
    assert main(["failures", "fit", str(log), "--output", str(tmp_path / "w.json")]) == 2
    assert "must end in .yaml" in capsys.readouterr().err
    with pytest.raises(InputError, match="processes"):
        fit_failures([], processes=("bursts",))
