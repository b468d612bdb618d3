"""LLM backends: a tiny local transformers model, an OpenAI-compatible server started here, vLLM on GPU."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time

import pytest
from chat_server import ChatServer, completion
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401 (fixture)

from helpers import with_ctrl_c
from resilibench.agents.backends import (
    OpenAIBackend,
    TransformersBackend,
    VLLMBackend,
    check_conversations,
    check_spec,
    make_backend,
    parse_spec,
    parse_tool_calls,
    truncate_at_stop,
)
from resilibench.llm import BackendError, ContextOverflowError, GenerationConfig, PartialFailure

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("torch_one_thread")

CONVERSATIONS = [
    [{"role": "user", "content": "Read the file and parse it."}],
    [{"role": "system", "content": "You call tools."}, {"role": "user", "content": "validate " * 12}],
    [{"role": "user", "content": "Search tools"}, {"role": "assistant", "content": "<tool_search>x</tool_search>"},
     {"role": "user", "content": "Tool search results: network_fetcher"}],
    [{"role": "user", "content": "task completed?"}],
]
GREEDY = GenerationConfig(max_new_tokens=16)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("tiny_lm"))


@pytest.fixture(scope="module")
def hf(tiny_path):
    return TransformersBackend(tiny_path, batch_size=3)


# --- the tiny model helper ----------------------------------------------------------------------------


def test_tiny_lm_tokenizer_encodes_anything_and_masks_assistant_turns(tiny_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    assert (tokenizer.padding_side, tokenizer.pad_token, tokenizer.eos_token) == ("left", "<|pad|>", "<|end|>")
    text = 'Ünïcode ✓ <tool_call>file_operations_reader {"source": "a.csv"}</tool_call>'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert tokenizer.convert_tokens_to_ids("<tool_call>") in ids  # protocol tags are single tokens
    conversation = [{"role": "user", "content": "read the file"},
                    {"role": "assistant", "content": "<tool_call>file_operations_reader</tool_call>"}]
    out = tokenizer.apply_chat_template(conversation, tokenize=True, return_dict=True,
                                        return_assistant_tokens_mask=True)
    kept = [i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m]
    assert tokenizer.decode(kept) == "<tool_call>file_operations_reader</tool_call><|end|>"


# --- transformers -------------------------------------------------------------------------------------


def test_greedy_batches_equal_single_generation(hf):
    batched = hf.generate(CONVERSATIONS, GREEDY)  # batch_size 3: one padded batch of 3, then one of 1
    single = [hf.generate([c], GREEDY)[0] for c in CONVERSATIONS]
    assert batched == single
    assert len(set(batched)) > 1, "outputs should depend on the conversation"
    assert all(isinstance(text, str) and text for text in batched)
    assert hf.generate(CONVERSATIONS, GREEDY) == batched  # deterministic


def test_sampling_is_seeded_and_leaves_global_rng_alone(hf):
    sampled = GenerationConfig(max_new_tokens=16, temperature=1.0, seed=7)
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = hf.generate(CONVERSATIONS, sampled)
    after = torch.rand(1)
    assert torch.equal(before, after), "seeded sampling must not move the global torch generator"
    assert hf.generate(CONVERSATIONS, sampled) == a
    assert hf.generate(CONVERSATIONS, GenerationConfig(max_new_tokens=16, temperature=1.0, seed=8)) != a
    assert a != hf.generate(CONVERSATIONS, GREEDY)


def test_stop_strings_end_and_are_cut(hf):
    full = hf.generate(CONVERSATIONS[:1], GenerationConfig(max_new_tokens=24))[0]
    stop = full[4:6]
    assert stop.strip(), "the tiny model's output should have text to stop at"
    stopped = hf.generate(CONVERSATIONS[:1], GenerationConfig(max_new_tokens=24, stop=(stop,)))[0]
    assert stopped == full[: full.find(stop)]


def test_transformers_backend_rejects_bad_input(tiny_path, hf):
    with pytest.raises(FileNotFoundError, match="model_path"):
        TransformersBackend(tiny_path / "missing")
    with pytest.raises(ValueError, match="dtype"):
        TransformersBackend(tiny_path, dtype="float99")
    with pytest.raises(ValueError, match="conversation 0"):
        hf.generate([[{"role": "robot", "content": "hi"}]], GREEDY)
    with pytest.raises(ValueError, match="empty"):
        hf.generate([[]], GREEDY)


def test_truncate_at_stop():
    assert truncate_at_stop("abc</tool_call>rest", ["</tool_call>"]) == "abc"
    assert truncate_at_stop("a;b.c", [".", ";"]) == "a"
    assert truncate_at_stop("abc", []) == "abc"


# --- specs --------------------------------------------------------------------------------------------


def test_specs(tiny_path):
    assert parse_spec("openai:http://127.0.0.1:8000/v1?model=m&timeout=5") == (
        "openai", "http://127.0.0.1:8000/v1", {"model": "m", "timeout": 5})
    backend = make_backend(f"hf:{tiny_path}?name=tiny&dtype=float32", batch_size=5)
    assert (backend.name, backend.batch_size) == ("tiny", 5)
    assert make_backend(f"hf:{tiny_path}?batch_size=2", batch_size=5).batch_size == 2
    openai = make_backend("openai:http://127.0.0.1:9/v1?model=qwen&max_concurrency=3")
    assert (openai.name, openai.max_concurrency, openai.url) == ("qwen", 3, "http://127.0.0.1:9/v1/chat/completions")
    for bad, message in [("gpt4", "backend spec must be"), ("hf:", "backend spec must be"),
                         ("openai:http://x/v1", "model=NAME"), (f"hf:{tiny_path}?colour=red", "unknown option"),
                         ("openai:http://x/v1?model=m&api_key=k", "OPENAI_API_KEY"),
                         ("openai:ftp://x?model=m", "http")]:
        with pytest.raises(ValueError, match=message):
            make_backend(bad)


# --- OpenAI-compatible HTTP ---------------------------------------------------------------------------


def test_openai_backend_matches_the_model_behind_the_server(hf):
    """The server answers with the tiny model; the client's batch equals calling the model directly."""
    model_lock = threading.Lock()

    def answer(body):
        time.sleep(0.05)  # let requests overlap
        config = GenerationConfig(max_new_tokens=body["max_tokens"], temperature=body["temperature"])
        with model_lock:
            text = hf.generate([body["messages"]], config)[0]
        return 200, completion(text)

    with ChatServer(answer) as server:
        client = OpenAIBackend(server.url, "tiny", api_key="secret", max_concurrency=4)
        got = client.generate(CONVERSATIONS, GREEDY)
    assert got == [hf.generate([c], GREEDY)[0] for c in CONVERSATIONS]
    assert server.max_active > 1, "a batch should be sent as concurrent requests"
    assert server.max_active <= 4
    assert {r["model"] for r in server.requests} == {"tiny"}
    assert all(h["Authorization"] == "Bearer secret" for h in server.headers)
    assert sorted(json.dumps(r["messages"]) for r in server.requests) == sorted(json.dumps(c) for c in CONVERSATIONS)


