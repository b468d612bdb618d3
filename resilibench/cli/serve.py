"""`serve mcp` and `serve tools`: the tool simulator over MCP (stdio or streamable HTTP), and the 30 tools
as an HTTP service with real faults (real-API mode; docs/envs/real_apis.md)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Any

from resilibench.cli.common import (
    CliError,
    add_api_options,
    add_config_option,
    add_group,
    add_library_options,
    choose_world,
    load_api,
    load_library,
    nonnegative_float,
    nonnegative_int,
    positive_float,
    positive_int,
)


def port_number(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number in [0, 65535], got {value}")
    return value


def seconds(text: str) -> float:
    value = positive_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a positive, finite number of seconds, got {text!r}")
    return value


def check_host(host: str, allow_remote: bool, what: str) -> None:
    """Refuse to listen beyond this machine without --allow-remote: the servers have no authentication."""
    from resilibench.envs.real_api.serving import is_loopback

    if not is_loopback(host) and not allow_remote:
        raise CliError(f"--host {host} is not a loopback address; the {what} has no authentication, so serving "
                       "beyond this machine needs --allow-remote")


def listen(host: str, port: int) -> Any:
    """A socket listening on ``host``:``port``; CliError naming both options when the system refuses."""
    from resilibench.envs.real_api.serving import bind_socket

    try:
        return bind_socket(host, port)
    except OSError as exc:
        raise CliError(f"--host/--port: cannot listen on {host}:{port}: {exc.strerror or exc}") from None


# The HTTP servers' limits (serving.ServerLimits: the first four) and the episode table's bounds
# (serving.EpisodeTable): option -> (field, type, metavar, help). An option not given keeps the library's
# default; the help shows _DEFAULTS, which a test holds equal to the library's (building the parser imports
# no server code).
_DEFAULTS = {"max_connections": 512, "header_timeout": 10.0, "body_timeout": 30.0, "max_body_bytes": 1 << 20,
             "max_episodes": 10_000, "max_episodes_per_client": 1_000, "episode_idle_timeout": 3600.0}
_BOUNDS = {
    "--max-connections": ("max_connections", positive_int, "N", "most connections open at once; one more is "
                          "answered 503 and closed (default {})"),
    "--header-timeout": ("header_timeout", seconds, "SECONDS", "a request's head must arrive within this long "
                         "of the connection's start or the previous response, else 408 (default {:g})"),
    "--body-timeout": ("body_timeout", seconds, "SECONDS", "a request's body must arrive within this long of "
                       "its head, else 408 (default {:g})"),
    "--max-body-bytes": ("max_body_bytes", positive_int, "N", "largest request body; a larger one is answered "
                         "413 (default {})"),
    "--max-episodes": ("max_episodes", positive_int, "N", "size of the episode table (default {}; finished "
                       "episodes are evicted first)"),
    "--max-episodes-per-client": ("max_episodes_per_client", positive_int, "N", "episodes one client may hold; "
                                  "its own oldest make room beyond (default {})"),
    "--episode-idle-timeout": ("episode_idle_timeout", seconds, "SECONDS", "drop an episode unused this long "
                               "(default {:g})"),
}
_LIMITS = dict(list(_BOUNDS.items())[:4])
_EPISODE_BOUNDS = dict(list(_BOUNDS.items())[4:])


def _add_bounds(parser: argparse.ArgumentParser, options: dict[str, tuple[Any, ...]], prefix: str = "") -> None:
    for option, (name, kind, metavar, text) in options.items():
        parser.add_argument(option, type=kind, metavar=metavar, help=prefix + text.format(_DEFAULTS[name]))


def _given(args: argparse.Namespace, options: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    """The bounds given on the command line, by field name."""
    values = {name: getattr(args, name) for name, *_ in options.values()}
    return {name: value for name, value in values.items() if value is not None}


def transport_limits(args: argparse.Namespace) -> Any:
    """The HTTP server's limits of ``add_transport_options`` (``serving.ServerLimits``)."""
    from resilibench.envs.real_api.serving import ServerLimits

    return ServerLimits(**_given(args, _LIMITS))


def transport_host(args: argparse.Namespace, what: str) -> str:
    """The host of ``add_transport_options``' HTTP transport, checked: HTTP options refused with stdio, a
    host beyond this machine refused without --allow-remote."""
    http_only = {"--host": args.host, "--port": args.port, "--session-idle-timeout": args.session_idle_timeout,
                 "--max-sessions": args.max_sessions, **{o: getattr(args, f[0]) for o, f in _LIMITS.items()}}
    given = [option for option, value in http_only.items() if value is not None]
    if args.transport == "stdio" and given:
        raise CliError(f"{', '.join(given)}: for --transport http only")
    host = args.host or "127.0.0.1"
    if args.transport == "http":
        check_host(host, args.allow_remote, what)
    return host


def cmd_serve_mcp(args: argparse.Namespace) -> int:
    import anyio

    from resilibench.envs.mcp.server import (
        DEFAULT_MAX_SESSIONS,
        DEFAULT_SESSION_IDLE_TIMEOUT,
        build_server,
        serve_http,
        serve_stdio,
    )
    host = transport_host(args, "server")
    api = load_api(args)
    if api is not None and api.live is not None and args.tasks is not None:
        raise CliError("--tasks: not with --api-tasks (the task file holds the tasks)")
    world = choose_world(args)
    tasks = None if api is not None and api.live is not None else load_library(args.tasks, world)[0]
    server = build_server(tasks, world.config, search=args.search, api=api and api.real,
                          **_given(args, _EPISODE_BOUNDS))
    if args.transport == "stdio":
        anyio.run(serve_stdio, server)
        return 0
    sock = listen(host, 8000 if args.port is None else args.port)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host

    def ready() -> None:  # printed once the port accepts connections, so a client may connect at once
        print(f"resilibench: MCP server (streamable HTTP) at http://{shown}:{bound_port}/mcp", file=sys.stderr,
              flush=True)

    idle = DEFAULT_SESSION_IDLE_TIMEOUT if args.session_idle_timeout is None else args.session_idle_timeout
    limits = transport_limits(args)
    anyio.run(lambda: serve_http(server, sock, on_ready=ready, session_idle_timeout=idle,
                                 max_sessions=args.max_sessions or DEFAULT_MAX_SESSIONS, limits=limits))
    return 0


