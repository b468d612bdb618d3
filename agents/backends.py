"""LLM backends: local transformers models, vLLM engines and OpenAI-compatible HTTP servers.

Each one implements ``resilibench.llm.Backend``: ``generate(conversations, config)`` turns a
batch of chat conversations into one assistant message each, in order. ``make_backend(spec)`` builds
one from a short string, the form the command line takes:

* ``hf:PATH[?device=cuda&dtype=bfloat16&batch_size=16&name=NAME]``: a local transformers model
  (``TransformersBackend``; needs the ``llm`` extra);
* ``vllm:PATH[?tensor_parallel_size=2&max_model_len=8192&name=NAME]``: a vLLM engine in this process
  (``VLLMBackend``; needs the ``vllm`` extra and a GPU); other options go to ``vllm.LLM``;
* ``openai:URL?model=NAME[&max_concurrency=1&timeout=600&max_retries=3]``: any server speaking the
  OpenAI chat completions API, e.g. ``vllm serve`` or llama.cpp's server (``OpenAIBackend``; standard
  library only). The API key comes from ``OPENAI_API_KEY`` when set, so it never lands in a command line
  or a results file.

Stop strings are honoured everywhere and, as in the OpenAI API, left out of the returned text. Every
backend speaks native tool calling (``generate_with_tools``): the OpenAI backend through the ``tools``
request field, transformers and vLLM through the chat template's ``tools`` argument with the model's
``<tool_call>`` blocks parsed back (``parse_tool_calls``).
"""

from __future__ import annotations

__all__ = ["BACKEND_KINDS", "BackendError", "ContextOverflowError", "OpenAIBackend", "TransformersBackend",
           "VLLMBackend", "make_backend", "parse_tool_calls"]

import contextlib
import json
import os
import queue
import random
import re
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilibench.llm import (
    Backend,
    BackendError,
    ContextOverflowError,
    GenerationConfig,
    Message,
    PartialFailure,
    RequestTimeoutError,
    raise_failures,
)
from resilibench.settings import Settings, setting

BACKEND_KINDS = ("hf", "vllm", "openai")


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]


MESSAGE_KEYS = ("role", "content", "tool_calls", "tool_call_id")


def check_conversations(conversations: Sequence[Sequence[Message]]) -> list[list[Message]]:
    """The conversations as lists of message dicts (``role`` and ``content``; ``tool_calls`` on assistant
    messages and ``tool_call_id`` on tool messages kept); ValueError naming the first bad one."""
    checked = []
    for i, conversation in enumerate(conversations):
        if not conversation:
            raise ValueError(f"conversation {i} is empty")
        for message in conversation:
            if not isinstance(message, dict) or not isinstance(message.get("content"), str) or \
                    message.get("role") not in ("system", "user", "assistant", "tool"):
                raise ValueError(f"conversation {i}: every message needs a role (system, user, assistant or "
                                 f"tool) and a string content, got {message!r}")
        checked.append([{k: m[k] for k in MESSAGE_KEYS if k in m} for m in conversation])
    return checked


_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
_JSON_FENCE = re.compile(r"```(?:json)?[ \t]*\n(.*?)```", re.DOTALL)


_CALL_KEYS = {"name", "arguments", "parameters"}


