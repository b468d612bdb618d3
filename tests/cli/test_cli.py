"""The ``resilibench`` command line, run in-process through ``main``: files, resume, errors, exports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from resilibench.cli import main
from resilibench.core.bounds import largest_turn_limit, optimal_success
from resilibench.core.registry import default_registry
from resilibench.core.tasks.library import TASK_TYPES, read_tasks
from resilibench.core.world import get_task, load_tasks
from resilibench.policies.runner import PLANNER_NAMES
from resilibench.results import METADATA_KEY, read_jsonl

RUN = ["run", "--limit", "5", "--seeds", "0"]
LEVELS = ("full_success", "partial_success", "failure")


def _run(tmp_path: Path, *extra: str) -> int:
    return main([*RUN, "--output-dir", str(tmp_path / "quick"), *extra])


def _rows(path: Path) -> list[dict]:
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in lines if METADATA_KEY not in r]


def _row_set(rows: list[dict]) -> set[str]:
    return {json.dumps(r, sort_keys=True) for r in rows}


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> tuple[Path, bytes]:
    """One small run shared by the resume tests (each works on its own copy)."""
    tmp = tmp_path_factory.mktemp("run")
    assert _run(tmp) == 0
    return tmp / "quick", (tmp / "quick" / "results.jsonl").read_bytes()


def _copy_run(first_run, tmp_path: Path) -> Path:
    directory, data = first_run
    target = tmp_path / "quick"
    target.mkdir()
    for name in ("results.jsonl", "summary.json"):
        (target / name).write_bytes((directory / name).read_bytes())
    return target


# --- run ----------------------------------------------------------------------------------------------


def test_run_writes_results_summary_and_plot(first_run):
    directory, _ = first_run
    contents = read_jsonl(directory / "results.jsonl")
    assert len(contents.metadata) == 1
    assert len(contents.rows) == len(PLANNER_NAMES) * 5
    assert {r["planner"] for r in contents.rows} == set(PLANNER_NAMES)
    # --limit takes task types in turn: five tasks, one of each type.
    assert len({r["task_type"] for r in contents.rows}) == 5

    summary = json.loads((directory / "summary.json").read_text())
    meta = summary["metadata"]
    for key in ("config", "seeds", "packages", "git_revision", "timestamp", "python"):
        assert key in meta
    assert meta["seeds"] == [0]
    assert meta["config"]["world"]["failure"]["base_success"] == 0.8
    assert {"numpy", "gymnasium", "scipy", "networkx", "resilibench"} <= set(meta["packages"])
    for planner in PLANNER_NAMES:
        groups = [summary["overall"][planner], *summary["by_task_type"][planner].values()]
        for stats in groups:
            assert sum(stats[level] for level in LEVELS) == pytest.approx(1.0)
            lo, hi = stats["full_success_ci95"]
            assert 0.0 <= lo <= stats["full_success"] <= hi <= 1.0
        assert summary["overall"][planner]["episodes"] == 5
    tasks = {r["task_id"] for r in contents.rows}
    expected = sum(optimal_success(get_task(t)) for t in tasks) / len(tasks)
    assert summary["overall"]["optimal"]["bound_iii"] == pytest.approx(expected)
    assert contents.metadata[0]["config"] == meta["config"]
    png = (directory / "summary.png").read_bytes()
    assert png.startswith(b"\x89PNG")


def test_run_resume_skips_done_rows(first_run, tmp_path, capsys):
    directory = _copy_run(first_run, tmp_path)
    before = (directory / "results.jsonl").read_bytes()
    assert _run(tmp_path) == 0
    assert "0 to run" in capsys.readouterr().err
    assert (directory / "results.jsonl").read_bytes() == before  # nothing run, nothing appended


def test_run_resume_restores_deleted_rows(first_run, tmp_path):
    directory = _copy_run(first_run, tmp_path)
    path = directory / "results.jsonl"
    original = _rows(path)
    lines = path.read_text().splitlines(keepends=True)
    path.write_text("".join(lines[:4] + lines[9:]))  # drop five rows
    assert len(_rows(path)) == len(original) - 5
    assert _run(tmp_path) == 0
    assert _row_set(_rows(path)) == _row_set(original)
    assert len(_rows(path)) == len(original)


def test_run_resume_after_truncated_last_line(first_run, tmp_path, capsys):
    directory = _copy_run(first_run, tmp_path)
    path = directory / "results.jsonl"
    original = _rows(path)
    data = path.read_bytes()
    path.write_bytes(data[:-30])  # a crash in the middle of the last row
    assert _run(tmp_path) == 0
    assert "truncated" in capsys.readouterr().err
    for line in path.read_text().splitlines():
        json.loads(line)  # every line parses again
    assert _row_set(_rows(path)) == _row_set(original)


def test_run_refuses_a_different_config(first_run, tmp_path, capsys):
    directory = _copy_run(first_run, tmp_path)
    before = (directory / "results.jsonl").read_bytes()
    config = tmp_path / "world.yaml"
    config.write_text("failure:\n  base_success: 0.9\n")
    assert _run(tmp_path, "--config", str(config)) == 2
    err = capsys.readouterr().err
    assert "different config" in err and "base_success" in err and "Traceback" not in err
    assert (directory / "results.jsonl").read_bytes() == before  # untouched
    # --no-resume discards the old results and starts afresh with the new config.
    assert _run(tmp_path, "--config", str(config), "--no-resume") == 0
    contents = read_jsonl(directory / "results.jsonl")
    assert len(contents.metadata) == 1
    assert contents.metadata[0]["config"]["world"]["failure"]["base_success"] == 0.9
    assert len(contents.rows) == len(PLANNER_NAMES) * 5


def test_run_refuses_a_directory_in_use(tmp_path, capsys):
    (tmp_path / "quick").mkdir()
    with FileLock(tmp_path / "quick" / ".lock"):  # what a second `run` into the same directory holds
        assert _run(tmp_path) == 2
    assert "--output-dir: " in (err := capsys.readouterr().err) and "another process is writing there" in err
    assert not (tmp_path / "quick" / "results.jsonl").exists()


# --- errors -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["run", "--planners", "nope"], "random_legal"),
        (["run", "--split", "dev"], "validation"),
        (["run", "--task-type", "nope"], "basic_file_processing"),
        (["run", "--seeds", "-1"], "non-negative"),
        (["run", "--limit", "0"], "positive"),
        (["run", "--config", "/nonexistent/world.yaml"], "does not exist"),
        (["run", "--tasks", "/nonexistent/tasks.jsonl"], "does not exist"),
        (["bounds", "--task-id", "task_nope"], "unknown task id"),
        (["bounds", "--format", "xml"], "table"),
        (["tasks", "show", "task_nope"], "unknown task id"),
        (["tasks", "generate", "--matcher", "fuzzy"], "lexical"),
        (["tasks"], "required"),
        (["frobnicate"], "tools"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(argv, needle, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"failure": {"base": 0.9}}', "accepted"),
        ('{"rules": {"profile": "training"}}', "profile"),
        ('{"rules": {"profile": "nope"}}', "profile"),
        ("[1, 2]", "mapping"),
        ("{not json", "cannot parse"),
    ],
)
def test_bad_config_exits_2(text, needle, tmp_path, capsys):
    config = tmp_path / "world.json"
    config.write_text(text)
    assert _run(tmp_path, "--config", str(config)) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1
    assert not (tmp_path / "quick").exists()


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('{"failure": {"base_success": 1.5}}', "failure.base_success must be a finite number in [0, 1]"),
        ('{"evaluator": {"completion_phrases": "task completed"}}', "evaluator.completion_phrases"),
        ('{"rules": {"turn_limit": 1000000000}}', "rules.turn_limit must be an integer in [1, 1000]"),
        ('{"rules": {"turn_limit": 30}}', "bound (iii) needs 30 spare tools"),
    ],
)
@pytest.mark.parametrize("command", [["run", "--limit", "5", "--seeds", "0"], ["bounds", "--split", "test"]])
def test_invalid_world_configs_exit_2_before_any_work(command, text, needle, tmp_path, capsys):
    config = tmp_path / "world.json"
    config.write_text(text)
    out = tmp_path / "out"
    extra = ["--output-dir", str(out)] if command[0] == "run" else ["--output", str(out)]
    assert main([*command, "--config", str(config), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_the_largest_turn_limit_is_the_smallest_spare_tool_count(tmp_path, capsys):
    tasks = load_tasks(split="test")
    largest = min(largest_turn_limit(t) for t in tasks)
    assert largest == 15  # docs/core/bounds.md (v1 test split)
    config = tmp_path / "world.json"
    config.write_text(json.dumps({"rules": {"turn_limit": largest + 1}}))
    assert main(["bounds", "--config", str(config), "--split", "test"]) == 2
    assert f"the largest turn limit for these tasks is {largest}" in capsys.readouterr().err
    task = min(tasks, key=largest_turn_limit)
    config.write_text(json.dumps({"rules": {"turn_limit": largest}}))
    assert main(["bounds", "--config", str(config), "--task-id", task.instance_id, "--format", "json"]) == 0


# --- tools, tasks, bounds -----------------------------------------------------------------------------


def test_tools_json_round_trips(tmp_path, capsys):
    assert main(["tools", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(default_registry().to_json())
    out = tmp_path / "registry.json"
    assert main(["tools", "--json", "--output", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads(default_registry().to_json())


def test_tools_table(capsys):
    assert main(["tools"]) == 0
    out = capsys.readouterr().out
    assert "file_operations_writer" in out and "data_processing_aggregator" in out
    assert len(out.strip().splitlines()) == 2 + len(default_registry())


def test_tasks_generate_is_byte_identical(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    assert main(["tasks", "generate", "--matcher", "lexical", "--output", str(a)]) == 0
    assert main(["tasks", "generate", "--matcher", "lexical", "--output", str(b)]) == 0
    assert a.read_bytes() == b.read_bytes()
    tasks = read_tasks(a)
    assert len(tasks) == 5040
    for task_type in TASK_TYPES:
        assert sum(t.task_type == task_type.name for t in tasks) == task_type.count
    out = capsys.readouterr().out
    assert "5040" in out and "easy 1520, medium 2880, hard 640" in out


def test_tasks_stats_and_worlds(tmp_path, capsys):
    assert main(["tasks", "stats", "--format", "json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["source"]["world"] == "v1" and stats["distinct_tool_lists"] == 5040
    assert stats["descriptions_naming_a_tool"] == 0 and stats["test_lists_seen_in_train_or_validation"] == 0
    assert main(["tasks", "stats", "--world", "v0"]) == 0
    out = capsys.readouterr().out
    assert "distinct required-tool lists: 41" in out and "descriptions that name a tool: 5040" in out
    v0 = tmp_path / "v0.jsonl"
    assert main(["tasks", "generate", "--world", "v0", "--matcher", "lexical", "--output", str(v0)]) == 0
    assert "tasks of world v0" in capsys.readouterr().out
    assert read_tasks(v0)[0].metadata["generator_version"] == "1"
    v0_task = load_tasks(split="test", world="v0")[0]
    assert main(["tasks", "show", v0_task.instance_id]) == 2  # not in the default world
    assert "unknown task id" in capsys.readouterr().err
    assert main(["tasks", "show", "--world", "v0", v0_task.instance_id]) == 0


def test_tasks_show_and_list(capsys):
    task = load_tasks(split="test")[0]
    assert main(["tasks", "show", task.instance_id]) == 0
    out = capsys.readouterr().out
    assert f'"instance_id": "{task.instance_id}"' in out
    assert f"1. {task.required_tools[0]}" in out
    assert f"{optimal_success(task):.6f}" in out
    assert main(["tasks", "list", "--split", "test", "--task-type", "simple_data_transformation",
                 "--limit", "3"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 + 3
    assert all("simple_data_transformation" in line for line in lines[2:])


def test_bounds_task_id_matches_optimal_success(tmp_path, capsys):
    task = load_tasks(split="validation")[3]
    expected = optimal_success(task)
    assert main(["bounds", "--task-id", task.instance_id]) == 0
    assert f"{expected:.6f}" in capsys.readouterr().out
    out = tmp_path / "bounds.json"
    assert main(["bounds", "--task-id", task.instance_id, "--clairvoyant-seeds", "2", "--format", "json",
                 "--output", str(out)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["tasks"][0]["bound_iii"] == expected
    assert 0.0 <= document["tasks"][0]["bound_ii"] <= 1.0
    assert document["summary"]["all"]["count"] == 1
    assert json.loads(out.read_text()) == document
    assert document["metadata"]["seeds"] == [0, 1]


def test_bounds_bound_ii_matches_run_rows(first_run, capsys):
    directory, _ = first_run
    rows = {r["task_id"]: r for r in read_jsonl(directory / "results.jsonl").rows if r["planner"] == "optimal"}
    ids = [arg for task_id in rows for arg in ("--task-id", task_id)]
    assert main(["bounds", *ids, "--clairvoyant-seeds", "1", "--format", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert len(document["tasks"]) == len(rows) == 5
    for entry in document["tasks"]:
        row = rows[entry["task_id"]]
        assert row["seed"] == 0
        assert (entry["bound_iii"], entry["bound_ii"]) == (row["bound_iii"], row["bound_ii"])


def test_python_dash_m(tmp_path):
    done = subprocess.run([sys.executable, "-m", "resilibench", "--version"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0 and "resilibench" in done.stdout


# --- output files and results files (issue 12, items 17-18) ---------------------------------------------


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if line.startswith("resilibench: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.mark.parametrize(
    "argv",
    [
        ["tools", "--json"],
        ["bounds", "--task-id", "task_c435fb64"],
        ["tasks", "generate", "--matcher", "lexical"],
        ["metrics", "score", "--pred", "{pred}", "--ref", "{pred}", "--metrics", "chain_f1"],
    ],
)
def test_a_directory_as_output_is_one_line_and_leaves_nothing(argv, tmp_path, capsys):
    from resilibench.core.workflow import Workflow

    pred = tmp_path / "pred.json"
    pred.write_text(Workflow.chain(["file_operations_reader"], ["read"]).to_json())
    target = tmp_path / "out"
    target.mkdir()
    before = sorted(tmp_path.iterdir())
    assert main([a.replace("{pred}", str(pred)) for a in argv] + ["--output", str(target)]) == 2
    assert f"--output: {target} is a directory" in _one_line(capsys)
    assert sorted(tmp_path.iterdir()) == before and not any(target.iterdir())


def test_output_below_a_file_is_one_line(tmp_path, capsys):
    (tmp_path / "afile").write_text("x")
    assert main(["tools", "--json", "--output", str(tmp_path / "afile" / "registry.json")]) == 2
    assert "is not a directory" in _one_line(capsys)
    assert main([*RUN, "--output-dir", str(tmp_path / "afile" / "quick")]) == 2
    assert "is not a directory" in _one_line(capsys)


def test_train_ppo_with_a_missing_task_file_is_one_line(tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert main(["train", "ppo", "--tasks", str(missing), "--output-dir", str(tmp_path / "ppo")]) == 2
    assert f"--tasks: {missing} does not exist" in _one_line(capsys)
    assert not (tmp_path / "ppo").exists()


def test_robust_demo_into_a_file_is_one_line(tmp_path, capsys):
    target = tmp_path / "afile"
    target.write_text("keep me")
    assert main(["robust", "demo", "--output-dir", str(target)]) == 2
    assert "exists and is not a directory" in _one_line(capsys)
    assert target.read_text() == "keep me"


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full to simulate a full disk")
def test_a_full_disk_is_one_line_naming_the_file(tmp_path, capsys):
    directory = tmp_path / "quick"
    directory.mkdir()
    (directory / "results.jsonl").symlink_to("/dev/full")  # every write: ENOSPC
    assert _run(tmp_path, "--no-resume") == 1
    assert f"No space left on device: '{directory / 'results.jsonl'}'" in _one_line(capsys)


def test_rows_without_a_known_level_are_refused_before_any_work(first_run, tmp_path, capsys):
    directory = _copy_run(first_run, tmp_path)
    results = directory / "results.jsonl"
    good = results.read_bytes()
    for bad in ({"planner": "greedy", "task_id": "t", "seed": 0, "task_type": "x"},
                {"planner": "greedy", "task_id": "t", "seed": 0, "task_type": "x", "level": "great"}):
        results.write_bytes(good + (json.dumps(bad) + "\n").encode())
        assert _run(tmp_path) == 2
        message = _one_line(capsys)
        assert "results.jsonl" in message and "level" in message and str(len(good.splitlines()) + 1) in message
        assert results.read_bytes() == good + (json.dumps(bad) + "\n").encode()


def test_a_nul_padded_tail_is_repaired_with_nothing_left_to_run(first_run, tmp_path, capsys):
    directory = _copy_run(first_run, tmp_path)
    results = directory / "results.jsonl"
    good = results.read_bytes()
    results.write_bytes(good + b"\0" * 4096)  # what a crash can leave on some file systems
    assert _run(tmp_path) == 0
    assert results.read_bytes() == good
    assert "truncated" in capsys.readouterr().err
    assert _run(tmp_path) == 0
    assert "truncated" not in capsys.readouterr().err


@pytest.mark.parametrize("command", [["eval", "agent", "--agent", "scripted:optimal", "--output-dir"],
                                     ["metrics", "calibrate", "--output-dir"],
                                     ["robust", "clusters", "--output-dir"]])
def test_every_command_with_bounds_refuses_a_turn_limit_beyond_the_spare_tools(tmp_path, capsys, command):
    config = tmp_path / "world.json"
    config.write_text(json.dumps({"rules": {"turn_limit": 19}}))
    status = main([*command, str(tmp_path / "out"), "--config", str(config), "--split", "test"])
    err = capsys.readouterr().err
    assert status == 2 and "bound (iii) needs 19 spare tools" in err, err
