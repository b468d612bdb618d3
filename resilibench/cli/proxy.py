"""`proxy mcp`: the MCP fault proxy, the world's failure processes in front of any MCP server
(docs/envs/proxy.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from resilibench.cli.common import (
    CliError,
    add_config_option,
    add_group,
    nonnegative_float,
    nonnegative_int,
    output_file,
)
from resilibench.cli.serve import add_transport_options, listen, seconds, transport_host, transport_limits


def cmd_proxy_mcp(args: argparse.Namespace) -> int:
    import anyio

    from resilibench.core.config import load_config
    from resilibench.envs.mcp.server import DEFAULT_MAX_SESSIONS as HTTP_SESSIONS
    from resilibench.envs.mcp.server import DEFAULT_SESSION_IDLE_TIMEOUT
    from resilibench.envs.proxy.proxy import (
        FaultProxy,
        LiveUpstream,
        ReplayUpstream,
        UpstreamError,
        serve_proxy,
    )

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    given = sum(x is not None for x in (args.upstream_url, args.replay)) + bool(command)
    if given != 1:
        raise CliError("give the upstream once: -- COMMAND [ARGS...] (over stdio), --upstream-url URL, or "
                       "--replay FILE" + (f"; got {given}" if given else ""))
    if args.replay is not None and args.record is not None:
        raise CliError("--record: not with --replay (a replay starts no upstream to record)")
    host = transport_host(args, "proxy")
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        raise CliError(f"--config: {exc}") from None
    call_log, record = output_file(args.call_log, "--call-log"), output_file(args.record, "--record")
    upstream = (ReplayUpstream(args.replay) if args.replay is not None else
                LiveUpstream(command or args.upstream_url, timeout=args.upstream_timeout))
    proxy = FaultProxy(upstream, config, args.seed, faults=not args.no_faults, call_log=call_log, record=record,
                       slow_seconds=args.slow_seconds, time_scale=args.time_scale)
    sock, http = None, {}
    if args.transport == "http":
        sock = listen(host, 8000 if args.port is None else args.port)
        http = {"session_idle_timeout": args.session_idle_timeout or DEFAULT_SESSION_IDLE_TIMEOUT,
                "max_sessions": args.max_sessions or HTTP_SESSIONS, "limits": transport_limits(args)}
    bound = sock.getsockname()[:2] if sock is not None else None

    def ready() -> None:  # printed once clients may connect
        where = "stdio" if bound is None else \
            f"http://{f'[{bound[0]}]' if ':' in bound[0] else bound[0]}:{bound[1]}/mcp"
        print(f"resilibench: MCP fault proxy of {proxy.upstream_name} ({len(proxy.tools)} tools) at {where}",
              file=sys.stderr, flush=True)

    try:
        anyio.run(lambda: serve_proxy(proxy, sock, ready, **http))
    except UpstreamError as exc:
        print(f"resilibench: error: upstream: {exc}", file=sys.stderr)
        return 1
    return 0


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    add_config_option(parser)
    parser.add_argument("--seed", type=nonnegative_int, default=0, metavar="N",
                        help="run seed: client session k plays the k-th episode seed of it (default 0)")
    parser.add_argument("--no-faults", action="store_true",
                        help="inject nothing: forward every call (a call log then measures the upstream itself)")
    parser.add_argument("--call-log", metavar="FILE",
                        help="append one JSON line per call (the call-log format `failures fit` reads)")
    recording = parser.add_mutually_exclusive_group()
    recording.add_argument("--record", metavar="FILE", help="keep the upstream's tool list and answers (JSON lines)")
    recording.add_argument("--replay", metavar="FILE",
                           help="answer from a --record file instead of an upstream (none is started)")
    parser.add_argument("--upstream-url", metavar="URL", help="an upstream served over streamable HTTP")
    parser.add_argument("--upstream-timeout", type=seconds, default=60.0, metavar="SECONDS",
                        help="a forwarded call taking longer fails with TIMEOUT (default 60)")
    parser.add_argument("--slow-seconds", type=nonnegative_float, default=2.0, metavar="SECONDS",
                        help="how long an injected TIMEOUT withholds its answer (default 2; past the client's "
                        "deadline when the client's is shorter)")
    parser.add_argument("--time-scale", type=nonnegative_float, default=1.0, metavar="X",
                        help="under the world's latency process, wait the drawn duration times X before "
                        "forwarding (default 1; 0: no wait)")
    add_transport_options(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND [ARGS...]",
                        help="the upstream MCP server's command line, launched over stdio")
    parser.set_defaults(func=cmd_proxy_mcp)


def add_commands(commands: Any) -> None:
    """Add ``proxy mcp`` to the ``resilibench`` parser."""
    add_group(commands, "proxy", "the world's failures in front of any MCP server", {
        "mcp": ("an MCP server's tools with the world's failure processes injected per tool and client session",
                _mcp_arguments,
                "Start an upstream MCP server (-- COMMAND, over stdio; or --upstream-url; or --replay a recording) "
                "and serve its tools, resources and prompts unchanged, each tool call drawn by the world's failure "
                "processes: a success is the upstream's own answer, a failure a tool error saying what happened; "
                "see docs/envs/proxy.md."),
    })
