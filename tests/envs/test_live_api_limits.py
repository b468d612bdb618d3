"""Live APIs whose tools are not the world's, the trust model of task files, and the limits of outbound
HTTP (a total deadline, a size cap, credentials kept off cross-origin redirects), each over a real
loopback server (tests/loopback_http.py)."""

from __future__ import annotations

import copy
import json
import time
import tracemalloc

import pytest
from loopback_http import drip_route, huge_route, json_route, loopback_server, redirect_route, send_json

from resilibench.cli import main as cli_main
from resilibench.core.world import load_tasks
from resilibench.envs.real_api import http_faults as hf
from resilibench.envs.real_api.client import Endpoint, ToolClient
from resilibench.envs.real_api.live_apis import load_document, load_live_api, openapi_tools, read_task_file
from resilibench.errors import InputError

FACTS = {
    "openapi": "3.0.3", "info": {"title": "facts", "version": "1.2"},
    "components": {"schemas": {"Post": {"type": "object", "properties": {"text": {"type": "string"}},
                                        "required": ["text"]}}},
    "paths": {
        "/fact": {"get": {"operationId": "getFact", "summary": "A random fact",
                          "parameters": [{"name": "topic", "in": "query", "schema": {"type": "string"}}]}},
        "/joke": {"get": {"operationId": "getJoke", "summary": "A joke"}},
        "/post": {"post": {"operationId": "compilePost", "summary": "Compile a post draft",
                           "requestBody": {"content": {"application/json": {
                               "schema": {"$ref": "#/components/schemas/Post"}}}}}},
    },
}
TASKS = """name: facts
api:
  openapi: openapi.json
{api}
tasks:
  - id: post_task
    description: Fetch a fact and a joke, then compile a social media post.
    steps:
      - {{tool: getFact, description: fetch a fact}}
      - {{tool: getJoke, description: fetch a joke}}
      - {{tool: compilePost, description: compile the post, depends_on: [getFact, getJoke], arguments: {{text: hi}}}}
"""


def facts_routes():
    return {("GET", "/fact"): json_route({"fact": "Honey never spoils."}),
            ("GET", "/joke"): json_route({"joke": "A joke."}),
            ("POST", "/post"): json_route({"draft": "HI"})}


def task_file(tmp_path, api="", document=FACTS):
    (tmp_path / "openapi.json").write_text(json.dumps(document))
    path = tmp_path / "tasks.yaml"
    path.write_text(TASKS.format(api=api))
    return path


def client_for(url, **options):
    return ToolClient(endpoints={"getFact": Endpoint("GET", url)}, **options)


# --- a live API with its own tool names, end to end --------------------------------------------------------


