"""The MCP fault proxy with real upstream servers (the PyPI time server, our echo server, `serve mcp`) and the
SDK's client: faults drawn as the simulator draws them, per session, seeded; record and replay; the call log
that `failures fit` reads; the CLI over stdio and HTTP with its one-line errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.server.mcpserver import MCPServer

from helpers import make_task
from resilibench.core.config import WorldConfig
from resilibench.core.simulator import Episode, env_episode
from resilibench.envs.proxy.proxy import FAULT_META, FaultProxy, LiveUpstream, ReplayUpstream
from resilibench.envs.real_api.call_log import read_rows
from resilibench.envs.real_api.failure_fit import fit_failures

ECHO = [sys.executable, str(Path(__file__).parents[1] / "echo_mcp_server.py")]
TIME = [sys.executable, "-m", "mcp_server_time", "--local-timezone", "UTC"]
PROCESS_CODES = ("RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT")
# Every process on, and the formula with a per-tool base.
FAULTY = {"failure": {"base_success": 0.85},
          "processes": {"rate_limit_probability": 0.15, "rate_limit_wait": 2, "outage_start": 0.1, "outage_end": 0.5,
                        "latency_seconds": [0.001, 0.002, 9.0], "latency_weights": [0.6, 0.3, 0.1],
                        "call_timeout_seconds": 5.0}}


def world(**sections: Any) -> WorldConfig:
    return WorldConfig().replace(**sections)


def echo_server(name: str = "echo") -> MCPServer:
    """An in-memory upstream: ``name`` answers its text, ``fail`` raises (an ``isError`` result)."""
    server = MCPServer("echo-memory")

    @server.tool(name=name)
    def echo(text: str) -> str:
        return text

    @server.tool()
    def fail(text: str) -> str:
        raise ValueError(f"cannot do {text}")

    return server


def code(result) -> str | None:
    return fault(result)["code"] if result.is_error else None


def fault(result) -> dict:
    """A tool error's details, kept in ``_meta`` (the structured content is the upstream tool's schema's)."""
    return result.meta[FAULT_META]


async def play(proxy: FaultProxy, calls: list[tuple[str, dict]]) -> list:
    async with proxy, Client(proxy.server) as client:
        return [await client.call_tool(tool, arguments) for tool, arguments in calls]


def test_a_session_draws_what_the_simulator_draws_for_a_tool_without_dependencies():
    """One source of truth: the proxy's session k meets, call by call, the outcomes an Episode of seed
    env_episode(seed, k, 1)[1] meets for a registry tool without dependencies (until its first success, after
    which the Episode replays it), under every process."""
    config = world(**FAULTY, rules={"turn_limit": 200, "max_consecutive_failures": 1000,
                                    "max_same_tool_failures": 1000})
    tool = "file_operations_reader"
    for seed in range(6):
        proxy = FaultProxy(LiveUpstream(echo_server(tool)), config, seed, slow_seconds=0, time_scale=0)
        results = anyio.run(play, proxy, [(tool, {"text": "x"})] * 12)
        episode = Episode.start(make_task([tool], max_retries=50), env_episode(seed, 0, 1)[1], config)
        for result in results:
            record = episode.call(tool)
            assert result.is_error == (not record.success)
            if record.error_code in PROCESS_CODES or record.success:
                assert code(result) == record.error_code
            if record.error_code == "RATE_LIMIT_ERROR":
                assert fault(result)["retry_after"] == record.retry_after
            if record.success:
                assert result.structured_content == {"result": "x"}  # the upstream's own answer
                break


def test_every_fault_kind_reaches_the_client_as_a_tool_error_saying_what_happened():
    config = world(**FAULTY)
    calls = [("get_current_time", {"timezone": "UTC"})] * 60
    results = anyio.run(play, FaultProxy(LiveUpstream(TIME), config, seed=4, slow_seconds=0.01, time_scale=0),
                        calls)
    codes = {code(r) for r in results}
    assert {None, "RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT"} <= codes
    assert codes - {None, *PROCESS_CODES}  # the success formula's failures, with the live tools' codes
    for result in results:
        text = result.content[0].text
        if result.is_error:
            assert text.startswith(f"Error: {code(result)}: get_current_time: ")
            assert result.structured_content is None  # no content the tool's output schema would refuse
        else:
            assert result.structured_content["timezone"] == "UTC"
    rate = next(r for r in results if code(r) == "RATE_LIMIT_ERROR")
    assert "retry after 2 more call(s)" in rate.content[0].text
    assert "withheld" in next(r for r in results if code(r) == "TIMEOUT").content[0].text


