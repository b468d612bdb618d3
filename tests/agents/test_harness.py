"""The batched evaluation harness (with a tiny local transformers model) and the report's metrics."""

from __future__ import annotations

import json

import pytest
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401 (fixture)

from resilibench.agents.harness import EVAL_KEY, eval_jobs, run_eval
from resilibench.agents.report import (
    format_tables,
    pass_hat_k,
    pass_k,
    plot_summary,
    recovery,
    summarize_eval,
    wasted_calls,
)
from resilibench.agents.scripted import OptimalTextAgent, PlanFollowingTextAgent
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.llm import GenerationConfig
from resilibench.results import read_jsonl

LEVELS = ("full_success", "partial_success", "failure")


def one_task_per_type(count: int = 1):
    """The first test tasks of each type with at least two required tools (every flaw type applies)."""
    tasks = [t for t in load_tasks(split="test") if len(t.required_tools) >= 2]
    return [t for name in TASK_TYPE_NAMES for t in [t for t in tasks if t.task_type == name][:count]]


# --- with a tiny transformers model -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory, torch_one_thread):  # noqa: F811 (fixture)
    from resilibench.agents.backends import TransformersBackend

    return TransformersBackend(build_tiny_lm(tmp_path_factory.mktemp("tiny_lm")), batch_size=8)


GENERATION = GenerationConfig(max_new_tokens=6)
# Keeps the embedding model out of this module; search itself is tested elsewhere.
ENV = {"search": SearchSettings(method="lexical")}


@pytest.fixture(scope="module")
def tiny_jobs():
    return eval_jobs(one_task_per_type()[:2], ["baseline", "optimal", "flawed"], seeds=[0], flaw_types=["order"])


@pytest.fixture(scope="module")
def tiny_run(tiny_backend, tiny_jobs, tmp_path_factory):
    """A complete run of 6 episodes, 4 at a time (the pool refills), with the conversations kept."""
    path = tmp_path_factory.mktemp("full") / "results.jsonl"
    rows = run_eval(tiny_backend, tiny_jobs, generation=GENERATION, batch_size=4, output_dir=path.parent,
                    keep_messages=True, metadata={"run": "full"}, progress=False, env={**ENV})
    return path, rows