def test_eval_over_a_live_api_with_its_own_tool_names(tmp_path, monkeypatch, capsys):
    """`eval agent` over an API whose tools are getFact, getJoke, compilePost: the plan follower reads the
    plan with the API's names, every step is called over the socket, and the summary is written."""
    monkeypatch.setenv("RB_TEST_TOKEN", "t0k")
    with loopback_server(facts_routes()) as server:
        path = task_file(tmp_path, f"  base_url: {server.url}\n  headers: {{Authorization: 'Bearer ${{RB_TEST_TOKEN}}'}}")
        code = cli_main(["eval", "agent", "--agent", "scripted:plan", "--prompts", "optimal", "--seeds", "0",
                         "--api-tasks", str(path), "--api-env", "RB_TEST_TOKEN", "--output-dir", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()[1:]]
    assert [(r["tool"], r["success"]) for r in rows[0]["trace"]] == [
        ("getFact", True), ("getJoke", True), ("compilePost", True)]
    assert rows[0]["level"] == "full_success"
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    robustness = summary["robustness"]["scripted:plan"]["optimal"]
    assert robustness["pass_k"]["pass_k"] == {"1": 1.0} and robustness["wasted_calls"]["per_episode"] == 0.0
    assert [(m, p) for m, p, _ in server.requests] == [("GET", "/fact"), ("GET", "/joke"), ("POST", "/post")]
    assert {h["Authorization"] for _, _, h in server.requests} == {"Bearer t0k"}


# --- the trust model of task files -----------------------------------------------------------------------


def test_header_variables_only_when_the_user_names_them(tmp_path, monkeypatch):
    monkeypatch.setenv("RB_TEST_TOKEN", "t0k")
    monkeypatch.delenv("RB_UNSET_TOKEN", raising=False)
    with loopback_server(facts_routes()) as server:
        path = task_file(tmp_path, f"  base_url: {server.url}\n  headers: {{X-Key: '${{RB_TEST_TOKEN}}'}}")
        with pytest.raises(InputError, match=r"api.headers.X-Key uses the environment variable\(s\) \['RB_TEST_TOKEN'\]"):
            load_live_api(path)
        live = load_live_api(path, env=["RB_TEST_TOKEN"])
        assert dict(live.endpoints["getFact"].headers) == {"X-Key": "t0k"}
        path = task_file(tmp_path, f"  base_url: {server.url}\n  headers: {{X-Key: '$RB_UNSET_TOKEN'}}")
        with pytest.raises(InputError, match=r"\['RB_UNSET_TOKEN'\] are not set"):  # never sent literally
            load_live_api(path, env=["RB_UNSET_TOKEN"])
        # A header with a variable goes only to an origin the file (or the caller) names, not one that only
        # the OpenAPI document names.
        document = {**FACTS, "servers": [{"url": server.url}]}
        path = task_file(tmp_path, "  headers: {X-Key: '${RB_TEST_TOKEN}'}", document)
        with pytest.raises(InputError, match="named only by the OpenAPI document"):
            load_live_api(path, env=["RB_TEST_TOKEN"])
        assert load_live_api(path, base_url=server.url, env=["RB_TEST_TOKEN"]).endpoints["getFact"].headers
        path = task_file(tmp_path, "  headers: {X-Client: resilibench}", document)  # no variable: no secret
        assert dict(load_live_api(path).endpoints["getFact"].headers) == {"X-Client": "resilibench"}


@pytest.mark.parametrize("source", ["/etc/passwd", "../outside.json", "sub/../../outside.json"])
def test_a_task_files_document_stays_in_its_folder(tmp_path, source):
    (tmp_path / "outside.json").write_text(json.dumps(FACTS))
    folder = tmp_path / "set"
    (folder / "sub").mkdir(parents=True)
    path = task_file(folder, "  base_url: http://127.0.0.1:9").with_name("tasks.yaml")
    path.write_text(path.read_text().replace("openapi: openapi.json", f"openapi: {source}"))
    with pytest.raises(InputError, match="relative to its own folder"):
        load_live_api(path)
    # relative to the task file, wherever the process runs; a document the caller gives is read as given
    assert load_live_api(task_file(folder, "  base_url: http://127.0.0.1:9")).registry.names
    assert load_live_api(path, openapi=str(tmp_path / "outside.json")).registry.names


@pytest.mark.parametrize("headers", ["{X-Key: clé}", "{X-Key: 5}", "{'X Key': a}", "{X-Key: \"a\\nInjected: b\"}"])
def test_bad_headers_are_refused_when_the_file_loads(tmp_path, headers):
    path = task_file(tmp_path, f"  base_url: http://127.0.0.1:9\n  headers: {headers}")
    with pytest.raises(InputError, match="api.headers"):
        read_task_file(path)


def test_bad_headers_never_reach_a_call(monkeypatch, tmp_path):
    with pytest.raises(InputError, match="headers.X-Key"):
        Endpoint("GET", "http://127.0.0.1:9/", (("X-Key", "clé"),))
    with pytest.raises(InputError, match="headers.X-Key"):
        ToolClient("http://127.0.0.1:9", headers={"X-Key": 5})
    monkeypatch.setenv("RB_TEST_TOKEN", "clé")  # non-ASCII once expanded: refused at load, not at call time
    path = task_file(tmp_path, "  base_url: http://127.0.0.1:9\n  headers: {X-Key: '${RB_TEST_TOKEN}'}")
    with pytest.raises(InputError, match="api.headers.X-Key"):
        load_live_api(path, env=["RB_TEST_TOKEN"])


def test_credentials_never_follow_a_redirect_to_another_origin():
    with loopback_server(facts_routes()) as other, loopback_server(facts_routes()) as home:
        home.routes[("GET", "/away")] = redirect_route(f"{other.url}/fact")
        home.routes[("GET", "/here")] = redirect_route(f"{home.url}/fact", 307)
        with ToolClient(endpoints={"away": Endpoint("GET", f"{home.url}/away", (("X-Key", "s3cret"),)),
                                   "here": Endpoint("GET", f"{home.url}/here", (("X-Key", "s3cret"),))},
                        headers={"Authorization": "Bearer t0k"}, timeout=5) as client:
            assert client.request("away").success and client.request("here").success
    assert [h.get("X-Key") for _, _, h in home.requests] == ["s3cret", "s3cret", "s3cret"]  # /away, /here, /fact
    assert other.requests and all("X-Key" not in h and "Authorization" not in h for _, _, h in other.requests)


# --- deadlines and size caps ----------------------------------------------------------------------------------


def drip_headers(handler):
    """A status line, then one header byte every 0.2 s: never a complete head."""
    try:
        handler.wfile.write(b"HTTP/1.1 200 OK\r\n")
        for _ in range(1000):
            handler.wfile.write(b"x")
            handler.wfile.flush()
            time.sleep(0.2)
    except OSError:
        pass


@pytest.mark.parametrize("route", [drip_route(0.2), drip_headers], ids=["body", "headers"])
def test_a_dripping_server_meets_the_deadline(route):
    with loopback_server({("GET", "/drip"): route}) as server, client_for(f"{server.url}/drip", timeout=1.0) as client:
        start = time.monotonic()
        outcome = client.request("getFact")
        elapsed = time.monotonic() - start
    assert outcome.error_class == hf.TIMEOUT_CLASS and outcome.error_code == "TIMEOUT"
    assert elapsed < 1.6  # per read the wait is 1 s, but the call as a whole ends at its deadline


@pytest.mark.parametrize("announce", [True, False], ids=["content-length", "streamed"])
def test_a_huge_answer_is_refused_at_the_cap(announce):
    with loopback_server({("GET", "/huge"): huge_route(300 * 2**20, announce)}) as server, \
            client_for(f"{server.url}/huge", timeout=20) as client:
        tracemalloc.start()
        try:
            outcome = client.request("getFact")
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert outcome.error_class == hf.MALFORMED_BODY and "cap of 10,485,760 bytes" in outcome.description
    assert peak < 40 * 2**20  # at most the cap is ever held, not the 300 MB


def test_the_openapi_fetch_has_a_deadline_and_a_cap(monkeypatch):
    from resilibench.envs.real_api import live_apis

    monkeypatch.setattr(live_apis, "_FETCH_TIMEOUT", 1.0)
    with loopback_server({("GET", "/drip.json"): drip_route(0.2),
                          ("GET", "/huge.json"): huge_route(300 * 2**20, announce=False),
                          ("GET", "/moved.json"): redirect_route("/openapi.json"),
                          ("GET", "/openapi.json"): json_route(FACTS)}) as server:
        start = time.monotonic()
        with pytest.raises(InputError, match="cannot fetch the OpenAPI document .*Timeout"):
            load_document(f"{server.url}/drip.json")
        assert time.monotonic() - start < 1.6
        with pytest.raises(InputError, match="cap of 10,485,760 bytes"):
            load_document(f"{server.url}/huge.json")
        assert load_document(f"{server.url}/moved.json")[0]["info"]["title"] == "facts"


def chat_answer(text="<answer>ok</answer>"):
    return {"choices": [{"message": {"role": "assistant", "content": text}}]}


def test_the_openai_backend_has_a_deadline_and_a_cap():
    from resilibench.agents.backends import OpenAIBackend
    from resilibench.llm import BackendError, GenerationConfig, RequestTimeoutError

    conversation = [[{"role": "user", "content": "hi"}]]
    with loopback_server({("POST", "/v1/chat/completions"): drip_route(0.2)}) as server:
        backend = OpenAIBackend(f"{server.url}/v1", "m", timeout=1.0, max_retries=0)
        start = time.monotonic()
        with pytest.raises((RequestTimeoutError, BackendError), match="no answer within 1 s"):
            backend.generate(conversation, GenerationConfig())
        assert time.monotonic() - start < 1.6
        server.routes[("POST", "/v1/chat/completions")] = huge_route(300 * 2**20, announce=False)
        with pytest.raises(BackendError, match="cap of"):
            OpenAIBackend(f"{server.url}/v1", "m", timeout=20, max_retries=0).generate(conversation, GenerationConfig())


@pytest.mark.parametrize("value", ["100000", "inf", "nan", "-5", "soon"])
def test_the_openai_backend_caps_and_checks_retry_after(value, monkeypatch):
    """A 429 with a Retry-After the backend must not obey as it is, then an answer: the retry comes after at
    most MAX_RETRY_AFTER (set to 0.5 s here), or after the backoff when the value is no number of seconds."""
    from resilibench.agents import backends
    from resilibench.llm import GenerationConfig

    monkeypatch.setattr(backends, "MAX_RETRY_AFTER", 0.5)
    answers = iter([(429, {"Retry-After": value}), (200, {})])

    def route(handler):
        status, headers = next(answers)
        send_json(handler, chat_answer() if status == 200 else {"error": "slow down"}, status, headers)

    with loopback_server({("POST", "/v1/chat/completions"): route}) as server:
        backend = backends.OpenAIBackend(f"{server.url}/v1", "m", timeout=5, max_retries=1, backoff=0.05)
        start = time.monotonic()
        assert backend.generate([[{"role": "user", "content": "hi"}]], GenerationConfig()) == ["<answer>ok</answer>"]
        assert time.monotonic() - start < 5  # not the 100000 s asked (slack for a loaded machine)
    assert len(server.requests) == 2


# --- OpenAPI documents: fan-out and malformed fields ----------------------------------------------------------


def test_ref_fan_out_is_bounded():
    """Each level refers twice to the next: 2**40 values if expanded; refused at once, naming the path."""
    schemas = {f"L{i}": {"type": "object", "properties": {"a": {"$ref": f"#/components/schemas/L{i + 1}"},
                                                          "b": {"$ref": f"#/components/schemas/L{i + 1}"}}}
               for i in range(40)}
    schemas["L40"] = {"type": "string"}
    document = {"openapi": "3.0.0", "components": {"schemas": schemas}, "paths": {"/x": {"post": {
        "operationId": "x", "requestBody": {"content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/L0"}}}}}}}}
    assert len(json.dumps(document)) < 8000
    start = time.monotonic()
    with pytest.raises(InputError, match=r"paths./x: the document's \$refs expand to more than 100,000 values"):
        openapi_tools(document, "http://127.0.0.1:9")
    assert time.monotonic() - start < 2
    schemas["L12"] = {"type": "string"}  # 2**12 values: shared, resolved once, accepted
    tools, _ = openapi_tools(document, "http://127.0.0.1:9")
    assert [p.name for p in tools[0].parameters] == ["a", "b"]