def test_openai_backend_retries_server_errors_and_rate_limits():
    attempts: dict[str, int] = {}
    lock = threading.Lock()

    def answer(body):
        key = body["messages"][-1]["content"]
        with lock:
            attempts[key] = attempts.get(key, 0) + 1
            n = attempts[key]
        if n == 1:
            return 500, {"error": {"message": "overloaded"}}
        if n == 2 and key.startswith("b"):
            return 429, {"error": {"message": "slow down"}}
        return 200, completion(f"<tool_call>{key}</tool_call> and more")

    config = GenerationConfig(max_new_tokens=8, temperature=0.5, seed=3, stop=(" and",))
    with ChatServer(answer) as server:
        client = OpenAIBackend(server.url, "m", backoff=0.01)
        got = client.generate([[{"role": "user", "content": c}] for c in ("a1", "b2", "a3")], config)
    assert got == ["<tool_call>a1</tool_call>", "<tool_call>b2</tool_call>", "<tool_call>a3</tool_call>"]
    assert attempts == {"a1": 2, "b2": 3, "a3": 2}
    body = server.requests[0]
    assert (body["max_tokens"], body["temperature"], body["top_p"], body["seed"], body["stop"]) == (
        8, 0.5, 1.0, 3, [" and"])


@pytest.mark.parametrize("status, payload, options, message", [
    (400, {"error": {"message": "bad model name"}}, {}, "HTTP 400.*bad model name"),
    (503, {"error": {"message": "down"}}, {"max_retries": 2}, "no answer after 3 attempts; last: HTTP 503.*down"),
    (200, {"unexpected": True}, {}, "not a chat completion"),
])
def test_openai_backend_errors_are_clear(status, payload, options, message):
    with ChatServer(lambda body: (status, payload)) as server, pytest.raises(BackendError, match=message):
        OpenAIBackend(server.url, "m", backoff=0.001, **options).generate(CONVERSATIONS[:1], GREEDY)


