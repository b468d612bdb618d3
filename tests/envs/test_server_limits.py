"""The servers' limits over real processes and raw sockets: `serve tools` and `serve mcp --transport http`
run as subprocesses with low limits, and clients that send half a request, too much of one, or too many
connections meet a status and a closed connection, not a server that stops answering or floods its log.
The episode table's bounds (per-client quota, idle expiry, one seed rule) and real-API mode's concurrency
are checked over the same wire.
"""

from __future__ import annotations

import os
import re
import resource
import select
import socket
import subprocess
import sys
import threading
import time

import anyio
import httpx2 as httpx
import pytest
from mcp import Client

from helpers import valid_arguments
from resilibench.core.simulator import Episode
from resilibench.core.world import load_tasks
from resilibench.envs.mcp.server import API_ERROR, BAD_ARGUMENTS, build_server
from resilibench.envs.real_api import http_faults as hf
from resilibench.envs.real_api.live_apis import RealApi
from resilibench.envs.real_api.service import ToolService, running_service
from resilibench.envs.real_api.serving import (
    MAX_SEED,
    EpisodeTable,
    ServerLimits,
    UnknownEpisodeError,
    start_episode,
)

TASK = load_tasks(split="test")[0]
HEADER_TIMEOUT = BODY_TIMEOUT = 1.0
MAX_CONNECTIONS, MAX_BODY = 4, 1000
LIMITS = ["--max-connections", str(MAX_CONNECTIONS), "--header-timeout", str(HEADER_TIMEOUT),
          "--body-timeout", str(BODY_TIMEOUT), "--max-body-bytes", str(MAX_BODY)]
COMMANDS = {
    "tools": ["tools", "--max-episodes", "5", "--max-episodes-per-client", "3", "--episode-idle-timeout", "2"],
    "mcp": ["mcp", "--transport", "http", "--search", "lexical"],
}


class Server:
    """A `resilibench serve ...` subprocess on a free port, with its stderr collected."""

    def __init__(self, args: list[str], rlimit_files: int | None = None):
        def limit_files() -> None:
            if rlimit_files is not None:
                resource.setrlimit(resource.RLIMIT_NOFILE, (rlimit_files, rlimit_files))

        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "resilibench", "serve", *args, "--port", "0"],
                                     stderr=subprocess.PIPE, env=env, preexec_fn=limit_files)
        self.log = b""
        self.port: int | None = None
        self.path = PATHS[args[0]]

    def wait_ready(self, timeout: float = 90) -> int:
        deadline = time.monotonic() + timeout
        while self.port is None:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.read_log()
            match = re.search(rb"http://127\.0\.0\.1:(\d+)", self.read_log(0.5))
            self.port = int(match.group(1)) if match else None
        return self.port

    def read_log(self, wait: float = 0.0) -> bytes:
        """All of stderr so far (reading what is there, waiting at most ``wait`` seconds for more)."""
        assert self.proc.stderr is not None
        while select.select([self.proc.stderr], [], [], wait)[0]:
            chunk = os.read(self.proc.stderr.fileno(), 1 << 16)
            if not chunk:
                break
            self.log += chunk
            wait = 0.05
        return self.log

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=20)


@pytest.fixture(scope="module")
def servers():
    started = {name: Server([*args, *LIMITS]) for name, args in COMMANDS.items()}
    try:
        for server in started.values():
            server.wait_ready()
        yield started
    finally:
        for server in started.values():
            server.stop()


@pytest.fixture(params=list(COMMANDS))
def server(request, servers) -> Server:
    return servers[request.param]


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10, source_address=(source, 0))
    return sock


