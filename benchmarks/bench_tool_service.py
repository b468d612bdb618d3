"""Latency and throughput of the HTTP tool service (``resilibench serve tools``) over loopback.

Workload: episodes of test-split tasks, each played by the same simple agent: call the task's required
tools in order (no arguments), a failed tool again until it succeeds, until the episode ends or its
turns are used up.

* **Anchor: direct calls.** ``toolbox.call_tool`` on ``Episode``s in this process: what every front end
  does per call, without HTTP.
* **Service.** ``resilibench serve tools --port 0`` in its own process; the same episodes played through
  ``HttpExecutor`` (each episode opened with ``POST /episodes``, one request per drawing call), by one
  client (request latency p50/p99, requests/s) and by ``--clients`` threads at once (requests/s). Faults
  are real: a dropped connection costs a reconnect; a TIMEOUT is answered after ``--slow-seconds``
  (default 0, so the figure is the service's cost, not its staged delay).

The script checks that both sides reach the same traces. Run: ``python benchmarks/bench_tool_service.py``
(``--episodes 200``).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from resilibench.core.simulator import Episode, run_episode_seed
from resilibench.core.text.toolbox import call_tool
from resilibench.core.world import load_tasks
from resilibench.envs.real_api.client import HttpExecutor, ToolClient


def play(call, episode: Episode) -> None:
    """The agent: required tools in order, each until it succeeds, while the episode runs."""
    for tool in episode.task.required_tools:
        while not episode.done and episode.turns_left > 0:
            if call(tool).success:
                break


def episodes(count: int) -> list[Episode]:
    tasks = load_tasks(split="test")
    return [Episode.start(t, run_episode_seed(t.instance_id, 0)) for t in (tasks[i % len(tasks)] for i in range(count))]


def run_direct(count: int) -> tuple[float, list]:
    started = time.perf_counter()
    played = episodes(count)
    for episode in played:
        play(lambda tool, e=episode: call_tool(e, tool).record, episode)
    return time.perf_counter() - started, [e.trace for e in played]


def run_http(url: str, count: int, clients: int) -> tuple[float, list, list[float]]:
    played = episodes(count)
    latencies: list[float] = []

    def one(share: list[Episode]) -> None:
        with ToolClient(url, timeout=30) as client:
            for episode in share:
                executor = HttpExecutor(client, episode)
                play(executor.call, episode)
                latencies.extend(o.latency_s for o in executor.outcomes)

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, [played[i::clients] for i in range(clients)]))
    return time.perf_counter() - started, [e.trace for e in played], latencies


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--slow-seconds", type=float, default=0.0)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-m", "resilibench", "serve", "tools", "--port", "0",
                               "--slow-seconds", str(args.slow_seconds)], stderr=subprocess.PIPE, text=True)
    try:
        url = server.stderr.readline().split(" at ", 1)[1].split()[0]
        direct_s, direct_traces = run_direct(args.episodes)
        one_s, one_traces, latencies = run_http(url, args.episodes, 1)
        many_s, many_traces, _ = run_http(url, args.episodes, args.clients)
    finally:
        server.terminate()
        server.wait(timeout=20)
    same = [[(r.tool, r.success, r.error_code) for r in t] for t in direct_traces]
    for traces in (one_traces, many_traces):
        assert [[(r.tool, r.success, r.error_code) for r in t] for t in traces] == same, "traces differ"
    calls = sum(len(t) for t in direct_traces)
    requests = len(latencies)
    latencies.sort()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()}")
    print(f"{args.episodes} episodes, {calls} tool calls, {requests} HTTP requests (same traces on both sides)")
    print(f"anchor, direct calls:        {calls / direct_s:10.0f} calls/s")
    print(f"service, 1 client:           {requests / one_s:10.0f} requests/s; latency p50 "
          f"{statistics.median(latencies) * 1e3:.1f} ms, p99 {latencies[int(0.99 * (requests - 1))] * 1e3:.1f} ms")
    print(f"service, {args.clients} clients at once:   {requests / many_s:10.0f} requests/s")


if __name__ == "__main__":
    main()