def test_llm_episodes_end_properly_and_rows_are_written(tiny_run, tiny_jobs, tiny_backend):
    path, rows = tiny_run
    assert [tuple(r[f] for f in EVAL_KEY) for r in rows] == [job.key(tiny_backend.name) for job in tiny_jobs]
    contents = read_jsonl(path)
    assert contents.metadata == [{"run": "full"}]
    assert sorted(json.dumps(r, sort_keys=True) for r in contents.rows) == sorted(
        json.dumps(r, sort_keys=True) for r in rows)
    for row in rows:
        assert row["model"] == tiny_backend.name
        assert row["level"] in LEVELS
        assert row["end_reason"] in ("finished", "out_of_turns", "consecutive_failures", "repetition_loop")
        assert 1 <= row["turns"] <= 10
        assert 0.0 < row["bound_iii"] < 1.0
        messages = row["messages"]
        assert [m["role"] for m in messages] == ["user", "assistant"] * ((len(messages) - 1) // 2) + ["user"]
        # Every assistant message is one turn, except a final message that only signals completion.
        assert len(messages) // 2 in (row["turns"], row["turns"] + 1)
        assert (row["plan"] is not None) == (row["prompt"] != "baseline")
        assert (row["severity"] is not None) == (row["prompt"] == "flawed")
    assert {r["prompt"] for r in rows} == {"baseline", "optimal", "flawed"}


@pytest.mark.slow
def test_llm_plays_the_tools_protocol(tiny_backend, tiny_jobs):
    """The tiny model under native tool calling: the chat template gets the function schemas, its answers
    are read back as assistant messages; the episodes end and rows carry the protocol."""
    jobs = tiny_jobs[:2]
    rows = run_eval(tiny_backend, jobs, generation=GENERATION, batch_size=2, keep_messages=True,
                    progress=False, env={**ENV, "prompt": PromptSettings(protocol="tools")})
    assert [r["protocol"] for r in rows] == ["tools", "tools"] and all(r["level"] in LEVELS for r in rows)
    for row in rows:
        assistant = [m for m in row["messages"] if m["role"] == "assistant"]
        assert len(assistant) in (row["turns"], row["turns"] + 1)
        assert all(isinstance(m["content"], str) for m in assistant)
    again = run_eval(tiny_backend, jobs, generation=GENERATION, batch_size=1, progress=False,
                     env={**ENV, "prompt": PromptSettings(protocol="tools")})
    assert again == [{k: v for k, v in r.items() if k != "messages"} for r in rows]


def test_llm_run_resumes_after_a_crash_mid_write(tiny_backend, tiny_jobs, tiny_run, tmp_path):
    """A run killed while writing its fourth row: a rerun plays the missing episodes only and ends with
    exactly the rows of the uninterrupted run (greedy decoding, paired seeds)."""
    full_path, complete = tiny_run
    lines = full_path.read_bytes().splitlines(keepends=True)  # metadata record, then one line per row
    path = tmp_path / "results.jsonl"
    path.write_bytes(b"".join(lines[:4]) + lines[4][:50])
    played: list[tuple] = []
    rows = run_eval(tiny_backend, tiny_jobs, generation=GENERATION, batch_size=4, output_dir=path.parent,
                    keep_messages=True, on_result=lambda row: played.append(tuple(row[f] for f in EVAL_KEY)),
                    progress=False, env={**ENV})
    done_before = {tuple(json.loads(line)[f] for f in EVAL_KEY) for line in lines[1:4]}
    assert len(played) == len(tiny_jobs) - 3 and not done_before & set(played)
    assert rows == complete
    contents = read_jsonl(path)
    assert not contents.dropped_tail
    keys = [tuple(r[f] for f in EVAL_KEY) for r in contents.rows]
    assert len(keys) == len(set(keys)) == len(tiny_jobs)


def test_resume_after_a_subset_redoes_nothing(tmp_path):
    """Run a subset of the jobs, then all of them: only the rest is played, nothing is lost."""
    jobs = eval_jobs(one_task_per_type(), ["baseline", "optimal"], seeds=[0, 1])
    path = tmp_path / "results.jsonl"
    played: list[tuple] = []

    def run(selection):
        return run_eval(OptimalTextAgent(), selection, batch_size=3, output_dir=path.parent, progress=False,
                        on_result=lambda row: played.append(tuple(row[f] for f in EVAL_KEY)))

    first = run(jobs[:7])
    rows = run(jobs)
    assert len(played) == len(jobs) and len(set(played)) == len(jobs)
    assert rows[:7] == first
    assert rows == run_eval(OptimalTextAgent(), jobs, progress=False)
    assert len(read_jsonl(path).rows) == len(jobs)
    played.clear()
    assert run(jobs) == rows and played == []


def test_batching_does_not_change_results():
    """The pool size only changes how episodes are grouped into agent calls, never their outcome."""
    jobs = eval_jobs(one_task_per_type(), ["optimal", "flawed"], seeds=[0, 1], flaw_types=["missing_step"])
    one = run_eval(PlanFollowingTextAgent(), jobs, batch_size=1, progress=False)
    many = run_eval(PlanFollowingTextAgent(), jobs, batch_size=7, progress=False)
    assert one == many
    assert len(one) == len(jobs) > 10


def test_eval_jobs_checks_its_input():
    tasks = one_task_per_type()[:2]
    jobs = eval_jobs(tasks, ["baseline", "flawed"], seeds=[3, 4], flaw_types=["order", "redundant"])
    assert len(jobs) == 2 * (1 + 2) * 2
    assert {(j.prompt, j.flaw_type) for j in jobs} == {("baseline", None), ("flawed", "order"),
                                                        ("flawed", "redundant")}
    with pytest.raises(ValueError, match="accepted: baseline"):
        eval_jobs(tasks, ["fancy"], seeds=[0])
    with pytest.raises(ValueError, match="needs at least one flaw type"):
        eval_jobs(tasks, ["flawed"], seeds=[0])
    with pytest.raises(ValueError, match="flaw type"):
        eval_jobs(tasks, ["flawed"], seeds=[0], flaw_types=["typo"])
    # A flaw that cannot be injected into a task's plan is left out for that task only.
    short = next(t for t in load_tasks(split="test") if len(t.required_tools) == 1)
    long = one_task_per_type()[-1]
    jobs_short = eval_jobs([short, long], ["optimal", "flawed"], seeds=[0], flaw_types=["missing_step", "order"])
    assert [(j.task, j.prompt, j.flaw_type) for j in jobs_short if j.task is short] == [(short, "optimal", None)]
    assert len([j for j in jobs_short if j.task is long]) == 3
    with pytest.raises(ValueError, match="more than once"):
        run_eval(OptimalTextAgent(), jobs + jobs[:1], progress=False)


# --- report metrics on hand-made rows -----------------------------------------------------------------


def call(tool, success, error=None, probability=0.5, replayed=False):
    return {"tool": tool, "success": success, "error_code": error, "turn": 0, "probability": probability,
            "unmet_dependencies": [], "replayed": replayed}


def row(task, seed, level, trace=(), prompt="optimal", flaw=None, bound=0.5, model="m",
        required=("file_operations_reader", "data_processing_parser")):
    return {"model": model, "task_id": task, "task_type": "basic_file_processing", "prompt": prompt,
            "flaw_type": flaw, "severity": None, "seed": seed, "level": level, "trace": list(trace),
            "required_tools": list(required), "bound_iii": bound}


def test_pass_hat_k_is_the_unbiased_estimator():
    assert pass_hat_k(3, 4, 1) == 0.75
    assert pass_hat_k(3, 4, 2) == 3 / 6
    assert pass_hat_k(3, 4, 4) == 0.0
    assert pass_hat_k(4, 4, 4) == 1.0
    with pytest.raises(ValueError):
        pass_hat_k(1, 2, 3)
    # Task a: 3 of 4 seeds succeed; task b: 1 of 4.
    rows = [row("a", s, "full_success" if s < 3 else "failure", bound=0.8) for s in range(4)]
    rows += [row("b", s, "full_success" if s == 0 else "partial_success", bound=0.5) for s in range(4)]
    result = pass_k(rows, max_k=5)
    assert result["tasks"] == 2
    assert result["pass_k"] == {"1": pytest.approx((0.75 + 0.25) / 2), "2": pytest.approx((0.5 + 0) / 2),
                                "3": pytest.approx((0.25 + 0) / 2), "4": 0.0}
    assert result["bound_iii"]["2"] == pytest.approx((0.8**2 + 0.5**2) / 2)


def test_recovery_counts_failed_calls_later_fixed():
    rows = [
        row("a", 0, "full_success", [call("x", False, "TIMEOUT"), call("x", True), call("y", False, "TIMEOUT"),
                                      call("z", False, "DEPENDENCY_ERROR", None), call("y", True)]),
        row("a", 1, "failure", [call("x", False, "TIMEOUT"), call("y", True), call("x", False, "TIMEOUT")]),
        row("a", 2, "full_success", [call("x", True), call("y", True)]),
    ]
    result = recovery(rows)
    # Failed: x, y, z (episode 0: x and y recovered), x, x (episode 1: none recovered).
    assert result["failed_calls"] == 5
    assert result["recovered"] == 2
    assert result["recovery_rate"] == pytest.approx(0.4)
    assert result["episodes_with_failure"] == 2
    assert result["full_after_failure"] == 0.5
    assert recovery([row("a", 0, "full_success", [call("x", True)])])["recovery_rate"] is None


def test_wasted_calls_by_reason():
    required = ("file_operations_reader", "data_processing_validator")  # the validator needs the parser
    trace = [
        call("file_operations_reader", True),
        call("file_operations_reader", True, probability=None, replayed=True),  # replay
        call("data_processing_validator", False, "DEPENDENCY_ERROR", None),  # useful attempt
        call("data_processing_parser", False, "INVALID_INPUT", None),  # arguments rejected
        call("data_processing_parser", False, "INVALID_INPUT", 0.72),  # a drawn INVALID_INPUT: not wasted
        call("utility_logger", True),  # not required, no dependency of a required tool
        call("data_processing_parser", False, "RETRY_LIMIT_EXCEEDED", None),  # over the cap
    ]
    result = wasted_calls([row("a", 0, "failure", trace, required=required), row("a", 1, "failure", [],
                                                                                   required=required)])
    assert result["by_reason"] == {"replay": 0.5, "retry_limit": 0.5, "invalid_input": 0.5, "not_required": 0.5}
    assert result["per_episode"] == 2.0
    assert result["share_of_calls"] == pytest.approx(4 / 7)


def test_summary_tables_and_plot(tmp_path):
    rows = []
    for model, full in (("good", 3), ("weak", 1)):
        for prompt, flaw in (("baseline", None), ("optimal", None), ("flawed", "order"), ("flawed", "redundant")):
            for s in range(4):
                level = "full_success" if s < (full if prompt != "flawed" else full - 1) else "failure"
                rows.append(row("a", s, level, [call("file_operations_reader", True)], prompt, flaw, model=model))
    summary = summarize_eval(rows)
    assert summary["models"] == ["good", "weak"]
    assert summary["prompts"] == ["baseline", "optimal", "flawed"]
    good = summary["by_prompt"]["good"]
    assert good["optimal"]["full_success"] == 0.75 and good["flawed"]["full_success"] == 0.5
    assert good["optimal"]["full_over_bound_iii"] == pytest.approx(1.5)
    assert summary["by_flaw_type"]["weak"]["order"]["full_success"] == 0.0
    assert summary["by_task_type"]["good"]["basic_file_processing"]["episodes"] == 16
    assert summary["robustness"]["good"]["flawed/order"]["pass_k"]["pass_k"]["1"] == 0.5
    text = format_tables(summary)
    for title in ("Table 2 shape", "Table 3 shape", "Table 13 shape", "by flaw type", "pass^k"):
        assert title in text
    assert "25.0" in text.split("Table 3 shape")[1].splitlines()[3]  # good: 75.0 -> 50.0, a 25.0 pp drop
    path = plot_summary(rows, tmp_path / "summary.png", title="test")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