def _mutations(node, path=()):
    """Every (path, replacement) of a value of ``node`` by a value of another kind."""
    for key, value in (node.items() if isinstance(node, dict) else enumerate(node)):
        for replacement in (None, 1, "x", True, [], {}, [1], {"$ref": "#/nowhere"}, {"$ref": 5}):
            if type(replacement) is not type(value) or replacement != value:
                yield (*path, key), replacement
        if isinstance(value, dict | list):
            yield from _mutations(value, (*path, key))


def test_malformed_openapi_documents_get_one_line_errors():
    """Every field of a document replaced by a value of another kind (several hundred documents): each is
    read or refused with an InputError naming a field, never another exception."""
    refused = read = 0
    for path, replacement in _mutations(FACTS):
        document = copy.deepcopy(FACTS)
        target = document
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = replacement
        try:
            openapi_tools(document, "http://127.0.0.1:9")
            read += 1
        except InputError as exc:
            assert "\n" not in str(exc) and exc.field
            refused += 1
    assert refused > 50 and read > 50 and refused + read > 300


# --- a service that dies, a backend that always fails ----------------------------------------------------------


def test_run_against_a_service_that_stops_answering_is_a_one_line_error(tmp_path, capsys):
    def drop(handler):
        handler.close_connection = True  # no response at all

    with loopback_server({("GET", "/health"): json_route({"status": "ok"}), ("POST", "/episodes"): drop}) as server:
        code = cli_main(["run", "--planners", "optimal", "--limit", "1", "--seeds", "0", "--api", server.url,
                         "--api-timeout", "2", "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "--api: the tool service at" in err and "did not answer POST" in err


def test_enhancement_stops_when_the_backend_always_fails():
    from resilibench.agents.backends import OpenAIBackend
    from resilibench.agents.task_enhancer import TaskEnhancer
    from resilibench.llm import BackendError

    with loopback_server({("POST", "/v1/chat/completions"): json_route({"error": "down"}, 500)}) as server:
        enhancer = TaskEnhancer(OpenAIBackend(f"{server.url}/v1", "m", timeout=5, max_retries=0))
        with pytest.raises(BackendError, match="failed 2 batches in a row, stopped after 8 of 40 tasks"):
            enhancer.enhance(load_tasks(split="test")[:40], batch_size=4)
    assert len(server.requests) == 8  # two batches of four, one attempt each; the other 32 never asked
