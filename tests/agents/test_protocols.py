"""The two protocols (tags, native tool calls) and the harness with real servers: same outcomes for the
same decisions, tool calls through an OpenAI-compatible server, infrastructure errors that end one episode."""

from __future__ import annotations

import json
import threading
import time

import pytest
from chat_server import ChatServer, completion

from resilibench.agents.backends import OpenAIBackend
from resilibench.agents.harness import eval_jobs, run_eval
from resilibench.agents.scripted import tag_view, tool_message
from resilibench.agents.specs import make_scripted_agent
from resilibench.cli import main
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.results import read_jsonl

ENV = {"search": SearchSettings(method="lexical")}
OUTCOME = ("trace", "level", "end_reason", "turns", "calls", "failed_calls", "coverage", "completed")


def one_task_per_type(world: str = "v1"):
    tasks = [t for t in load_tasks(split="test", world=world) if len(t.required_tools) >= 2]
    return [next(t for t in tasks if t.task_type == name) for name in TASK_TYPE_NAMES]


@pytest.mark.parametrize("kind, world", [("optimal", "v1"), ("plan", "v1"), ("names", "v0"), ("search", "v1"),
                                         ("search-optimal", "v1")])
def test_both_protocols_give_identical_outcomes(kind, world):
    """Every scripted agent makes the same decisions under both protocols (the tools one through
    ``tag_view``/``tool_message``): the same trace, grade and reward on every task and seed. (The
    name-reading agent plays world v0, whose task texts name their tools. Feedback is not cut here: five
    searches in one message overflow the default limit with tags, while each tool message is cut alone.)"""
    jobs = eval_jobs(one_task_per_type(world), ["baseline", "optimal"], seeds=[0, 1, 2])
    env = {**ENV, "world": world, "max_length": 1 << 16}
    tags = run_eval(make_scripted_agent(kind), jobs, progress=False, env={**env})
    tools = run_eval(make_scripted_agent(kind), jobs, progress=False, keep_messages=True,
                     env={**env, "prompt": PromptSettings(protocol="tools")})
    assert [r["protocol"] for r in tags + tools] == ["tags"] * len(jobs) + ["tools"] * len(jobs)
    assert [{f: r[f] for f in OUTCOME} for r in tags] == [{f: r[f] for f in OUTCOME} for r in tools]
    assert any(r["calls"] for r in tools)
    assert any(m["role"] == "tool" for r in tools for m in r["messages"])


def test_tag_messages_and_tool_messages_convert_both_ways():
    text = '<tool_search>read</tool_search><tool_call>file_operations_reader {"source": "a"}</tool_call> Task completed.'
    message = tool_message(text)
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["tool_search", "file_operations_reader"]
    assert json.loads(message["tool_calls"][1]["function"]["arguments"]) == {"source": "a"}
    assert message["content"] == "Task completed."
    view = tag_view([{"role": "user", "content": "prompt"}, message,
                     {"role": "tool", "tool_call_id": "call_0", "content": "found"},
                     {"role": "tool", "tool_call_id": "call_1", "content": "ran"}])
    assert view == [{"role": "user", "content": "prompt"},
                    {"role": "assistant", "content": '<tool_search>read</tool_search><tool_call>file_operations_reader '
                                                     '{"source": "a"}</tool_call>Task completed.'},
                    {"role": "user", "content": "found\n\nran"}]


# --- an OpenAI-compatible server answering with tool calls ---------------------------------------------


def scripted_server_answer(body):
    """A 'model' that searches, calls the first required tool of the task it reads, then says it is done."""
    assistant_turns = sum(m["role"] == "assistant" for m in body["messages"])
    if assistant_turns == 0:
        calls = [{"id": "a", "type": "function", "function": {"name": "tool_search",
                                                              "arguments": json.dumps({"query": "read a file"})}}]
    elif assistant_turns == 1:
        calls = [{"id": "b", "type": "function", "function": {"name": "file_operations_reader", "arguments": "{}"}}]
    else:
        return 200, completion("All steps are done. Task completed.")
    return 200, {"choices": [{"index": 0, "finish_reason": "tool_calls",
                              "message": {"role": "assistant", "content": None, "tool_calls": calls}}]}


def test_tools_protocol_through_an_openai_compatible_server():
    jobs = eval_jobs(one_task_per_type()[:2], ["baseline"], seeds=[0, 1])
    with ChatServer(scripted_server_answer) as server:
        rows = run_eval(OpenAIBackend(server.url, "m"), jobs, progress=False, keep_messages=True,
                        env={**ENV, "prompt": PromptSettings(protocol="tools")})
    assert all(len(r["trace"]) == 1 and r["trace"][0]["tool"] == "file_operations_reader" for r in rows)
    assert all(r["completed"] and r["turns"] == 2 for r in rows)
    first = server.requests[0]
    assert len(first["tools"]) == 32 and first["tools"][0]["function"]["name"] == "tool_search"
    later = next(b for b in server.requests if len(b["messages"]) == 5)  # prompt, call, answer, call, answer
    assert [m["role"] for m in later["messages"]] == ["user", "assistant", "tool", "assistant", "tool"]
    assert later["messages"][2]["tool_call_id"] == "a" and later["messages"][4]["tool_call_id"] == "b"
    assert later["messages"][4]["content"].startswith("file_operations_reader")


