"""Real-API mode in every front end, over a real tool service on a loopback socket, and live APIs registered
from OpenAPI documents, MCP tool lists and task files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest
from mcp import Client

from resilibench.agents.harness import eval_jobs, run_eval
from resilibench.agents.scripted import OptimalTextAgent, PlanFollowingTextAgent
from resilibench.cli import main as cli_main
from resilibench.core.config import WorldConfig
from resilibench.core.registry import ToolRegistry, default_registry
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.text.toolbox import SearchSettings, resolve_tool
from resilibench.core.world import load_tasks
from resilibench.envs.mcp.server import build_server
from resilibench.envs.real_api.call_log import read_rows
from resilibench.envs.real_api.live_apis import (
    LIVE_TASK_TYPE,
    RealApi,
    load_document,
    load_live_api,
    mcp_tools,
    openapi_tools,
    read_task_file,
    service_openapi_url,
)
from resilibench.envs.real_api.service import ToolService, running_service
from resilibench.envs.text.env import ResiliBenchTextEnv
from resilibench.errors import InputError

REGISTRY = default_registry()
EXAMPLE = Path(__file__).resolve().parents[2] / "envs" / "real_api" / "data" / "live_example" / "tasks.yaml"
# A TIMEOUT is a response slower than the client waits: the service sleeps SLOW, the client waits WAIT.
SLOW, WAIT = 1.5, 0.75
API_OPTIONS = {"timeout": WAIT}
TASKS = load_tasks(split="test")[:3]


@pytest.fixture(scope="module")
def service_url():
    with running_service(ToolService(slow_seconds=SLOW, retry_after=0.1)) as url:
        yield url


def without_probability(trace):
    """A trace as both modes record it: real calls carry no probability (nothing was drawn here)."""
    return [{k: v for k, v in record.items() if k != "probability"} for record in trace]


def play(env, task, seed, agent, options=None):
    """One episode of ``agent`` in ``env``: (its trace, its level, the conversation)."""
    env.reset(seed=seed, options={"task_id": task.instance_id, **(options or {})})
    info = env.info()
    while info["level"] is None:
        reply = agent.respond([(env.messages, env)])[0]
        _, _, _, _, info = env.step(reply)
    return info["trace"], info["level"], env.messages


# --- live APIs: registries and task files ------------------------------------------------------------------


def test_registry_from_the_service_openapi_is_the_30_tools(service_url):
    document, url = load_document(service_openapi_url(service_url))
    tools, endpoints = openapi_tools(document, service_url, document_url=url)
    assert [t.name for t in tools] == list(REGISTRY.names)
    for tool, original in zip(tools, REGISTRY.tools, strict=True):
        assert tool.input_schema() == original.input_schema()
        assert tool.error_codes == original.error_codes
        assert endpoints[tool.name].url == f"{service_url}/tools/{tool.name}"
        assert endpoints[tool.name].method == "POST"


def test_openapi_parameters_go_where_the_document_says():
    document = {"openapi": "3.0.3", "info": {"version": "2"}, "servers": [{"url": "https://api.example.org/v1"}],
                "components": {"schemas": {"Note": {"type": "object", "required": ["text"], "properties": {
                    "text": {"type": "string"},
                    "replies": {"type": "array", "items": {"$ref": "#/components/schemas/Note"}}}}}},
                "paths": {"/items/{item_id}": {
                    "parameters": [{"name": "item_id", "in": "path", "schema": {"type": "integer"}}],
                    "get": {"operationId": "getItem", "summary": "Read an item",
                            "parameters": [{"name": "verbose", "in": "query", "schema": {"type": "boolean"}},
                                           {"name": "X-Key", "in": "header", "schema": {"type": "string"}}]},
                    "post": {"operationId": "addNote",
                             "parameters": [{"name": "lang", "in": "query", "required": True,
                                             "schema": {"type": "string"}},
                                            {"name": "dry_run", "in": "query", "schema": {"type": "boolean"}}],
                             "requestBody": {"content": {"application/json": {
                                 "schema": {"$ref": "#/components/schemas/Note"}}}}}}}}
    tools, endpoints = openapi_tools(document, headers={"X-Key": "secret"})
    get, post = tools
    assert get.input_schema()["properties"].keys() == {"item_id", "verbose"}
    assert get.input_schema()["required"] == ["item_id"]
    assert post.input_schema()["required"] == ["item_id", "lang", "text"]  # dry_run: optional query of a POST
    assert endpoints["getItem"].request_parts({"item_id": 7, "verbose": True}) == (
        "https://api.example.org/v1/items/7", {"verbose": "true"}, None)
    assert endpoints["addNote"].request_parts({"item_id": 7, "lang": "en", "text": "hi"}) == (
        "https://api.example.org/v1/items/7?lang=en", None, {"text": "hi"})
    assert endpoints["addNote"].headers == (("X-Key", "secret"),)
    registry = ToolRegistry(tuple(tools))  # agents may write a camelCase name in any case
    assert [resolve_tool(n, registry) for n in ("getItem", "getitem", "ADDNOTE")] == [0, 0, 1]
    assert post.input_schema()["properties"]["replies"]["items"] == {}  # a recursive schema, cut where it recurs
    assert post.check_arguments({"item_id": 1, "lang": "en", "text": "a", "replies": [{"text": "b"}]}) is None
    with pytest.raises(InputError, match="operations"):
        openapi_tools(document, operations=["getItem", "nothing"])


def test_registry_from_an_mcp_tool_list():
    async def listing():
        async with Client(build_server(search="lexical")) as client:
            return (await client.list_tools()).tools

    tools = mcp_tools(anyio.run(listing), names=["network_fetcher", "finish"])
    assert [t.name for t in tools] == ["finish", "network_fetcher"]  # in the server's order
    schema = tools[1].input_schema()
    assert schema["required"] == ["episode", *REGISTRY["network_fetcher"].input_schema()["required"]]
    assert schema["properties"]["source"] == REGISTRY["network_fetcher"].input_schema()["properties"]["source"]
    with pytest.raises(InputError, match="nothing"):
        mcp_tools(anyio.run(listing), names=["nothing"])


def test_the_example_task_file():
    spec = read_task_file(EXAMPLE)
    assert len(spec.tasks) == 8
    assert all(len(t.required_tools) >= 4 and t.split == "test" for t in spec.tasks)
    for task in spec.tasks:  # the steps' dependencies are the world's, so the service's rules agree
        for tool in task.required_tools:
            assert spec.dependencies[tool] == tuple(sorted(REGISTRY[tool].dependencies))
    assert set(spec.min_coverage) == {t.task_type for t in spec.tasks}


BAD_FILES = {
    "not a mapping": ("- 1\n", "task_file must be a mapping"),
    "unknown field": ("tasks: []\ncolour: red\n", "unknown field(s) ['colour']"),
    "no tasks": ("tasks: []\n", "tasks must be a non-empty list"),
    "no id": ("tasks: [{steps: [{tool: a}]}]\n", "tasks[0].id"),
    "bad tool name": ("tasks: [{id: t, steps: [{tool: 'a b'}]}]\n", "tasks[0].steps[0].tool"),
    "later dependency": ("tasks: [{id: t, steps: [{tool: a, depends_on: [b]}, {tool: b}]}]\n",
                         "tasks[0].steps[0].depends_on"),
    "repeated step": ("tasks: [{id: t, steps: [{tool: a}, {tool: a}]}]\n", "tasks[0].steps[1].tool"),
    "twice the same id": ("tasks: [{id: t, steps: [{tool: a}]}, {id: t, steps: [{tool: a}]}]\n", "tasks[1].id"),
    "dependencies differ": ("tasks: [{id: t, steps: [{tool: a}, {tool: b, depends_on: [a]}]},\n"
                            "        {id: u, steps: [{tool: a}, {tool: b}]}]\n", "tasks[1].steps[1].depends_on"),
    "bad coverage": ("min_coverage: 2\ntasks: [{id: t, steps: [{tool: a}]}]\n", "min_coverage"),
    "bad retries": ("tasks: [{id: t, max_retries: -1, steps: [{tool: a}]}]\n", "tasks[0].max_retries"),
    "not YAML": ("tasks: [\n", "cannot parse task file"),
}


@pytest.mark.parametrize("case", sorted(BAD_FILES))
def test_bad_task_files_are_named(tmp_path, case):
    text, expected = BAD_FILES[case]
    path = tmp_path / "tasks.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as excinfo:
        read_task_file(path)
    assert expected in str(excinfo.value)
    assert "\n" not in str(excinfo.value)


def test_a_step_tool_the_api_lacks_is_named(tmp_path, service_url, capsys):
    path = tmp_path / "tasks.yaml"
    path.write_text("tasks: [{id: t, steps: [{tool: network_fetcher}, {tool: weather_now}]}]\n")
    with pytest.raises(InputError, match=r"tasks\[0\]\.steps\[1\]\.tool: 'weather_now' is not a tool of the API"):
        load_live_api(path, base_url=service_url)
    code = cli_main(["eval", "agent", "--agent", "scripted:plan", "--api", service_url, "--api-tasks", str(path),
                     "--output-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "--api-tasks" in err and "weather_now" in err and len(err.strip().splitlines()) == 1


# --- real-API mode in the front ends -----------------------------------------------------------------------


def test_text_env_against_the_service_meets_the_simulator(service_url):
    """Same task and seed: the same trace and level through HTTP as in the simulator, including calls the
    env answers without a request (a dependency not met, bad arguments, a replay)."""
    agent = OptimalTextAgent()
    simulated = ResiliBenchTextEnv(split=None, tasks=TASKS, search=SearchSettings(method="lexical"))
    real = ResiliBenchTextEnv(split=None, tasks=TASKS, search=SearchSettings(method="lexical"),
                              api=RealApi(service_url, API_OPTIONS))
    failures = set()
    for task in TASKS:
        for seed in range(3):
            trace, level, _ = play(simulated, task, seed, agent)
            real_trace, real_level, messages = play(real, task, seed, agent)
            assert without_probability(real_trace) == without_probability(trace)
            assert real_level == level
            failures |= {r["error_code"] for r in trace if not r["success"]}
            assert all(r["probability"] is None for r in real_trace)
    assert failures  # the comparison met failures, not only successes
    # Calls answered by the env without a request keep the service's episode in step.
    task = TASKS[0]
    script = ["<tool_call>computation_analyzer</tool_call>",  # dependencies unmet: DEPENDENCY_ERROR
              f'<tool_call>{task.required_tools[0]} {{"unexpected": 1}}</tool_call>',  # INVALID_INPUT
              *[f"<tool_call>{t}</tool_call>" for t in task.required_tools], "Task completed."]
    results = []
    for env in (simulated, real):
        env.reset(seed=5, options={"task_id": task.instance_id})
        for message in script:
            _, _, terminated, truncated, info = env.step(message)
            if terminated or truncated:
                break
        results.append((without_probability(info["trace"]), info["level"]))
    assert results[0] == results[1]
    assert [r["error_code"] for r in results[0][0][:2]] == ["DEPENDENCY_ERROR", "INVALID_INPUT"]
    real.close()


def test_the_agent_reads_the_real_response_body(service_url):
    env = ResiliBenchTextEnv(split=None, tasks=TASKS, search=SearchSettings(method="lexical"),
                             api=RealApi(service_url, API_OPTIONS))
    task = TASKS[0]
    for seed in range(20):
        env.reset(seed=seed, options={"task_id": task.instance_id})
        feedback, *_ , info = env.step(f"<tool_call>{task.required_tools[0]}</tool_call>")
        if info["trace"][0]["success"]:
            break
    body = env.executor.last_output
    assert isinstance(body, dict) and body  # the service's JSON answer, shown as the output's data
    assert json.dumps({"data": body}, sort_keys=True)[1:-1] in feedback.replace("\n", "")
    env.close()


def test_eval_over_the_service_writes_rows_and_the_call_log(service_url, tmp_path, capsys):
    common = ["eval", "agent", "--agent", "scripted:optimal", "--prompts", "baseline", "--limit", "3", "--seeds", "0", "1",
              "--batch-size", "2"]
    assert cli_main([*common, "--output-dir", str(tmp_path / "sim")]) == 0
    log = tmp_path / "calls.jsonl"
    assert cli_main([*common, "--output-dir", str(tmp_path / "real"), "--api", service_url, "--call-log", str(log),
                     "--api-timeout", str(WAIT)]) == 0
    rows = {}
    for name in ("sim", "real"):
        lines = (tmp_path / name / "results.jsonl").read_text().splitlines()
        rows[name] = sorted((json.loads(line) for line in lines[1:]), key=lambda r: (r["task_id"], r["seed"]))
    assert len(rows["real"]) == 6
    for sim, real in zip(rows["sim"], rows["real"], strict=True):
        assert (real["task_id"], real["seed"], real["level"]) == (sim["task_id"], sim["seed"], sim["level"])
        assert without_probability(real["trace"]) == without_probability(sim["trace"])
        assert real["bound_iii"] == sim["bound_iii"]
    log_rows = list(read_rows(log))
    requested = [r for row in rows["real"] for r in row["trace"]
                 if not r["replayed"] and r["error_code"] not in ("DEPENDENCY_ERROR", "RETRY_LIMIT_EXCEEDED")]
    assert len(log_rows) == len(requested) > 0
    assert {r.source for r in log_rows} == {"http"}
    assert sorted((r.tool, r.success, r.error_code) for r in log_rows) == sorted(
        (r["tool"], r["success"], r["error_code"]) for r in requested)
    # The API target is part of the run: resuming against another one is refused, naming it.
    for other in (["--api", service_url + "/"], []):  # another service, or the simulator
        capsys.readouterr()
        assert cli_main([*common, "--output-dir", str(tmp_path / "real"), *other]) == 2
        assert "different config (api" in capsys.readouterr().err


def test_mcp_session_in_real_api_mode(service_url):
    task = TASKS[1]
    script = [*task.required_tools, *task.required_tools]

    async def session(server):
        async with Client(server) as client:
            start = await client.call_tool("start_task", {"task_id": task.instance_id, "seed": 3})
            handle = start.structured_content["episode"]
            outputs = []
            for tool in script:
                result = await client.call_tool(tool, {"episode": handle})
                outputs.append(result.structured_content)
                if result.structured_content.get("episode_end") or "level" in result.structured_content:
                    break
            status = await client.call_tool("episode_status", {"episode": handle})
            return outputs, status.structured_content

    sim_outputs, sim_status = anyio.run(session, build_server(search="lexical"))
    real_outputs, real_status = anyio.run(session, build_server(search="lexical", api=RealApi(service_url,
                                                                                          API_OPTIONS)))
    assert without_probability(real_status["trace"]) == without_probability(sim_status["trace"])
    assert real_status.get("level", real_status.get("level_if_finished")) == sim_status.get(
        "level", sim_status.get("level_if_finished"))
    for sim, real in zip(sim_outputs, real_outputs, strict=True):
        assert real["success"] == sim["success"]
        if real["success"] and not real["metadata"]["replayed"]:
            assert "data" in real  # the real body, where the simulator shows its simulated fields


def test_the_example_task_set_runs_end_to_end(tmp_path):
    with running_service(ToolService(slow_seconds=SLOW)) as url:
        live = load_live_api("live_example", base_url=url)  # the shipped set, by name
        assert len(live.tasks) == 8 and set(live.registry.names) == {t for task in live.tasks
                                                                     for t in task.required_tools}
        jobs = eval_jobs(live.tasks, ["optimal"], [0], config=live.world_config())
        log = tmp_path / "calls.jsonl"
        rows = run_eval(PlanFollowingTextAgent(), jobs, progress=False,
                        env={"config": WorldConfig(), "search": SearchSettings(method="lexical"),
                             "api": RealApi(live, {**API_OPTIONS, "log": log})})
    assert [r["task_id"] for r in rows] == [t.instance_id for t in live.tasks]
    assert {r["level"] for r in rows} <= {"full_success", "partial_success", "failure"}
    assert any(r["level"] != "failure" for r in rows)
    assert all(r["bound_iii"] is None and r["task_type"] != LIVE_TASK_TYPE for r in rows)
    log_rows = list(read_rows(log))
    assert len(log_rows) >= sum(1 for r in rows for t in r["trace"] if not t["replayed"]
                                and t["error_code"] not in ("DEPENDENCY_ERROR", "RETRY_LIMIT_EXCEEDED"))
    assert {r.task_id for r in log_rows} == {t.instance_id for t in live.tasks}


def test_a_live_api_over_mcp_through_the_text_env(tmp_path):
    """Tools listed by an MCP server (a real session, in memory) become a live API: the same executor plays
    them, failures come from the server's tool errors, the agent reads the server's answers."""
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError

    from resilibench.envs.real_api.live_apis import McpToolClient, mcp_live_api

    server, calls = MCPServer("facts"), {"joke": 0}

    @server.tool()
    def random_fact() -> dict:
        """A random fact."""
        return {"fact": "Honey never spoils."}

    @server.tool()
    def random_joke() -> dict:
        """A random joke; the upstream fails on the first call."""
        calls["joke"] += 1
        if calls["joke"] == 1:
            raise ToolError("upstream unavailable")
        return {"joke": "A joke."}

    @server.tool()
    def compile_post(text: str) -> dict:
        """Compile a social media post draft."""
        return {"draft": text.upper()}

    path = tmp_path / "tasks.yaml"
    path.write_text("name: facts\ntasks:\n  - id: content_creation_task\n    description: Compile a post.\n"
                    "    steps:\n      - {tool: random_fact}\n      - {tool: random_joke}\n"
                    "      - {tool: compile_post, depends_on: [random_fact, random_joke], arguments: {text: hi}}\n")
    log = tmp_path / "calls.jsonl"
    with McpToolClient(server, timeout=5.0, log=log) as client:
        live = mcp_live_api(path, client)
        assert live.registry.names == ("random_fact", "random_joke", "compile_post")
        assert live.registry["compile_post"].dependencies == ("random_fact", "random_joke")
        env = ResiliBenchTextEnv(split=None, tasks=live.tasks, registry=live.registry,
                                 config=live.world_config(), search=SearchSettings(method="lexical"),
                                 api=RealApi(client))
        env.reset(seed=0)
        feedback = [env.step(f"<tool_call>{tool}</tool_call>")[0]
                    for tool in ("compile_post", "random_fact", "random_joke", "random_joke", "compile_post")]
        *_, info = env.step("Task completed.")
        env.close()
    assert [(r["tool"], r["error_code"]) for r in info["trace"]] == [
        ("compile_post", "DEPENDENCY_ERROR"), ("random_fact", None), ("random_joke", "OPERATION_FAILED"),
        ("random_joke", None), ("compile_post", None)]
    assert info["level"] == "full_success"
    assert "Honey never spoils." in feedback[1] and "upstream unavailable" in feedback[2]
    assert '"draft": "HI"' in feedback[4]  # the task's step arguments, sent when the agent gave none
    assert [(r.tool, r.success) for r in read_rows(log)] == [
        ("random_fact", True), ("random_joke", False), ("random_joke", True), ("compile_post", True)]
    # The optimal prompt of a live task shows its own steps as the plan; the plan follower completes it.
    with McpToolClient(server, timeout=5.0) as client:
        env = ResiliBenchTextEnv(split=None, tasks=live.tasks, registry=live.registry,
                                 config=live.world_config(), prompt=PromptSettings(variant="optimal"),
                                 search=SearchSettings(method="lexical"), api=RealApi(client))
        trace, level, messages = play(env, live.tasks[0], 1, PlanFollowingTextAgent())
        env.close()
    assert "1. random_fact" in messages[0]["content"] and level == "full_success"
    assert [r["tool"] for r in trace] == ["random_fact", "random_joke", "compile_post"]


def test_run_over_the_service_gives_the_simulator_rows(service_url, tmp_path):
    common = ["run", "--planners", "optimal", "dependency_aware", "--limit", "3", "--seeds", "0", "1"]
    assert cli_main([*common, "--output-dir", str(tmp_path / "sim")]) == 0
    assert cli_main([*common, "--output-dir", str(tmp_path / "real"), "--api", service_url,
                     "--api-timeout", str(WAIT)]) == 0
    rows = {}
    for name in ("sim", "real"):
        lines = (tmp_path / name / "results.jsonl").read_text().splitlines()[1:]
        rows[name] = sorted((json.loads(line) for line in lines), key=lambda r: (r["planner"], r["task_id"], r["seed"]))
    assert len(rows["real"]) == 12
    keep = ("planner", "task_id", "seed", "level", "end_reason", "tools", "return", "bound_iii", "bound_ii")
    assert [{k: r[k] for k in keep} for r in rows["real"]] == [{k: r[k] for k in keep} for r in rows["sim"]]


def test_a_task_file_naming_an_mcp_server_over_stdio(tmp_path):
    """``api.mcp`` as a command: the server runs as a subprocess, each env opens its own session."""
    script = tmp_path / "server.py"
    script.write_text("from mcp.server.mcpserver import MCPServer\n"
                      "server = MCPServer('facts')\n\n"
                      "@server.tool()\ndef random_fact() -> dict:\n    \"\"\"A random fact.\"\"\"\n"
                      "    return {'fact': 'Honey never spoils.'}\n\n"
                      "@server.tool()\ndef compile_post(text: str) -> dict:\n    \"\"\"A post draft.\"\"\"\n"
                      "    return {'draft': text.upper()}\n\n"
                      "server.run()\n")
    path = tmp_path / "tasks.yaml"
    path.write_text(f"api: {{mcp: [{json.dumps(sys.executable)}, server.py]}}\n"  # relative to the task file
                    "tasks:\n  - id: post_task\n    steps:\n      - {tool: random_fact, description: a fact}\n"
                    "      - {tool: compile_post, depends_on: [random_fact], arguments: {text: hi}}\n")
    with pytest.raises(InputError, match="api.mcp starts the command"):  # not without the user's consent
        load_live_api(path)
    live = load_live_api(path, allow_command=True)
    assert live.mcp is not None and live.registry.names == ("random_fact", "compile_post")
    env = ResiliBenchTextEnv(split=None, search=SearchSettings(method="lexical"), api=RealApi(live))
    env.reset(seed=0)
    first, *_ = env.step("<tool_call>random_fact</tool_call>")
    env.step("<tool_call>compile_post</tool_call>")
    *_, info = env.step("Task completed.")
    env.close()
    assert "Honey never spoils." in first
    assert [(r["tool"], r["success"]) for r in info["trace"]] == [("random_fact", True), ("compile_post", True)]
    assert info["level"] == "full_success"


@pytest.mark.slow
def test_serve_mcp_with_api_over_stdio(service_url, tmp_path, capsys):
    """`resilibench serve mcp --api URL` as an MCP host launches it: the session's trace is the simulator's
    and every real call is in the call log."""
    import os

    from mcp import StdioServerParameters

    from resilibench.core.arguments import valid_arguments

    task, log = TASKS[2], tmp_path / "calls.jsonl"
    serve = ["-m", "resilibench", "serve", "mcp", "--search", "lexical"]
    api = ["--api", service_url, "--api-timeout", str(WAIT), "--call-log", str(log)]

    async def session(args):
        async with Client(StdioServerParameters(command=sys.executable, args=args, env=dict(os.environ))) as client:
            start = await client.call_tool("start_task", {"task_id": task.instance_id, "seed": 4})
            handle = start.structured_content["episode"]
            for tool in (*task.required_tools, *task.required_tools):
                arguments = {"episode": handle, **valid_arguments(REGISTRY[tool])}
                result = await client.call_tool(tool, arguments)
                if result.structured_content.get("episode_end"):
                    break
            return (await client.call_tool("episode_status", {"episode": handle})).structured_content["trace"]

    simulated, real = anyio.run(session, serve), anyio.run(session, [*serve, *api])
    assert without_probability(real) == without_probability(simulated)
    requested = [r for r in real if not r["replayed"] and r["error_code"] not in ("DEPENDENCY_ERROR",
                                                                                   "RETRY_LIMIT_EXCEEDED")]
    assert len(list(read_rows(log))) == len(requested) > 0
    assert cli_main(["serve", "mcp", "--api", "http://127.0.0.1:9"]) == 2  # nothing listens there
    assert "--api: no tool service answers" in capsys.readouterr().err


def test_flawed_prompts_of_a_small_live_registry(tmp_path):
    """Flaws of a live task's plan use the live registry's own tools: each flaw type is injected or said
    not to apply (a three-tool API has no spare tool to drift to), never a crash."""
    from resilibench.core.text.flaws import FLAW_TYPES, FlawNotApplicable
    from resilibench.envs.real_api.live_apis import LiveApi, live_registry, live_tool

    path = tmp_path / "tasks.yaml"
    path.write_text("tasks:\n  - id: t1\n    steps:\n      - {tool: getFact}\n      - {tool: getJoke}\n"
                    "      - {tool: compilePost, depends_on: [getFact]}\n")
    spec = read_task_file(path)
    registry = live_registry([live_tool(n, n.lower(), ()) for n in ("getFact", "getJoke", "compilePost")], spec)
    live = LiveApi("small", registry, spec.tasks, {}, spec.min_coverage, "test")
    injected = set()
    for flaw in FLAW_TYPES:
        env = ResiliBenchTextEnv(split=None, tasks=live.tasks, registry=registry, config=live.world_config(),
                                 prompt=PromptSettings(variant="flawed", flaw_type=flaw, matcher="lexical"),
                                 search=SearchSettings(method="lexical"))
        try:
            _, info = env.reset(seed=0)
        except FlawNotApplicable:
            continue
        injected.add(flaw)
        assert all(c["after"] is None or c["after"]["tool"] in registry for c in info["injection"]["changes"])
    assert {"order", "missing_step"} <= injected


def test_mcp_server_serves_a_live_api(service_url):
    """`serve mcp --api-tasks`: the MCP server offers the live API's tools and tasks, calls go to its
    endpoints, and finishing grades the task file's task with its own task type."""
    live = load_live_api("live_example", base_url=service_url)
    task = live.tasks[6]  # service_health_task: four steps, no dependencies

    async def session():
        async with Client(build_server(search="lexical", api=RealApi(live, API_OPTIONS))) as client:
            listed = {t.name for t in (await client.list_tools()).tools}
            start = await client.call_tool("start_task", {"task_id": task.instance_id, "seed": 0})
            handle = start.structured_content["episode"]
            outputs = []
            for tool in task.required_tools:  # each step until it succeeds (the episode may end first)
                while not outputs or not outputs[-1]["episode_end"]:
                    outputs.append((await client.call_tool(tool, {"episode": handle})).structured_content)
                    if outputs[-1]["success"]:
                        break
            status = await client.call_tool("episode_status", {"episode": handle})
            return listed, start.structured_content, outputs, status.structured_content

    listed, start, outputs, status = anyio.run(session)
    assert set(live.registry.names) <= listed and "file_operations_writer" not in listed
    assert start["task_type"] == task.task_type
    assert [o["success"] for o in outputs] == [r["success"] for r in status["trace"]]
    assert all("data" in o for o in outputs if o["success"])  # the service's answers, through the endpoints
    # Graded with the file's own task type (the world's evaluator has no such type by default).
    if status["done"]:
        assert status["level"] in ("full_success", "partial_success", "failure")
    else:
        assert status["progress"]["required_done"] == 4 and status["level_if_finished"] == "full_success"
