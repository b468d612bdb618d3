"""Requests per second of ``resilibench serve tools`` against a minimal Starlette echo endpoint on uvicorn.

* **Anchor: echo.** A Starlette app with one route, ``POST /echo``, that parses the JSON body and answers
  it, under ``uvicorn.run`` with its defaults (``--anchor-http``: its parser; default "auto", httptools
  when installed), in its own process.
* **Service.** ``resilibench serve tools --port 0 --slow-seconds 0`` in its own process (``--server-python``:
  the interpreter whose resilibench is measured, e.g. another checkout's, for a before/after). Each request
  is one tool call on the service's default episode (``POST /tools/{name}`` with ``{}``; the service
  restarts the episode as it ends): the world's draws decide the answer, so some are 4xx/5xx and a
  NETWORK_ERROR drops the connection (the client reconnects, as a real one must).

One client (one keep-alive ``httpx`` connection in this process) sends ``--requests`` requests to each
server in turn, ``--repeats`` short rounds interleaved (anchor, service, anchor, ...), so that a change in
the machine's load meets both alike. Printed per server: the median round's requests/s (wall clock, one
client) and the server's CPU per request (its process's user + system time over the round, from /proc);
then the median over rounds of the paired ratios (a service round over the anchor round just before it):
service over anchor in requests/s, anchor over service in CPU per request. 1.0x means as fast as the
echo. Run: ``python benchmarks/bench_service_http.py``.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

import httpx2 as httpx

from resilibench.core.registry import default_registry

ECHO = """
import json, sys, uvicorn
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

async def echo(request):
    return JSONResponse(json.loads(await request.body()))

app = Starlette(routes=[Route("/echo", echo, methods=["POST"])])
config = uvicorn.Config(app, host="127.0.0.1", port=0, http=sys.argv[1], log_level="warning")
server = uvicorn.Server(config)
config.load()
print("parser:", config.http_protocol_class.__name__, flush=True)
import socket
sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)  # as uvicorn binds: TCP_NODELAY
sock.bind(("127.0.0.1", 0))
print(f"echo at http://127.0.0.1:{sock.getsockname()[1]}", flush=True)
server.run(sockets=[sock])
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start(command: list[str], pattern: str) -> tuple[subprocess.Popen, str, str]:
    """A server process and the URL (and first lines) it prints."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"), cwd=tempfile.gettempdir())  # not ./resilibench
    assert proc.stdout is not None
    seen = ""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{command[:4]} did not start: {seen}")
        seen += line
        match = re.search(pattern, line)
        if match:
            return proc, match.group(1), seen


def round_(client: httpx.Client, urls: list[str], pid: int) -> tuple[float, float, int]:
    """(wall seconds, server CPU seconds, dropped connections) of one round of requests."""
    dropped = 0
    cpu, began = cpu_seconds(pid), time.perf_counter()
    for url in urls:
        try:
            client.post(url, content=b"{}", headers={"content-type": "application/json"})
        except httpx.TransportError:
            dropped += 1
    return time.perf_counter() - began, cpu_seconds(pid) - cpu, dropped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="requests per round (default 200)")
    parser.add_argument("--repeats", type=int, default=40, help="rounds per server, interleaved (default 40)")
    parser.add_argument("--anchor-http", default="auto", choices=("auto", "h11", "httptools"))
    parser.add_argument("--server-python", default=sys.executable,
                        help="interpreter whose `resilibench serve tools` is measured (default: this one)")
    args = parser.parse_args()
    names = default_registry().names
    echo, echo_url, echo_seen = start([sys.executable, "-c", ECHO, args.anchor_http], r"echo at (\S+)")
    work = {"anchor (echo)": (echo, [f"{echo_url}/echo"] * args.requests)}
    rounds: dict[str, list[tuple[float, float, int]]] = {"anchor (echo)": [], "service": []}
    try:
        service, service_url, _ = start([args.server_python, "-m", "resilibench", "serve", "tools", "--port", "0",
                                         "--slow-seconds", "0"], r"tool service at (\S+)")
        work["service"] = (service, [f"{service_url}/tools/{names[i % len(names)]}" for i in range(args.requests)])
        with httpx.Client(timeout=30) as client:
            for proc, urls in work.values():  # warm-up: imports, first episode, connection
                round_(client, urls[:200], proc.pid)
            for _ in range(args.repeats):
                for name, (proc, urls) in work.items():
                    rounds[name].append(round_(client, urls, proc.pid))
    finally:
        for proc, _ in work.values():
            proc.terminate()
            proc.wait(timeout=20)
    rps = {n: statistics.median(args.requests / wall for wall, _, _ in r) for n, r in rounds.items()}
    cpu = {n: statistics.median(c / args.requests for _, c, _ in r) for n, r in rounds.items()}
    load = os.getloadavg()[0]
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load {load:.1f}; python {platform.python_version()}")
    print(f"anchor {echo_seen.splitlines()[0]}; {args.repeats} interleaved rounds of {args.requests} requests, "
          f"one client; medians")
    for name in work:
        dropped = sum(d for _, _, d in rounds[name])
        print(f"{name:14s} {rps[name]:8.0f} requests/s   server CPU {cpu[name] * 1e6:6.0f} us/request"
              + (f"   ({dropped} dropped connections)" if dropped else ""))
    pairs = list(zip(rounds["anchor (echo)"], rounds["service"], strict=True))
    rps_ratio = statistics.median(anchor[0] / service[0] for anchor, service in pairs)
    cpu_ratio = statistics.median(anchor[1] / max(service[1], 1e-9) for anchor, service in pairs)
    print(f"service / anchor (median of paired rounds): {rps_ratio:.2f}x requests/s, {cpu_ratio:.2f}x CPU per "
          f"request (anchor's over the service's)")


if __name__ == "__main__":
    main()
