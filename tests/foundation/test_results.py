"""The long-run helpers: metadata, crash-tolerant JSONL, atomic JSON, level summaries."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from resilibench.results import (
    METADATA_KEY,
    JsonlWriter,
    check_level_rows,
    level_stats,
    read_jsonl,
    run_metadata,
    summarize_levels,
    wilson_interval,
    write_json_atomic,
)


def test_run_metadata_carries_provenance():
    meta = run_metadata({"a": (1, 2), "x": np.float64(0.5)}, np.arange(3), extra={"note": "hi"})
    assert meta["config"] == {"a": [1, 2], "x": 0.5}
    assert meta["seeds"] == [0, 1, 2]
    assert meta["note"] == "hi"
    for package in ("resilibench", "numpy", "gymnasium", "scipy", "networkx"):
        assert package in meta["packages"]
    assert meta["git_revision"] == "unknown" or len(meta["git_revision"]) == 40
    assert meta["timestamp"].endswith("+00:00")
    json.dumps(meta)


def test_jsonl_writer_appends_and_reads_back(tmp_path):
    path = tmp_path / "rows.jsonl"
    with JsonlWriter(path, metadata={"run": 1}) as writer:
        writer.write({"k": 1, "v": np.int64(7)})
        writer.write({"k": 2, "v": float("nan")})
        assert path.read_text().count("\n") == 3  # flushed row by row
    with JsonlWriter(path, metadata={"run": 2}) as writer:
        assert [r["k"] for r in writer.existing.rows] == [1, 2]
        writer.write({"k": 3, "v": 0})
    contents = read_jsonl(path)
    assert contents.metadata == [{"run": 1}, {"run": 2}]
    assert contents.rows == [{"k": 1, "v": 7}, {"k": 2, "v": None}, {"k": 3, "v": 0}]
    with JsonlWriter(path, resume=False) as writer:
        assert writer.existing.rows == []
    assert path.read_text() == ""
    with pytest.raises(ValueError, match=METADATA_KEY), JsonlWriter(path) as writer:
        writer.write({METADATA_KEY: {}})


def test_truncated_last_line_is_dropped_and_repaired(tmp_path):
    path = tmp_path / "rows.jsonl"
    with JsonlWriter(path) as writer:
        for i in range(3):
            writer.write({"k": i})
    path.write_bytes(path.read_bytes()[:-4])  # '{"k":2' without its end
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert [r["k"] for r in read_jsonl(path).rows] == [0, 1]
    assert path.read_bytes().endswith(b'{"k"')  # reading alone changes nothing
    with pytest.warns(RuntimeWarning):
        read_jsonl(path, repair=True)
    assert path.read_text() == '{"k":0}\n{"k":1}\n'
    with JsonlWriter(path) as writer:
        writer.write({"k": 2})
    assert [r["k"] for r in read_jsonl(path).rows] == [0, 1, 2]


def test_complete_last_row_without_newline_is_kept(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"k":0}\n{"k":1}')
    assert [r["k"] for r in read_jsonl(path, repair=True).rows] == [0, 1]
    assert path.read_text() == '{"k":0}\n{"k":1}\n'


def test_corrupt_middle_line_raises(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"k":0}\ngarbage\n{"k":1}\n')
    with pytest.raises(ValueError, match=r"rows.jsonl:2"):
        read_jsonl(path)


def test_write_json_atomic(tmp_path):
    path = tmp_path / "sub" / "summary.json"
    write_json_atomic(path, {"x": (1, 2), "y": float("inf")})
    assert json.loads(path.read_text()) == {"x": [1, 2], "y": None}
    write_json_atomic(path, {"x": 3})
    assert json.loads(path.read_text()) == {"x": 3}
    assert sorted(p.name for p in path.parent.iterdir()) == ["summary.json"]  # no temporary left behind
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask  # permissions of an ordinary new file
    with pytest.raises(TypeError, match="object"):
        write_json_atomic(path, {"bad": object()})
    assert json.loads(path.read_text()) == {"x": 3}  # a failed write leaves the old file


def test_wilson_interval():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and 0.2 < hi < 0.35
    lo, hi = wilson_interval(10, 10)
    assert hi == 1.0 and 0.65 < lo < 0.8
    lo, hi = wilson_interval(50, 100)
    assert lo == pytest.approx(1 - hi) and math.isclose(lo, 0.4038, abs_tol=1e-3)


def test_level_summaries():
    rows = [
        {"planner": "a", "task_type": "x", "level": "full_success", "bound_iii": 0.8, "bound_ii": 1.0},
        {"planner": "a", "task_type": "y", "level": "failure", "bound_iii": 0.6, "bound_ii": 0.0},
        {"planner": "b", "task_type": "x", "level": "partial_success", "bound_iii": 0.8, "bound_ii": 1.0},
    ]
    summary = summarize_levels(rows)
    a = summary["overall"]["a"]
    assert (a["episodes"], a["full_success"], a["failure"]) == (2, 0.5, 0.5)
    assert a["bound_iii"] == pytest.approx(0.7) and a["full_over_bound_iii"] == pytest.approx(0.5 / 0.7)
    assert set(summary["by_task_type"]["b"]) == {"x"}
    with pytest.raises(ValueError, match="level"):
        level_stats([{"level": "great"}])


def test_rows_without_a_level_or_a_group_are_named():
    rows = [{"planner": "a", "task_type": "x", "level": "full_success"}, {"planner": "a", "task_type": "x"}]
    with pytest.raises(ValueError, match="rows row 2: the row has no 'level' field"):
        summarize_levels(rows)
    with pytest.raises(ValueError, match="results.jsonl:7: the row has no 'planner' field"):
        check_level_rows([{"level": "failure"}], ("planner",), "results.jsonl", [7])


def test_row_lines_count_metadata_and_blank_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text('{"__metadata__": {}}\n{"a": 1}\n\n{"a": 2}')
    assert read_jsonl(path).row_lines == [2, 4]
