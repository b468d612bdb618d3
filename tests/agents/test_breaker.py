"""The breaker loop: the flaw taxonomy end to end offline, LLM taxonomies with scripted and tiny models,
malformed answers, crash-safe resuming, determinism and the command line."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from tiny_lm import torch_one_thread  # noqa: F401 (fixture)

from helpers import ScriptedBackend
from resilibench.agents.breaker import (
    ATTEMPTS,
    BREAK_THRESHOLD,
    FlawTaxonomy,
    LLMTaxonomy,
    export_csv,
    max_similarity,
    parse_grading,
    parse_max_iterations,
    parse_runs,
    parse_task,
    refinement_report,
    run_breaker,
)
from resilibench.agents.specs import make_text_agent
from resilibench.cli import main
from resilibench.core.plan_follower import workflow_success
from resilibench.core.text.flaws import FLAW_TYPES
from resilibench.core.text.prompts import parse_plan
from resilibench.core.world import load_tasks
from resilibench.results import read_jsonl

POOL = load_tasks(split="test")[:12]
pytestmark = pytest.mark.usefixtures("torch_one_thread")  # MiniLM on one sentence: threads only cost


def records(directory: Path, name: str = "iterations.jsonl") -> list[dict]:
    return read_jsonl(directory / name).rows


def without_time(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "created"} for r in rows]


def flaw_run(directory: Path, solver: str = "scripted:plan", runs: int = 4, cap: int = 3, **kwargs) -> dict:
    taxonomy = FlawTaxonomy(make_text_agent(solver), POOL)
    return run_breaker(
        directory, {"flaw": taxonomy}, {"flaw": runs}, {"flaw": cap}, seed=0, progress=False, **kwargs
    ).taxonomies["flaw"]


# --- parsing ----------------------------------------------------------------------------------------------


def test_runs_and_max_iterations_parsing():
    assert parse_runs("qc:8,itf:5") == {"qc": 8, "itf": 5}
    assert parse_runs("qc, flaw") == {"qc": 1, "flaw": 1}
    assert parse_max_iterations("qc:15", {"qc": 8, "itf": 5}) == {"qc": 15, "itf": 1}
    assert parse_max_iterations(None, {"mim": 2}) == {"mim": 1}
    for bad, message in [
        ("qc:8,xx:2", "unknown taxonomy 'xx'"),
        ("qc:0", "positive integer"),
        ("qc:two", "positive integer"),
        ("qc,qc:2", "given twice"),
    ]:
        with pytest.raises(ValueError, match=message):
            parse_runs(bad)
    with pytest.raises(ValueError, match="valid: qc, itf, mim, flaw"):
        parse_runs("QC")
    with pytest.raises(ValueError, match="max_iterations: mim not in the runs"):
        parse_max_iterations("qc:3,mim:2", {"qc": 1})


def test_parsers_are_strict_about_form_and_consistency():
    task = parse_task(
        'Sure! ```json\n{"taxonomy": "qc", "prompt": "P", "correct_response": "R", '
        '"response_reference": [{"id": "C1", "criteria1": "x"}]}\n```',
        "qc",
    )
    assert task["response_reference"] == [{"id": "C1", "criterion": "x"}]
    with pytest.raises(ValueError, match="'taxonomy' must be 'qc'"):
        parse_task(
            '{"taxonomy": "mim", "prompt": "P", "correct_response": "R", "response_reference": []}', "qc"
        )
    with pytest.raises(ValueError, match="unique"):
        parse_task(
            '{"prompt": "P", "correct_response": "R", "response_reference": '
            '[{"id": "C1", "criterion": "a"}, {"id": "C1", "criterion": "b"}]}',
            "qc",
        )
    ok = parse_grading(
        '{"criteria": [{"id": "C1", "status": "pass"}, {"id": "C2", "status": "FAIL"}], "status": "FAIL"}',
        ["C1", "C2"],
    )
    assert ok == {"status": "FAIL", "criteria": {"C1": "PASS", "C2": "FAIL"}}
    with pytest.raises(ValueError, match="disagrees"):
        parse_grading('{"criteria": [{"id": "C1", "status": "FAIL"}], "status": "PASS"}', ["C1"])
    with pytest.raises(ValueError, match=r"no status for criteria \['C2'\]"):
        parse_grading('{"criteria": [{"id": "C1", "status": "PASS"}], "status": "PASS"}', ["C1", "C2"])


def test_refinement_report_marks_criteria_by_the_keep_threshold():
    report = refinement_report(
        [{"id": "C1", "criterion": "a"}, {"id": "C2", "criterion": "b"}, {"id": "C3", "criterion": "c"}],
        {"C1": 2, "C2": 3, "C3": 4},
    )
    assert report.splitlines() == [
        "- C1 (2/4 failed, needs improvement): a",
        "- C2 (3/4 failed, keep intact): b",
        "- C3 (4/4 failed, keep intact): c",
    ]


# --- flaw -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("plan")
    flaw_run(directory)
    return directory


def test_flaw_breaks_the_plan_follower_with_consistent_rows(plan_dir):
    rows, its = records(plan_dir, "rows.jsonl"), records(plan_dir)
    assert rows, "a literal plan follower must be broken by some flaw"
    assert {(r["run"]) for r in rows} == {r["run"] for r in its if r["status"] == "model_breaking"}
    by_id = {t.instance_id: t for t in POOL}
    previous = []
    for row in rows:
        assert row["fail_count"] == row["attempt_statuses"].count("FAIL") >= BREAK_THRESHOLD
        assert len(row["solver_responses"]) == len(row["judge_responses"]) == ATTEMPTS
        assert [j["status"] for j in row["judge_responses"]] == row["attempt_statuses"]
        details = row["details"]
        assert details["flaw_type"] in FLAW_TYPES and 0 < details["severity"] <= 1
        # The prompt shows exactly the flawed plan that was validated, and the validator's numbers hold.
        task, plan = by_id[details["task_id"]], parse_plan(row["prompt"])
        assert workflow_success(
            task, plan, FlawTaxonomy(make_text_agent("scripted:plan"), POOL).config
        ) == pytest.approx(details["success_flawed"], abs=1e-6)
        assert row["validator_status"] == (
            "PASS" if details["success_flawed"] < details["success_reference"] else "FAIL"
        )
        vector = np.asarray(row["embedding"])
        assert vector.shape == (384,) and np.linalg.norm(vector) == pytest.approx(1.0, abs=1e-4)
        assert row["max_similarity"] == max_similarity(row["embedding"], previous)
        previous.append(row["embedding"])
    assert rows[0]["max_similarity"] == 0.0 and (len(rows) == 1 or rows[1]["max_similarity"] > 0.3)
    # Runs end at a row or at the cap; each iteration after the first changes the proposal.
    for run in {r["run"] for r in its}:
        mine = [r for r in its if r["run"] == run]
        assert [r["iteration"] for r in mine] == list(range(1, len(mine) + 1))
        assert mine[-1]["status"] == "model_breaking" or len(mine) == 3
        proposals = [
            tuple(r["details"][k] for k in ("task_id", "flaw_type", "severity", "position")) for r in mine
        ]
        assert len(set(proposals)) == len(proposals)


def test_flaw_optimal_solver_ignores_the_plan_and_is_rarely_broken(tmp_path, plan_dir):
    stats = flaw_run(tmp_path, "scripted:optimal")
    its = records(tmp_path)
    fails = [r["fail_count"] for r in its]
    assert np.mean(fails) < 1.0 and stats["model_breaking"] <= 1
    for record in its:
        assert (record["status"] == "model_breaking") == (record["fail_count"] >= BREAK_THRESHOLD)
    # The planner adapter around OptimalPlanner plays exactly what the scripted optimal agent plays.
    planner_dir = tmp_path / "planner"
    flaw_run(planner_dir, "optimal")
    assert [r["details"]["levels"] for r in records(planner_dir)] == [r["details"]["levels"] for r in its]
    assert records(planner_dir)[0]["solver"] == "planner:optimal"
    # The plan follower on the same seeds breaks more often.
    assert sum(r["fail_count"] for r in records(plan_dir)) / len(records(plan_dir)) > np.mean(fails)


class Crash(Exception):
    pass


class CrashingTaxonomy:
    """Delegates to a flaw taxonomy and raises on the ``after``-th iteration (a crash between iterations)."""

    def __init__(self, inner, after: int):
        self.inner, self.after, self.calls = inner, after, 0
        self.name, self.settings = inner.name, inner.settings

    def iterate(self, *args):
        self.calls += 1
        if self.calls == self.after:
            raise Crash
        return self.inner.iterate(*args)


def test_resume_after_crash_and_truncated_lines_duplicates_nothing(tmp_path, plan_dir):
    inner = FlawTaxonomy(make_text_agent("scripted:plan"), POOL)
    with pytest.raises(Crash):
        run_breaker(tmp_path, {"flaw": CrashingTaxonomy(inner, 4)}, {"flaw": 4}, {"flaw": 3}, progress=False)
    assert len(records(tmp_path)) == 3
    # A crash in the middle of writing: half a line at the end of both files.
    for name in ("iterations.jsonl", "rows.jsonl"):
        with (tmp_path / name).open("a") as fh:
            fh.write('{"taxonomy": "flaw", "run": 9, "iter')
    with pytest.warns(RuntimeWarning, match="truncated"):
        flaw_run(tmp_path)
    assert without_time(records(tmp_path)) == without_time(records(plan_dir))
    assert without_time(records(tmp_path, "rows.jsonl")) == without_time(records(plan_dir, "rows.jsonl"))
    # A crash between an iteration record and its row: the rerun writes the row, once.
    rows_path = tmp_path / "rows.jsonl"
    lines = rows_path.read_text().splitlines(keepends=True)
    rows_path.write_text("".join(lines[:-1]))
    flaw_run(tmp_path)
    assert without_time(records(tmp_path, "rows.jsonl")) == without_time(records(plan_dir, "rows.jsonl"))
    assert len(records(tmp_path)) == len(records(plan_dir))


def test_same_seed_same_rows(tmp_path, plan_dir):
    flaw_run(tmp_path)
    assert without_time(records(tmp_path, "rows.jsonl")) == without_time(records(plan_dir, "rows.jsonl"))
    other = tmp_path / "other"
    taxonomy = FlawTaxonomy(make_text_agent("scripted:plan"), POOL)
    run_breaker(other, {"flaw": taxonomy}, {"flaw": 2}, {"flaw": 3}, seed=1, progress=False)
    seeded = [r["details"] for r in records(other)]
    assert seeded != [r["details"] for r in records(plan_dir)][: len(seeded)]


def test_flaw_llm_generator_is_validated_and_invalid_proposals_are_recorded(tmp_path):
    task = next(t for t in POOL if len(t.required_tools) >= 3)
    answers = iter(
        [
            '{"task_id": "task_nope", "flaw_type": "order", "severity": 0.5, "position": null}',
            f'{{"task_id": "{task.instance_id}", "flaw_type": "order", "severity": 1.5}}',
            "I would pick the order flaw.",
            f'{{"task_id": "{task.instance_id}", "flaw_type": "missing_step", "severity": 1, '
            '"position": null}',
        ]
    )
    generator = ScriptedBackend(lambda conversation: next(answers, "{}"))
    taxonomy = FlawTaxonomy(make_text_agent("scripted:plan"), POOL, generator=generator)
    run_breaker(tmp_path, {"flaw": taxonomy}, {"flaw": 1}, {"flaw": 3}, progress=False)
    first, second = records(tmp_path)
    assert first["status"] == "invalid" and len(first["generator_raw"]) == 2
    assert "task_id" in first["generator_errors"][0] and "severity" in first["generator_errors"][1]
    assert "task_nope" in first["generator_raw"][0]
    assert second["generator_errors"] == ["no JSON object found"]
    assert second["details"]["flaw_type"] == "missing_step" and second["generator"] == "scripted"
    assert "Candidate tasks:" in second["generator_input"]


# --- LLM taxonomies ---------------------------------------------------------------------------------------

TASK_A = {
    "taxonomy": "mim",
    "prompt": "Write a haiku. Actually, write one word instead.",
    "correct_response": "Word",
    "response_reference": [
        {"id": "C1", "criterion": "exactly one word"},
        {"id": "C2", "criterion": "no line breaks"},
    ],
}
TASK_B = {**TASK_A, "prompt": "List three fruits. Then: no, list exactly two vegetables, lowercase."}


def scripted_roles():
    """Generator (task A, then B after refinement), validator, solver and judge with fixed behaviour."""
    solver_answers = iter(
        [
            "Word",
            "Word",
            "two words",
            "Word",  # task A: 1 of 4 fails
            "apple banana cherry",
            "carrot, pea",
            "apple\nkiwi",
            "Fruit list",
        ]
    )  # task B: 3 fail

    def generator(conversation):
        request = conversation[-1]["content"]
        return json.dumps(TASK_B if "did not break" in request else TASK_A)

    def judge(conversation):
        text = conversation[0]["content"]
        if "reference answer" in text:
            return '{"status": "PASS", "remarks": "the reference satisfies C1 and C2"}'
        answer = text.rsplit("Answer to grade:\n", 1)[1].split("\n\nAnswer with", 1)[0]
        if answer == "two words" and len(conversation) == 1:
            return "Score: 0 point"  # malformed: retried with the error
        c1 = "PASS" if answer in ("Word", "carrot, pea") else "FAIL"
        c2 = "FAIL" if "\n" in answer else "PASS"
        overall = "PASS" if c1 == c2 == "PASS" else "FAIL"
        return json.dumps(
            {"criteria": [{"id": "C1", "status": c1}, {"id": "C2", "status": c2}], "status": overall}
        )

    return ScriptedBackend(generator), ScriptedBackend(lambda c: next(solver_answers)), ScriptedBackend(judge)


def test_llm_taxonomy_breaks_after_refinement_with_marked_feedback(tmp_path):
    generator, solver, judge = scripted_roles()
    taxonomy = LLMTaxonomy("mim", generator, solver, judge)
    summary = run_breaker(
        tmp_path, {"mim": taxonomy}, {"mim": 1}, {"mim": 3}, embed=lambda t: [1.0, 0.0], progress=False
    )
    assert summary.taxonomies["mim"] == {
        "runs": 1,
        "finished": 1,
        "model_breaking": 1,
        "iterations": 2,
        "invalid": 0,
    }
    first, second = records(tmp_path)
    assert first["status"] == "not_breaking" and first["fail_count"] == 1
    assert first["criteria_failures"] == {"C1": 1, "C2": 0}
    assert first["judge_responses"][2]["errors"] == ["no JSON object found"]  # retried, then valid
    feedback = second["generator_input"]
    assert "- C1 (1/4 failed, needs improvement): exactly one word" in feedback
    assert "- C2 (0/4 failed, needs improvement): no line breaks" in feedback
    assert "Make the initial instruction strong" in feedback and TASK_A["prompt"] in feedback
    assert second["status"] == "model_breaking" and second["fail_count"] == 3
    assert second["criteria_failures"] == {"C1": 3, "C2": 1}
    (row,) = records(tmp_path, "rows.jsonl")
    assert row["prompt"] == TASK_B["prompt"] and row["validator_status"] == "PASS" and row["status"] == "FAIL"
    assert row["solver_responses"][1] == "carrot, pea" and row["embedding"] == [1.0, 0.0]
    assert solver.calls == [1] * 8  # one call per attempt: each with its own sampling seed
    # The CSV carries the original columns, attempts keyed attempt_1..4.
    assert export_csv(tmp_path / "rows.jsonl", tmp_path / "rows.csv") == 1
    (line,) = csv.DictReader((tmp_path / "rows.csv").open())
    assert line["agent_01_correct_response_status"] == "PASS" and line["max_similarity"] == "0.0000"
    assert json.loads(line["agent_02_response"])["attempt_2"] == "carrot, pea"
    assert json.loads(line["judge_response"])["attempt_1"]["status"] == "FAIL"


@pytest.fixture(scope="module")
def tiny_backend(tmp_path_factory):
    from tiny_lm import build_tiny_lm

    from resilibench.agents.backends import TransformersBackend

    return TransformersBackend(build_tiny_lm(tmp_path_factory.mktemp("tiny")))


def test_tiny_model_generator_garbage_is_retried_then_recorded_invalid(tmp_path, tiny_backend):
    from resilibench.llm import GenerationConfig

    unused = ScriptedBackend(lambda c: pytest.fail("no stage after an invalid generator answer may run"))
    taxonomy = LLMTaxonomy(
        "qc", tiny_backend, unused, unused, generation=GenerationConfig(max_new_tokens=8, temperature=0.7)
    )
    summary = run_breaker(tmp_path, {"qc": taxonomy}, {"qc": 2}, {"qc": 2}, progress=False)
    assert summary.taxonomies["qc"] == {
        "runs": 2,
        "finished": 2,
        "model_breaking": 0,
        "iterations": 4,
        "invalid": 4,
    }
    for record in records(tmp_path):
        assert record["status"] == "invalid" and record["reason"].startswith(
            "generator: no valid JSON after 2"
        )
        assert len(record["generator_raw"]) == 2 and len(record["generator_errors"]) == 2
        assert "question correction (qc)" in record["generator_input"]
    assert not (tmp_path / "rows.jsonl").read_text().strip()


# --- command line -----------------------------------------------------------------------------------------


def test_cli_errors_are_one_line(tmp_path, capsys):
    out = str(tmp_path / "out")
    cases = [
        (["--runs", "qc:2,bogus", "--solver", "x"], "unknown taxonomy 'bogus'"),
        (["--runs", "flaw", "--max-iterations", "qc:3", "--solver", "x"], "--max-iterations: qc not in the runs"),
        (["--runs", "qc:3", "--solver", "hf:/nonexistent"], "--generator is required"),
        (["--runs", "flaw", "--solver", "scripted:nope", "--limit", "2"], "--solver scripted:nope"),
        (["--runs", "flaw", "--solver", "hf:/nonexistent"], "--solver hf:/nonexistent"),
    ]
    for extra, message in cases:
        assert main(["breaker", "--output-dir", out, *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err


def test_cli_flaw_run_resumes_and_refuses_another_config(tmp_path, capsys, plan_dir):
    out = tmp_path / "cli"
    args = [
        "breaker",
        "--runs",
        "flaw:2",
        "--max-iterations",
        "flaw:3",
        "--solver",
        "scripted:plan",
        "--output-dir",
        str(out),
        "--split",
        "all",
        "--limit",
        "6",
        "--csv",
    ]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "model_breaking" in table and "flaw" in table
    rows = records(out, "rows.jsonl")
    assert (
        rows
        and (out / "rows.csv").exists()
        and json.loads((out / "meta.json").read_text())["config"]["seed"] == 0
    )
    assert main(args) == 0  # finished: nothing new
    assert records(out, "rows.jsonl") == rows
    assert main([*args[:-1], "--seed", "3"]) == 2
    assert "different config" in capsys.readouterr().err
    # Without meta.json the directory's config is unknown: refused as `run` refuses it, nothing touched.
    (out / "meta.json").unlink()
    iterations = (out / "iterations.jsonl").read_bytes()
    assert main([*args[:-1], "--seed", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert "meta.json is missing" in err and len(err.splitlines()) == 1
    assert (out / "iterations.jsonl").read_bytes() == iterations and not (out / "meta.json").exists()
