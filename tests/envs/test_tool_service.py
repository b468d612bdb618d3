"""The HTTP tool service, the fault table and the HTTP client, over real sockets on loopback.

Faults are never staged: each test finds, with a plain simulator Episode, a seed whose call draws the
wanted error code, then opens a service episode with that seed and looks at what the wire shows.
"""

from __future__ import annotations

import email.utils
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import httpx2 as httpx
import pytest
from jsonschema import Draft202012Validator

from helpers import with_ctrl_c
from resilibench.cli import main
from resilibench.core.config import WorldConfig
from resilibench.core.registry import default_registry
from resilibench.core.simulator import Episode, run_episode_seed
from resilibench.core.world import load_tasks
from resilibench.envs.real_api import http_faults as hf
from resilibench.envs.real_api.call_log import read_rows
from resilibench.envs.real_api.client import REPLAY_HEADER, Endpoint, HttpExecutor, ToolClient
from resilibench.envs.real_api.service import ToolService, running_service
from resilibench.errors import InputError

SLOW, TIMEOUT, RETRY_AFTER = 1.2, 0.5, 0.05  # a normal answer takes milliseconds: far below TIMEOUT
TASK = load_tasks(split="test")[0]
STRICT = WorldConfig().replace(rules={"strict_dependencies": True})


@pytest.fixture(scope="module")
def service():
    return ToolService(slow_seconds=SLOW, retry_after=RETRY_AFTER)


@pytest.fixture(scope="module")
def base_url(service):
    with running_service(service) as url:
        yield url


@pytest.fixture
def client(base_url):
    with ToolClient(base_url, timeout=TIMEOUT) as c:
        yield c


def seed_for(tool: str, code: str | None, config: WorldConfig | None = None) -> int:
    """The first episode seed whose first call (of ``tool``, on TASK) gives ``code`` in the simulator."""
    for seed in range(20_000):
        record = Episode.start(TASK, seed, config).call(tool)
        if record.error_code == code:
            return seed
    raise AssertionError(f"no seed gives {code} for {tool}")


def test_fault_table_reads_back_every_code():
    """Every code of every tool, rendered by the service's side of the table, reads back as that code."""
    for tool in default_registry().tools:
        for code in tool.error_codes:
            fault = hf.fault_of(code)
            if fault.kind == hf.DROP:
                error_class, status = hf.CONNECTION, None
            elif fault.kind == hf.MALFORMED:
                error_class, status = hf.MALFORMED_BODY, None
            else:
                error_class, status = hf.class_of_status(fault.status), fault.status
            assert error_class == fault.error_class, code
            assert hf.code_of(error_class, status, code, tool.error_codes) == code, (tool.name, code)
    # A body code that is not the tool's gives way to the status's code, then the class's.
    assert hf.code_of(hf.CLIENT_ERROR, 404, "UNKNOWN_TOOL", ("TIMEOUT",)) == "FILE_NOT_FOUND"
    assert hf.code_of(hf.SERVER_ERROR, 500, "DEPENDENCY_ERROR", ("TIMEOUT",)) == "OPERATION_FAILED"
    assert hf.class_of_status(200) is None and hf.class_of_status(418) == hf.CLIENT_ERROR
    assert hf.class_of_status(304) == hf.CLIENT_ERROR and hf.class_of_status(502) == hf.SERVER_ERROR


