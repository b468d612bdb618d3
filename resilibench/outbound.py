"""Outbound HTTP with limits: every request of the library to another host (a live API's tools, an OpenAPI
document, an OpenAI-compatible server) goes through ``fetch``.

* A total deadline per call: every network read, write and connect of the call waits at most what is
  left of ``timeout`` (an httpcore network backend that reads the deadline), so a server that drips one
  byte a second, in the headers or the body, is cut off at the deadline; ``httpx.TimeoutException``.
* A size cap: an announced Content-Length above ``max_bytes`` is refused before the body is read, and
  a body is read in chunks and abandoned as soon as it passes the cap; ``ResponseTooLarge``.
* Redirects are followed (at most ``MAX_REDIRECTS``), but the caller's ``headers`` (credentials) never
  follow one to another origin (scheme, host, port).
* ``retry_after_seconds``: a Retry-After header read safely (a finite number of seconds >= 0, or None).
"""

from __future__ import annotations

__all__ = [
    "MAX_REDIRECTS", "ResponseTooLarge", "Reply", "origin", "http_client", "fetch", "retry_after_seconds",
]

import contextvars
import email.utils
import math
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_REDIRECTS = 5
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("resilibench_outbound_deadline",
                                                                          default=None)


class ResponseTooLarge(OSError):
    """A response body larger than the caller's cap (the rest was not read)."""


@dataclass(frozen=True)
class Reply:
    """A whole response: status, headers (case-insensitive), the body's bytes and the final URL."""

    status: int
    headers: Mapping[str, str]
    content: bytes
    url: str

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", "replace")


def origin(url: Any) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, default ports made explicit: what a credential is bound to."""
    parts = urllib.parse.urlsplit(str(url))
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """The wait of one network operation: its own ``timeout`` bounded by what is left of the call's deadline;
    ``error`` when nothing is left."""
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = deadline - time.monotonic()
    if left <= 0:
        raise error("the call's deadline passed")
    return left if timeout is None else min(timeout, left)


def _network_backend() -> Any:
    """An httpcore network backend whose every connect, read and write waits at most until the deadline."""
    import httpcore2

    class DeadlineStream(httpcore2.NetworkStream):
        def __init__(self, stream: Any):
            self._stream = stream

        def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
            return self._stream.read(max_bytes, _left(timeout, httpcore2.ReadTimeout))

        def write(self, buffer: bytes, timeout: float | None = None) -> None:
            self._stream.write(buffer, _left(timeout, httpcore2.WriteTimeout))

        def close(self) -> None:
            self._stream.close()

        def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                      timeout: float | None = None) -> Any:
            return DeadlineStream(self._stream.start_tls(ssl_context, server_hostname,
                                                         _left(timeout, httpcore2.ConnectTimeout)))

        def get_extra_info(self, info: str) -> Any:
            return self._stream.get_extra_info(info)

    class DeadlineBackend(httpcore2.SyncBackend):
        def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                        socket_options: Any = None) -> Any:
            return DeadlineStream(super().connect_tcp(host, port, _left(timeout, httpcore2.ConnectTimeout),
                                                      local_address, socket_options))

    return DeadlineBackend()


def http_client(timeout: float) -> Any:
    """An ``httpx2.Client`` for ``fetch``: ``timeout`` per network operation, no proxy from the environment,
    redirects left to ``fetch``, connections made by the deadline backend."""
    import httpcore2
    import httpx2 as httpx

    transport = httpx.HTTPTransport(trust_env=False)
    # httpx takes no network backend of its own: the transport's pool is made again with ours.
    transport._pool = httpcore2.ConnectionPool(ssl_context=httpx.create_ssl_context(trust_env=False),
                                               network_backend=_network_backend())
    return httpx.Client(timeout=timeout, transport=transport, trust_env=False, follow_redirects=False)


def fetch(client: Any, method: str, url: str, *, timeout: float, max_bytes: int,
          headers: Mapping[str, str] | None = None, **request: Any) -> Reply:
    """One call through ``client`` (``http_client``): the whole answer within ``timeout`` seconds
    (``httpx2.TimeoutException`` otherwise) and at most ``max_bytes`` of body (``ResponseTooLarge``);
    redirects followed, ``headers`` dropped on the first hop to another origin. ``request``: httpx's
    ``params``, ``json``, ``content``."""
    import httpx2 as httpx

    token = _DEADLINE.set(time.monotonic() + timeout)
    try:
        home, sent = origin(url), dict(headers or {})
        outgoing = client.build_request(method, url, headers=sent, **request)
        for _ in range(MAX_REDIRECTS + 1):
            response = client.send(outgoing, stream=True)
            try:
                following = response.next_request
                if following is None:
                    return Reply(response.status_code, response.headers, _read(response, max_bytes),
                                 str(response.url))
            finally:
                response.close()
            if origin(following.url) != home:
                for name in sent:
                    following.headers.pop(name, None)
            outgoing = following
        raise httpx.TooManyRedirects(f"more than {MAX_REDIRECTS} redirects from {url}", request=outgoing)
    finally:
        _DEADLINE.reset(token)


def _read(response: Any, max_bytes: int) -> bytes:
    announced = response.headers.get("content-length", "")
    if announced.isdigit() and int(announced) > max_bytes:
        raise ResponseTooLarge(f"the answer announces {int(announced):,} bytes, over the cap of {max_bytes:,} bytes")
    chunks, size = [], 0
    for chunk in response.iter_bytes():
        size += len(chunk)
        if size > max_bytes:
            raise ResponseTooLarge(f"the answer passed the cap of {max_bytes:,} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def retry_after_seconds(value: str | None) -> float | None:
    """A Retry-After header in seconds (delta-seconds or an HTTP date; a date in the past is 0); None when
    absent or not a finite number >= 0 (``inf``, ``nan``, ``-5``)."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        seconds = max(0.0, when.timestamp() - time.time())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
