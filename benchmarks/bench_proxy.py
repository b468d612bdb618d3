"""What the MCP fault proxy adds to a tool call: CPU time per call through the proxy (faults drawn, none
failing; and --no-faults) against the anchor, the same calls made straight to the same upstream, in memory
(SDK client -> server objects, no sockets), interleaved repeats.

    python benchmarks/bench_proxy.py [--calls N] [--repeats R]
"""

from __future__ import annotations

import argparse
import statistics
import time

import anyio
from mcp import Client
from mcp.server.mcpserver import MCPServer

from resilibench.core.config import WorldConfig
from resilibench.envs.proxy.proxy import FaultProxy, LiveUpstream


def upstream() -> MCPServer:
    server = MCPServer("echo")

    @server.tool()
    def echo(text: str) -> str:
        return text

    return server


async def direct(calls: int) -> float:
    async with Client(upstream()) as client:
        start = time.process_time()
        for i in range(calls):
            await client.call_tool("echo", {"text": str(i)})
        return time.process_time() - start


async def proxied(calls: int, faults: bool) -> float:
    world = WorldConfig().replace(failure={"base_success": 1.0}, processes={"outage_start": 0.0})
    async with FaultProxy(LiveUpstream(upstream()), world, faults=faults) as proxy, Client(proxy.server) as client:
        start = time.process_time()
        for i in range(calls):
            await client.call_tool("echo", {"text": str(i)})
        return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"direct (anchor)": [], "proxy, faults drawn": [], "proxy, --no-faults": []}
    paths = {"direct (anchor)": lambda: anyio.run(direct, args.calls),
             "proxy, faults drawn": lambda: anyio.run(proxied, args.calls, True),
             "proxy, --no-faults": lambda: anyio.run(proxied, args.calls, False)}
    names = list(paths)
    for r in range(args.repeats):  # interleaved, in a rotating order, so load changes and warm-up hit all three
        for name in names[r % 3:] + names[: r % 3]:
            runs[name].append(paths[name]())
    anchor = statistics.median(runs["direct (anchor)"]) / args.calls
    print(f"{'path':<22} {'ms CPU per call':>16} {'x anchor':>9}")
    for name, times in runs.items():
        per_call = statistics.median(times) / args.calls
        print(f"{name:<22} {per_call * 1e3:>16.3f} {per_call / anchor:>9.2f}")


if __name__ == "__main__":
    main()
