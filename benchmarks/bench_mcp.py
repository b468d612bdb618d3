"""Throughput of the MCP server against direct calls on the Episode core, measured in one process.

Workload: episodes of test-split tasks, each played by the same simple agent: call the task's required
tools in order with valid arguments, retry a tool until it succeeds, call ``finish`` when all succeeded or
the turns are used up (or stop when the episode ends on its own).

* **Anchor: direct calls.** ``start_episode`` + ``resilibench.core.text.toolbox.call_tool`` + ``finish`` on the
  Episode core, one episode after another: what every front end does per call, without MCP.
* **MCP.** ``--sessions`` (default 50) in-memory ``mcp.Client`` sessions on one server, all at once (an
  anyio task group); each plays its share of the episodes through ``start_task``, the tool calls and
  ``finish``. Modes: ``auto`` (the SDK's in-process modern 2026-07-28 dispatch) and ``legacy`` (the
  in-memory stream transport with JSON-RPC framing).
* **SDK floor: echo server.** The very requests each MCP session sent, replayed by as many concurrent
  sessions to a low-level ``Server`` with the same tool list that answers every call with a constant
  result: the most any MCP server can do here, so ``MCP / echo`` is the share of it this server reaches.

The figure is simulated tool calls per second (the start and finish requests are inside the timed loop
on both sides; connecting the MCP sessions is not). Both sides play the same episodes; the script checks that they reach the same levels.
Repeats are interleaved (anchor, MCP, anchor, ...) and each ratio is the median of the per-repeat ratios.

Latency (``--part latency``): one client session plays ``--latency-episodes`` episodes one request at a
time, as an agent does, over each transport: **anchor: in memory** (``mcp.Client(server)`` in this
process, no transport), **stdio** (``resilibench serve mcp`` launched by the client) and **streamable
HTTP** (``resilibench serve mcp --transport http`` on a loopback port). Per transport: p50 and p99 of the
request latency, requests/s, and CPU milliseconds per request of the client and of the server process
(read from /proc, so Linux only). Repeats are interleaved and each figure is the median over repeats.
Run: ``python benchmarks/bench_mcp.py`` (``--quick`` for a short run).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.server.lowlevel import Server

from resilibench.core.config import WorldConfig
from resilibench.core.registry import default_registry
from resilibench.core.text.toolbox import call_tool
from resilibench.core.world import load_tasks
from resilibench.envs.mcp.server import ResiliBenchMCP, build_server
from resilibench.envs.real_api.serving import start_episode

REGISTRY = default_registry()
STRICT = WorldConfig().replace(rules={"strict_dependencies": True})  # start_task's default


def valid_arguments(tool_name: str) -> dict:
    """Each required parameter with a plain value of its type (checked against the schema)."""
    values = {"string": "input.csv", "object": {}, "number": 1.0, "integer": 1, "boolean": True}
    tool = REGISTRY[tool_name]
    args = {p.name: p.constraints["enum"][0] if "enum" in p.constraints else values[p.type]
            for p in tool.parameters if p.required}
    assert tool.check_arguments(args) is None
    return args


ARGUMENTS = {name: valid_arguments(name) for name in REGISTRY.names}


def direct(jobs) -> tuple[int, list[str], float]:
    """(tool calls, levels, seconds) of the jobs played on the Episode core."""
    calls, levels = 0, []
    start = time.perf_counter()
    for task, seed in jobs:
        episode = start_episode(task, seed, STRICT)
        required, i = task.required_tools, 0
        while i < len(required) and episode.turns_left and not episode.done:
            record = call_tool(episode, required[i], ARGUMENTS[required[i]]).record
            calls += 1
            i += record.success
        if not episode.done:
            episode.finish()
        levels.append(episode.evaluation.level)
    return calls, levels, time.perf_counter() - start


async def _play(client: Client, jobs, out: dict) -> None:
    """Play ``jobs`` in one client session; records the levels, the tool calls and every request sent."""
    sent = out["requests"].setdefault(id(jobs), [])
    latencies = out.setdefault("latencies", [])

    async def request(name: str, arguments: dict):
        sent.append((name, arguments))
        start = time.perf_counter()
        result = await client.call_tool(name, arguments)
        latencies.append(time.perf_counter() - start)
        return result

    for task, seed in jobs:
        started = await request("start_task", {"task_id": task.instance_id, "seed": seed})
        handle = started.structured_content["episode"]
        required, i, data = task.required_tools, 0, {"turns_left": 1, "episode_end": None}
        while i < len(required) and data["turns_left"] and data["episode_end"] is None:
            result = await request(required[i], {"episode": handle, **ARGUMENTS[required[i]]})
            data = result.structured_content
            out["calls"] += 1
            i += not result.is_error
        if data["episode_end"] is None:
            data = (await request("finish", {"episode": handle})).structured_content
        out["levels"][(task.instance_id, seed)] = data["level"]


async def _replay(client: Client, requests) -> None:
    for name, arguments in requests:
        await client.call_tool(name, arguments)


def concurrently(server: Server, mode: str, body, shares) -> float:
    """Seconds for one connected session per share to run ``body(client, share)``, all at once. The clock
    starts when every session has connected and listed the tools (the SDK client lists them once to
    check results), so connecting is not timed."""
    clock: dict[str, float] = {}
    everyone_ready = anyio.Event()

    async def session(share) -> None:
        async with Client(server, mode=mode) as client:
            await client.list_tools()
            clock["ready"] = clock.get("ready", 0) + 1
            if clock["ready"] == len(shares):
                clock["start"] = time.perf_counter()
                everyone_ready.set()
            await everyone_ready.wait()
            await body(client, share)
            clock["end"] = time.perf_counter()

    async def main() -> None:
        async with anyio.create_task_group() as group:
            for share in shares:
                group.start_soon(session, share)

    anyio.run(main)
    return clock["end"] - clock["start"]


def over_mcp(jobs, sessions: int, mode: str) -> tuple[int, list[str], float, list]:
    """(tool calls, levels, seconds, requests of each session) of the jobs played by ``sessions``
    concurrent MCP sessions."""
    out: dict = {"calls": 0, "levels": {}, "requests": {}}
    shares = [jobs[i::sessions] for i in range(sessions)]
    seconds = concurrently(build_server(search="lexical"), mode, lambda c, share: _play(c, share, out), shares)
    levels = [out["levels"][(t.instance_id, s)] for t, s in jobs]
    return out["calls"], levels, seconds, [out["requests"][id(share)] for share in shares]


def echo_server(tools: list[types.Tool]) -> Server:
    """The SDK's floor: the same tool list, every call answered at once with a constant result."""
    result = types.CallToolResult(content=[types.TextContent(type="text", text="ok")], structured_content={})

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return types.ListToolsResult(tools=tools)

    async def call(ctx, params) -> types.CallToolResult:
        return result

    return Server("echo", on_list_tools=list_tools, on_call_tool=call)