def test_openai_backend_without_a_server():
    with ChatServer(lambda body: (200, completion("x"))) as server:
        url = server.url
    with pytest.raises(BackendError, match="no answer after 2 attempts"):  # nothing listens any more
        OpenAIBackend(url, "m", max_retries=1, backoff=0.001, timeout=2).generate(CONVERSATIONS[:1], GREEDY)


# --- vLLM ---------------------------------------------------------------------------------------------


def _vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.is_available()


def test_vllm_backend_names_its_extra_when_missing(tiny_path):
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match=r"resilibench\[vllm\]"):
            VLLMBackend(tiny_path)
    else:
        pytest.skip("vllm is installed")


@pytest.mark.gpu
@pytest.mark.skipif(not _vllm_available(), reason="needs vllm and a CUDA GPU")
def test_vllm_backend_batches_greedy_generation(tmp_path):
    # Attention kernels want a common head size: 256 / 4 heads = 64.
    path = build_tiny_lm(tmp_path / "tiny_vllm", hidden_size=256, num_heads=4)
    backend = VLLMBackend(path, gpu_memory_utilization=0.2, max_model_len=2048, enforce_eager=True,
                          dtype="float32")
    got = backend.generate(CONVERSATIONS, GREEDY)
    assert len(got) == len(CONVERSATIONS) and all(isinstance(t, str) for t in got)
    assert len(set(got)) > 1
    assert backend.generate(CONVERSATIONS, GREEDY) == got  # greedy: the same batch, the same answers
    # Repeated prompts in one seeded call get distinct samples (ScPO's r candidates), reproducibly.
    sampling = GenerationConfig(max_new_tokens=16, temperature=1.0, seed=7)
    samples = backend.generate(CONVERSATIONS[:1] * 4, sampling)
    assert len(set(samples)) > 1 and backend.generate(CONVERSATIONS[:1] * 4, sampling) == samples
    full = got[0]
    stop = full[2:4]
    if stop.strip():
        stopped = backend.generate(CONVERSATIONS[:1], GenerationConfig(max_new_tokens=16, stop=(stop,)))[0]
        assert stopped == full[: full.find(stop)]
    messages = backend.generate_with_tools([TOOL_CONVERSATION, CONVERSATIONS[0]], GREEDY, TOOLS)
    assert [m["role"] for m in messages] == ["assistant", "assistant"]
    assert all(isinstance(m["content"], str) for m in messages)


# --- native tool calling, failures of one conversation, Ctrl-C ----------------------------------------

TOOLS = [{"type": "function", "function": {"name": "file_operations_reader", "description": "Read a file",
                                           "parameters": {"type": "object", "properties": {
                                               "source": {"type": "string"}}, "required": ["source"]}}}]