@pytest.mark.parametrize(("tool", "code", "status", "error_class"), [
    ("network_fetcher", None, 200, None),
    ("network_fetcher", "TIMEOUT", None, hf.TIMEOUT_CLASS),
    ("network_fetcher", "RATE_LIMIT_ERROR", 429, hf.RATE_LIMITED),
    ("integration_connector", "SERVICE_UNAVAILABLE", 503, hf.UNAVAILABLE),
    ("network_fetcher", "NETWORK_ERROR", None, hf.CONNECTION),
    ("data_processing_parser", "SCHEMA_MISMATCH", 200, hf.MALFORMED_BODY),
    ("integration_connector", "AUTHENTICATION_FAILED", 401, hf.CLIENT_ERROR),
    ("file_operations_reader", "PERMISSION_DENIED", 403, hf.CLIENT_ERROR),
    ("file_operations_reader", "FILE_NOT_FOUND", 404, hf.CLIENT_ERROR),
    ("network_fetcher", "INVALID_INPUT", 422, hf.CLIENT_ERROR),
    ("network_fetcher", "OPERATION_FAILED", 500, hf.SERVER_ERROR),
    ("computation_optimizer", "OVERFLOW", 500, hf.SERVER_ERROR),
])
def test_each_fault_end_to_end(client, tool, code, status, error_class):
    episode = client.open_episode(TASK.instance_id, seed_for(tool, code))
    outcome = client.request(tool, episode=episode)
    assert (outcome.success, outcome.error_code, outcome.status, outcome.error_class) == (
        code is None, code, status, error_class)
    if code is None:
        assert outcome.output["success"] is True and outcome.output["episode"] == episode
    elif code == "TIMEOUT":
        assert outcome.latency_s >= TIMEOUT  # it gave up: the answer would have come after SLOW
    elif code == "RATE_LIMIT_ERROR":
        assert outcome.retry_after == pytest.approx(RETRY_AFTER)
    elif code == "SCHEMA_MISMATCH":
        assert outcome.output is None and outcome.body.startswith('{"success": false')
    elif status is not None:
        assert outcome.output["error"]["code"] == code and outcome.description


def test_timeout_answer_arrives_after_the_slow_delay(base_url):
    """A client that waits longer than the slow delay gets the 504 that carries TIMEOUT."""
    with ToolClient(base_url, timeout=SLOW * 4) as patient:
        episode = patient.open_episode(TASK.instance_id, seed_for("network_fetcher", "TIMEOUT"))
        outcome = patient.request("network_fetcher", episode=episode)
    assert (outcome.status, outcome.error_code, outcome.error_class) == (504, "TIMEOUT", hf.TIMEOUT_CLASS)
    assert outcome.latency_s >= SLOW


def _raw_exchange(base_url: str, request: bytes) -> bytes:
    parts = urlsplit(base_url)
    with socket.create_connection((parts.hostname, parts.port), timeout=5) as sock:
        sock.sendall(request)
        received = b""
        try:
            while chunk := sock.recv(65536):
                received += chunk
        except ConnectionResetError:  # an aborted connection may end in a reset: still nothing received
            pass
    return received


def test_dropped_connection_sends_no_byte(service, client, base_url):
    episode = client.open_episode(TASK.instance_id, seed_for("network_fetcher", "NETWORK_ERROR"))
    request = (f"POST /tools/network_fetcher HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Episode: {episode}\r\n"
               "Content-Length: 0\r\n\r\n").encode()
    assert _raw_exchange(base_url, request) == b""
    with service.episodes.use(episode) as played:  # the call was played: its failure is on the episode
        assert [(r.tool, r.error_code) for r in played.trace] == [("network_fetcher", "NETWORK_ERROR")]


def test_schema_check_is_invalid_input_naming_the_argument(client):
    episode = client.open_episode(TASK.instance_id, 0)
    outcome = client.request("network_fetcher", {"source": 3}, episode=episode)
    assert (outcome.status, outcome.error_code) == (422, "INVALID_INPUT")
    assert "argument 'source'" in outcome.description
    outcome = client.request("network_fetcher", {"nope": 1}, episode=episode)
    assert outcome.error_code == "INVALID_INPUT" and "nope" in outcome.description


def test_retry_honours_retry_after_and_each_attempt_is_a_turn(base_url, tmp_path):
    seed = seed_for("network_fetcher", "RATE_LIMIT_ERROR")
    log = tmp_path / "calls.jsonl"
    with ToolClient(base_url, timeout=TIMEOUT, max_retries=2, log=log) as retrying:
        episode = Episode.start(TASK, seed)
        executor = HttpExecutor(retrying, episode)
        started = time.perf_counter()
        record = executor.call("network_fetcher")
        elapsed = time.perf_counter() - started
        episode.finish()  # an episode's rows reach the log when it ends
    reference = Episode.start(TASK, seed)
    expected = [reference.call("network_fetcher") for _ in executor.outcomes]
    assert [(r.success, r.error_code) for r in episode.trace] == [(r.success, r.error_code) for r in expected]
    assert executor.outcomes[0].status == 429 and len(executor.outcomes) >= 2
    assert [o.attempt for o in executor.outcomes] == list(range(1, len(executor.outcomes) + 1))
    assert episode.turns_used == len(executor.outcomes) and record == episode.trace[-1]
    assert elapsed >= RETRY_AFTER
    rows = list(read_rows(log))
    assert [(r.attempt, r.turn, r.status, r.error_code) for r in rows] == [
        (o.attempt, i + 1, o.status, o.error_code) for i, o in enumerate(executor.outcomes)]
    assert rows[0].retry_after == pytest.approx(RETRY_AFTER) and rows[0].error_class == hf.RATE_LIMITED