def over_echo(requests, mode: str) -> float:
    """Seconds to send the same requests, session by session and all at once, to ``echo_server``."""
    return concurrently(echo_server(ResiliBenchMCP(search="lexical").tool_list), mode, _replay, requests)


SERVE = [sys.executable, "-m", "resilibench", "serve", "mcp", "--search", "lexical"]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def parent_pid(stat: Path) -> int | None:
    """The parent of the process whose /proc stat file is ``stat`` (None when it is gone)."""
    try:
        return int(stat.read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def stdio_server_pid(http_pid: int) -> int:
    """The child process of this one that is not the HTTP server: the stdio server the client launched."""
    children = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
                if parent_pid(p) == os.getpid() and int(p.parent.name) != http_pid]
    if len(children) != 1:
        raise SystemExit(f"expected one child process (the stdio server), found {len(children)}")
    return children[0]


@contextmanager
def http_server():
    """``resilibench serve mcp --transport http --port 0``: yields (url, pid); stopped on exit."""
    proc = subprocess.Popen([*SERVE, "--transport", "http", "--port", "0"], stderr=subprocess.PIPE, text=True)
    try:
        for line in proc.stderr:
            match = re.search(r"http://\S+/mcp", line)
            if match:
                break
        else:
            raise SystemExit("the HTTP server did not start")
        yield match.group(0), proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def one_session(target, jobs, server_pid: Callable[[], int] | None = None) -> tuple[dict[str, float], dict]:
    """p50/p99 latency (ms), requests/s and CPU ms per request (client; server where it is another
    process, ``server_pid()``) of one client session playing ``jobs`` request by request, and the levels
    it reached; connecting is not timed."""

    async def main() -> tuple[dict[str, float], dict]:
        out: dict = {"calls": 0, "levels": {}, "requests": {}}
        async with Client(target) as client:
            await client.list_tools()
            pid = server_pid() if server_pid else None
            cpu = time.process_time(), cpu_seconds(pid) if pid else 0.0
            start = time.perf_counter()
            await _play(client, jobs, out)
            seconds = time.perf_counter() - start
            client_cpu = time.process_time() - cpu[0]
            server_cpu = cpu_seconds(pid) - cpu[1] if pid else float("nan")
        ms = sorted(1000 * t for t in out["latencies"])
        n = len(ms)
        return {"p50": ms[n // 2], "p99": ms[min(n - 1, int(0.99 * n))], "rps": n / seconds,
                "client_cpu": 1000 * client_cpu / n, "server_cpu": 1000 * server_cpu / n, "requests": n}, out["levels"]

    return anyio.run(main)


def latency(jobs, repeats: int) -> None:
    """Print the single-session latency table: in memory (anchor), stdio, streamable HTTP."""
    runs: dict[str, list[dict[str, float]]] = {"anchor: in memory": [], "stdio": [], "streamable HTTP": []}
    stdio = StdioServerParameters(command=SERVE[0], args=SERVE[1:], env=dict(os.environ))
    levels = []
    with http_server() as (url, pid):
        for _ in range(repeats):
            for name, target, server_pid in (("anchor: in memory", build_server(search="lexical"), None),
                                             ("stdio", stdio, lambda: stdio_server_pid(pid)),
                                             ("streamable HTTP", url, lambda: pid)):
                stats, reached = one_session(target, jobs, server_pid)
                runs[name].append(stats)
                levels.append(reached)
    if any(reached != levels[0] for reached in levels):
        raise SystemExit("the transports reached different levels: a bug, not a benchmark result")
    anchor = statistics.median(r["rps"] for r in runs["anchor: in memory"])
    print(f"one session, {runs['stdio'][0]['requests']} requests per repeat, median of {repeats} repeats")
    print(f"  {'transport':<18} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'/anchor':>8} "
          f"{'client CPU ms/req':>18} {'server CPU ms/req':>18}")
    for name, rows in runs.items():
        med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
        server = "(same process)" if name.startswith("anchor") else f"{med['server_cpu']:.2f}"
        print(f"  {name:<18} {med['p50']:>8.2f} {med['p99']:>8.2f} {med['rps']:>8.0f} {med['rps'] / anchor:>8.3f} "
              f"{med['client_cpu']:>18.2f} {server:>18}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=50)
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per repeat (default 1000)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", choices=("auto", "legacy"), default=["auto", "legacy"])
    parser.add_argument("--part", choices=("throughput", "latency", "all"), default="all")
    parser.add_argument("--latency-episodes", type=int, default=100,
                        help="episodes of the single-session latency runs (default 100)")
    parser.add_argument("--quick", action="store_true", help="200 episodes, 2 repeats")
    args = parser.parse_args()
    if args.quick:
        args.episodes, args.repeats, args.latency_episodes = 200, 2, 40
    tasks = load_tasks(split="test")
    jobs = [(tasks[i % len(tasks)], i // len(tasks)) for i in range(max(args.episodes, args.latency_episodes))]
    print(f"python {platform.python_version()}, {platform.machine()}, {args.sessions} sessions, "
          f"{args.episodes} episodes x {args.repeats} repeats", file=sys.stderr)
    if args.part in ("latency", "all"):
        latency(jobs[: args.latency_episodes], args.repeats)
    if args.part == "latency":
        return 0
    jobs = jobs[: args.episodes]
    warm_up = over_mcp(jobs[: args.sessions], args.sessions, "auto")[3]  # imports, caches
    over_echo(warm_up, "auto")
    direct(jobs[: args.sessions])
    for mode in args.modes:
        anchor_rates, mcp_rates, echo_rates, ratios, echo_ratios = [], [], [], [], []
        for _ in range(args.repeats):
            n_direct, direct_levels, t_direct = direct(jobs)
            n_mcp, mcp_levels, t_mcp, requests = over_mcp(jobs, args.sessions, mode)
            if (n_mcp, mcp_levels) != (n_direct, direct_levels):
                raise SystemExit("MCP and direct play disagree: a bug, not a benchmark result")
            t_echo = over_echo(requests, mode)
            anchor_rates.append(n_direct / t_direct)
            mcp_rates.append(n_mcp / t_mcp)
            echo_rates.append(n_mcp / t_echo)
            ratios.append(mcp_rates[-1] / anchor_rates[-1])
            echo_ratios.append(mcp_rates[-1] / echo_rates[-1])
        n_requests = sum(len(r) for r in requests)
        print(f"mode {mode}: {n_direct} tool calls ({n_requests} MCP requests) per repeat")
        print(f"  anchor: direct call_tool on Episode         {statistics.median(anchor_rates):>10,.0f} calls/s")
        print(f"  MCP server, {args.sessions} in-memory sessions      {statistics.median(mcp_rates):>10,.0f} calls/s")
        print(f"  SDK floor: same requests to an echo server  {statistics.median(echo_rates):>10,.0f} calls/s")
        print(f"  ratio MCP / direct                          {statistics.median(ratios):>10.4f}")
        print(f"  ratio MCP / echo server                     {statistics.median(echo_ratios):>10.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