def test_malformed_answers_and_per_tool_reliability():
    config = world(failure={"base_success": 1.0}, processes={"tool_base_success": {"echo": 0.0}})
    proxy = FaultProxy(LiveUpstream(echo_server()), config, seed=0, slow_seconds=0)
    results = anyio.run(play, proxy, [("echo", {"text": "a fairly long answer"})] * 40)
    assert all(r.is_error for r in results)
    malformed = [r for r in results if code(r) == "SCHEMA_MISMATCH"]
    assert malformed and "'a fairly" in malformed[0].content[0].text  # the answer cut short
    with pytest.raises(ValueError, match="tool_base_success names unknown tool"):
        anyio.run(play, FaultProxy(LiveUpstream(echo_server()), world(processes={"tool_base_success": {"x": 1.0}})),
                  [])


def test_same_seed_same_faults_and_another_seed_others():
    calls = [("echo", {"text": str(i)}) for i in range(30)]

    def outcomes(seed: int) -> list:
        results = anyio.run(play, FaultProxy(LiveUpstream(echo_server()), world(**FAULTY), seed, slow_seconds=0,
                                             time_scale=0), calls)
        return [(r.is_error, r.content[0].text) for r in results]

    first = outcomes(11)
    assert outcomes(11) == first
    assert outcomes(12) != first
    for (_, arguments), (error, text) in zip(calls, first, strict=True):
        assert error or text == arguments["text"]  # a success is the upstream's own answer