def test_no_retry_past_the_retry_after_cap_nor_after_a_timeout(base_url):
    with ToolClient(base_url, timeout=TIMEOUT, max_retries=3, retry_after_cap=RETRY_AFTER / 2) as c:
        for code in ("RATE_LIMIT_ERROR", "TIMEOUT"):
            executor = HttpExecutor(c, Episode.start(TASK, seed_for("network_fetcher", code)))
            executor.call("network_fetcher")
            assert [o.error_code for o in executor.outcomes] == [code]


def test_server_errors_are_retried_with_backoff(base_url):
    with ToolClient(base_url, timeout=TIMEOUT, max_retries=1, backoff=0.01) as c:
        executor = HttpExecutor(c, Episode.start(TASK, seed_for("network_fetcher", "OPERATION_FAILED")))
        executor.call("network_fetcher")
        assert [o.attempt for o in executor.outcomes] == [1, 2]
        assert c.call("network_fetcher").attempt == 1  # the default episode: no retry after a success


def _play(call, tools):
    """A fixed call sequence with out-of-order calls, invalid input and repeats (for strict dependencies:
    DEPENDENCY_ERROR, replays of successes and call caps)."""
    for i, tool in enumerate(tools):
        record = call(tool, i % 5 == 3)
        if record is None:
            return


def _sequence(task):
    required = list(task.required_tools)
    return [required[-1]] + required * 3


@pytest.mark.parametrize("config", [None, STRICT], ids=["default", "strict"])
def test_same_task_and_seed_give_the_simulators_trace(service, base_url, tmp_path, config):
    """Through the client and the service, an episode meets exactly a plain Episode's outcomes, with every
    rule that answers without a request (replay, call cap, invalid input, strict dependencies) in play."""
    log = tmp_path / "calls.jsonl"
    checked = 0
    with ToolClient(base_url, timeout=TIMEOUT, log=log) as c:
        for task in load_tasks(split="test")[:4]:
            for seed in range(3):
                over_http = Episode.start(task, seed, config)
                executor = HttpExecutor(c, over_http)
                plain = Episode.start(task, seed, config)
                for i, tool in enumerate(_sequence(task)):
                    if over_http.done or over_http.turns_left == 0:
                        break
                    executor.call(tool, invalid_input=i % 5 == 3)
                    plain.call(tool, invalid_input=i % 5 == 3)
                assert [(r.tool, r.success, r.error_code, r.turn, r.replayed) for r in over_http.trace] == [
                    (r.tool, r.success, r.error_code, r.turn, r.replayed) for r in plain.trace]
                assert over_http.end_reason == plain.end_reason
                if not over_http.done:
                    over_http.finish()  # an episode's rows reach the log when it ends
                with service.episodes.use(executor.service_episode) as served:  # the service played them all
                    assert [tuple(r) for r in served.trace] == [tuple(r) for r in plain.trace[:len(served.trace)]]
                    assert all(r.probability is None for r in plain.trace[len(served.trace):])  # not sent yet
                checked += sum(r.probability is not None for r in plain.trace)
    assert checked >= 20
    # One row per request, with the simulator's covariates at that call.
    rows = list(read_rows(log))
    assert len(rows) == checked and all(r.source == "http" for r in rows)