def _is_plain_call(d: dict[str, Any]) -> bool:
    """Nothing but a name and arguments (an object, or an object written as a JSON string)."""
    arguments = d.get("arguments", d.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            return False
    return set(d) <= _CALL_KEYS and isinstance(arguments, dict)


def _call_items(data: Any, strict: bool) -> list[dict[str, Any]] | None:
    """The calls in a JSON value: an object with a string ``name`` or a list of them, else None.
    ``strict`` (calls outside a ``<tool_call>`` block) also asks for nothing but name and arguments."""
    items = data if isinstance(data, list) else [data]
    if not items or not all(isinstance(d, dict) and isinstance(d.get("name"), str) for d in items):
        return None
    if strict and not all(_is_plain_call(d) for d in items):
        return None
    return items


def _json_values(text: str, cut_tail: bool = False) -> tuple[list[Any], int] | None:
    """``text`` as a sequence of JSON values separated by white space, and where the sequence ends; else
    None. With ``cut_tail`` an object cut off by the token limit (the text ends inside it) ends the
    sequence instead of spoiling it."""
    decoder, values, i = json.JSONDecoder(), [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return (values, i) if values else None
        try:
            value, end = decoder.raw_decode(text, i)
        except (ValueError, RecursionError):
            cut = cut_tail and values and text[i] == "{" and not text.rstrip().endswith("}")
            return (values, i) if cut else None
        values.append(value)
        i = end


def _call_spans(text: str) -> list[tuple[int, int, list[dict[str, Any]]]]:
    """(start, end, calls) of each part of ``text`` read as calls (``parse_tool_calls``)."""
    blocks = list(_TOOL_CALL_BLOCK.finditer(text))
    if blocks:
        found = [(m.start(), m.end(), _json_values(m.group(1))) for m in blocks]
        return [(a, b, items) for a, b, parsed in found if parsed and len(parsed[0]) == 1
                and (items := _call_items(parsed[0][0], strict=False))]
    spans = []
    for m in _JSON_FENCE.finditer(text):
        calls = _plain_calls(_json_values(m.group(1)))
        if calls:
            spans.append((m.start(), m.end(), calls))
    if spans:
        return spans
    parsed = _json_values(text, cut_tail=True)
    calls = _plain_calls(parsed)
    return [(0, parsed[1], calls)] if parsed and calls else []


def _plain_calls(parsed: tuple[list[Any], int] | None) -> list[dict[str, Any]]:
    """The calls of parsed JSON values when every value is plain calls (``_call_items`` strict), else []."""
    groups = [_call_items(v, strict=True) for v in (parsed[0] if parsed else ())]
    return [d for group in groups for d in group or ()] if groups and all(groups) else []


def parse_tool_calls(text: str) -> Message:
    """A model's answer in the ``<tool_call>`` form of Qwen2.5/Hermes chat templates (one JSON object
    ``{"name", "arguments"}`` per block) or SmolLM2's (a JSON list of them in one block) as an assistant
    message: the text outside the blocks as ``content``, the calls as ``tool_calls``. An answer without
    such a block may write its calls as plain JSON instead, as small Qwen2.5 models do: in ```json code
    fences, or as the whole answer (one call object after another, the last maybe cut off by the token
    limit); they are read as calls when they hold nothing but ``{"name": ..., "arguments": {...}}`` objects
    (arguments may be a JSON string of an object). Anything else stays in the content, so nothing the
    model wrote is lost."""
    calls, kept, last = [], [], 0
    for start, end, items in _call_spans(text):
        for d in items:
            arguments = d.get("arguments", d.get("parameters", {}))
            calls.append({"id": f"call_{len(calls)}", "type": "function", "function": {
                "name": d["name"], "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept.append(text[last:start])
        last = end
    message: Message = {"role": "assistant", "content": ("".join(kept) + text[last:]).strip()}
    if calls:
        message["tool_calls"] = calls
    return message


def template_messages(conversation: list[Message]) -> list[Message]:
    """A conversation for a Hugging Face chat template: tool call arguments as objects (templates write
    them with ``tojson``), each call as its ``function``."""
    out = []
    for m in conversation:
        if "tool_calls" in m:
            calls = []
            for call in m["tool_calls"]:
                function = dict(call.get("function", call))
                with contextlib.suppress(TypeError, ValueError):  # an object already, or not JSON: as written
                    function["arguments"] = json.loads(function.get("arguments") or "{}")
                calls.append({"type": "function", "function": function})
            m = {**m, "tool_calls": calls}
        out.append(m)
    return out


HERMES_TOOLS = (
    "You may call functions to do the task. Their signatures are within <tools></tools>:\n<tools>\n{tools}\n"
    "</tools>\nTo call one, answer with a JSON object of its name and arguments within <tool_call></tool_call>:\n"
    '<tool_call>\n{{"name": "function_name", "arguments": {{"argument": "value"}}}}\n</tool_call>'
)


def hermes_chat(conversation: list[Message], tools: list[dict[str, Any]]) -> list[Message]:
    """A tool conversation for a chat template that knows no tools: the tools in a system message (Hermes
    form), each tool call written as a ``<tool_call>`` block, each tool message as a user message holding
    a ``<tool_response>``."""
    system = HERMES_TOOLS.format(tools="\n".join(json.dumps(t) for t in tools))
    if conversation[0]["role"] == "system":
        system = conversation[0]["content"] + "\n\n" + system
        conversation = conversation[1:]
    out = [{"role": "system", "content": system}]
    for m in conversation:
        if m["role"] == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        elif "tool_calls" in m:
            blocks = [f"<tool_call>\n{json.dumps(c['function'])}\n</tool_call>"
                      for c in template_messages([m])[0]["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join([m["content"], *blocks]).strip()})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def map_answers(convert: Callable[[Any], Any], produce: Callable[[], list[Any]]) -> list[Any]:
    """``convert`` applied to every answer of ``produce()``, also to the answers of a ``PartialFailure``
    (which is raised again with them)."""
    try:
        answers = produce()
    except PartialFailure as exc:
        raise PartialFailure([a if isinstance(a, BackendError) else convert(a) for a in exc.answers]) from None
    return [convert(a) for a in answers]


def model_location(model_path: str | Path) -> tuple[Path, str | None]:
    """(directory, GGUF file name or None) of a local model: a directory holding a transformers model, or
    a ``.gguf`` file (loaded by transformers with the ``gguf`` package, dequantised); FileNotFoundError
    otherwise."""
    path = Path(model_path)
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    if not path.is_dir():
        raise FileNotFoundError(f"model_path {model_path}: not a directory holding a transformers model nor a "
                                ".gguf file (models load from local paths only)")
    return path, None


# --- transformers -------------------------------------------------------------------------------------


class TransformersBackend:
    """A local Hugging Face causal LM: chat template, left padding, batched ``generate``.

    Greedy decoding at temperature 0; otherwise sampling seeded by ``config.seed`` (the global torch
    generator is left untouched). ``batch_size`` caps how many conversations go through one forward
    pass; larger batches are split. A conversation whose prompt plus ``max_new_tokens`` exceeds the
    model's maximum positions fails with ``ContextOverflowError`` before anything is generated (the
    others of the batch are answered). Tools go to the chat template's ``tools`` argument; a template
    that ignores them gets them in a system message in the Hermes form the answers are parsed in.
    """

    def __init__(self, model_path: str | Path, device: str = "cpu", dtype: Any = None, batch_size: int = 8,
                 name: str | None = None):
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
        except ImportError as exc:
            raise ImportError(f"TransformersBackend needs torch and transformers: pip install "
                              f"'resilibench[llm]' ({exc})") from None
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        path, gguf = model_location(model_path)
        if isinstance(dtype, str) and dtype != "auto":
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype must be a torch dtype name such as float32, bfloat16 or float16, "
                                 f"or 'auto'; got {dtype!r}")
            dtype = getattr(torch, dtype)
        self.name = name or (Path(gguf).stem if gguf else path.resolve().name)
        self.device = device
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf)
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(f"model_path {model_path}: the tokenizer has no chat template")
        # transformers declares ``to`` through functools.wraps(Module.to) (read as the unbound method) and
        # ``generate``'s self as a protocol its own models do not match: pyright is wrong on both.
        model = AutoModelForCausalLM.from_pretrained(path, gguf_file=gguf, dtype=dtype or "auto")
        self.model = model.to(device)  # pyright: ignore[reportArgumentType]
        self.model.eval()
        self.max_positions = getattr(self.model.config, "max_position_embeddings", None)
        self._template_takes_tools: bool | None = None

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        return self._generate([self._render(c, None) for c in check_conversations(conversations)], config)

    def generate_with_tools(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig,
                            tools: Sequence[dict[str, Any]]) -> list[Message]:
        texts = [self._render(c, list(tools)) for c in check_conversations(conversations)]
        return map_answers(parse_tool_calls, lambda: self._generate(texts, config))

    def _render(self, conversation: list[Message], tools: list[dict[str, Any]] | None) -> str:
        """The prompt text of a conversation (with ``tools`` offered when given)."""
        if tools is None:
            return self.tokenizer.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
        if self._template_takes_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            self._template_takes_tools = self.tokenizer.apply_chat_template(
                probe, tools=tools, add_generation_prompt=True, tokenize=False
            ) != self.tokenizer.apply_chat_template(probe, add_generation_prompt=True, tokenize=False)
        if self._template_takes_tools:
            return self.tokenizer.apply_chat_template(template_messages(conversation), tools=tools,
                                                      add_generation_prompt=True, tokenize=False)
        return self.tokenizer.apply_chat_template(hermes_chat(conversation, tools), add_generation_prompt=True,
                                                  tokenize=False)

    def _generate(self, texts: list[str], config: GenerationConfig) -> list[str]:
        """Completions of prompt texts, in batches; ``PartialFailure`` for prompts that do not fit."""
        answers: list[Any] = [None] * len(texts)
        fitting = []
        for i, text in enumerate(texts):
            n = len(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if self.max_positions is not None and n + config.max_new_tokens > self.max_positions:
                answers[i] = ContextOverflowError(
                    f"the prompt has {n} tokens; with max_new_tokens={config.max_new_tokens} it exceeds the "
                    f"model's {self.max_positions} positions")
            else:
                fitting.append(i)
        for start in range(0, len(fitting), self.batch_size):
            chunk = fitting[start:start + self.batch_size]
            seed = None if config.seed is None else config.seed + start
            for i, answer in zip(chunk, self._generate_chunk([texts[i] for i in chunk], config, seed), strict=True):
                answers[i] = answer
        return raise_failures(answers)

    def _generate_chunk(self, texts: list[str], config: GenerationConfig, seed: int | None) -> list[str]:
        import torch

        # The chat template writes any beginning-of-sequence token itself.
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
        kwargs: dict[str, Any] = {"max_new_tokens": config.max_new_tokens,
                                  "pad_token_id": self.tokenizer.pad_token_id}
        if config.temperature > 0:
            kwargs.update(do_sample=True, temperature=config.temperature, top_p=config.top_p)
        else:
            kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        if config.stop:
            kwargs.update(stop_strings=list(config.stop), tokenizer=self.tokenizer)
        devices = [torch.device(self.device)] if torch.device(self.device).type == "cuda" else []
        with torch.random.fork_rng(devices=devices, enabled=seed is not None), torch.inference_mode():
            if seed is not None:
                torch.manual_seed(seed)
            generated = self.model.generate(**inputs, **kwargs)  # pyright: ignore[reportAttributeAccessIssue]
        new_tokens = generated[:, inputs["input_ids"].shape[1]:]
        decoded = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [truncate_at_stop(text, config.stop) for text in decoded]


# --- vLLM ---------------------------------------------------------------------------------------------


class VLLMBackend:
    """A vLLM engine in this process; every batch goes to the engine in one ``LLM.chat`` call, which
    schedules it with continuous batching (the throughput lever of the evaluation harness). Tools go to
    ``LLM.chat(tools=...)`` (the model's chat template) and the answers are read with ``parse_tool_calls``,
    the Hermes form vLLM's ``hermes`` tool parser reads. A prompt longer than the engine's
    ``max_model_len`` fails alone with ``ContextOverflowError``."""

    def __init__(self, model: str | Path, name: str | None = None, **engine_kwargs: Any):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(f"VLLMBackend needs vLLM (GPU machines): pip install 'resilibench[vllm]' ({exc})"
                              ) from None
        self.name = name or Path(model).name
        self.llm = LLM(model=str(model), **engine_kwargs)

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        return self._chat(check_conversations(conversations), config, None)

    def generate_with_tools(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig,
                            tools: Sequence[dict[str, Any]]) -> list[Message]:
        chats = [template_messages(c) for c in check_conversations(conversations)]
        return map_answers(parse_tool_calls, lambda: self._chat(chats, config, list(tools)))

    def _chat(self, conversations: list[list[Message]], config: GenerationConfig,
              tools: list[dict[str, Any]] | None) -> list[str]:
        from vllm import SamplingParams

        if not conversations:
            return []
        tokenizer, limit = self.llm.get_tokenizer(), self.llm.llm_engine.model_config.max_model_len
        answers: list[Any] = [None] * len(conversations)
        fitting = []
        for i, c in enumerate(conversations):
            text = tokenizer.apply_chat_template(c, tools=tools, add_generation_prompt=True, tokenize=False)
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if n + config.max_new_tokens > limit:
                answers[i] = ContextOverflowError(f"the prompt has {n} tokens; with max_new_tokens="
                                                  f"{config.max_new_tokens} it exceeds max_model_len {limit}")
            else:
                fitting.append(i)
        # One seed per conversation (config.seed + i), as the transformers backend draws each row on: vLLM
        # seeds each request on its own, so one shared seed would give repeated prompts identical samples.
        params = [SamplingParams(n=1, max_tokens=config.max_new_tokens, temperature=config.temperature,
                                 top_p=config.top_p if config.temperature > 0 else 1.0,
                                 seed=None if config.seed is None else config.seed + i, stop=list(config.stop) or None)
                  for i in fitting]
        if fitting:
            results = self.llm.chat([conversations[i] for i in fitting], sampling_params=params, use_tqdm=False,
                                    tools=tools)
            for i, r in zip(fitting, results, strict=True):
                answers[i] = truncate_at_stop(r.outputs[0].text, config.stop)
        return raise_failures(answers)


# --- OpenAI-compatible HTTP ---------------------------------------------------------------------------

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
MAX_RETRY_AFTER = 60.0  # the longest Retry-After an OpenAI-compatible server is obeyed for (seconds)
MAX_ANSWER_BYTES = 16 * 2**20  # the largest chat completion answer read
_OVERFLOW = re.compile(r"context|maximum.{0,40}length|too long|exceed", re.IGNORECASE)


def run_concurrently(work: Callable[[Any], Any], items: Sequence[Any], workers: int) -> list[Any]:
    """``work`` over ``items`` on at most ``workers`` daemon threads, results in order; a ``BackendError``
    raised by ``work`` is the item's result, any other exception is raised here. Ctrl-C returns at
    once: queued items are dropped and requests in flight are abandoned (daemon threads do not hold up
    the interpreter's exit)."""
    results: list[Any] = [None] * len(items)
    todo: queue.SimpleQueue[int] = queue.SimpleQueue()
    finished: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in range(len(items)):
        todo.put(i)

    def worker() -> None:
        while True:
            try:
                i = todo.get_nowait()
            except queue.Empty:
                return
            try:
                results[i] = work(items[i])
            except BaseException as exc:  # noqa: BLE001 (handed to the calling thread)
                results[i] = exc
            finished.put(i)

    for _ in range(min(workers, len(items))):
        threading.Thread(target=worker, daemon=True, name="resilibench-request").start()
    try:
        for _ in items:
            while True:
                try:
                    finished.get(timeout=0.2)
                    break
                except queue.Empty:
                    continue
    except BaseException:
        while not todo.empty():  # no new requests; those in flight end with their daemon threads
            try:
                todo.get_nowait()
            except queue.Empty:
                break
        raise
    for r in results:
        if isinstance(r, BaseException) and not isinstance(r, BackendError):
            raise r
    return results


class OpenAIBackend:
    """A server speaking the OpenAI chat completions API (``POST {base_url}/chat/completions``).

    The conversations of a batch are sent as concurrent requests, at most ``max_concurrency`` at once
    (default 1: a local llama.cpp server computes one request at a time, and queued requests would only
    wait out their timeout). Refused or dropped connections, 408, rate limits (429) and server errors
    (5xx), after which the server holds no work of ours, are retried with exponential backoff and jitter
    (honouring a valid ``Retry-After`` up to ``MAX_RETRY_AFTER`` seconds), up to ``max_retries`` times. A
    request without its whole answer within ``timeout`` seconds (a total deadline: ``resilibench.outbound``)
    is not resubmitted (the server may still be computing it): that conversation fails with
    ``RequestTimeoutError``; an answer over ``MAX_ANSWER_BYTES`` raises ``BackendError``; an HTTP 400 about the context length fails it with
    ``ContextOverflowError``; the others of the batch are answered (``PartialFailure``). Other HTTP
    errors and malformed answers raise ``BackendError`` with the server's message.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 600,
                 max_concurrency: int = 1, max_retries: int = 3, backoff: float = 0.5, name: str | None = None):
        parts = urllib.parse.urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
        if not model:
            raise ValueError("model must name the served model (the 'model' field of the request)")
        if max_concurrency < 1 or max_retries < 0 or timeout <= 0:
            raise ValueError("max_concurrency must be >= 1, max_retries >= 0 and timeout > 0")
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model = model
        self.name = name or model
        self.api_key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        self.timeout, self.max_concurrency = timeout, max_concurrency
        self.max_retries, self.backoff = max_retries, backoff

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        return map_answers(lambda m: truncate_at_stop(m["content"], config.stop),
                           lambda: self._run(conversations, config, None))

    def generate_with_tools(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig,
                            tools: Sequence[dict[str, Any]]) -> list[Message]:
        """Assistant messages with the server's ``tool_calls``; a server that hands the model's
        ``<tool_call>`` blocks back as text (llama-cpp-python with a GGUF's own chat template) has them
        read with ``parse_tool_calls``."""
        return map_answers(lambda m: m if "tool_calls" in m else parse_tool_calls(m["content"]),
                           lambda: self._run(conversations, config, list(tools)))

    def _run(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig,
             tools: list[dict[str, Any]] | None) -> list[Message]:
        conversations = check_conversations(conversations)
        answers = run_concurrently(lambda c: self._complete(c, config, tools), conversations, self.max_concurrency)
        return raise_failures(answers)

    def request_body(self, conversation: list[Message], config: GenerationConfig,
                     tools: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": conversation,
                                "max_tokens": config.max_new_tokens, "temperature": config.temperature}
        if config.temperature > 0:
            body["top_p"] = config.top_p
        if config.seed is not None:
            body["seed"] = config.seed
        if config.stop:
            body["stop"] = list(config.stop)
        if tools:
            body["tools"] = tools
        return body

    def _complete(self, conversation: list[Message], config: GenerationConfig,
                  tools: list[dict[str, Any]] | None) -> Message:
        import httpx2 as httpx

        from resilibench.outbound import ResponseTooLarge, fetch, http_client

        data = json.dumps(self.request_body(conversation, config, tools)).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_problem = ""
        with http_client(self.timeout) as client:
            for attempt in range(self.max_retries + 1):
                retry_after = None
                try:
                    reply = fetch(client, "POST", self.url, timeout=self.timeout, max_bytes=MAX_ANSWER_BYTES,
                                  headers=headers, content=data)
                except httpx.TimeoutException:
                    raise self._timeout() from None
                except ResponseTooLarge as exc:
                    raise BackendError(f"{self.url}: {exc}") from None
                except httpx.RequestError as exc:  # refused, reset, closed without an answer
                    last_problem = f"{type(exc).__name__}: {exc}"
                else:
                    if reply.status == 200:
                        return self._message(reply.content)
                    detail = reply.text[:300]
                    if reply.status == 400 and _OVERFLOW.search(detail):
                        raise ContextOverflowError(f"{self.url} answered HTTP 400: {detail}")
                    if reply.status not in RETRY_STATUSES:
                        raise BackendError(f"{self.url} answered HTTP {reply.status}: {detail}")
                    last_problem = f"HTTP {reply.status}: {detail}"
                    retry_after = reply.headers.get("Retry-After")
                if attempt < self.max_retries:
                    time.sleep(self._delay(attempt, retry_after))
        raise BackendError(f"{self.url}: no answer after {self.max_retries + 1} attempts; last: {last_problem}")

    def _timeout(self) -> RequestTimeoutError:
        return RequestTimeoutError(f"{self.url}: no answer within {self.timeout:g} s (not resubmitted: the server "
                                   "may still be computing it)")

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        """Seconds before another attempt: the server's Retry-After when it is a finite number of seconds
        >= 0, at most ``MAX_RETRY_AFTER``; else exponential backoff with jitter."""
        from resilibench.outbound import retry_after_seconds

        wait = retry_after_seconds(retry_after)
        if wait is not None:
            return min(wait, MAX_RETRY_AFTER)
        return self.backoff * 2**attempt * (1 + 0.25 * random.random())

    def _message(self, raw: bytes) -> Message:
        """The assistant message of a chat completion answer (``content`` a string, ``tool_calls`` kept)."""
        try:
            message = json.loads(raw)["choices"][0]["message"]
            calls = message.get("tool_calls") or []
            out: Message = {"role": "assistant", "content": message.get("content") or ""}
            if calls:
                out["tool_calls"] = [{"id": c.get("id") or f"call_{i}", "type": "function",
                                      "function": {"name": c["function"]["name"],
                                                   "arguments": c["function"].get("arguments") or "{}"}}
                                     for i, c in enumerate(calls)]
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            raise BackendError(f"{self.url}: not a chat completion answer: {raw[:300]!r}") from None
        return out


# --- settings and specs ---


@dataclass(frozen=True)
class RequestSettings(Settings):
    """How an HTTP backend sends requests; the defaults suit a local server that computes one request at a
    time (llama.cpp on CPU). Options of an ``openai:`` spec override them."""

    timeout: float = setting(600.0, above=0, flag="--request-timeout", metavar="S",
                             help="seconds to wait for one answer; a request without an answer is not "
                                  "resubmitted, and it ends that episode as an infrastructure error")
    max_retries: int = setting(3, bounds=(0, None), help="retries of a refused connection, HTTP 429 or 5xx")
    max_concurrency: int = setting(1, bounds=(1, None), flag="--concurrency",
                                   help="HTTP requests in flight at once (1: a local server computes one at a "
                                        "time)")


# --- specs --------------------------------------------------------------------------------------------


def _typed(value: str) -> Any:
    """A query-string value as int, float, bool or str."""
    for convert in (int, float):
        try:
            return convert(value)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(value.lower(), value)


def parse_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """``kind:target?key=value&...`` -> (kind, target, options); ValueError naming the accepted forms."""
    kind, sep, rest = spec.partition(":")
    if not sep or kind not in BACKEND_KINDS or not rest:
        raise ValueError(f"backend spec must be hf:PATH, vllm:PATH or openai:URL?model=NAME, got {spec!r}")
    target, _, query = rest.partition("?")
    options = {k: _typed(v) for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True, strict_parsing=False)}
    return kind, target, options


SPEC_OPTIONS = {
    "hf": ("device", "dtype", "batch_size", "name"),
    "vllm": None,  # any vllm.LLM engine argument
    "openai": ("model", "timeout", "max_concurrency", "max_retries", "name"),
}


def check_spec(spec: str) -> tuple[str, str, dict[str, Any]]:
    """Parse and check a spec without building anything (nothing is loaded or contacted): the form, the
    options, and for ``hf:`` that the model directory exists. Returns ``parse_spec``'s triple."""
    kind, target, options = parse_spec(spec)
    accepted = SPEC_OPTIONS[kind]
    if accepted is not None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            hint = " (set the OPENAI_API_KEY environment variable instead)" if "api_key" in unknown else ""
            raise ValueError(f"{kind} backend spec: unknown option(s) {unknown}; accepted: {', '.join(accepted)}"
                             + hint)
    if kind == "hf":
        model_location(target)
    if kind == "openai" and "model" not in options:
        raise ValueError(f"openai backend spec needs ?model=NAME (the served model), got {spec!r}")
    return kind, target, options


def make_backend(spec: str, requests: RequestSettings | None = None, **defaults: Any) -> Backend:
    """A backend from a spec string (see the module docstring). ``requests`` and ``defaults`` are options
    the spec may override (the command line passes ``batch_size`` and its request settings this way);
    they are dropped where they do not apply."""
    defaults = {**asdict(requests or RequestSettings()), **defaults}
    kind, target, options = check_spec(spec)
    accepted = SPEC_OPTIONS[kind]
    if accepted is not None:
        options = {**{k: v for k, v in defaults.items() if k in accepted}, **options}
    if kind == "hf":
        return TransformersBackend(target, **options)
    if kind == "vllm":
        return VLLMBackend(target, **options)
    model = str(options.pop("model"))
    return OpenAIBackend(target, model, **options)
