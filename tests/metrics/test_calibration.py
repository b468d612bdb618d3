"""WorkflowPerturb calibration: the plan, the summary statistics, and `metrics calibrate` end to end with
an interruption (Ctrl-C after the third row) and a resume that neither redoes nor loses a pair."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilibench.cli import main
from resilibench.core.world import load_tasks
from resilibench.metrics.calibration import (
    WorkflowScorer,
    plan_calibration,
    score_items,
    sensitivity,
    summarize,
)
from resilibench.metrics.perturb import PERTURBATIONS, RATES, golden_workflows
from resilibench.results import METADATA_KEY, read_jsonl
from resilibench.rundir import RunDirectory

METRICS = ["chain_f1", "mcis_f1", "bleu", "gleu"]


@pytest.fixture(scope="module")
def goldens():
    tasks = [t for t in load_tasks() if t.task_type == "complex_validation_pipeline"][:8]
    return golden_workflows(tasks)


def test_sensitivity_is_the_mean_slope():
    assert sensitivity([0.9, 0.7, 0.5], RATES) == pytest.approx(1.0)
    assert sensitivity([0.9, 0.8, 0.4], RATES) == pytest.approx(0.5 * (0.1 / 0.2 + 0.4 / 0.2))
    assert sensitivity([1.0, 1.0, 1.0], RATES) == 0.0
    assert sensitivity([0.9, None, 0.5], RATES) is None and sensitivity([0.9], [0.1]) is None


def test_plan_counts_tasks_and_distinct_pairs(goldens):
    plan = plan_calibration(goldens, seed=0)
    counts = plan.counts()
    assert counts["tasks"] == 8 and counts["task_variants"] == 8 * 9
    assert sum(item.tasks for item in plan.items) == 8 * 9  # every task variant lands in one pair
    assert counts["distinct_pairs"] == len({item.item_id for item in plan.items}) <= 8 * 9
    assert {(i.kind, i.rate) for i in plan.items} == {(k, r) for k in PERTURBATIONS for r in RATES}
    assert plan_calibration(goldens, seed=0).items == plan.items  # reproducible
    llm = plan_calibration(goldens, method="llm")
    assert len(llm.items) == len(goldens.goldens) * 9 and all(i.perturbation is None for i in llm.items)
    assert sum(i.tasks for i in llm.items) == 8 * 9
    with pytest.raises(ValueError, match="method must be one of"):
        plan_calibration(goldens, method="manual")


def test_summary_views_weigh_by_tasks_or_count_pairs_once(goldens):
    plan = plan_calibration(goldens, seed=1)
    rows = score_items(plan.items, WorkflowScorer(["chain_f1", "bleu"]))
    assert all(r["valid"] and set(r["scores"]) == {"chain_f1", "bleu"} for r in rows)
    summary = summarize(plan, rows, ["chain_f1", "bleu"])
    for metric in ("chain_f1", "bleu"):
        for kind in PERTURBATIONS:
            items = [(i, r) for i, r in zip(plan.items, rows, strict=True) if i.kind == kind and i.rate == 0.3]
            by_task = sum(i.tasks * r["scores"][metric] for i, r in items) / sum(i.tasks for i, _ in items)
            by_pair = sum(r["scores"][metric] for _, r in items) / len(items)
            cell = summary["views"]["tasks"][metric][kind]["rates"]["0.3"]
            assert cell["mean"] == pytest.approx(by_task) and cell["n"] == 8
            assert cell["residual"] == pytest.approx(by_task - (1.0 if kind == "description_change" else 0.7))
            assert summary["views"]["distinct"][metric][kind]["rates"]["0.3"]["mean"] == pytest.approx(by_pair)
    # Tool-grounded steps: rewording leaves the structure, and chain F1, exactly intact.
    assert summary["views"]["tasks"]["chain_f1"]["description_change"]["sensitivity"] == 0.0
    assert summary["counts"]["scored_pairs"] == len(plan.items) and summary["counts"]["invalid_variants"] == 0


def _calibrate(directory: Path, *extra: str) -> list[str]:
    # The tasks of the `goldens` fixture: their bound-(iii) solutions are already cached in this process.
    return ["metrics", "calibrate", "--task-type", "complex_validation_pipeline", "--limit", "6", "--metrics", *METRICS,
            "--batch-size", "1", "--output-dir", str(directory), *extra]


def _rows(path: Path) -> list[str]:
    return [line for line in path.read_text().splitlines() if METADATA_KEY not in line]


def test_calibrate_interrupt_resume_and_outputs(tmp_path, capsys, monkeypatch):
    directory = tmp_path / "cal"
    results = directory / "results.jsonl"
    write = RunDirectory.write

    def write_then_interrupt(self, row):  # Ctrl-C after the third row (a real SIGINT: tests/foundation/test_rundir.py)
        write(self, row)
        if len(self.new_rows) == 3:
            raise KeyboardInterrupt

    monkeypatch.setattr(RunDirectory, "write", write_then_interrupt)
    assert main(_calibrate(directory)) == 130
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert "rerun the same command to resume" in err
    before = read_jsonl(results).rows
    assert len(before) == len({r["item_id"] for r in before}) == 3  # every finished row kept

    assert main(_calibrate(directory)) == 0
    out, err = capsys.readouterr()
    after = read_jsonl(results).rows
    ids = [r["item_id"] for r in after]
    summary = json.loads((directory / "summary.json").read_text())
    counts = summary["counts"]
    assert f"{len(before)} already in" in err and f"{counts['distinct_pairs'] - len(before)} to score" in err
    assert len(ids) == len(set(ids)) == counts["distinct_pairs"]  # nothing redone, nothing lost
    assert after[:len(before)] == before  # the rows written before the interruption are untouched
    assert counts["tasks"] == 6 and counts["task_variants"] == 54
    assert set(summary["views"]["tasks"]) == set(METRICS)
    assert summary["metadata"]["config"]["calibration"]["metrics"] == METRICS
    assert "missing_steps (expected 0.9 / 0.7 / 0.5)" in out and "sensitivity" in out
    for name in ("scores.png", "sensitivity.png"):
        assert (directory / name).read_bytes()[:4] == b"\x89PNG"
    goldens = json.loads((directory / "goldens.json").read_text())
    assert sum(len(g["tasks"]) for g in goldens) == 6 and len(goldens) == counts["distinct_goldens"]
    assert len(read_jsonl(results).metadata) == 2  # one metadata record per invocation that scored

    # A rerun finds everything done; other metrics are refused; --no-resume starts afresh.
    assert main(_calibrate(directory)) == 0
    assert "0 to score" in capsys.readouterr().err and read_jsonl(results).rows == after
    assert main(["metrics", "calibrate", "--task-type", "complex_validation_pipeline", "--limit", "6", "--metrics",
                 "bleu", "--output-dir", str(directory)]) == 2
    assert "a different config (calibration." in capsys.readouterr().err and read_jsonl(results).rows == after
    # Scores do not depend on --batch-size (a resume may change it); they do on the MCIS budget: refused.
    assert main([*_calibrate(directory), "--batch-size", "5"]) == 0 and read_jsonl(results).rows == after
    assert main([*_calibrate(directory), "--mcis-budget", "5"]) == 2
    assert "calibration.mcis_budget" in capsys.readouterr().err and read_jsonl(results).rows == after
    assert main([*_calibrate(directory), "--limit", "3", "--no-resume"]) == 0
    assert len(_rows(results)) == json.loads((directory / "summary.json").read_text())["counts"]["distinct_pairs"]


def test_calibrate_errors_exit_2(tmp_path, capsys):
    file = tmp_path / "file"
    file.write_text("x")
    cases = [
        (["--perturber", "llm"], "--perturber llm needs --backend"),
        (["--split", "test", "--task-type", "simple_data_transformation"], "at least 5 steps"),
        (["--output-dir", str(file)], "exists and is not a directory"),
        (["--metrics", "judge"], "--metrics judge needs --backend"),
        (["--metrics", "rouge"], "invalid choice: 'rouge'"),
        (["--limit", "0"], "expected a positive integer"),
        (["--backend", "nope:x", "--metrics", "judge"], "backend spec must be"),
    ]
    for extra, message in cases:
        argv = ["metrics", "calibrate", "--limit", "2", "--output-dir", str(tmp_path / "out"), *extra]
        assert main(argv) == 2, extra
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_calibrate_with_an_llm_perturber_records_invalid_variants(tmp_path, capsys):
    """A random tiny model never returns a valid variant: every pair is recorded invalid, nothing crashes."""
    from tiny_lm import build_tiny_lm

    model = build_tiny_lm(tmp_path / "tiny")
    directory = tmp_path / "llm"
    argv = ["metrics", "calibrate", "--task-type", "complex_validation_pipeline", "--limit", "1", "--perturber", "llm",
            "--backend", f"hf:{model}", "--metrics", "bleu", "--attempts", "2", "--max-new-tokens", "4",
            "--output-dir", str(directory)]
    assert main(argv) == 0
    rows = read_jsonl(directory / "results.jsonl").rows
    assert len(rows) == 9 and not any(r["valid"] for r in rows)
    assert all(len(r["perturbation"]["raw"]) == 2 and r["scores"] == {} for r in rows)
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["counts"]["invalid_variants"] == 9
    cell = summary["views"]["tasks"]["bleu"]["missing_steps"]["rates"]["0.1"]
    assert cell["mean"] is None and cell["invalid"] == 1 and cell["n"] == 0
    assert "9 invalid" in capsys.readouterr().out