def test_log_rows_carry_the_covariates(base_url, tmp_path):
    log = tmp_path / "calls.jsonl"
    task = next(t for t in load_tasks(split="test") if len(t.required_tools) >= 3)
    with ToolClient(base_url, timeout=TIMEOUT, log=log) as c:
        episode = Episode.start(task, 5)
        executor = HttpExecutor(c, episode, log_episode="run-1")
        shadow = Episode.start(task, 5)
        expected = []
        for tool in reversed(task.required_tools):
            expected.append(shadow.covariates(shadow.registry.id_of(tool)))
            shadow.call(tool)
            executor.call(tool)
        assert not log.exists()  # the episode is running: none of its rows is logged yet
        episode.finish()
    rows = list(read_rows(log))
    assert [(r.n_uncalled, r.n_failed, r.n_history) for r in rows] == expected
    assert {(r.task_id, r.episode) for r in rows} == {(task.instance_id, "run-1")}
    assert [r.success for r in rows] == [r.success for r in episode.trace]


def test_openapi_document(client, base_url):
    document = httpx.get(f"{base_url}/openapi.json").json()
    registry = default_registry()
    assert document["openapi"] == "3.1.0"
    operations = [(path, method, op) for path, item in document["paths"].items() for method, op in item.items()]
    assert len(operations) == 30
    assert sorted(op["operationId"] for _, _, op in operations) == sorted(registry.names)
    for path, method, op in operations:
        tool = registry[op["operationId"]]
        assert (path, method) == (f"/tools/{tool.name}", "post")
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        assert schema == tool.input_schema()
        Draft202012Validator.check_schema(schema)
        assert {"200", "422", "429", "500", "503", "504"} <= set(op["responses"])
        assert "Retry-After" in op["responses"]["429"]["headers"]
        ref = op["responses"]["500"]["content"]["application/json"]["schema"]["$ref"]
        assert ref.split("/")[-1] in document["components"]["schemas"]
    try:
        from openapi_spec_validator import validate
    except ImportError:
        return
    validate(document)


def test_bad_requests_are_named(client, base_url):
    def error(response, status):
        assert response.status_code == status, response.text
        return response.json()["error"]

    assert error(httpx.post(f"{base_url}/tools/no_such_tool", json={}), 404)["field"] == "name"
    assert error(httpx.post(f"{base_url}/tools/network_fetcher", headers={"X-Episode": "ep-0"}), 404)[
        "field"] == "X-Episode"
    assert error(httpx.post(f"{base_url}/episodes", content=b"{"), 400)["field"] == "body"
    assert error(httpx.post(f"{base_url}/episodes", json={"task_id": "nope"}), 404)["field"] == "task_id"
    assert error(httpx.post(f"{base_url}/episodes", json={"task_id": TASK.instance_id, "seed": -1}), 422)[
        "field"] == "seed"
    other = WorldConfig().replace(failure={"base_success": 0.5}).to_dict()
    assert error(httpx.post(f"{base_url}/episodes", json={"task_id": TASK.instance_id, "config": other}), 409)[
        "field"] == "config.failure"
    bad = WorldConfig().to_dict() | {"rules": {"turn_limit": 0}}
    assert error(httpx.post(f"{base_url}/episodes", json={"task_id": TASK.instance_id, "config": bad}), 422)[
        "field"] == "config.rules.turn_limit"
    episode = client.open_episode(TASK.instance_id, 0)
    assert error(httpx.post(f"{base_url}/tools/network_fetcher", headers={"X-Episode": episode, REPLAY_HEADER: "x"}),
                 400)["field"] == REPLAY_HEADER
    # Bad JSON arguments are the agent's error: INVALID_INPUT on the episode, costing the turn.
    response = httpx.post(f"{base_url}/tools/network_fetcher", content=b"{'url':", headers={"X-Episode": episode})
    body = response.json()
    assert response.status_code == 422 and body["error"]["code"] == "INVALID_INPUT"
    assert "not JSON" in body["error"]["description"] and body["turns_left"] == 9
    deep = b"[" * 100_000 + b"]" * 100_000  # too deep for the JSON reader: still the agent's bad JSON
    response = httpx.post(f"{base_url}/tools/network_fetcher", content=deep, headers={"X-Episode": episode})
    assert response.status_code == 422 and response.json()["turns_left"] == 8
    assert error(httpx.post(f"{base_url}/episodes", content=deep), 400)["field"] == "body"
    with pytest.raises(InputError, match="episode"):
        client.open_episode("nope", 0)


