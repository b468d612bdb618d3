"""The MCP fault proxy driven by a client on the TypeScript MCP SDK (tests/envs/js/mcp_client.mjs, run by node)
over stdio and streamable HTTP, in front of our echo server and of the PyPI git server (an upstream written
with nothing of ours): what the client gets through the proxy is what it gets from the upstream directly,
but for the injected faults, which are tool errors that say what happened and are the faults an SDK client
in Python meets for the same seed. Needs node and `cd tests/envs/js && npm ci` (CI runs it)."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from echo_mcp_server import server as echo_server
from mcp import Client

from resilibench.core.config import load_config
from resilibench.envs.proxy.proxy import FAULT_META, FaultProxy, LiveUpstream

JS = Path(__file__).parent / "js"
ECHO = [sys.executable, str(Path(__file__).parents[1] / "echo_mcp_server.py")]
PROXY = [sys.executable, "-m", "resilibench", "proxy", "mcp"]
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("node") is None or not (JS / "node_modules" / "@modelcontextprotocol" / "sdk").is_dir(),
                       reason="needs node and the TypeScript MCP SDK: cd tests/envs/js && npm ci"),
]
# Every process on: rate limits, outages, timeouts (a drawn 9 s past the 5 s deadline), the formula.
WORLD = ("failure: {base_success: 0.9}\nprocesses: {rate_limit_probability: 0.15, rate_limit_wait: 1, outage_start: 0.1, "
         "outage_end: 0.5, latency_seconds: [0.001, 9.0], latency_weights: [0.85, 0.15], call_timeout_seconds: 5.0}\n")
FAST = ["--slow-seconds", "0.05", "--time-scale", "0"]  # a TIMEOUT withheld 0.05 s, no latency slept
OFFERS = ("server", "capabilities", "tools", "resources", "resourceTemplates", "reads", "prompts", "gets")


def ts_client(plan: dict[str, Any]) -> subprocess.Popen:
    """The TypeScript SDK client playing ``plan`` (mcp_client.mjs), started."""
    return subprocess.Popen(["node", str(JS / "mcp_client.mjs"), json.dumps(plan)], stdout=subprocess.PIPE, text=True)


def answers(client: subprocess.Popen) -> dict[str, Any]:
    out, _ = client.communicate(timeout=180)
    assert client.returncode == 0, out
    return json.loads(out)


def codes(results: list[dict[str, Any]]) -> list[str]:
    """Per call: the injected fault's code, "upstream error" for the upstream's own, or "ok"."""
    return [label(r.get("isError"), r.get("_meta")) for r in results]


def label(error: bool | None, meta: dict[str, Any] | None) -> str:
    return (meta or {}).get(FAULT_META, {}).get("code", "upstream error") if error else "ok"


def assert_faults_say_what_happened(results: list[dict[str, Any]], tool: str) -> None:
    for result in results:
        if result.get("isError"):
            fault = result["_meta"][FAULT_META]
            assert result["content"] == [{"type": "text", "text": f"Error: {fault['code']}: {fault['description']}"}]
            assert fault["description"].startswith(f"{tool}: ") and "structuredContent" not in result
    rate = next(r for r in results if codes([r]) == ["RATE_LIMIT_ERROR"])
    assert "rate limited" in rate["content"][0]["text"] and "retry_after" in rate["_meta"][FAULT_META]


async def python_sdk_codes(upstream: Any, config: Path, seed: int, calls: list, sessions: int = 1) -> list[list[str]]:
    """The fault codes Python SDK clients meet, one session after another, for ``calls`` with the same world."""
    proxy = FaultProxy(LiveUpstream(upstream), load_config(config), seed, slow_seconds=0, time_scale=0)
    async with proxy:
        runs = []
        for _ in range(sessions):
            async with Client(proxy.server) as client:  # in memory: every client is the stdio session
                results = [await client.call_tool(tool, arguments) for tool, arguments in calls]
            runs.append([label(r.is_error, r.meta) for r in results])
            proxy.sessions.clear()  # the next client is the next session
        return runs


ECHO_PLAN = {"calls": [["echo", {"text": f"call {i}"}] for i in range(16)], "resources": ["notes://today", "notes://mon"],
             "prompts": [["greet", {"name": "Ada"}]]}


def test_typescript_client_over_stdio_gets_the_upstream_unchanged_but_for_the_faults(tmp_path):
    config = tmp_path / "world.yaml"
    config.write_text(WORLD)
    direct = ts_client({**ECHO_PLAN, "command": ECHO})
    proxied = answers(ts_client({**ECHO_PLAN, "command": [*PROXY, "--config", str(config), "--seed", "6", *FAST, "--",
                                                           *ECHO]}))
    direct = answers(direct)
    for offer in OFFERS:  # tools, resources and prompts listed, read and got as the upstream gives them
        assert proxied[offer] == direct[offer], offer
    assert [t["name"] for t in proxied["tools"]] == ["echo", "count", "pid", "die"]
    assert proxied["reads"][1]["contents"][0]["text"] == "the note of mon" and len(proxied["gets"][0]["messages"]) == 1
    for mine, theirs in zip(proxied["calls"], direct["calls"], strict=True):
        assert mine.get("isError") or mine == theirs  # a success is the upstream's answer, untouched
    seen = codes(proxied["calls"])
    assert {"ok", "RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT", "SCHEMA_MISMATCH"} <= set(seen)
    assert_faults_say_what_happened(proxied["calls"], "echo")
    # The same faults as a Python SDK client meets for the same seed and calls.
    assert seen == anyio.run(python_sdk_codes, echo_server, config, 6, ECHO_PLAN["calls"])[0]


def test_typescript_clients_over_http_each_get_a_session_of_their_own(tmp_path):
    config = tmp_path / "world.yaml"
    config.write_text(WORLD)
    proxy = subprocess.Popen([*PROXY, "--config", str(config), "--seed", "6", *FAST, "--transport", "http", "--port",
                              "0", "--", *ECHO], stderr=subprocess.PIPE, text=True)
    try:
        line = proxy.stderr.readline() if proxy.stderr else ""
        url = line.rsplit(" at ", 1)[-1].strip()
        assert url.startswith("http://127.0.0.1:"), line
        clients = [ts_client({**ECHO_PLAN, "url": url}) for _ in range(3)]
        got = [answers(c) for c in clients]
        proxy.send_signal(signal.SIGINT)
        assert proxy.wait(timeout=60) in (0, 130)
    finally:
        if proxy.poll() is None:
            proxy.kill()
    assert len({g["sessionId"] for g in got}) == 3 and all(g["sessionId"] for g in got)
    for g in got:
        assert [t["name"] for t in g["tools"]] == ["echo", "count", "pid", "die"]
        assert g["reads"][0]["contents"][0]["text"] == "buy milk"
        for (_, arguments), result in zip(ECHO_PLAN["calls"], g["calls"], strict=True):
            assert result.get("isError") or result["content"][0]["text"] == arguments["text"]
        assert_faults_say_what_happened(g["calls"], "echo")
    # The three clients are sessions 0, 1, 2 of the seed in some order (no cross-talk).
    expected = anyio.run(python_sdk_codes, echo_server, config, 6, ECHO_PLAN["calls"], 3)
    assert sorted(codes(g["calls"]) for g in got) == sorted(expected)


def test_a_server_the_proxy_has_never_seen_the_pypi_git_server(tmp_path):
    """mcp-server-git (written with nothing of ours) in front of a fresh repository: the TypeScript client
    gets its tools, resources, prompts and answers unchanged through the proxy, its own tool errors
    (a bad revision) untouched, and the world's faults, the same as the Python SDK client meets."""
    pytest.importorskip("mcp_server_git", reason="pip install mcp-server-git (the dev extra)")
    repo = tmp_path / "repo"
    repo.mkdir()
    for args in (["init", "-q"], ["-c", "user.name=t", "-c", "user.email=t@x", "commit", "-q", "--allow-empty", "-m", "first"]):
        subprocess.run(["git", *args], cwd=repo, check=True)
    git = [sys.executable, "-m", "mcp_server_git", "--repository", str(repo)]
    config = tmp_path / "world.yaml"
    config.write_text(WORLD)
    calls = [["git_status", {"repo_path": str(repo)}], ["git_log", {"repo_path": str(repo), "max_count": 1}],
             ["git_show", {"repo_path": str(repo), "revision": "no-such-revision"}]] * 5
    direct = ts_client({"command": git, "calls": calls})
    proxied = answers(ts_client({"command": [*PROXY, "--config", str(config), "--seed", "6", *FAST, "--", *git],
                                 "calls": calls}))
    direct = answers(direct)
    for offer in OFFERS:
        assert proxied.get(offer) == direct.get(offer), offer
    assert proxied["server"]["name"] == "mcp-git" and len(proxied["tools"]) >= 10
    assert direct["calls"][2]["isError"]  # the upstream's own error for a bad revision ...
    for mine, theirs in zip(proxied["calls"], direct["calls"], strict=True):
        assert FAULT_META in mine.get("_meta", {}) or mine == theirs  # ... forwarded untouched, like its answers
    seen = codes(proxied["calls"])
    assert "ok" in seen and len(set(seen)) >= 3
    assert seen == anyio.run(python_sdk_codes, git, config, 6, calls)[0]
