"""A small HTTP server on a loopback socket for client tests: each route a function of the request
handler, so a test can answer JSON, drip bytes, send a huge body or redirect, and see what was sent."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Route = Callable[[BaseHTTPRequestHandler], None]


def send_json(handler: BaseHTTPRequestHandler, data: Any, status: int = 200,
              headers: dict[str, str] | None = None) -> None:
    body = json.dumps(data).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    handler.end_headers()
    handler.wfile.write(body)


def json_route(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Route:
    return lambda handler: send_json(handler, data, status, headers)


def drip_route(seconds: float = 0.2, total: int = 1000) -> Route:
    """Headers at once, then a body of ``total`` bytes announced, one byte every ``seconds``."""
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(total))
        handler.end_headers()
        try:
            for _ in range(total):
                handler.wfile.write(b" ")
                handler.wfile.flush()
                time.sleep(seconds)
        except OSError:  # the client gave up
            pass
    return route


def huge_route(size: int, announce: bool = True) -> Route:
    """A body of ``size`` bytes sent in 1 MiB chunks (``announce``: with its Content-Length)."""
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        if announce:
            handler.send_header("Content-Length", str(size))
        handler.end_headers()
        chunk = b" " * (1 << 20)
        try:
            sent = 0
            while sent < size:
                handler.wfile.write(chunk[:size - sent])
                sent += len(chunk)
        except OSError:
            pass
    return route


def redirect_route(location: str, status: int = 302) -> Route:
    def route(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()
    return route


class Server:
    """The running server: ``url``, ``routes`` ((method, path) -> route, editable) and ``requests``
    (method, path, headers) in arrival order."""

    def __init__(self, routes: dict[tuple[str, str], Route]):
        self.routes = routes
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def handle_one(self) -> None:
                server.requests.append((self.command, self.path, dict(self.headers.items())))
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                route = server.routes.get((self.command, self.path.split("?")[0]))
                if route is None:
                    send_json(self, {"error": {"code": "FILE_NOT_FOUND", "description": self.path}}, 404)
                else:
                    route(self)

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = handle_one

            def log_message(self, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"


@contextmanager
def loopback_server(routes: dict[tuple[str, str], Route] | None = None) -> Iterator[Server]:
    server = Server(dict(routes or {}))
    thread = threading.Thread(target=server._http.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server._http.shutdown()
        server._http.server_close()