def test_replay_that_the_service_would_draw_is_refused(client, base_url):
    """A client whose episode is not the service's (it says a call was answered without a draw where the
    service draws) is told so instead of meeting other outcomes silently."""
    episode = client.open_episode(TASK.instance_id, 0)
    response = httpx.post(f"{base_url}/tools/network_fetcher",
                          headers={"X-Episode": episode, REPLAY_HEADER: '[["network_router", "DEPENDENCY_ERROR"]]'})
    assert response.status_code == 409 and response.json()["error"]["code"] == "REPLAY_MISMATCH"


def test_default_episode_restarts_when_it_ends(base_url):
    with ToolClient(base_url, timeout=TIMEOUT) as c:
        handles = []
        for _ in range(12):  # more calls than turns: the default episode must start anew
            outcome = c.request("utility_logger", {"message": "hi"})
            assert outcome.error_class in (None, hf.TIMEOUT_CLASS, hf.SERVER_ERROR, hf.CLIENT_ERROR)
            if outcome.output is not None:
                handles.append(outcome.output["episode"])
        assert len(set(handles)) >= 2
    health = httpx.get(f"{base_url}/health").json()
    assert health["status"] == "ok" and health["tools"] == 30


def test_client_checks_its_settings():
    with pytest.raises(InputError, match="base_url"):
        ToolClient()
    with pytest.raises(InputError, match="timeout"):
        ToolClient("http://127.0.0.1:1", timeout=0)
    with pytest.raises(InputError, match="max_retries"):
        ToolClient("http://127.0.0.1:1", max_retries=-1)
    with pytest.raises(InputError, match="method"):
        Endpoint("FETCH", "http://x")
    endpoint = Endpoint("GET", "https://api.example/items/{item_id}")
    assert endpoint.request_parts({"item_id": "a b", "limit": 3}) == (
        "https://api.example/items/a%20b", {"limit": "3"}, None)
    with pytest.raises(InputError, match="item_id"):
        endpoint.request_parts({})


class _LiveApi(BaseHTTPRequestHandler):
    """A stand-in for a live API that is not our service: text answers, its own error bodies."""

    def _answer(self, status: int, body: bytes, kind: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):  # noqa: N802 (http.server's name)
        parts = urlsplit(self.path)
        self._answer(200, f"{unquote(parts.path)}?{parts.query} key={self.headers['X-Key']}".encode(), "text/plain")

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/echo":
            self._answer(200, body, "application/json")
        elif self.path == "/broken":
            self._answer(200, b'{"data": ', "application/json")
        elif self.path == "/limited":
            when = email.utils.format_datetime(datetime.now(UTC) + timedelta(seconds=30), usegmt=True)
            self._answer(429, b"slow down", "text/plain", Retry_After=when)
        else:
            self._answer(500, json.dumps({"error": {"code": "TIMEOUT", "description": "upstream"}}).encode(),
                         "application/json")

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def live_api():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _LiveApi)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_live_api_through_endpoints(live_api):
    """Path and query parameters, endpoint headers, text bodies, malformed JSON, a 429 with an HTTP date
    and a foreign error body, as a live API shows them."""
    endpoints = {
        "network_fetcher": Endpoint("GET", f"{live_api}/items/{{item_id}}", (("X-Key", "k1"),)),
        "network_poster": Endpoint("POST", f"{live_api}/echo"),
        "data_processing_parser": Endpoint("POST", f"{live_api}/broken"),
        "network_router": Endpoint("POST", f"{live_api}/limited"),
        "computation_optimizer": Endpoint("POST", f"{live_api}/fails"),
    }
    with ToolClient(endpoints=endpoints, timeout=5) as c:
        got = c.request("network_fetcher", {"item_id": "a b", "limit": 3})
        assert (got.success, got.status, got.output) == (True, 200, "/items/a b?limit=3 key=k1")
        got = c.request("network_poster", {"destination": "x", "data": {"n": 1}})
        assert got.output == {"destination": "x", "data": {"n": 1}}
        got = c.request("data_processing_parser", {})
        assert (got.success, got.error_class, got.error_code) == (False, hf.MALFORMED_BODY, "SCHEMA_MISMATCH")
        got = c.request("network_router", {})
        assert (got.status, got.error_code) == (429, "RATE_LIMIT_ERROR") and 25 < got.retry_after <= 30
        assert c.retry_delay(got) is None  # beyond the cap (and no retries configured)
        got = c.request("computation_optimizer", {})
        assert (got.status, got.error_class, got.error_code, got.description) == (500, hf.SERVER_ERROR, "TIMEOUT",
                                                                                  "upstream")
        assert not c.is_service
        with pytest.raises(InputError, match="tool"):
            c.request("utility_cache")
        with pytest.raises(InputError, match="endpoints"):  # a tool of the registry has no endpoint
            HttpExecutor(c, Episode.start(TASK, 0))
    # A call whose arguments cannot fill the URL is the agent's invalid input: no request, no broken episode.
    every = {name: Endpoint("GET", f"{live_api}/items/{{item_id}}") for name in default_registry().names}
    with ToolClient(endpoints=every, timeout=5) as c:
        episode = Episode.start(TASK, 0)
        executor = HttpExecutor(c, episode)
        record = executor.call("network_fetcher", {"limit": 1})
        assert (record.error_code, record.turn, executor.outcomes) == ("INVALID_INPUT", 1, [])
        assert "item_id" in executor.last_output["error"]["description"]
        assert executor.call("network_fetcher", {"item_id": "x"}).success and executor.last_output.startswith("/items/x")
        with pytest.raises(InputError, match="base_url"):
            HttpExecutor(c, Episode.start(TASK, 0), mirror=True)


