"""LLM backends: local transformers models, vLLM engines and OpenAI-compatible HTTP servers.

Each one implements ``resilibench.agents.base.Backend``: ``generate(conversations, config)`` turns a
batch of chat conversations into one assistant message each, in order. ``make_backend(spec)`` builds
one from a short string, the form the command line takes:

* ``hf:PATH[?device=cuda&dtype=bfloat16&batch_size=16&name=NAME]``: a local transformers model
  (``TransformersBackend``; needs the ``llm`` extra);
* ``vllm:PATH[?tensor_parallel_size=2&max_model_len=8192&name=NAME]``: a vLLM engine in this process
  (``VLLMBackend``; needs the ``vllm`` extra and a GPU); other options go to ``vllm.LLM``;
* ``openai:URL?model=NAME[&max_concurrency=16&timeout=120]``: any server speaking the OpenAI chat
  completions API, e.g. ``vllm serve`` (``OpenAIBackend``; standard library only). The API key comes
  from ``OPENAI_API_KEY`` when set, so it never lands in a command line or a results file.

Stop strings are honoured everywhere and, as in the OpenAI API, left out of the returned text.
"""

from __future__ import annotations

import json
import os
import random
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from resilibench.agents.base import Backend, GenerationConfig, Message

BACKEND_KINDS = ("hf", "vllm", "openai")


class BackendError(RuntimeError):
    """A backend could not produce completions (bad server answer, exhausted retries, missing extra)."""