def cmd_serve_tools(args: argparse.Namespace) -> int:
    from resilibench.envs.real_api.service import ToolService, serve_tools, url_of

    check_host(args.host, args.allow_remote, "service")
    world = choose_world(args)
    tasks, _ = load_library(args.tasks, world)
    if args.task is not None and args.task not in {t.instance_id for t in tasks}:
        raise CliError(f"--task: no task {args.task!r} in the library (see `resilibench tasks list` for ids)")
    service = ToolService(tasks, world.config, task_id=args.task,
                          seed=args.seed, slow_seconds=args.slow_seconds, retry_after=args.retry_after,
                          host=args.host, time_scale=args.time_scale, **_given(args, _EPISODE_BOUNDS))
    limits = transport_limits(args)
    sock = listen(args.host, args.port)

    def ready() -> None:  # printed once the port accepts connections
        print(f"resilibench: tool service at {url_of(sock)} (OpenAPI: {url_of(sock)}/openapi.json; "
              f"default task {service.default_task.instance_id}); Ctrl-C stops it", file=sys.stderr, flush=True)

    serve_tools(service, sock, on_ready=ready, limits=limits)
    return 0


# --- parser ---------------------------------------------------------------------------------------------------


def add_transport_options(parser: argparse.ArgumentParser) -> None:
    """How clients reach an MCP server: ``--transport``, the HTTP options and the HTTP server's limits (read
    by ``transport_host`` and ``transport_limits``)."""
    parser.add_argument("--transport", choices=("stdio", "http"), default="stdio",
                        help="stdio (default; for clients that launch the server) or streamable HTTP")
    parser.add_argument("--host", help="HTTP: address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number,
                        help="HTTP: port (default 8000; 0 picks a free one, printed on stderr)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="HTTP: allow a --host that is not a loopback address (no authentication!)")
    parser.add_argument("--session-idle-timeout", type=seconds, metavar="SECONDS",
                        help="HTTP: close a session idle this long (default 300; the client re-initializes, "
                        "episodes stay)")
    parser.add_argument("--max-sessions", type=positive_int, metavar="N",
                        help="HTTP: most sessions open at once; a new one beyond gets 503 (default 1000)")
    _add_bounds(parser, _LIMITS, "HTTP: ")


def _mcp_arguments(parser: argparse.ArgumentParser) -> None:
    add_library_options(parser)
    add_config_option(parser)
    add_api_options(parser)
    add_transport_options(parser)
    _add_bounds(parser, _EPISODE_BOUNDS)
    parser.add_argument("--search", choices=("auto", "semantic", "lexical"), default="auto",
                        help="tool_search method (default auto: semantic when the embed extra is installed)")
    parser.set_defaults(func=cmd_serve_mcp)


def _tools_arguments(parser: argparse.ArgumentParser) -> None:
    add_library_options(parser)
    add_config_option(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=8010, help="port (default 8010; 0 picks a free one, printed)")
    parser.add_argument("--allow-remote", action="store_true",
                        help="allow a --host that is not a loopback address (no authentication!)")
    parser.add_argument("--seed", type=nonnegative_int, default=0, metavar="N",
                        help="run seed of the default episode (calls without X-Episode; default 0)")
    parser.add_argument("--task", metavar="ID", help="task of the default episode (default: the first test task)")
    parser.add_argument("--slow-seconds", type=nonnegative_float, default=2.0, metavar="SECONDS",
                        help="how late a TIMEOUT is answered (default 2; give clients a shorter timeout)")
    parser.add_argument("--retry-after", type=nonnegative_float, default=1.0, metavar="SECONDS",
                        help="the Retry-After of a 429, per turn of a rate-limit process's wait (default 1)")
    parser.add_argument("--time-scale", type=nonnegative_float, default=1.0, metavar="X",
                        help="under the world's latency process, answer after the drawn duration times X "
                        "(default 1; 0 answers at once)")
    _add_bounds(parser, _LIMITS)
    _add_bounds(parser, _EPISODE_BOUNDS)
    parser.set_defaults(func=cmd_serve_tools)


def add_commands(commands: Any) -> None:
    """Add ``serve mcp|tools`` to the ``resilibench`` parser."""
    add_group(commands, "serve", "serve the tools: over MCP, or over HTTP with real faults", {
        "mcp": ("the 30 simulated tools over MCP (stdio or streamable HTTP)", _mcp_arguments,
                "Serve the tool simulator over MCP. Open an episode with the start_task tool and pass its handle "
                "as 'episode' to every tool call; see docs/envs/mcp.md."),
        "tools": ("the 30 tools over HTTP with real faults (timeouts, 429, 5xx, dropped connections)", _tools_arguments,
                  "Serve the tools over HTTP: POST /tools/NAME with JSON arguments; failures drawn by the world show "
                  "as real faults. Open an episode with POST /episodes and name it in the X-Episode header; see "
                  "docs/envs/real_apis.md."),
    })