TOOL_CONVERSATION = [
    {"role": "user", "content": "Read a.csv"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "file_operations_reader", "arguments": '{"source": "a.csv"}'}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "file_operations_reader executed successfully."},
]
# A Qwen2.5-like template that renders tools and tool calls (arguments written with tojson).
TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>{{ eos_token }}\n"
    "{% endif %}{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% for c in m.tool_calls or [] %}"
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}\n</tool_call>'
    "{% endfor %}{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def test_hf_specs_take_a_gguf_file(tmp_path):
    (tmp_path / "m.gguf").write_bytes(b"")
    (tmp_path / "m.bin").write_bytes(b"")
    assert parse_spec(f"hf:{tmp_path / 'm.gguf'}")[1] == str(tmp_path / "m.gguf")
    check_spec(f"hf:{tmp_path / 'm.gguf'}")
    with pytest.raises(FileNotFoundError, match="nor a .gguf file"):
        check_spec(f"hf:{tmp_path / 'm.bin'}")


def test_parse_tool_calls_reads_qwen_and_smollm2_forms():
    qwen = parse_tool_calls('I will read it.\n<tool_call>\n{"name": "file_operations_reader", "arguments": '
                            '{"source": "a.csv"}}\n</tool_call>')
    assert qwen == {"role": "assistant", "content": "I will read it.", "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "file_operations_reader", "arguments": '{"source": "a.csv"}'}}]}
    smol = parse_tool_calls('<tool_call>[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]'
                            '</tool_call>')
    assert [c["function"]["name"] for c in smol["tool_calls"]] == ["a", "b"] and smol["content"] == ""
    unclosed = parse_tool_calls('<tool_call>{"name": "a", "arguments": {"x": 2}}')  # stopped before the tag
    assert unclosed["tool_calls"][0]["function"]["arguments"] == '{"x": 2}'
    prose = parse_tool_calls("<tool_call>read the file</tool_call> Task completed.")
    assert "tool_calls" not in prose and prose["content"] == "<tool_call>read the file</tool_call> Task completed."



def test_parse_tool_calls_reads_plain_json_calls_only_when_unambiguous():
    # As Qwen2.5-Coder-0.5B-Instruct answered under the tools protocol (a transcript of docs/agents/llm_agents.md).
    fenced = parse_tool_calls('To scan the files:\n```json\n{"name": "file_operations_scanner", "arguments": '
                              '{"path": "data/in"}}\n```\nThen convert them.')
    assert [c["function"]["name"] for c in fenced["tool_calls"]] == ["file_operations_scanner"]
    assert fenced["tool_calls"][0]["function"]["arguments"] == '{"path": "data/in"}'
    assert fenced["content"] == "To scan the files:\n\nThen convert them."
    for text in ('```json\n{"name": "x", "arguments": {}, "result": "done"}\n```',  # more than a call
                 '```json\n{"name": "x", "arguments": "path"}\n```',  # arguments not an object
                 '```json\n{"tool": "x"}\n```', '```python\nprint("x")\n```'):
        assert "tool_calls" not in parse_tool_calls(text) and parse_tool_calls(text)["content"] == text
    # ... and through llama.cpp: the whole answer one call object after another, arguments as JSON text.
    lines = parse_tool_calls('{"name": "tool_info", "arguments": "{\\"name\\": \\"data_processing_parser\\"}"}\n'
                             '{"name": "tool_info", "arguments": "{\\"name\\": \\"file_operations_reader\\"}"}')
    assert [json.loads(c["function"]["arguments"]) for c in lines["tool_calls"]] == [
        {"name": "data_processing_parser"}, {"name": "file_operations_reader"}] and lines["content"] == ""
    cut = parse_tool_calls('{"name": "tool_search", "arguments": {"query": "xml"}}\n{"name": "tool_info", "argu')
    assert [c["function"]["name"] for c in cut["tool_calls"]] == ["tool_search"]  # the token limit cut the second
    assert cut["content"] == '{"name": "tool_info", "argu'
    for text in ('{"name": "x", "arguments": {}} and then more', '{"name": "x", "arguments": "not json"}',
                 '{"answer": 42}'):
        assert "tool_calls" not in parse_tool_calls(text)
    both = parse_tool_calls('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n```json\n'
                            '{"name": "b", "arguments": {}}\n```')
    assert [c["function"]["name"] for c in both["tool_calls"]] == ["a"]  # the template's form wins

def test_transformers_tools_with_a_template_that_ignores_them(hf):
    prompt = hf._render(check_conversations([TOOL_CONVERSATION])[0], TOOLS)
    assert hf._template_takes_tools is False
    assert "<tools>" in prompt and '"name": "file_operations_reader"' in prompt
    assert '<tool_call>\n{"name": "file_operations_reader", "arguments": {"source": "a.csv"}}' in prompt
    assert "<tool_response>\nfile_operations_reader executed successfully.\n</tool_response>" in prompt
    answers = hf.generate_with_tools([TOOL_CONVERSATION, TOOL_CONVERSATION[:1]], GREEDY, TOOLS)
    assert all(a["role"] == "assistant" and isinstance(a["content"], str) for a in answers)
    assert answers[1] == hf.generate_with_tools([TOOL_CONVERSATION[:1]], GREEDY, TOOLS)[0]


def test_transformers_tools_with_a_template_that_takes_them(tiny_path):
    backend = TransformersBackend(tiny_path)
    backend.tokenizer.chat_template = TOOLS_TEMPLATE
    prompt = backend._render(check_conversations([TOOL_CONVERSATION])[0], TOOLS)
    assert backend._template_takes_tools is True
    assert prompt.startswith("<|system|>\n<tools>") and "<tool_response>" not in prompt
    assert '"arguments": {"source": "a.csv"}' in prompt  # an object, not a JSON string written again


def test_a_prompt_past_the_models_positions_fails_alone(tmp_path):
    backend = TransformersBackend(build_tiny_lm(tmp_path / "short", max_positions=64))
    long = [{"role": "user", "content": "validate the records " * 40}]
    with pytest.raises(PartialFailure) as caught:
        backend.generate([CONVERSATIONS[0], long], GREEDY)
    answer, failure = caught.value.answers
    assert isinstance(answer, str) and isinstance(failure, ContextOverflowError)
    assert "exceeds the model's 64 positions" in str(failure)
    assert answer == backend.generate([CONVERSATIONS[0]], GREEDY)[0]


def test_openai_tools_request_and_answer():
    calls = [{"id": "x", "type": "function", "function": {"name": "file_operations_reader",
                                                          "arguments": '{"source": "a.csv"}'}}]
    with ChatServer(lambda body: (200, {"choices": [{"message": {"role": "assistant", "content": None,
                                                                 "tool_calls": calls}}]})) as server:
        got = OpenAIBackend(server.url, "m").generate_with_tools([TOOL_CONVERSATION], GREEDY, TOOLS)
    assert got == [{"role": "assistant", "content": "", "tool_calls": calls}]
    assert server.requests[0]["tools"] == TOOLS and server.requests[0]["messages"] == TOOL_CONVERSATION
    # A server that returns the model's own tool-call blocks as text (llama-cpp-python's default).
    text = 'Reading.\n<tool_call>\n{"name": "file_operations_reader", "arguments": {"source": "a.csv"}}\n</tool_call>'
    with ChatServer(lambda body: (200, completion(text))) as server:
        (got,) = OpenAIBackend(server.url, "m").generate_with_tools([TOOL_CONVERSATION], GREEDY, TOOLS)
    assert got["content"] == "Reading." and got["tool_calls"][0]["function"]["arguments"] == '{"source": "a.csv"}'


def test_ctrl_c_does_not_wait_for_a_request_in_flight():
    """A process interrupted while its request is in flight exits at once (the request is abandoned, no
    thread holds up the exit) and never sends the queued second request."""
    with ChatServer(lambda body: (time.sleep(30), (200, completion("late")))[1]) as server:
        code = ("from resilibench.agents.backends import OpenAIBackend\n"
                "from resilibench.llm import GenerationConfig\n"
                f"OpenAIBackend({server.url!r}, 'm', timeout=60).generate("
                "[[{'role': 'user', 'content': 'a'}], [{'role': 'user', 'content': 'b'}]], GenerationConfig())")
        process = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, preexec_fn=with_ctrl_c)
        deadline = time.monotonic() + 60
        while not server.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        start = time.monotonic()
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20)
        assert time.monotonic() - start < 5
        assert process.returncode != 0 and b"KeyboardInterrupt" in err
        assert len(server.requests) == 1, "with one request at a time the second is never sent"
