"""`serve-tools`: the 30 tools as an HTTP service with real faults (real-API mode; docs/envs/real_apis.md)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from resilibench.cli import CliError, choose_world, load_library, nonnegative_float, nonnegative_int
from resilibench.cli.mcp import _port


def cmd_serve_tools(args: argparse.Namespace) -> int:
    from resilibench.envs.real_api.service import ToolService, serve_tools, url_of
    from resilibench.envs.real_api.serving import bind_socket, is_loopback

    if not is_loopback(args.host) and not args.allow_remote:
        raise CliError(f"--host {args.host} is not a loopback address; the service has no authentication, so "
                       "serving beyond this machine needs --allow-remote")
    world = choose_world(args)
    tasks, _ = load_library(args.tasks, world)
    if args.task is not None and args.task not in {t.instance_id for t in tasks}:
        raise CliError(f"--task: no task {args.task!r} in the library (see `resilibench tasks list` for ids)")
    service = ToolService(tasks, world.config, task_id=args.task,
                          seed=args.seed, slow_seconds=args.slow_seconds, retry_after=args.retry_after,
                          host=args.host, time_scale=args.time_scale)
    try:
        sock = bind_socket(args.host, args.port)
    except OSError as exc:
        raise CliError(f"--host/--port: cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None

    def ready() -> None:  # printed once the port accepts connections
        print(f"resilibench: tool service at {url_of(sock)} (OpenAPI: {url_of(sock)}/openapi.json; "
              f"default task {service.default_task.instance_id}); Ctrl-C stops it", file=sys.stderr, flush=True)

    serve_tools(service, sock, on_ready=ready)
    return 0


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``serve-tools`` to the ``resilibench`` parser."""
    serve = commands.add_parser(
        "serve-tools", parents=[parents["library"], parents["world"]],
        help="serve the 30 tools over HTTP with real faults (timeouts, 429, 5xx, dropped connections)",
        description="Serve the tools over HTTP: POST /tools/NAME with JSON arguments; failures drawn by the "
        "world show as real faults. Open an episode with POST /episodes and name it in the X-Episode "
        "header; see docs/envs/real_apis.md.")
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=_port, default=8010, help="port (default 8010; 0 picks a free one, printed)")
    serve.add_argument("--allow-remote", action="store_true",
                       help="allow a --host that is not a loopback address (no authentication!)")
    serve.add_argument("--seed", type=nonnegative_int, default=0,
                       help="run seed of the default episode (calls without X-Episode; default 0)")
    serve.add_argument("--task", metavar="ID", help="task of the default episode (default: the first test task)")
    serve.add_argument("--slow-seconds", type=nonnegative_float, default=2.0, metavar="SECONDS",
                       help="how late a TIMEOUT is answered (default 2; give clients a shorter timeout)")
    serve.add_argument("--retry-after", type=nonnegative_float, default=1.0, metavar="SECONDS",
                       help="the Retry-After of a 429, per turn of a rate-limit process's wait (default 1)")
    serve.add_argument("--time-scale", type=nonnegative_float, default=1.0, metavar="X",
                       help="under the world's latency process, answer after the drawn duration times X "
                       "(default 1; 0 answers at once)")
    serve.set_defaults(func=cmd_serve_tools)