def test_executor_plugs_into_episode_call_directly(base_url):
    """A front end may pass the executor as Episode.call's outcome itself, arguments set beforehand."""
    with ToolClient(base_url, timeout=TIMEOUT) as c:
        episode = Episode.start(TASK, 11)
        executor = HttpExecutor(c, episode)
        executor.arguments = {"source": 5}
        record = episode.call("network_fetcher", outcome=executor)
        assert (record.error_code, executor.last_outcome.status) == ("INVALID_INPUT", 422)
        assert "argument 'source'" in executor.last_output["error"]["description"]
        episode.call("network_fetcher", outcome=executor)
        assert [o.attempt for o in executor.outcomes] == [1, 1]
        with pytest.raises(InputError, match="episode"):
            HttpExecutor(c, episode)  # a mirror must start with the episode


def test_connection_refused_is_a_connection_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with ToolClient(f"http://127.0.0.1:{port}", timeout=TIMEOUT) as c:
        outcome = c.request("network_fetcher")
    assert (outcome.error_class, outcome.error_code, outcome.status) == (hf.CONNECTION, "NETWORK_ERROR", None)


@pytest.mark.parametrize(("argv", "needle"), [
    (["--host", "0.0.0.0"], "--allow-remote"),
    (["--task", "nope"], "--task: no task 'nope'"),
    (["--slow-seconds", "inf"], "--slow-seconds: must be a finite number of seconds >= 0, got inf"),
    (["--config", "missing.yaml"], "--config: config file missing.yaml does not exist"),
    (["--port", "70000"], "--port"),
])
def test_serve_tools_refuses_bad_options_in_one_line(argv, needle, capsys):
    assert main(["serve", "tools", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err


def test_serve_tools_refuses_a_taken_port(capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert main(["serve", "tools", "--port", str(taken.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1" in capsys.readouterr().err


def test_serve_tools_command():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-m", "resilibench", "serve", "tools", "--port", "0",
                                "--slow-seconds", "0.1"], stderr=subprocess.PIPE, text=True, env=env,
                               preexec_fn=with_ctrl_c)
    try:
        line = process.stderr.readline()
        url = line.split(" at ", 1)[1].split()[0]
        assert httpx.get(f"{url}/health").json()["status"] == "ok"
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=20) in (0, 130)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_loopback_service_refuses_foreign_host_headers():
    """DNS rebinding: a page of another site must not reach a loopback service through its own name."""
    with running_service(ToolService(host="127.0.0.1")) as url:
        assert httpx.get(f"{url}/health").status_code == 200
        assert httpx.get(f"{url}/health", headers={"Host": f"localhost:{urlsplit(url).port}"}).status_code == 200
        assert httpx.get(f"{url}/health", headers={"Host": "attacker.example"}).status_code == 400


PROCESSES = WorldConfig().replace(processes={
    "outage_start": 0.2, "outage_end": 0.4, "rate_limit_probability": 0.2, "rate_limit_wait": 2,
    "latency_seconds": [0.01, 0.02, 0.5], "latency_weights": [0.6, 0.3, 0.1], "call_timeout_seconds": 0.3,
    "time_budget_seconds": 0.32})


def test_failure_processes_over_http_keep_the_simulators_trace_and_clock():
    """Under every failure process at once (time_scale 0: the drawn durations are not slept), a mirrored
    episode meets the simulator's outcomes, its clock (timeouts and drops included, read back from the
    service) and its time budget; a rate-limit refusal's Retry-After is retry_after per turn until the tool answers again."""
    seen_codes, budget_ends = set(), 0
    with running_service(ToolService(config=PROCESSES, slow_seconds=SLOW, retry_after=RETRY_AFTER,
                                     time_scale=0)) as url, ToolClient(url, timeout=TIMEOUT) as c:
        for task in load_tasks(split="test")[:6]:
            for seed in range(3):
                over_http, plain = Episode.start(task, seed, PROCESSES), Episode.start(task, seed, PROCESSES)
                executor = HttpExecutor(c, over_http)
                for tool in list(task.required_tools) * 3:
                    if plain.done or plain.turns_left == 0:
                        break
                    executor.call(tool)
                    plain.call(tool)
                seen = [(r.tool, r.success, r.error_code, r.turn, r.duration, r.retry_after) for r in over_http.trace]
                assert seen == [(r.tool, r.success, r.error_code, r.turn, r.duration, r.retry_after) for r in plain.trace]
                assert (over_http.time_used, over_http.turns_left) == (plain.time_used, plain.turns_left)
                budget_ends += plain.turns_left == 0 and plain.turns_used < PROCESSES.rules.turn_limit
                seen_codes |= {r.error_code for r in over_http.trace}
                for outcome in executor.outcomes:
                    if outcome.error_code == "RATE_LIMIT_ERROR":
                        assert outcome.retry_after == pytest.approx(RETRY_AFTER * (1 + outcome.wait_turns))
    assert {"RATE_LIMIT_ERROR", "SERVICE_UNAVAILABLE", "TIMEOUT", None} <= seen_codes
    assert budget_ends >= 1


def test_time_scale_makes_the_drawn_latency_real():
    config = WorldConfig().replace(processes={"latency_seconds": [0.3], "latency_weights": [1.0]})
    with running_service(ToolService(config=config, time_scale=1.0)) as url, ToolClient(url, timeout=5) as c:
        outcome = c.request("network_fetcher", episode=c.open_episode(TASK.instance_id, 0))
    assert outcome.world_duration == 0.3 and outcome.latency_s >= 0.3


def test_calibration_reads_the_services_world_timing_from_http_rows(tmp_path):
    """Rows the client logs against our service under failure processes carry the world's wait and
    duration (X-Retry-After-Turns, X-Call-Duration), so calibration reads the rate-limit wait off them and
    its interval for the refusal probability holds the served value."""
    from resilibench.envs.real_api.failure_fit import fit_failures

    served = WorldConfig().replace(processes={"rate_limit_probability": 0.15, "rate_limit_wait": 2})
    log = tmp_path / "calls.jsonl"
    with running_service(ToolService(config=served, slow_seconds=0.4, time_scale=0)) as url, \
            ToolClient(url, timeout=0.2, log=log) as c:
        for task in load_tasks(split="test")[:12]:
            for seed in range(4):
                episode = Episode.start(task, run_episode_seed(task.instance_id, seed), served)
                executor = HttpExecutor(c, episode)
                for tool in list(task.required_tools) * 3:
                    if episode.done or episode.turns_left == 0:
                        break
                    executor.call(tool)
    rows = list(read_rows(log))
    assert any(r.wait_turns == 2 for r in rows) and all(r.world_duration is not None for r in rows)
    fit = fit_failures(rows, processes=("rate-limits",), level=0.99)
    estimates = {e.name: e for e in fit.estimates}
    assert estimates["processes.rate_limit_wait"].value == 2
    refusal = estimates["processes.rate_limit_probability"]
    assert refusal.low <= 0.15 <= refusal.high
