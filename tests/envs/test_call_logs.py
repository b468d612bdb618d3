"""Call logs survive crashes and hostile input: a torn last line is skipped and then cut off, an episode's
rows reach the log only once it ends (so a resumed run logs nothing twice), and a malformed row is refused
naming its line and field."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from resilibench.cli import main as cli_main
from resilibench.core.config import WorldConfig
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.envs.real_api.call_log import CallLogRow, read_rows, write_rows
from resilibench.envs.real_api.live_apis import RealApi
from resilibench.envs.real_api.service import ToolService, running_service
from resilibench.envs.text.env import ResiliBenchTextEnv
from resilibench.errors import InputError
from resilibench.policies.runner import run_jobs

ROW = {"source": "simulator", "task_id": "t", "episode": "e", "turn": 1, "tool": "a", "n_uncalled": 1,
       "n_failed": 0, "n_history": 0, "success": True}


def rows(count: int, episode: str = "e") -> list[CallLogRow]:
    return [CallLogRow(**{**ROW, "episode": episode, "turn": turn}) for turn in range(1, count + 1)]


def test_a_torn_last_line_is_skipped_then_cut_off(tmp_path):
    log = tmp_path / "calls.jsonl"
    write_rows(log, rows(3))
    with log.open("ab") as out:
        out.write(b'{"source": "simulator", "task_id": "t", "epis')  # a write stopped by kill -9
    with pytest.warns(UserWarning, match="torn last line"):
        assert len(list(read_rows(log))) == 3
    write_rows(log, rows(2, episode="f"))
    lines = log.read_bytes().splitlines(keepends=True)
    assert len(lines) == 5 and all(line.endswith(b"\n") for line in lines)
    assert [r.episode for r in read_rows(log)] == ["e"] * 3 + ["f"] * 2


@pytest.mark.parametrize(("line", "field"), [
    (b'{"source": "simulator", "task_id": "t\xff"}', "log"),  # not UTF-8
    (json.dumps({**ROW, "latency_s": "fast"}).encode(), "latency_s"),
    (json.dumps({**ROW, "success": False, "error_code": "RATE_LIMITED", "retry_after": float("nan")}).encode(),
     "retry_after"),
    (json.dumps({**ROW, "retry_after": float("inf")}).encode(), "retry_after"),
    (json.dumps({**ROW, "status": "200"}).encode(), "status"),
    (json.dumps({**ROW, "success": 1}).encode(), "success"),
    (json.dumps({**ROW, "tool": 7}).encode(), "tool"),
    (json.dumps({**ROW, "world_duration": -1.0}).encode(), "world_duration"),
])
def test_a_malformed_row_is_named_by_line_and_field(tmp_path, capsys, line, field):
    log = tmp_path / "calls.jsonl"
    log.write_bytes(json.dumps(ROW).encode() + b"\n" + line + b"\n")
    with pytest.raises(InputError) as caught:
        list(read_rows(log))
    assert caught.value.field == field and f"{log}:2" in str(caught.value)
    assert cli_main(["failures", "fit", str(log), "--output", str(tmp_path / "fit.yaml")]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and f"{log}:2" in error


def test_http_rows_reach_the_log_when_the_episode_ends(tmp_path):
    """An episode stopped before its end (a killed run replays it on resume) leaves no row in the log."""
    log = tmp_path / "calls.jsonl"
    task = load_tasks(split="test")[0]
    with running_service(ToolService()) as url:
        env = ResiliBenchTextEnv(split=None, tasks=[task], search=SearchSettings(method="lexical"),
                                 api=RealApi(url, {"log": str(log)}))
        env.reset(seed=0)
        env.step(f"<tool_call>{task.required_tools[0]}</tool_call>")
        assert not log.exists()  # the episode is still running
        env.reset(seed=1)  # the first episode is abandoned: its rows never reach the log
        for tool in task.required_tools:
            env.step(f"<tool_call>{tool}</tool_call>")
        *_, info = env.step("Task completed.")
        env.close()
    logged = list(read_rows(log))
    assert len({r.episode for r in logged}) == 1
    assert [(r.tool, r.success) for r in logged] == [(t["tool"], t["success"]) for t in info["trace"]]


def test_a_resumed_run_does_not_log_its_episodes_twice(tmp_path):
    log = tmp_path / "calls.jsonl"
    jobs = [("optimal", task, seed) for task in load_tasks(split="test")[:2] for seed in (0, 1)]
    run_jobs(jobs[:3], WorldConfig(), call_log=log, bounds=False)
    first = log.read_text()
    logged = {r.episode for r in read_rows(log)}
    run_jobs(jobs, WorldConfig(), call_log=log, bounds=False, logged=logged)  # the resumed run plays all 4
    assert log.read_text().startswith(first)
    turns = Counter((r.episode, r.turn) for r in read_rows(log))
    assert max(turns.values()) == 1 and len({episode for episode, _ in turns}) == 4


@pytest.mark.slow
def test_kill_9_then_resume_logs_every_episode_once(tmp_path):
    """A real ``resilibench run --call-log`` killed with SIGKILL mid-run, then resumed: the log holds each
    episode of the results exactly once, every turn once."""
    out, log = tmp_path / "run", tmp_path / "calls.jsonl"
    command = [sys.executable, "-m", "resilibench", "run", "--planners", "optimal", "random_legal", "--limit", "40",
               "--seeds", "0", "1", "--output-dir", str(out), "--call-log", str(log)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    results = out / "results.jsonl"
    deadline = time.monotonic() + 120
    while not results.exists() or len(results.read_text().splitlines()) < 20:
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert subprocess.run([*command, "--resume"], capture_output=True).returncode == 0
    played = {f"{r['planner']}/{r['task_id']}/{r['seed']}" for r in map(json.loads, results.read_text().splitlines())
              if "planner" in r}  # not the run's metadata lines
    turns = Counter((r.episode, r.turn) for r in read_rows(log))
    assert len(played) == 160 and max(turns.values()) == 1
    assert {episode for episode, _ in turns} <= played
