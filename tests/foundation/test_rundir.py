"""RunDirectory: resume, a changed config refused with its diff, one writer at a time, Ctrl-C, torn lines."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from helpers import with_ctrl_c
from resilibench.errors import ConfigChanged, DirectoryBusy, RunDirectoryError, RunInterrupted
from resilibench.results import read_jsonl, run_metadata
from resilibench.rundir import RunDirectory


def _squares(path, power=2, count=10, resume=True, stop_after=None):
    """A tiny long job: rows n -> n**power, keyed by n; KeyboardInterrupt after ``stop_after`` new rows."""
    run = RunDirectory(path, {"power": power, "world": {"turn_limit": 10}}, key=("n",))
    with run.session(resume):
        todo = [n for n in range(count) if (n,) not in run.done()]
        run.open_results(run_metadata({"power": power, "world": {"turn_limit": 10}}, None))
        for i, n in enumerate(todo):
            if i == stop_after:
                raise KeyboardInterrupt
            run.write({"n": n, "value": n ** power})
        run.write_summary({"metadata": run_metadata({"power": power, "world": {"turn_limit": 10}}, None),
                           "total": sum(row["value"] for row in run.rows())})
    return todo


def test_resume_runs_only_what_is_missing(tmp_path):
    assert _squares(tmp_path, count=4) == [0, 1, 2, 3]
    assert _squares(tmp_path, count=6) == [4, 5]
    assert _squares(tmp_path, count=6) == []
    contents = read_jsonl(tmp_path / "results.jsonl")
    assert [r["n"] for r in contents.rows] == list(range(6)) and len(contents.metadata) == 3
    assert json.loads((tmp_path / "summary.json").read_text())["total"] == sum(n * n for n in range(6))


def test_a_changed_config_is_refused_with_the_differences(tmp_path):
    _squares(tmp_path, count=3)
    before = (tmp_path / "results.jsonl").read_bytes()
    with pytest.raises(ConfigChanged, match=r"results.jsonl was produced with a different config \(power: 2 -> 3\)"
                       ) as caught:
        _squares(tmp_path, power=3)
    assert caught.value.field == "output_dir" and caught.value.differences == ["power: 2 -> 3"]
    assert (tmp_path / "results.jsonl").read_bytes() == before  # nothing written
    assert _squares(tmp_path, power=3, count=2, resume=False) == [0, 1]  # afresh: the old rows are gone
    assert [r["value"] for r in read_jsonl(tmp_path / "results.jsonl").rows] == [0, 1]


def test_nested_differences_and_allowed_changes(tmp_path):
    _squares(tmp_path, count=1)
    run = RunDirectory(tmp_path, {"power": 2, "world": {"turn_limit": 12}})
    with pytest.raises(ConfigChanged, match=r"world.turn_limit: 10 -> 12"):
        run.check()
    RunDirectory(tmp_path, {"power": 2, "world": {"turn_limit": 12}}, may_change=["world.turn_limit"]).check()


def test_rows_of_unknown_config_and_foreign_files_are_refused(tmp_path):
    (tmp_path / "results.jsonl").write_text('{"n": 0}\n')
    with pytest.raises(RunDirectoryError, match="results.jsonl has records but no metadata record"):
        _squares(tmp_path)
    (tmp_path / "file").write_text("")
    with pytest.raises(RunDirectoryError, match="exists and is not a directory"):
        RunDirectory(tmp_path / "file")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "summary.json").write_text("{half")
    with pytest.raises(RunDirectoryError, match="summary.json is not a ResiliBench record"):
        _squares(tmp_path / "bad")


def test_a_torn_last_line_is_repaired_and_redone(tmp_path):
    _squares(tmp_path, count=3)
    path = tmp_path / "results.jsonl"
    path.write_bytes(path.read_bytes()[:-5])  # a crash in the middle of the last row
    with pytest.warns(RuntimeWarning, match="truncated"):
        assert _squares(tmp_path, count=3) == [2]
    assert [r["n"] for r in read_jsonl(path).rows] == [0, 1, 2]


def test_ctrl_c_leaves_a_resumable_directory(tmp_path):
    with pytest.raises(RunInterrupted, match=r"interrupted after 3 new rows; every finished row is saved in .*"
                                             r"rerun the same command to resume"):
        _squares(tmp_path, stop_after=3)
    assert [r["n"] for r in read_jsonl(tmp_path / "results.jsonl").rows] == [0, 1, 2]
    assert not (tmp_path / "summary.json").exists()
    _squares(tmp_path)  # the lock was released
    assert [r["n"] for r in read_jsonl(tmp_path / "results.jsonl").rows] == list(range(10))


def test_a_second_writer_is_refused(tmp_path):
    """Another process holds the directory: a second session fails at once; after it ends, it works."""
    script = textwrap.dedent(f"""
        import sys
        from resilibench.rundir import RunDirectory
        with RunDirectory({str(tmp_path)!r}).session():
            print("ready", flush=True)
            sys.stdin.readline()
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        started = time.monotonic()
        with pytest.raises(DirectoryBusy, match="another process is writing there"):
            _squares(tmp_path)
        assert time.monotonic() - started < 5
    finally:
        holder.communicate("\n", timeout=30)
    assert holder.returncode == 0
    assert _squares(tmp_path, count=2) == [0, 1]


def test_sigint_in_a_job_process_leaves_its_rows_resumable(tmp_path):
    """A real Ctrl-C (SIGINT) in a process running a job: exit status 130, the rows so far kept, a rerun
    completes them."""
    script = textwrap.dedent(f"""
        import sys, time
        from resilibench.errors import RunInterrupted
        from resilibench.results import run_metadata
        from resilibench.rundir import RunDirectory
        run = RunDirectory({str(tmp_path)!r}, {{"power": 2}}, key=("n",))
        try:
            with run.session():
                run.open_results(run_metadata({{"power": 2}}, None))
                for n in range(1000):
                    run.write({{"n": n}})
                    print(n, flush=True)
                    time.sleep(0.01)
        except RunInterrupted as exc:
            print(exc, file=sys.stderr)
            sys.exit(130)
    """)
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, preexec_fn=with_ctrl_c)
    for _ in range(5):
        process.stdout.readline()
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "rerun the same command to resume" in err
    rows = read_jsonl(tmp_path / "results.jsonl").rows
    assert len(rows) >= 5 and [r["n"] for r in rows] == list(range(len(rows)))
    with RunDirectory(tmp_path, {"power": 2}, key=("n",)).session() as run:
        assert len(run.done()) == len(rows)
