"""A real OpenAI-compatible chat server on loopback for tests: ``answer(body) -> (status, payload)``
decides each reply (it may sleep, to play a slow server)."""

from __future__ import annotations

import contextlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ChatServer:
    """A local /v1/chat/completions server; ``answer(body) -> (status, payload)`` decides each reply."""

    def __init__(self, answer):
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.active = self.max_active = 0
        lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server API)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with lock:
                    server.requests.append(body)
                    server.headers.append(dict(self.headers))
                    server.active += 1
                    server.max_active = max(server.max_active, server.active)
                try:
                    if self.path != "/v1/chat/completions":
                        status, payload = 404, {"error": {"message": f"no route {self.path}"}}
                    else:
                        status, payload = answer(body)
                finally:
                    with lock:
                        server.active -= 1
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if status == 429:
                    self.send_header("Retry-After", "0")
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up waiting
                    self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True  # a handler still sleeping does not hold up the test's end
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(text: str) -> dict:
    return {"object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                                      "finish_reason": "stop"}]}
