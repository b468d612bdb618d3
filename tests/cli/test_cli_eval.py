"""`resilibench eval agent`: files written, resume, two agents in one directory, refusing to mix, bad input."""

from __future__ import annotations

import json

import pytest
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401 (fixture)

from resilibench.cli import main
from resilibench.results import read_jsonl

EVAL = ["eval", "agent", "--prompts", "baseline", "optimal", "flawed", "--flaw-types", "order", "missing_step",
        "--limit", "5", "--seeds", "0", "1"]


@pytest.fixture(scope="module")
def eval_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("eval") / "out"
    assert main([*EVAL, "--agent", "scripted:optimal", "--output-dir", str(directory)]) == 0
    return directory


def test_eval_writes_results_summary_and_plot(eval_dir, capsys):
    contents = read_jsonl(eval_dir / "results.jsonl")
    assert len(contents.metadata) == 1
    meta = contents.metadata[0]
    # 5 tasks x 2 seeds x (baseline, optimal and each flaw type that applies to the task's plan).
    assert len(contents.rows) == meta["config"]["episodes"]
    assert 5 * 2 * 3 < len(contents.rows) <= 5 * 2 * 4
    assert len({r["task_type"] for r in contents.rows}) == 5
    assert meta["config"]["world"]["rules"]["strict_dependencies"] is True
    assert meta["config"]["agent"] == "scripted:optimal" and meta["seeds"] == [0, 1]
    summary = json.loads((eval_dir / "summary.json").read_text())
    for key in ("metadata", "by_prompt", "by_task_type", "by_flaw_type", "robustness"):
        assert key in summary
    stats = summary["by_prompt"]["scripted:optimal"]["optimal"]
    assert stats["episodes"] == 10 and 0 < stats["bound_iii"] < 1
    assert set(summary["by_flaw_type"]["scripted:optimal"]) == {"order", "missing_step"}
    assert (eval_dir / "summary.png").read_bytes()[:4] == b"\x89PNG"


def test_eval_resumes_and_adds_a_second_agent(eval_dir, tmp_path, capsys):
    directory = tmp_path / "out"
    directory.mkdir()
    for name in ("results.jsonl", "summary.json"):
        (directory / name).write_bytes((eval_dir / name).read_bytes())
    before = (directory / "results.jsonl").read_bytes()
    assert main([*EVAL, "--agent", "scripted:optimal", "--output-dir", str(directory)]) == 0
    assert (directory / "results.jsonl").read_bytes() == before, "nothing to redo: the file is unchanged"
    assert main([*EVAL, "--agent", "scripted:plan", "--output-dir", str(directory)]) == 0
    out = capsys.readouterr().out
    assert "Table 3 shape" in out and "scripted:plan" in out and "scripted:optimal" in out
    rows = read_jsonl(directory / "results.jsonl").rows
    assert len(rows) == 2 * len(read_jsonl(eval_dir / "results.jsonl").rows)
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["models"] == ["scripted:optimal", "scripted:plan"]


def test_eval_plays_planners_through_the_text_protocol(eval_dir, tmp_path, capsys):
    """A planner name as --agent: the optimal planner plays every episode as scripted:optimal does."""
    assert main([*EVAL, "--agent", "optimal", "--output-dir", str(tmp_path / "out")]) == 0

    def outcomes(path):
        return sorted((r["task_id"], r["prompt"], str(r.get("flaw_type")), r["seed"], r["level"], r["calls"], str(r["trace"]))
                      for r in read_jsonl(path / "results.jsonl").rows)

    assert read_jsonl(tmp_path / "out" / "results.jsonl").rows[0]["model"] == "planner:optimal"
    assert outcomes(tmp_path / "out") == outcomes(eval_dir)


def test_eval_refuses_to_mix_settings(eval_dir, tmp_path, capsys):
    directory = tmp_path / "out"
    directory.mkdir()
    (directory / "results.jsonl").write_bytes((eval_dir / "results.jsonl").read_bytes())
    config = tmp_path / "world.json"
    config.write_text(json.dumps({"failure": {"base_success": 0.7}}))
    for extra, message in ((["--severity", "0.9"], "a different config (eval."),
                           (["--config", str(config)], "different config")):
        capsys.readouterr()
        assert main([*EVAL, "--agent", "scripted:optimal", "--output-dir", str(directory), *extra]) == 2
        err = capsys.readouterr().err
        assert message in err and "refusing to mix" in err and len(err.strip().splitlines()) == 1
    assert (directory / "results.jsonl").read_bytes() == (eval_dir / "results.jsonl").read_bytes()
    assert main([*EVAL, "--agent", "scripted:optimal", "--output-dir", str(directory), "--severity", "0.9",
                 "--no-resume"]) == 0


@pytest.mark.parametrize("args, message", [
    (["--agent", "gpt"], "--agent gpt: agent spec 'gpt' not understood"),
    (["--agent", "ppo:/nonexistent/run"], "not a checkpoint directory"),
    (["--agent", "scripted:genius"], "scripted agent must be one of"),
    (["--agent", "hf:/nonexistent/model"], "not a directory"),
    (["--agent", "scripted:plan", "--prompts", "fancy"], "accepted: baseline"),
    (["--agent", "scripted:plan", "--flaw-types", "typo"], "flaw type(s) ['typo'] unknown"),
    (["--agent", "scripted:plan", "--severity", "2"], "expected a number in (0, 1]"),
    (["--agent", "scripted:plan", "--batch-size", "0"], "expected a positive integer"),
    (["--prompts", "baseline"], "the following arguments are required: --agent"),
])
def test_eval_bad_arguments_exit_2_with_one_line(args, message, tmp_path, capsys):
    assert main(["eval", "agent", "--limit", "1", "--seeds", "0", "--output-dir", str(tmp_path / "out"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out" / "results.jsonl").exists()


def test_eval_with_a_local_transformers_model(tmp_path_factory, torch_one_thread, capsys):  # noqa: F811
    model = build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))
    directory = tmp_path_factory.mktemp("hf") / "out"
    args = ["eval", "agent", "--agent", f"hf:{model}?name=tiny", "--prompts", "cot", "--limit", "2", "--seeds", "0",
            "--max-new-tokens", "6", "--batch-size", "2", "--keep-messages", "--output-dir", str(directory)]
    assert main(args) == 0
    rows = read_jsonl(directory / "results.jsonl").rows
    assert [r["model"] for r in rows] == ["tiny", "tiny"]
    assert all(r["prompt"] == "cot" and len(r["messages"]) >= 3 for r in rows)
    assert "tiny" in capsys.readouterr().out
