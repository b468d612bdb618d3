"""`resilibench metrics score`: a pair of workflow files or a JSONL of pairs, tables, JSON, files, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resilibench.cli import main
from resilibench.core.workflow import Workflow

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
    cyclic = write(tmp_path / "cyclic.json", json.dumps({"nodes": [{"tool": "a"}, {"tool": "b"}],
                                                          "edges": [[0, 1], [1, 0]]}))
    strings = write(tmp_path / "strings.json", json.dumps({"nodes": ["read the input file"]}))
    cases = [
        ([], "give either --pred FILE and --ref FILE, or --pairs FILE"),
        (["--pred", good], "give either --pred FILE and --ref FILE"),
        (["--pred", good, "--ref", good, "--pairs", good], "give either"),
        (["--pred", str(tmp_path / "missing.json"), "--ref", good], "--pred: file"),
        (["--pred", write(tmp_path / "bad.json", "{not json"), "--ref", good], "not valid JSON"),
        (["--pred", good, "--ref", cyclic], "--ref " + cyclic + ": the reference has a cycle (edges (1, 0))"),
        (["--pred", strings, "--ref", good], "node 0 is a plain string"),
        (["--pred", good, "--ref", good, "--input-format", "worfbench", "--string-steps", "text"],
         "--string-steps applies to --input-format resilibench"),
        (["--pred", good, "--ref", write(tmp_path / "two.json", json.dumps([REF.to_dict()] * 2))],
         "holds 1 workflows and --ref"),
        (["--pred", write(tmp_path / "a.txt", "1: a"), "--ref", write(tmp_path / "gold.txt", WORFBENCH_GOLD),
          "--input-format", "worfbench"], "'Node:'"),
        (["--pairs", write(tmp_path / "p1.jsonl", '{"pred": {"nodes": ["a"]}}\n')], "p1.jsonl:1: each line must"),
        (["--pairs", write(tmp_path / "p2.jsonl", '\n{"pred": 1, "ref": 2}\n')], "p2.jsonl:2: ref: workflow JSON must"),
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


def test_score_defaults_come_from_the_library():
    from resilibench.cli import build_parser
    from resilibench.metrics.structural import DEFAULT_MCIS_BUDGET

    args = build_parser().parse_args(["metrics", "score", "--pairs", "x"])
    assert args.mcis_budget == DEFAULT_MCIS_BUDGET


WORFBENCH_GOLD = ("Node:\n1: read the input file\n2: parse raw input into a structured format\n3: write the results\n"
                  "Edge: (START,1) (1,2) (2,3) (3,END)")


def test_score_worfbench_files_gold_and_predictions(tmp_path, capsys):
    """WorFBench's own files: a gold file (answer last in ``conversations``) and a prediction file
    (``workflow``), paired by position; one prediction is reworded, one cyclic, one has a duplicate edge."""
    gold = [{"id": f"os_{i}", "conversations": [{"role": "user", "content": "task"},
                                                 {"role": "assistant", "content": WORFBENCH_GOLD}]} for i in range(4)]
    preds = [{"workflow": WORFBENCH_GOLD},
             {"workflow": WORFBENCH_GOLD.replace("parse raw input into a structured format",
                                                 "turn the raw input into structured data")},
             {"workflow": WORFBENCH_GOLD.replace("(2,3)", "(2,3) (3,1)")},
             {"workflow": WORFBENCH_GOLD.replace("(1,2)", "(1,2) (1,2)")}]
    ref, pred = write(tmp_path / "gold.json", json.dumps(gold)), write(tmp_path / "pred.json", json.dumps(preds))
    assert main(["metrics", "score", "--input-format", "worfbench", "--pred", pred, "--ref", ref,
                 "--metrics", "chain_f1", "reachability_f1", "--format", "json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["id"] for r in rows] == ["os_0", "os_1", "os_2", "os_3"]
    assert [r["scores"]["chain_f1"] for r in rows] == [1.0, 1.0, 0.0, 1.0]  # reworded step aligned by meaning
    assert rows[2]["details"]["repairs"] == {"cycle_edges": [[2, 0]]}
    assert rows[3]["details"]["repairs"] == {"duplicates": [[0, 1]]} and rows[3]["scores"]["reachability_f1"] == 1.0
    assert "cyclic, scored 0 structurally: os_2" in captured.err
    answer = write(tmp_path / "answer.txt", WORFBENCH_GOLD)  # one answer as plain text
    assert main(["metrics", "score", "--input-format", "worfbench", "--pred", answer, "--ref", answer,
                 "--metrics", "mcis_f1"]) == 0
    assert capsys.readouterr().out.splitlines()[2].split() == ["mcis_f1", "1.0000"]


def test_score_robustflow_graphs(tmp_path, capsys):
    ref = {"nodes": ["START", "read the input file", "parse the input", "write the results", "END"],
           "edges": [[0, 1], [1, 2], [2, 3], [3, 4]]}
    pred = {"nodes": ["START", "read the input file", "write the results", "END"], "edges": [[0, 1], [1, 2], [2, 3]]}
    pairs = write(tmp_path / "pairs.jsonl", json.dumps({"pred": pred, "ref": ref}) + "\n")
    assert main(["metrics", "score", "--input-format", "robustflow", "--pairs", pairs,
                 "--metrics", "reachability_f1", "--format", "json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["scores"]["reachability_f1"] == pytest.approx(2 / 3)  # RobustFlow's own scorer: 0.75 (START/END)


def test_plain_string_steps_are_read_as_the_user_says(tmp_path, capsys):
    """Regression: plain-string steps were silently tool names, so a reworded prediction scored 0.0."""
    ref = write(tmp_path / "r.json", json.dumps({"nodes": ["read the input file", "write the results"],
                                                 "edges": [[0, 1]]}))
    pred = write(tmp_path / "p.json", json.dumps({"nodes": ["load the input file", "write the results"],
                                                  "edges": [[0, 1]]}))
    base = ["metrics", "score", "--pred", pred, "--ref", ref, "--metrics", "chain_f1", "--format", "json"]
    assert main(base + ["--string-steps", "text"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["scores"]["chain_f1"] == 1.0
    assert main(base + ["--string-steps", "tool"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["scores"]["chain_f1"] == 0.5


def test_mcis_budget_is_reported_not_hidden(tmp_path, capsys):
    import random

    names = [f"t{i}" for i in range(100)]
    ref = Workflow.chain(names)
    pred = Workflow.chain(random.Random(0).sample(names, 100))
    p, r = write(tmp_path / "p.json", pred.to_json()), write(tmp_path / "r.json", ref.to_json())
    assert main(["metrics", "score", "--pred", p, "--ref", r, "--metrics", "mcis_f1", "--mcis-budget", "20",
                 "--format", "json"]) == 0
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    low, high = row["details"]["mcis_f1"]["f1_bounds"]
    assert row["details"]["mcis_f1"]["exact"] is False and low == row["scores"]["mcis_f1"] < high
    assert "mcis_f1 of 1 pair(s) is a lower bound" in captured.err


# Two of WorFBench's released gold answers (wikihow) that announce their edges in Markdown.
MARKDOWN_GOLDS = (
    "Node:\n1: Get your credit report\n2: Review it\n3: Decide which errors to fix\n4: Fix errors\n"
    "Considering these dependencies, the topology diagram can be formed as:\n\n"
    "- **Edge**: (START, 1), (1, 2), (2, 3), (3, 4), (4, END) \n\nThis diagram traces the flow.",
    "Node:\n1: Fold the paper\n2: Tape it\n3: Turn the box\nHere's how the subtasks would be arranged:\n\n"
    "**Graph Structure:**\n- **Edge:** (START, 1)\n- **Edge:** (1, 2)\n- **Edge:** (2, 3)\n- **Edge:** (3, END)\n",
)


@pytest.mark.parametrize("gold", MARKDOWN_GOLDS)
def test_worfbench_golds_with_markdown_edges_keep_their_edges(tmp_path, capsys, gold):
    steps = [line.split(": ", 1)[1] for line in gold.splitlines()[1:] if line[:1].isdigit()]
    assert Workflow.from_worfbench(gold).edges == tuple((i, i + 1) for i in range(len(steps) - 1))
    reversed_plan = "Node:\n" + "".join(f"{i + 1}: {s}\n" for i, s in enumerate(reversed(steps))) + "Edge: " + " ".join(
        f"({i + 1},{i + 2})" for i in range(len(steps) - 1))
    ref, pred = write(tmp_path / "gold.txt", gold), write(tmp_path / "pred.txt", reversed_plan)
    assert main(["metrics", "score", "--input-format", "worfbench", "--pred", pred, "--ref", ref,
                 "--metrics", "chain_f1", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["scores"]["chain_f1"] < 0.5


def test_an_unreadable_prediction_scores_zero_unless_strict(tmp_path, capsys):
    """As WorFBench's scorer skips an answer without 'Node:', one bad prediction does not end the batch."""
    gold = [{"id": f"g{i}", "conversations": [{"role": "assistant", "content": WORFBENCH_GOLD}]} for i in range(3)]
    preds = [{"workflow": WORFBENCH_GOLD}, {"workflow": "I could not plan this."}, {"workflow": WORFBENCH_GOLD}]
    ref, pred = write(tmp_path / "gold.json", json.dumps(gold)), write(tmp_path / "pred.json", json.dumps(preds))
    command = ["metrics", "score", "--input-format", "worfbench", "--pred", pred, "--ref", ref, "--metrics", "chain_f1",
               "--format", "json"]
    assert main(command) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert [r["scores"]["chain_f1"] for r in rows] == [1.0, 0.0, 1.0]
    assert "'Node:'" in rows[1]["details"]["unreadable"]
    assert "1 of 3 prediction(s) could not be read and score 0" in captured.err
    assert main([*command, "--strict"]) == 2
    err = capsys.readouterr().err
    assert "(workflow 2)" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(("workflow", "message"), [
    ({"nodes": [{"tool": "a"}, {"tool": "b"}], "edges": "01"}, "'edges' must be a list"),
    ({"nodes": [{"tool": "a"}, {"tool": "b"}], "edges": 5}, "'edges' must be a list"),
    ({"nodes": [{"tool": "a"}, {"tool": "b"}], "edges": [[True, False]]}, "must be a pair of node indices"),
])
def test_malformed_edges_are_named(tmp_path, capsys, workflow, message):
    good = write(tmp_path / "good.json", REF.to_json())
    bad = write(tmp_path / "bad.json", json.dumps(workflow))
    assert main(["metrics", "score", "--pred", good, "--ref", bad]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    pairs = write(tmp_path / "pairs.jsonl", json.dumps({"pred": workflow, "ref": REF.to_dict()}) + "\n"
                  + json.dumps({"pred": REF.to_dict(), "ref": REF.to_dict()}) + "\n")
    assert main(["metrics", "score", "--pairs", pairs, "--metrics", "chain_f1"]) == 0
    assert "1 of 2 prediction(s) could not be read" in capsys.readouterr().err


def test_deeply_nested_json_is_a_one_line_error(tmp_path, capsys):
    deep = write(tmp_path / "deep.json", "[" * 5000 + "]" * 5000)
    good = write(tmp_path / "good.json", REF.to_json())
    pairs = write(tmp_path / "deep.jsonl", '{"pred": ' + "[" * 5000 + "]" * 5000 + ', "ref": 1}\n')
    for extra in (["--pred", deep, "--ref", good], ["--pairs", pairs]):
        assert main(["metrics", "score", *extra]) == 2
        err = capsys.readouterr().err
        assert "nested too deeply" in err and len(err.strip().splitlines()) == 1
