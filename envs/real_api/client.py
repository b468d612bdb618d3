"""The one HTTP client of real-API mode: tools called over the network, failures read off the wire.

* ``Endpoint``: where and how one tool is called (method, URL template, headers).
* ``ToolClient``: calls tools over HTTP (httpx2, synchronous, a total deadline and a size cap per call:
  ``resilibench.outbound``) and says what really
  happened (``HttpOutcome``): success, error code, status, latency, error class (``envs.real_api.http_faults``),
  Retry-After, the body. Against our tool service (``base_url``) a tool is ``POST {base}/tools/{name}``;
  for a live API each tool has its own ``Endpoint``.
* ``HttpExecutor``: plugs a client into ``Episode.call(outcome=...)``: where the simulator would draw, the
  call goes over HTTP; it retries (``max_retries``, each attempt one call of the episode) and writes one
  ``CallLogRow`` per attempt when the client has a log.
"""

from __future__ import annotations

__all__ = [
    "METHODS", "EPISODE_HEADER", "REPLAY_HEADER", "LOG_RUN", "DURATION_HEADER", "WAIT_TURNS_HEADER",
    "DEFAULT_MAX_BYTES", "check_headers", "Endpoint", "HttpOutcome", "retry_after_seconds", "ToolClient", "HttpExecutor",
]

import itertools
import json
import math
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx2 as httpx

from resilibench.errors import InputError
from resilibench.outbound import Reply, ResponseTooLarge, fetch, http_client, retry_after_seconds

from ...core.registry import INVALID_INPUT, ToolRegistry, default_registry
from ...core.simulator import CallRecord, Episode
from . import http_faults as hf
from .call_log import CallLogRow, write_rows

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
EPISODE_HEADER = "X-Episode"
# The calls of a mirrored episode that the client answered without a request (replays, call caps,
# invalid input, strict dependencies), sent with the next request so the service's episode plays them too.
REPLAY_HEADER = "X-Episode-Replay"
LOG_RUN = secrets.token_hex(3)  # this process's part of call-log episode names
_LOGGED = itertools.count(1)
# Sent by the tool service under failure processes: the call's duration in the world (seconds) and, for a
# rate-limit refusal, the turns of the wait, so a mirrored episode keeps the same clock and waits.
DURATION_HEADER = "X-Call-Duration"
WAIT_TURNS_HEADER = "X-Retry-After-Turns"
_PLACEHOLDER = re.compile(r"{([A-Za-z_][A-Za-z0-9_]*)}")
DEFAULT_MAX_BYTES = 10 * 2**20  # the largest response body a call reads
_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")  # an HTTP header name (RFC 9110 token)


def _check_url(url: Any, name: str) -> str:
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InputError(name, f"must be an http:// or https:// URL, got {url!r}")
    return url


def check_headers(headers: Any, name: str) -> tuple[tuple[str, str], ...]:
    """Request headers as (name, value) pairs: names HTTP tokens, values strings of visible ASCII (and
    spaces); InputError naming ``name`` and the header otherwise, so a call never fails on them."""
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    try:
        pairs = tuple(pairs)
    except TypeError:
        raise InputError(name, f"headers must be a mapping of names to strings, got {headers!r:.80}") from None
    for pair in pairs:
        if not (isinstance(pair, tuple) and len(pair) == 2):
            raise InputError(name, f"headers must be (name, value) pairs, got {pair!r:.80}")
        key, value = pair
        if not isinstance(key, str) or not _TOKEN.match(key):
            raise InputError(f"{name}.{key}", f"header name {key!r:.80} is not an HTTP token (letters, digits, -)")
        if not isinstance(value, str) or not all(c == "\t" or " " <= c <= "~" for c in value):
            raise InputError(f"{name}.{key}", f"the value of header {key} must be a string of visible ASCII "
                             f"characters, got {value!r:.80}")
    return pairs


