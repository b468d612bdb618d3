"""`serve-mcp`: the tool simulator over MCP (stdio or streamable HTTP)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from resilibench.cli import CliError, choose_world, load_api, load_library, positive_float, positive_int


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {value}")
    return value


def _seconds(text: str) -> float:
    value = positive_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


def cmd_serve_mcp(args: argparse.Namespace) -> int:
    import anyio

    from resilibench.envs.mcp.server import (
        DEFAULT_MAX_SESSIONS,
        DEFAULT_SESSION_IDLE_TIMEOUT,
        build_server,
        serve_http,
        serve_stdio,
    )
    from resilibench.envs.real_api.serving import DEFAULT_MAX_EPISODES, bind_socket, is_loopback

    http_only = {"--host": args.host, "--port": args.port, "--session-idle-timeout": args.session_idle_timeout,
                 "--max-sessions": args.max_sessions}
    given = [option for option, value in http_only.items() if value is not None]
    if args.transport == "stdio" and given:
        raise CliError(f"{', '.join(given)}: for --transport http only")
    host = args.host or "127.0.0.1"
    if args.transport == "http" and not is_loopback(host) and not args.allow_remote:
        raise CliError(f"--host {host} is not a loopback address; the server has no authentication, so "
                       "serving beyond this machine needs --allow-remote")
    api = load_api(args)
    if api is not None and api.live is not None and args.tasks is not None:
        raise CliError("--tasks: not with --api-tasks (the task file holds the tasks)")
    world = choose_world(args)
    tasks = None if api is not None and api.live is not None else load_library(args.tasks, world)[0]
    server = build_server(tasks, world.config, max_episodes=args.max_episodes or
                          DEFAULT_MAX_EPISODES, search=args.search, api=api and api.real)
    if args.transport == "stdio":
        anyio.run(serve_stdio, server)
        return 0
    port = 8000 if args.port is None else args.port
    try:
        sock = bind_socket(host, port)
    except OSError as exc:
        raise CliError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host

    def ready() -> None:  # printed once the port accepts connections, so a client may connect at once
        print(f"resilibench: MCP server (streamable HTTP) at http://{shown}:{bound_port}/mcp", file=sys.stderr,
              flush=True)

    idle = DEFAULT_SESSION_IDLE_TIMEOUT if args.session_idle_timeout is None else args.session_idle_timeout
    anyio.run(lambda: serve_http(server, sock, on_ready=ready, session_idle_timeout=idle,
                                 max_sessions=args.max_sessions or DEFAULT_MAX_SESSIONS))
    return 0


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``serve-mcp`` to the ``resilibench`` parser."""
    serve = commands.add_parser(
        "serve-mcp", parents=[parents["library"], parents["world"], parents["api"]],
        help="serve the 30 simulated tools over MCP (stdio or streamable HTTP)",
        description="Serve the tool simulator over MCP. Open an episode with the start_task tool and pass its "
        "handle as 'episode' to every tool call; see docs/envs/mcp.md.")
    serve.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                       help="stdio (default; for clients that launch the server) or streamable HTTP")
    serve.add_argument("--host", help="HTTP: address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, help="HTTP: port (default 8000; 0 picks a free one, printed on stderr)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="HTTP: allow a --host that is not a loopback address (no authentication!)")
    serve.add_argument("--session-idle-timeout", type=_seconds, metavar="SECONDS",
                       help="HTTP: close a session idle this long (default 300; the client re-initializes, "
                       "episodes stay)")
    serve.add_argument("--max-sessions", type=positive_int, metavar="N",
                       help="HTTP: most sessions open at once; a new one beyond gets 503 (default 1000)")
    serve.add_argument("--max-episodes", type=positive_int, metavar="N",
                       help="size of the episode handle table (default 10000; finished episodes are evicted first)")
    serve.add_argument("--search", choices=("auto", "semantic", "lexical"), default="auto",
                       help="tool_search method (auto: semantic when the embed extra is installed)")
    serve.set_defaults(func=cmd_serve_mcp)
