"""`resilibench metrics score`: a pair of workflow files or a JSONL of pairs, tables, JSON, files, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilibench.cli import main
from resilibench.metrics.workflow import Workflow

REF = Workflow.chain(["file_operations_reader", "data_processing_parser", "file_operations_writer"],
                     ["read the input file", "parse raw input into a structured format", "write the results"])
PRED = Workflow.chain(["file_operations_reader", "file_operations_writer"], ["read the input file", "write the results"])
LIGHT = ["chain_f1", "mcis_f1", "reachability_f1", "kendall_tau", "bleu", "gleu"]  # no model needed for tool steps


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def test_score_a_pair_prints_every_requested_metric(tmp_path, capsys):
    pred, ref = write(tmp_path / "p.json", PRED.to_json()), write(tmp_path / "r.json", REF.to_json())
    assert main(["metrics", "score", "--pred", ref, "--ref", ref, "--metrics", *LIGHT]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[2:]] == LIGHT
    assert all(line.split()[1] == "1.0000" for line in out.splitlines()[2:])
    assert main(["metrics", "score", "--pred", pred, "--ref", ref, "--metrics", "chain_f1", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["scores"]["chain_f1"] == pytest.approx(0.8)  # l = 2: p = 1, r = 2/3
    assert row["details"]["chain_f1"] == pytest.approx({"precision": 1.0, "recall": 2 / 3})


def test_score_pairs_file_writes_rows_and_means(tmp_path, capsys):
    lines = [json.dumps({"id": "same", "pred": REF.to_dict(), "ref": REF.to_dict()}),
             "",
             json.dumps({"pred": PRED.to_dict(), "ref": REF.to_dict(), "task": "convert a file"})]
    pairs = write(tmp_path / "pairs.jsonl", "\n".join(lines) + "\n")
    output = tmp_path / "scores.jsonl"
    assert main(["metrics", "score", "--pairs", pairs, "--metrics", "chain_f1", "bleu", "--output", str(output)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["id", "chain_f1", "bleu"]
    assert out[2].split()[:2] == ["same", "1.0000"] and out[3].split()[:2] == ["3", "0.8000"]
    assert out[4].split()[:2] == ["mean", "0.9000"]
    rows = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["id"] for r in rows] == ["same", "3"] and rows[1]["scores"]["chain_f1"] == pytest.approx(0.8)


def test_score_with_the_judge_through_a_transformers_backend(tmp_path, capsys):
    """A random tiny model gives no valid verdict: the judge score is recorded as invalid, the run ends well."""
    from tiny_lm import build_tiny_lm

    model = build_tiny_lm(tmp_path / "tiny")
    pred, ref = write(tmp_path / "p.json", PRED.to_json()), write(tmp_path / "r.json", REF.to_json())
    output = tmp_path / "judge.jsonl"
    assert main(["metrics", "score", "--pred", pred, "--ref", ref, "--metrics", "judge", "--backend", f"hf:{model}",
                 "--attempts", "1", "--max-new-tokens", "8", "--output", str(output)]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["judge", "-"]
    (row,) = [json.loads(line) for line in output.read_text().splitlines()]
    verdict = row["details"]["judge"]
    assert row["scores"]["judge"] is None and verdict["valid"] is False and len(verdict["raw"]) == 1


def test_score_errors_exit_2(tmp_path, capsys):
    good = write(tmp_path / "good.json", REF.to_json())
    cyclic = write(tmp_path / "cyclic.json", json.dumps({"nodes": ["a", "b"], "edges": [[0, 1], [1, 0]]}))
    cases = [
        ([], "give either --pred FILE and --ref FILE, or --pairs FILE"),
        (["--pred", good], "give either --pred FILE and --ref FILE"),
        (["--pred", good, "--ref", good, "--pairs", good], "give either"),
        (["--pred", str(tmp_path / "missing.json"), "--ref", good], "--pred: file"),
        (["--pred", write(tmp_path / "bad.json", "{not json"), "--ref", good], "not valid JSON"),
        (["--pred", good, "--ref", cyclic], "cycle"),
        (["--pairs", write(tmp_path / "p1.jsonl", '{"pred": {"nodes": ["a"]}}\n')], "p1.jsonl:1: each line must"),
        (["--pairs", write(tmp_path / "p2.jsonl", '\n{"pred": 1, "ref": 2}\n')], "p2.jsonl:2: workflow JSON must"),
        (["--pairs", write(tmp_path / "p3.jsonl", "\n")], "no pairs in the file"),
        (["--pred", good, "--ref", good, "--metrics", "judge"], "--metrics judge needs --backend"),
        (["--pred", good, "--ref", good, "--metrics", "judge", "--backend", "hf:" + str(tmp_path / "none")],
         "not a directory"),
        (["--pred", good, "--ref", good, "--metrics", "meteor"], "invalid choice: 'meteor'"),
        (["--pred", good, "--ref", good, "--attempts", "0"], "expected a positive integer"),
    ]
    for extra, message in cases:
        assert main(["metrics", "score", *extra]) == 2, extra
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, (extra, err)


def test_metric_choices_match_the_library():
    from resilibench.cli_metrics import METRIC_CHOICES
    from resilibench.metrics.calibration import METRICS

    assert METRIC_CHOICES == METRICS