def answer(sock: socket.socket) -> tuple[bytes, float]:
    """What the server sends until it closes the connection, and how long that took."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return data, time.monotonic() - start


def status(data: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.1 (\d{3})", data)
    return int(match.group(1)) if match else None


PATHS = {"tools": "/tools/data_processing_parser", "mcp": "/mcp"}


def head(server: Server) -> bytes:
    """The head of a POST its server reads the body of (without the blank line that ends it)."""
    return (f"POST {server.path} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\nContent-Type: application/json\r\n"
            "Accept: application/json, text/event-stream\r\nMCP-Protocol-Version: 2025-06-18\r\n").encode()


def test_half_a_head_is_answered_408_after_the_header_timeout(server):
    with connect(server.port) as sock:
        sock.sendall(head(server))  # no blank line: the head never ends
        data, waited = answer(sock)
    assert status(data) == 408 and HEADER_TIMEOUT * 0.8 < waited < HEADER_TIMEOUT + 3


def test_an_idle_connection_is_closed_after_the_header_timeout(server):
    with connect(server.port) as sock:
        data, waited = answer(sock)
    assert data == b"" and HEADER_TIMEOUT * 0.8 < waited < HEADER_TIMEOUT + 3


def test_half_a_body_is_answered_408_after_the_body_timeout(server):
    with connect(server.port) as sock:
        sock.sendall(head(server) + b"Content-Length: 100\r\n\r\n" + b"{" * 10)
        data, waited = answer(sock)
    assert status(data) == 408 and BODY_TIMEOUT * 0.8 < waited < BODY_TIMEOUT + 3


def test_an_oversized_head_is_answered_431(server):
    with connect(server.port) as sock:
        try:
            sock.sendall(head(server))
            for i in range(200):  # 200 KB of headers, far past the 64 KiB the servers read
                if select.select([sock], [], [], 0.002)[0]:
                    break  # answered: sending on would make the server's close a reset
                sock.sendall(b"X-Filler-%d: %s\r\n" % (i, b"a" * 1000))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server closed the connection while we were still sending
        data, _ = answer(sock)
    assert status(data) == 431


def test_a_body_past_the_limit_is_answered_413_before_it_is_read(server):
    with connect(server.port) as sock:  # declared too large: refused before a byte of it is sent
        sock.sendall(head(server) + b"Content-Length: %d\r\n\r\n" % (MAX_BODY + 1))
        data, waited = answer(sock)
    assert status(data) == 413 and waited < 2
    with connect(server.port) as sock:  # chunked: refused once the limit is passed
        sock.sendall(head(server) + b"Transfer-Encoding: chunked\r\n\r\n")
        try:
            for _ in range(5):
                if select.select([sock], [], [], 0.05)[0]:
                    break
                sock.sendall(b"190\r\n" + b" " * 400 + b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        data, _ = answer(sock)
    assert status(data) == 413
    response = httpx.post(f"http://127.0.0.1:{server.port}{server.path}", content=b" " * MAX_BODY)
    assert response.status_code != 413  # at the limit: read


def test_connections_past_the_cap_get_503_and_the_server_serves_again_after(server):
    held = [connect(server.port) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.2)  # the server has accepted them
        with connect(server.port) as sock:
            data, waited = answer(sock)
        assert status(data) == 503 and waited < 2
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    response = httpx.get(f"http://127.0.0.1:{server.port}/health")
    assert response.status_code in (200, 404)  # /health is the tool service's; MCP answers 404 there


def test_clients_leaving_mid_body_write_no_traceback(server):
    before = len(server.read_log())
    for _ in range(20):
        with connect(server.port) as sock:
            sock.sendall(head(server) + b"Content-Length: 500\r\n\r\n" + b"{" * 100)
            time.sleep(0.02)
    time.sleep(0.5)
    new = server.read_log(0.2)[before:]
    assert b"Traceback" not in new and len(new) < 2000, new[:2000]


def pending(sock: socket.socket) -> bytes | None:
    """What the server has sent on ``sock`` so far; None when nothing (select() cannot take fds past 1024)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096)
    except BlockingIOError:
        return None