def truncate_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` up to (not including) the earliest occurrence of any stop string."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=len(text))
    return text[:cut]


def check_conversations(conversations: Sequence[Sequence[Message]]) -> list[list[Message]]:
    """The conversations as lists of ``{"role", "content"}`` dicts; ValueError naming the first bad one."""
    checked = []
    for i, conversation in enumerate(conversations):
        if not conversation:
            raise ValueError(f"conversation {i} is empty")
        for message in conversation:
            if not isinstance(message, dict) or not isinstance(message.get("content"), str) or \
                    message.get("role") not in ("system", "user", "assistant"):
                raise ValueError(f"conversation {i}: every message needs a role (system, user or assistant) "
                                 f"and a string content, got {message!r}")
        checked.append([{"role": m["role"], "content": m["content"]} for m in conversation])
    return checked


# --- transformers -------------------------------------------------------------------------------------


class TransformersBackend:
    """A local Hugging Face causal LM: chat template, left padding, batched ``generate``.

    Greedy decoding at temperature 0; otherwise sampling seeded by ``config.seed`` (the global torch
    generator is left untouched). ``batch_size`` caps how many conversations go through one forward
    pass; larger batches are split.
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
        path = Path(model_path)
        if not path.is_dir():
            raise FileNotFoundError(f"model_path {model_path}: not a directory holding a transformers model "
                                    "(models load from local paths only)")
        if isinstance(dtype, str) and dtype != "auto":
            if not isinstance(getattr(torch, dtype, None), torch.dtype):
                raise ValueError(f"dtype must be a torch dtype name such as float32, bfloat16 or float16, "
                                 f"or 'auto'; got {dtype!r}")
            dtype = getattr(torch, dtype)
        self.name = name or path.resolve().name
        self.device = device
        self.batch_size = batch_size
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        self.tokenizer.padding_side = "left"  # generation continues at the right end of every row
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(f"model_path {model_path}: the tokenizer has no chat template")
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto").to(device)
        self.model.eval()

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        conversations = check_conversations(conversations)
        outputs: list[str] = []
        for start in range(0, len(conversations), self.batch_size):
            chunk = conversations[start:start + self.batch_size]
            seed = None if config.seed is None else config.seed + start
            outputs += self._generate_chunk(chunk, config, seed)
        return outputs

    def _generate_chunk(self, conversations: list[list[Message]], config: GenerationConfig,
                        seed: int | None) -> list[str]:
        import torch

        texts = [self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False)
                 for c in conversations]
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
            generated = self.model.generate(**inputs, **kwargs)
        new_tokens = generated[:, inputs["input_ids"].shape[1]:]
        decoded = self.tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        return [truncate_at_stop(text, config.stop) for text in decoded]


# --- vLLM ---------------------------------------------------------------------------------------------


class VLLMBackend:
    """A vLLM engine in this process; every batch goes to the engine in one ``LLM.chat`` call, which
    schedules it with continuous batching (the throughput lever of the evaluation harness)."""

    def __init__(self, model: str | Path, name: str | None = None, **engine_kwargs: Any):
        try:
            from vllm import LLM
        except ImportError as exc:
            raise ImportError(f"VLLMBackend needs vLLM (GPU machines): pip install 'resilibench[vllm]' ({exc})"
                              ) from None
        self.name = name or Path(model).name
        self.llm = LLM(model=str(model), **engine_kwargs)

    def generate(self, conversations: Sequence[Sequence[Message]], config: GenerationConfig) -> list[str]:
        from vllm import SamplingParams

        conversations = check_conversations(conversations)
        if not conversations:
            return []
        # One seed per conversation (config.seed + i), as the transformers backend draws each row on: vLLM
        # seeds each request on its own, so one shared seed would give repeated prompts identical samples.
        params = [SamplingParams(n=1, max_tokens=config.max_new_tokens, temperature=config.temperature,
                                 top_p=config.top_p if config.temperature > 0 else 1.0,
                                 seed=None if config.seed is None else config.seed + i, stop=list(config.stop) or None)
                  for i in range(len(conversations))]
        results = self.llm.chat(conversations, sampling_params=params, use_tqdm=False)
        return [truncate_at_stop(r.outputs[0].text, config.stop) for r in results]


# --- OpenAI-compatible HTTP ---------------------------------------------------------------------------

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIBackend:
    """A server speaking the OpenAI chat completions API (``POST {base_url}/chat/completions``).

    The conversations of a batch are sent as concurrent requests (at most ``max_concurrency`` at once).
    Rate limits (429), server errors (5xx) and dropped connections are retried with exponential backoff
    and jitter (honouring ``Retry-After``), up to ``max_retries`` times; other HTTP errors and malformed
    answers raise ``BackendError`` at once with the server's message.
    """

    def __init__(self, base_url: str, model: str, api_key: str | None = None, timeout: float = 60,
                 max_concurrency: int = 8, max_retries: int = 5, backoff: float = 0.5, name: str | None = None):
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
        conversations = check_conversations(conversations)
        if not conversations:
            return []
        workers = min(self.max_concurrency, len(conversations))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="openai") as pool:
            return list(pool.map(lambda c: self._complete(c, config), conversations))

    def request_body(self, conversation: list[Message], config: GenerationConfig) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "messages": conversation,
                                "max_tokens": config.max_new_tokens, "temperature": config.temperature}
        if config.temperature > 0:
            body["top_p"] = config.top_p
        if config.seed is not None:
            body["seed"] = config.seed
        if config.stop:
            body["stop"] = list(config.stop)
        return body

    def _complete(self, conversation: list[Message], config: GenerationConfig) -> str:
        data = json.dumps(self.request_body(conversation, config)).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        last_problem = ""
        for attempt in range(self.max_retries + 1):
            request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
            retry_after = None
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return self._content(response.read(), config)
            except urllib.error.HTTPError as exc:
                detail = exc.read().decode("utf-8", "replace")[:300]
                if exc.code not in RETRY_STATUSES:
                    raise BackendError(f"{self.url} answered HTTP {exc.code}: {detail}") from None
                last_problem = f"HTTP {exc.code}: {detail}"
                retry_after = exc.headers.get("Retry-After") if exc.headers else None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
                last_problem = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
            if attempt < self.max_retries:
                time.sleep(self._delay(attempt, retry_after))
        raise BackendError(f"{self.url}: no answer after {self.max_retries + 1} attempts; last: {last_problem}")

    def _delay(self, attempt: int, retry_after: str | None) -> float:
        if retry_after is not None:
            try:
                return max(0.0, float(retry_after))
            except ValueError:
                pass
        return self.backoff * 2**attempt * (1 + 0.25 * random.random())

    def _content(self, raw: bytes, config: GenerationConfig) -> str:
        try:
            answer = json.loads(raw)
            content = answer["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise BackendError(f"{self.url}: not a chat completion answer: {raw[:300]!r}") from None
        return truncate_at_stop(content or "", config.stop)


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
    if kind == "hf" and not Path(target).is_dir():
        raise FileNotFoundError(f"model path {target}: not a directory holding a transformers model "
                                "(models load from local paths only)")
    if kind == "openai" and "model" not in options:
        raise ValueError(f"openai backend spec needs ?model=NAME (the served model), got {spec!r}")
    return kind, target, options


def make_backend(spec: str, **defaults: Any) -> Backend:
    """A backend from a spec string (see the module docstring). ``defaults`` are options the spec may
    override (the command line passes ``batch_size`` this way); they are dropped where they do not apply."""
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