# --- infrastructure errors --------------------------------------------------------------------------------


class FlakyModel:
    """Slow for the conversations of ``slow`` (a task id in the prompt), HTTP 400 "context length" for
    those of ``long``, a completion signal for the others; ``healed`` makes every answer normal."""

    def __init__(self, slow: str, long: str, delay: float):
        self.slow, self.long, self.delay = slow, long, delay
        self.healed = False
        self.lock = threading.Lock()

    def __call__(self, body):
        prompt = body["messages"][0]["content"]
        if not self.healed and self.slow in prompt:
            time.sleep(self.delay)
        if not self.healed and self.long in prompt:
            return 400, {"error": {"message": "This model's maximum context length is 2048 tokens; you requested "
                                              "4000 tokens"}}
        return 200, completion("<tool_call>file_operations_reader</tool_call>")


def test_an_episode_the_server_cannot_answer_ends_alone_and_resume_keeps_it(tmp_path):
    tasks = one_task_per_type()[:3]
    jobs = eval_jobs(tasks, ["baseline"], seeds=[0])
    path = tmp_path / "results.jsonl"  # run_eval's output_dir is tmp_path
    model = FlakyModel(tasks[0].description, tasks[1].description, delay=3.0)
    with ChatServer(model) as server:
        backend = OpenAIBackend(server.url, "m", timeout=1.0, max_concurrency=3, max_retries=0)
        start = time.monotonic()
        rows = run_eval(backend, jobs, batch_size=3, output_dir=tmp_path, progress=False, env={**ENV})
        assert time.monotonic() - start < 20
        levels = [r["level"] for r in rows]
        assert levels[:2] == ["infra_error", "infra_error"] and levels[2] != "infra_error"
        assert "RequestTimeoutError" in rows[0]["infra_error"] and "not resubmitted" in rows[0]["infra_error"]
        assert "ContextOverflowError" in rows[1]["infra_error"] and rows[1]["turns"] == 0
        slow_requests = sum(tasks[0].description in b["messages"][0]["content"] for b in server.requests)
        assert slow_requests == 1, "a timed-out request is never resubmitted"

        sent = len(server.requests)
        again = run_eval(backend, jobs, batch_size=3, output_dir=tmp_path, progress=False, env={**ENV})
        assert again == rows and len(server.requests) == sent, "an infra-error row is a finished row"

        model.healed = True
        retried = run_eval(backend, jobs, batch_size=3, output_dir=tmp_path, progress=False,
                           retry_infra_errors=True, env={**ENV})
    assert [r["level"] != "infra_error" for r in retried] == [True, True, True]
    assert retried[2] == rows[2]  # a finished episode is not played again
    assert len(read_jsonl(path).rows) == 5


def test_eval_command_survives_a_server_that_times_out(tmp_path, capsys):
    tasks = one_task_per_type()[:2]
    model = FlakyModel(tasks[0].description, "no such text", delay=3.0)
    directory = tmp_path / "out"
    with ChatServer(model) as server:
        code = main(["eval", "agent", "--agent", f"openai:{server.url}?model=m", "--prompts", "baseline", "--seeds", "0",
                     "--task-id", tasks[0].instance_id, "--task-id", tasks[1].instance_id, "--protocol", "tools",
                     "--request-timeout", "1", "--max-retries", "0", "--batch-size", "2", "--concurrency", "2",
                     "--output-dir", str(directory)])
    assert code == 0
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["infra_errors"] == {"m": 1}
    assert summary["by_prompt"]["m"]["baseline"]["episodes"] == 1
    assert summary["metadata"]["config"]["eval"]["protocol"] == "tools"
    assert "1 episode(s) ended by an infrastructure error" in capsys.readouterr().out


@pytest.mark.parametrize("extra, message", [
    (["--protocol", "xml"], "invalid choice: 'xml'"),
    (["--wording", "poem"], "invalid choice: 'poem'"),
    (["--request-timeout", "0"], "--request-timeout: timeout must be a finite number > 0"),
    (["--concurrency", "0"], "--concurrency"),
    (["--max-retries", "-1"], "--max-retries"),
])
def test_eval_refuses_bad_protocol_and_request_options(extra, message, tmp_path, capsys):
    assert main(["eval", "agent", "--agent", "scripted:optimal", "--limit", "1", "--output-dir", str(tmp_path / "o"),
                 *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()