@pytest.mark.slow
def test_the_default_cap_holds_at_a_1024_open_file_limit():
    """1,100 half-sent requests against the default limits at a 1,024 open-file limit (the reproduction):
    those past the cap are answered 503 at once, the server keeps answering, and serves as before once
    they leave, writing a line or two of log."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1400:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 1400), hard))
    server = Server(["tools"], rlimit_files=1024)
    held: list[socket.socket] = []
    try:
        port = server.wait_ready()
        for _ in range(1100):
            sock = connect(port)
            sock.sendall(head(server))
            held.append(sock)
        time.sleep(0.5)
        answered = [status(data) for data in map(pending, held) if data is not None]
        assert len(answered) >= 1100 - 512 and set(answered) == {503}
        began = time.monotonic()
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=10)
        assert response.status_code in (200, 503) and time.monotonic() - began < 2
        for sock in held:
            sock.close()
        time.sleep(0.5)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"
        log = server.read_log(0.5)
        assert b"Traceback" not in log and len(log) < 2000, log[:3000]
    finally:
        for sock in held:
            sock.close()
        server.stop()


# --- the episode table's bounds -------------------------------------------------------------------------


def open_episode(port: int, seed: int = 0, source: str = "127.0.0.1") -> httpx.Response:
    transport = httpx.HTTPTransport(local_address=source)
    with httpx.Client(transport=transport) as client:
        return client.post(f"http://127.0.0.1:{port}/episodes", json={"task_id": TASK.instance_id, "seed": seed})


def episode_exists(port: int, handle: str) -> bool:
    return httpx.get(f"http://127.0.0.1:{port}/episodes/{handle}").status_code == 200


def test_one_client_cannot_evict_another_clients_episodes(servers):
    port = servers["tools"].port
    other = open_episode(port, source="127.0.0.2").json()["episode"]  # another client: another address
    mine = [open_episode(port, seed=i).json()["episode"] for i in range(10)]
    assert episode_exists(port, other)  # the table holds 5, each client 3: this client made room in its own
    assert [episode_exists(port, h) for h in mine] == [False] * 7 + [True] * 3


def test_service_episodes_expire_when_idle(servers):
    port = servers["tools"].port
    handle = open_episode(port, source="127.0.0.3").json()["episode"]
    time.sleep(1.0)
    assert episode_exists(port, handle)  # a use restarts its clock
    time.sleep(2.3)
    assert not episode_exists(port, handle)


def test_both_servers_take_seeds_below_2_64_and_refuse_larger(servers):
    port = servers["tools"].port
    assert open_episode(port, seed=MAX_SEED, source="127.0.0.4").status_code == 201
    refused = open_episode(port, seed=MAX_SEED + 1, source="127.0.0.4")
    assert refused.status_code == 422 and refused.json()["error"]["field"] == "seed"

    async def start(seed: int):
        async with Client(build_server(search="lexical")) as client:
            return await client.call_tool("start_task", {"task_id": TASK.instance_id, "seed": seed})

    assert not anyio.run(start, MAX_SEED).is_error
    result = anyio.run(start, MAX_SEED + 1)
    assert result.is_error and BAD_ARGUMENTS in result.content[0].text


def test_the_cli_help_shows_the_librarys_defaults():
    from resilibench.cli.serve import _DEFAULTS

    limits, table = ServerLimits(), EpisodeTable()
    assert {"max_connections": limits.max_connections, "header_timeout": limits.header_timeout,
                         "body_timeout": limits.body_timeout, "max_body_bytes": limits.max_body_bytes,
                         "max_episodes": table.max_episodes, "max_episodes_per_client": table.max_per_client,
                         "episode_idle_timeout": table.idle_timeout} == _DEFAULTS


def test_table_quota_and_idle_expiry_rules():
    table = EpisodeTable(max_episodes=4, max_per_client=2, idle_timeout=0.3)
    episode = start_episode(TASK, 0)
    a1, a2 = table.add(episode, client="a"), table.add(episode, client="a")
    b1 = table.add(episode, client="b")
    a3 = table.add(episode, client="a")  # a is at its quota: its own least recently used goes
    assert a1 not in table and {a2, a3, b1} <= set(h for h in (a2, a3, b1) if h in table)
    time.sleep(0.2)
    with table.use(b1):
        pass
    time.sleep(0.2)
    table.add(episode, client="c")  # a2 and a3 were idle past the timeout; b1 was used
    assert a2 not in table and a3 not in table and b1 in table
    with pytest.raises(UnknownEpisodeError), table.use(a2):
        pass


# --- real-API mode over MCP: one slow call holds up nobody else ---------------------------------------------


def test_a_slow_real_call_holds_up_no_other_episode():
    slow = 1.5
    tool = TASK.required_tools[0]
    seed = next(s for s in range(5000) if start_episode(TASK, s).call(tool).error_code == hf.TIMEOUT)
    fast_seed = next(s for s in range(5000) if start_episode(TASK, s).call(tool).success)
    with running_service(ToolService(slow_seconds=slow)) as url:
        server = build_server(search="lexical", api=RealApi(url, {"timeout": slow + 3}))

        async def session():
            timings: dict[str, float] = {}
            async with Client(server) as client:
                async def start(s: int) -> str:
                    result = await client.call_tool("start_task", {"task_id": TASK.instance_id, "seed": s})
                    return result.structured_content["episode"]

                slow_handle, fast_handle = await start(seed), await start(fast_seed)

                async def slow_call():
                    began = time.monotonic()
                    result = await client.call_tool(tool, {"episode": slow_handle, **valid_arguments(tool)})
                    timings["slow"] = time.monotonic() - began
                    assert result.structured_content["error"]["code"] == hf.TIMEOUT

                async def others():
                    await anyio.sleep(0.3)  # the slow call is under way
                    began = time.monotonic()
                    await client.call_tool(tool, {"episode": fast_handle, **valid_arguments(tool)})
                    await start(fast_seed + 1)
                    timings["others"] = time.monotonic() - began

                async with anyio.create_task_group() as group:
                    group.start_soon(slow_call)
                    group.start_soon(others)
            return timings

        timings = anyio.run(session)
    assert timings["slow"] >= slow and timings["others"] < 0.8, timings


def test_start_task_against_a_stopped_service_is_an_api_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, not listening: connections are refused
        server = build_server(search="lexical", api=RealApi(f"http://127.0.0.1:{port}", {"timeout": 2}))

        async def start():
            async with Client(server) as client:
                return await client.call_tool("start_task", {"task_id": TASK.instance_id})

        result = anyio.run(start)
    assert result.is_error and result.structured_content["error"]["code"] == API_ERROR


def test_a_stuck_loop_is_not_what_serves_start_task():
    """start_task in real-API mode runs off the event loop: a service that takes its time to open an
    episode does not stop the server from answering a free lookup meanwhile."""
    release = threading.Event()
    gate = socket.socket()
    gate.bind(("127.0.0.1", 0))
    gate.listen()
    port = gate.getsockname()[1]

    def hold() -> None:  # accept the connection and answer nothing until released
        conn, _ = gate.accept()
        release.wait(10)
        conn.close()

    threading.Thread(target=hold, daemon=True).start()
    server = build_server(search="lexical", api=RealApi(f"http://127.0.0.1:{port}", {"timeout": 5}))

    async def session():
        async with Client(server) as client:
            async with anyio.create_task_group() as group:
                group.start_soon(client.call_tool, "start_task", {"task_id": TASK.instance_id})
                await anyio.sleep(0.3)
                began = time.monotonic()
                await client.call_tool("tool_info", {"name": "data_processing_parser"})
                waited = time.monotonic() - began
                release.set()
            return waited

    try:
        waited = anyio.run(session)
    finally:
        release.set()
        gate.close()
    assert waited < 1.0


@pytest.mark.parametrize("parser", ["httptools", "h11"])
def test_both_parsers_drop_a_connection_and_keep_the_limits(parser):
    """The protocol's drop (NETWORK_ERROR) and limits hold over either parser."""
    tool = "network_fetcher"
    seed = next(s for s in range(20_000) if Episode.start(TASK, s).call(tool).error_code == hf.NETWORK_ERROR)
    limits = ServerLimits(header_timeout=0.5)
    with running_service(ToolService(), limits=limits, parser=parser) as url:
        port = int(url.rsplit(":", 1)[1])
        handle = httpx.post(f"{url}/episodes", json={"task_id": TASK.instance_id, "seed": seed}).json()["episode"]
        with connect(port) as sock:
            sock.sendall(f"POST /tools/{tool} HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Episode: {handle}\r\n"
                         f"Content-Length: 0\r\n\r\n".encode())
            assert answer(sock)[0] == b""  # closed without a byte
        with connect(port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            assert status(answer(sock)[0]) == 408