def test_record_then_replay_gives_identical_answers_without_the_upstream(tmp_path):
    record, calls = tmp_path / "time.jsonl", [("get_current_time", {"timezone": z}) for z in ("UTC", "Asia/Tokyo")] * 4
    calls += [("convert_time", {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Europe/Paris"})]
    config = world(failure={"base_success": 0.7})
    recorded = anyio.run(play, FaultProxy(LiveUpstream(TIME), config, 5, record=record, slow_seconds=0), calls)
    time.sleep(1.1)  # the time server's answers would differ now
    replayed = anyio.run(play, FaultProxy(ReplayUpstream(record), config, 5, slow_seconds=0), calls)
    assert [r.model_dump() for r in replayed] == [r.model_dump() for r in recorded]
    assert any(not r.is_error for r in recorded) and any(r.is_error for r in recorded)
    unrecorded = anyio.run(play, FaultProxy(ReplayUpstream(record), faults=False),
                           [("get_current_time", {"timezone": "America/Lima"})])
    assert code(unrecorded[0]) == "NOT_RECORDED"


@pytest.mark.slow
def test_call_log_fits_back_the_world_that_made_it(tmp_path):
    """A log of injected faults, fitted by `failures fit`'s code with the upstream's tools, recovers the
    world's base success and rate-limit probability within their intervals."""
    log = tmp_path / "calls.jsonl"
    config = world(failure={"base_success": 0.7, "failure_history_factor": 1.0},
                   processes={"rate_limit_probability": 0.2})

    async def many() -> None:
        async with FaultProxy(LiveUpstream(echo_server()), config, 3, call_log=log) as proxy:
            for session in range(25):
                for _ in range(15):
                    await proxy.call("echo", {"text": "x"}, f"s{session}")

    anyio.run(many)
    rows = list(read_rows(log))
    assert len(rows) == 375 and {r.source for r in rows} == {"mcp"} and len({r.episode for r in rows}) == 25
    fit = fit_failures(rows, processes=["rate-limits"])
    for name, value in (("failure.base_success", 0.7), ("processes.rate_limit_probability", 0.2)):
        estimate = fit.estimate(name)
        assert estimate.identified and estimate.low <= value <= estimate.high, estimate


def test_no_faults_forwards_everything_and_logs_the_upstream_itself(tmp_path):
    log = tmp_path / "calls.jsonl"
    calls = [("echo", {"text": "a"}), ("fail", {"text": "b"})] * 3
    results = anyio.run(play, FaultProxy(LiveUpstream(echo_server()), faults=False, call_log=log), calls)
    assert [r.is_error for r in results] == [False, True] * 3
    assert results[1].content[0].text == "Error executing tool fail"  # the upstream's own error, untouched
    rows = list(read_rows(log))
    assert [r.error_code for r in rows] == [None, "OPERATION_FAILED"] * 3
    assert all(r.world_duration is None and r.latency_s > 0 for r in rows)
    assert [r.n_history for r in rows] == [0, 0, 1, 1, 2, 2]


# --- the command line -----------------------------------------------------------------------------------


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "resilibench", "proxy", "mcp", *args]


@pytest.mark.slow
def test_cli_stdio_serves_sdk_clients_and_stops_its_upstream_with_it(tmp_path):
    config = tmp_path / "world.yaml"
    config.write_text("processes: {rate_limit_probability: 0.3, rate_limit_wait: 1}\n")

    async def main() -> tuple[list, int]:
        params = StdioServerParameters(command=ECHO[0], args=[*cli("--config", str(config), "--", *ECHO)[1:]])
        async with Client(params) as client:
            assert [t.name for t in (await client.list_tools()).tools] == ["echo", "count", "pid", "die"]
            results = [await client.call_tool("echo", {"text": str(i)}) for i in range(10)]
            pid = await client.call_tool("pid", {})
            while pid.is_error:
                pid = await client.call_tool("pid", {})
            return results, int(pid.content[0].text)

    results, upstream = anyio.run(main)
    assert {code(r) for r in results} >= {None, "RATE_LIMIT_ERROR"}
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and alive(upstream):
        time.sleep(0.1)
    assert not alive(upstream)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()


def test_cli_bad_upstreams_and_arguments_are_one_line_errors(capsys):
    from resilibench.cli import main

    assert main(["proxy", "mcp", "--", "no-such-mcp-server-xyz"]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "resilibench: error: upstream: cannot open an MCP session with no-such-mcp-server-xyz: FileNotFoundError: "
        "[Errno 2] No such file or directory: 'no-such-mcp-server-xyz'"]
    for args, message in ((["--replay", "r.jsonl", "--", "x"], "give the upstream once"),
                          ([], "give the upstream once"),
                          (["--port", "0", "--", "x"], "--port: for --transport http only"),
                          (["--replay", "/no/such.jsonl"], "--replay: recording /no/such.jsonl does not exist")):
        assert main(["proxy", "mcp", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, err


@pytest.mark.slow
def test_cli_dying_upstream_answers_in_flight_calls_then_stops():
    async def main() -> list:
        params = StdioServerParameters(command=ECHO[0], args=cli("--no-faults", "--", *ECHO)[1:])
        async with Client(params) as client:
            first = await client.call_tool("echo", {"text": "hi"})
            died = await client.call_tool("die", {})
            return [first, died]

    first, died = anyio.run(main)
    assert first.content[0].text == "hi"
    assert died.is_error and died.content[0].text.startswith("Error: NETWORK_ERROR: die: the upstream MCP server is gone")


@pytest.mark.slow
def test_cli_http_serves_21_concurrent_sessions_without_cross_talk(tmp_path):
    """21 SDK clients at once over streamable HTTP: each gets its own answers untouched and, call by call, the
    faults of one session of the seed played alone (a bijection of clients and sessions)."""
    config = tmp_path / "world.yaml"
    config.write_text("failure: {base_success: 0.8}\nprocesses: {rate_limit_probability: 0.2, rate_limit_wait: 1, "
                      "outage_start: 0.1, outage_end: 0.5}\n")
    proc = subprocess.Popen(cli("--config", str(config), "--seed", "9", "--transport", "http", "--port", "0", "--",
                                *ECHO), stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stderr.readline() if proc.stderr else ""
        url = line.rsplit(" at ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), line
        n, calls = 21, 5
        seen: dict[int, list] = {}

        async def client(i: int) -> None:
            async with Client(url) as c:
                results = [await c.call_tool("echo", {"text": f"{i}-{j}"}) for j in range(calls)]
            for j, r in enumerate(results):
                assert r.is_error or r.content[0].text == f"{i}-{j}"  # its own answer, untouched
            seen[i] = [code(r) or "ok" for r in results]

        async def everyone() -> None:
            async with anyio.create_task_group() as group:
                for i in range(n):
                    group.start_soon(client, i)

        anyio.run(everyone)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) in (0, 130)
    finally:
        if proc.poll() is None:
            proc.kill()

    async def alone() -> list[list]:
        async with FaultProxy(LiveUpstream(echo_server()), world(failure={"base_success": 0.8}, processes={
                "rate_limit_probability": 0.2, "rate_limit_wait": 1, "outage_start": 0.1, "outage_end": 0.5}),
                9) as proxy:
            return [[code(await proxy.call("echo", {"text": "x"}, f"s{k}")) or "ok" for _ in range(calls)]
                    for k in range(n)]

    expected = anyio.run(alone)
    assert sorted(map(tuple, seen.values())) == sorted(map(tuple, expected))
    assert len({tuple(s) for s in expected}) > n // 2  # the sessions' faults differ


@pytest.mark.slow
def test_cli_in_front_of_serve_mcp(tmp_path):
    """Our own MCP server as the upstream: its 35 tools listed unchanged, its episodes played through."""
    log = tmp_path / "calls.jsonl"
    serve = [sys.executable, "-m", "resilibench", "serve", "mcp", "--search", "lexical"]

    async def main() -> tuple[Any, Any, Any]:
        params = StdioServerParameters(command=ECHO[0], args=cli("--no-faults", "--call-log", str(log), "--",
                                                                 *serve)[1:])
        async with Client(params) as client:
            tools = (await client.list_tools()).tools
            started = await client.call_tool("start_task", {"seed": 0})
            episode = started.structured_content["episode"]
            call = await client.call_tool("network_fetcher", {"episode": episode, "source": "https://x.org"})
            return tools, started, call

    tools, started, call = anyio.run(main)
    assert len(tools) == 35 and not started.is_error
    assert call.structured_content["episode"] == started.structured_content["episode"]
    assert [r.tool for r in read_rows(log)] == ["start_task", "network_fetcher"]