def _positive_seconds(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise InputError(name, f"must be a positive, finite number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Endpoint:
    """How one tool is called: ``method`` and ``url``; ``{name}`` placeholders in the URL are filled from
    the arguments of that name (and removed from them); the other arguments go as query parameters for
    GET and DELETE, as a JSON body otherwise. ``headers`` are sent with every request."""

    method: str
    url: str
    headers: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise InputError("method", f"must be one of {METHODS}, got {self.method!r}")
        _check_url(self.url, "url")
        object.__setattr__(self, "headers", check_headers(self.headers, "headers"))

    def request_parts(self, arguments: Mapping[str, Any] | None) -> tuple[str, dict[str, Any] | None, Any]:
        """(URL, query parameters, JSON body) of a call with ``arguments`` (None: no body at all, which
        the tool service plays as a call without arguments)."""
        rest = dict(arguments or {})

        def fill(match: re.Match[str]) -> str:
            name = match.group(1)
            if name not in rest:
                raise InputError(name, f"argument {name!r} is required: it is part of the URL {self.url}")
            value = rest.pop(name)
            return quote(value if isinstance(value, str) else json.dumps(value), safe="")

        url = _PLACEHOLDER.sub(fill, self.url)
        if self.method in ("GET", "DELETE"):
            params = {k: v if isinstance(v, str) else json.dumps(v) for k, v in rest.items()}
            return url, params or None, None
        return url, None, None if arguments is None else rest


@dataclass(frozen=True)
class HttpOutcome:
    """What one HTTP attempt really gave: success and the error code the episode records, the HTTP status
    (None: no response: timeout or dropped connection), seconds to the answer (or to the timeout), the
    error class (``http_faults.ERROR_CLASSES``; None on success), the 429's Retry-After in seconds, the
    body as JSON (``output``; None when it is none) and as text, and the attempt number (1 = first)."""

    tool: str
    success: bool
    error_code: str | None
    status: int | None
    latency_s: float
    error_class: str | None = None
    retry_after: float | None = None
    output: Any = None
    body: str = ""
    description: str | None = None
    attempt: int = 1
    world_duration: float | None = None  # the tool service's X-Call-Duration (failure processes on)
    wait_turns: int | None = None  # the tool service's X-Retry-After-Turns


def _world_timing(headers: Mapping[str, str]) -> dict[str, Any]:
    """``world_duration`` and ``wait_turns`` from the tool service's headers (absent: None)."""
    try:
        duration = headers.get(DURATION_HEADER)
        wait = headers.get(WAIT_TURNS_HEADER)
        return {"world_duration": None if duration is None else float(duration),
                "wait_turns": None if wait is None else int(wait)}
    except ValueError:  # not our service's headers
        return {"world_duration": None, "wait_turns": None}


class ToolClient:
    """Calls tools over HTTP. Give ``base_url`` (our tool service: ``POST {base}/tools/{name}``) or
    ``endpoints`` (tool name -> ``Endpoint``, for registered live APIs); ``timeout`` is a call's total
    deadline in seconds and ``max_bytes`` the largest body it reads (``resilibench.outbound``). ``max_retries`` (default 0) more attempts are made after a 429 whose Retry-After is at most
    ``retry_after_cap`` seconds (waiting that long), a 5xx, a dropped connection or a malformed body
    (waiting ``backoff * 2**(attempt-1)``); a timed-out request is never sent again (the service may have
    acted on it). ``log``: a call-log file that ``HttpExecutor`` appends one row per attempt to.
    ``registry`` gives each tool's error codes (default: the 30 tools). Use as a context manager, or
    ``close()``."""

    def __init__(self, base_url: str | None = None, endpoints: Mapping[str, Endpoint] | None = None, *,
                 timeout: float = 10.0, max_retries: int = 0, retry_after_cap: float = 5.0,
                 backoff: float = 0.1, log: str | Path | None = None, registry: ToolRegistry | None = None,
                 headers: Mapping[str, str] | None = None, max_bytes: int = DEFAULT_MAX_BYTES):
        if (base_url is None) == (endpoints is None):
            raise InputError("base_url", "give either a base URL (the tool service) or endpoints (live APIs)")
        self.base_url = None if base_url is None else _check_url(base_url, "base_url").rstrip("/")
        self.endpoints = dict(endpoints or {})
        for name, endpoint in self.endpoints.items():
            if not isinstance(endpoint, Endpoint):
                raise InputError("endpoints", f"the endpoint of {name!r} must be an Endpoint, got {endpoint!r}")
        self.timeout = _positive_seconds(timeout, "timeout")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise InputError("max_retries", f"must be an integer >= 0, got {max_retries!r}")
        self.max_retries = max_retries
        self.retry_after_cap = _positive_seconds(retry_after_cap, "retry_after_cap")
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff < math.inf:
            raise InputError("backoff", f"must be a finite number of seconds >= 0, got {backoff!r}")
        self.backoff = float(backoff)
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InputError("max_bytes", f"must be an integer >= 1, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.log = None if log is None else Path(log)
        self.registry = registry or default_registry()
        self.headers = dict(check_headers(headers or {}, "headers"))
        self._http = http_client(self.timeout)

    def _fetch(self, method: str, url: str, headers: Mapping[str, str] | None = None, **request: Any) -> Reply:
        return fetch(self._http, method, url, timeout=self.timeout, max_bytes=self.max_bytes,
                     headers={**self.headers, **(headers or {})}, **request)

    def _control(self, method: str, url: str, **request: Any) -> Reply:
        """A request to the tool service's control routes; InputError naming ``api`` when it cannot be made."""
        try:
            return self._fetch(method, url, **request)
        except (httpx.HTTPError, ResponseTooLarge) as exc:
            raise InputError("api", f"the tool service at {self.base_url} did not answer {method} {url}: "
                             f"{type(exc).__name__}: {exc}") from None

    @property
    def is_service(self) -> bool:
        """Whether the tools are our tool service (which plays episodes: ``open_episode``)."""
        return self.base_url is not None

    def endpoint(self, tool: str) -> Endpoint:
        """The endpoint of ``tool``; InputError naming ``tool`` when no endpoint is registered for it."""
        if self.base_url is not None:
            return Endpoint("POST", f"{self.base_url}/tools/{quote(tool, safe='')}")
        try:
            return self.endpoints[tool]
        except KeyError:
            raise InputError("tool", f"no endpoint for tool {tool!r}; registered: {sorted(self.endpoints)}") from None

    def open_episode(self, task_id: str, seed: int, config: Mapping[str, Any] | None = None) -> str:
        """Open an episode of the tool service (task, episode seed; ``config``: the client's world config as
        a dict, which the service checks against its own) and return its id for ``X-Episode``."""
        if self.base_url is None:
            raise InputError("base_url", "episodes exist only on the tool service (a client made with a base URL)")
        body: dict[str, Any] = {"task_id": task_id, "seed": seed}
        if config is not None:
            body["config"] = config
        response = self._control("POST", f"{self.base_url}/episodes", json=body)
        data = _json_or_none(response)
        if response.status != 201 or not isinstance(data, dict) or not isinstance(data.get("episode"), str):
            error = data.get("error") if isinstance(data, dict) else None
            detail = error.get("description") if isinstance(error, dict) else response.text[:200]
            raise InputError("episode", f"the tool service refused the episode ({response.status}): {detail}")
        return data["episode"]

    def episode_state(self, episode: str) -> dict[str, Any]:
        """The tool service's view of an episode (``GET /episodes/{id}``): turns_used, time_used, end_reason,
        level."""
        response = self._control("GET", f"{self.base_url}/episodes/{episode}")
        data = _json_or_none(response)
        if response.status != 200 or not isinstance(data, dict):
            raise InputError("episode", f"the tool service has no episode {episode!r} ({response.status})")
        return data

    def request(self, tool: str, arguments: Mapping[str, Any] | None = None, *, episode: str | None = None,
                headers: Mapping[str, str] | None = None, attempt: int = 1) -> HttpOutcome:
        """One HTTP attempt at ``tool`` (``episode``: the tool service's episode id, sent as X-Episode)."""
        endpoint = self.endpoint(tool)
        url, params, body = endpoint.request_parts(arguments)
        sent = dict(endpoint.headers)
        if episode is not None:
            sent[EPISODE_HEADER] = episode
        sent.update(headers or {})
        codes = self.registry[tool].error_codes if tool in self.registry else ()
        start = time.perf_counter()
        try:
            response = self._fetch(endpoint.method, url, sent, params=params, json=body)
        except httpx.TimeoutException as exc:
            return self._failure(tool, hf.TIMEOUT_CLASS, start, attempt, f"no answer within {self.timeout} s ({exc!r})")
        except ResponseTooLarge as exc:
            return self._failure(tool, hf.MALFORMED_BODY, start, attempt, str(exc))
        except httpx.RequestError as exc:  # refused, reset, closed without a response, redirected in circles
            return self._failure(tool, hf.CONNECTION, start, attempt, f"connection failed: {exc!r}")
        latency = time.perf_counter() - start
        timing = _world_timing(response.headers)
        status, text = response.status, response.text
        data = _json_or_none(response)
        error_class = hf.class_of_status(status)
        if error_class is None:
            if data is None and _says_json(response):
                return HttpOutcome(tool, False, hf.code_of(hf.MALFORMED_BODY), status, latency, hf.MALFORMED_BODY,
                                   body=text, description="the response body is not valid JSON", attempt=attempt,
                                   **timing)
            return HttpOutcome(tool, True, None, status, latency, output=data if data is not None else text,
                               body=text, attempt=attempt, **timing)
        error = data.get("error") if isinstance(data, dict) else None
        body_code = error.get("code") if isinstance(error, dict) else None
        description = error.get("description") if isinstance(error, dict) else None
        retry_after = retry_after_seconds(response.headers.get("retry-after")) if status == 429 else None
        return HttpOutcome(tool, False, hf.code_of(error_class, status, body_code, codes), status, latency,
                           error_class, retry_after, data, text, description or f"HTTP {status}", attempt, **timing)

    def retry_delay(self, outcome: HttpOutcome) -> float | None:
        """Seconds to wait before another attempt after ``outcome``, or None: no retry (success, a
        timeout, a client error, a Retry-After beyond the cap, or the attempts used up)."""
        if outcome.success or outcome.attempt > self.max_retries:
            return None
        if outcome.error_class == hf.RATE_LIMITED:
            wait = outcome.retry_after or 0.0
            return wait if wait <= self.retry_after_cap else None
        if outcome.error_class in (hf.SERVER_ERROR, hf.UNAVAILABLE, hf.CONNECTION, hf.MALFORMED_BODY):
            return self.backoff * 2 ** (outcome.attempt - 1)
        return None

    def call(self, tool: str, arguments: Mapping[str, Any] | None = None, *,
             episode: str | None = None) -> HttpOutcome:
        """Call ``tool`` with up to ``max_retries`` retries (no episode of ours involved, no log); the last
        attempt's outcome."""
        outcome = self.request(tool, arguments, episode=episode)
        while (delay := self.retry_delay(outcome)) is not None:
            time.sleep(delay)
            outcome = self.request(tool, arguments, episode=episode, attempt=outcome.attempt + 1)
        return outcome

    def _failure(self, tool: str, error_class: str, start: float, attempt: int, description: str) -> HttpOutcome:
        return HttpOutcome(tool, False, hf.code_of(error_class), None, time.perf_counter() - start, error_class,
                           description=description, attempt=attempt)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ToolClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _says_json(response: Reply) -> bool:
    kind = response.headers.get("content-type", "").split(";")[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _json_or_none(response: Reply) -> Any:
    try:
        return json.loads(response.content) if response.content else None
    except (ValueError, UnicodeDecodeError):
        return None


@dataclass
class HttpExecutor:
    """Plays ``episode``'s tool calls over HTTP through ``client``.

    Call tools with ``call(tool, arguments)`` (or pass the executor as ``Episode.call``'s ``outcome`` after
    setting ``arguments``). Rules that answer without a draw still answer without a request. Against the
    tool service the executor opens a service episode of the same task, seed and world (``mirror``), and
    sends the calls answered without a request along with the next one (``X-Episode-Replay``), so the
    service's episode meets exactly the calls of this one and the outcomes are the simulator's.
    ``last_outcome`` and ``last_output`` hold the latest attempt's ``HttpOutcome`` and its JSON body (what
    a front end shows instead of the simulated output); ``outcomes`` all of them. Log rows (when the client
    has a log) name the episode ``log_episode`` (default ``<task id>/<seed>/<process id>-<k>``, ``k``
    counting the executors of this process: unique when a run plays one task and seed twice, as two
    planners do, or when runs append to one log). With ``whole_episodes`` (the default) they reach the log
    in one write when the episode ends, so a run killed mid-episode leaves none of its rows to be logged
    again when the run resumes; without it (a server, whose clients may leave episodes unfinished and which
    resumes nothing) each call's row is written at once."""

    client: ToolClient
    episode: Episode
    log_episode: str | None = None
    mirror: bool | None = None  # None: when the client is the tool service
    arguments: Mapping[str, Any] | None = None
    whole_episodes: bool = True  # log rows when the episode ends (False: each call's row at once)
    service_episode: str | None = field(default=None, init=False)
    last_outcome: HttpOutcome | None = field(default=None, init=False)
    outcomes: list[HttpOutcome] = field(default_factory=list, init=False)
    log_rows: list[CallLogRow] = field(default_factory=list, init=False)  # written when the episode ends

    def __post_init__(self) -> None:
        if self.mirror is None:
            self.mirror = self.client.is_service
        if self.client.log is not None and self.whole_episodes:
            self.episode.end_listeners.append(self._write_log)
        if self.log_episode is None:
            self.log_episode = f"{self.episode.task.instance_id}/{self.episode.seed}/{LOG_RUN}-{next(_LOGGED)}"
        if not self.client.is_service:
            missing = [n for n in self.episode.registry.names if n not in self.client.endpoints]
            if missing:
                raise InputError("endpoints", f"no endpoint for tool(s) {missing} of the episode's registry")
        if self.mirror:
            if self.episode.turns_used:
                raise InputError("episode", "a mirrored episode must start with the executor: this one has "
                                 f"used {self.episode.turns_used} turns already")
            self.service_episode = self.client.open_episode(self.episode.task.instance_id, self.episode.seed,
                                                            self.episode.config.to_dict())
        self._sent = 0  # trace records the service has seen
        self._attempt = 1

    @property
    def last_output(self) -> Any:
        """The JSON body (or text) of the latest attempt of the latest ``call``; None when it had none or
        the call made no request (then the simulated output stands)."""
        return None if self.last_outcome is None else self.last_outcome.output

    def call(self, tool: str | int, arguments: Mapping[str, Any] | None = None,
             invalid_input: bool = False) -> CallRecord:
        """Call ``tool`` on the episode, retrying as the client allows while the episode can take another
        call of it; each attempt is one call (one turn). The last attempt's record."""
        self.arguments, self.last_outcome = arguments, None
        episode = self.episode
        tool_id = episode.registry.id_of(tool) if isinstance(tool, str) else int(tool)
        attempt = 1
        while True:
            before = len(self.outcomes)
            self._attempt = attempt
            record = episode.call(tool_id, invalid_input=invalid_input, outcome=self)
            if len(self.outcomes) == before or record.success or episode.done or episode.turns_left == 0:
                return record
            if episode.calls[tool_id] >= episode.max_calls:
                return record
            delay = self.client.retry_delay(self.outcomes[-1])
            if delay is None:
                return record
            time.sleep(delay)
            attempt += 1

    def __call__(self, tool_id: int) -> tuple[bool, str | None, float, int | None]:
        """The real call in place of the draw (``Episode.call``'s ``outcome``): (success, error code,
        duration, rate-limit wait in turns). The duration is the world's (our service's X-Call-Duration)
        or, without it, the seconds the call really took; the episode counts it only under a time budget."""
        episode = self.episode
        name = episode.registry.names[tool_id]
        headers = {}
        if self.mirror:
            unsent = [[r.tool, r.error_code] for r in episode.trace[self._sent:]]
            if unsent:
                headers[REPLAY_HEADER] = json.dumps(unsent)
        try:
            outcome = self.client.request(name, self.arguments, episode=self.service_episode, headers=headers,
                                          attempt=self._attempt)
        except InputError as exc:  # arguments the endpoint cannot carry (a URL parameter missing): no request
            error = {"code": INVALID_INPUT, "description": f"{name}: {exc}"}
            self.last_outcome = HttpOutcome(name, False, INVALID_INPUT, None, 0.0, description=error["description"],
                                            output={"success": False, "error": error})
            return False, INVALID_INPUT, 0.0, None  # not sent: a mirror replays it with the next request
        finally:
            self._attempt = 1  # a later call made straight through Episode.call is a first attempt
        self._sent = len(episode.trace) + 1  # this call's record is appended when we return
        self.last_outcome = outcome
        self.outcomes.append(outcome)
        world_duration = outcome.world_duration
        if world_duration is None and self.mirror and episode.config.processes.active:
            # A timeout or a dropped connection carries no header: the service's episode has the clock.
            world_duration = self.client.episode_state(str(self.service_episode))["time_used"] - episode.time_used
        if self.client.log is not None:
            n_uncalled, n_failed, n_history = episode.covariates(tool_id)
            self.log_rows.append(CallLogRow(
                "http", episode.task.instance_id, str(self.log_episode), episode.turns_used, name, n_uncalled,
                n_failed, n_history, outcome.success, outcome.error_code, outcome.status,
                round(outcome.latency_s, 6), outcome.error_class, outcome.retry_after, outcome.attempt,
                world_duration, outcome.wait_turns))
            if not self.whole_episodes:
                self._write_log(episode)
        duration = outcome.latency_s if world_duration is None else world_duration
        return outcome.success, outcome.error_code, duration, outcome.wait_turns

    def _write_log(self, episode: Episode) -> None:
        """Append the rows not yet logged to the client's log."""
        assert self.client.log is not None  # registered only then
        write_rows(self.client.log, self.log_rows)
        self.log_rows.clear()
