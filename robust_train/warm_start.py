"""The warm start of GRPO: supervised fine-tuning on expert transcripts played in the GRPO environment.

A model that never calls a tool gives GRPO nothing to compare (every reward and advantage is 0). The
warm start teaches the tool-calling format and a first policy before RL:

* ``play_expert`` plays a scripted agent of the text protocol (``scripted:optimal``, the policy of bound
  (iii); ``scripted:search``, which finds tools from the description alone) inside an instance of the
  GRPO environment (``envs.text.trl``): each of its tag messages becomes native tool calls (a call
  without arguments gets the task's own arguments for the tool, ``default_arguments``; on the "search"
  surface a tool is called through ``call_tool``), each call is the environment's method, so the
  transcript holds exactly the tool results a GRPO rollout sees, and ``get_reward`` grades it;
* ``render_transcript`` tokenizes a transcript as TRL's GRPO tool loop builds a rollout: the prompt
  rendered with the tools and the generation prompt, each assistant message as the tokens the model
  generates (through the end-of-turn token), each run of tool results as TRL's tool suffix; the mask is 1
  on the assistant's tokens only (TRL's ``tool_mask``);
* ``train_warm_start`` fine-tunes the model on the rendered transcripts of train tasks with TRL's
  ``SFTTrainer`` (loss on the assistant's tokens) in ``DIR/sft`` and returns the model GRPO starts from
  (a LoRA adapter merged into the base).
"""

from __future__ import annotations

__all__ = ["EXPERTS", "WARM_STARTS", "SFT_DIR", "MERGED_DIR", "TRANSCRIPTS_FILE", "environment_tools",
           "play_expert", "expert_outcomes", "transcript_corpus", "assistant_ids", "tool_suffix_ids", "render_transcript",
           "train_warm_start"]

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from resilibench.llm import Message

from ..agents.scripted import COMPLETION_MESSAGE, Agent
from ..agents.specs import make_scripted_agent
from ..core.text.toolbox import INFO_FUNCTION, SEARCH_FUNCTION, default_arguments, parse_message

EXPERTS = ("optimal", "search", "search-optimal")
WARM_STARTS = ("none", "sft")
SFT_DIR = "sft"
MERGED_DIR = "merged"
TRANSCRIPTS_FILE = "transcripts.jsonl"
_NOT_TOOLS = ("reset", "get_reward")


def environment_tools(env) -> list[Callable]:
    """The methods of a GRPO environment instance that TRL offers as tools, in TRL's order (the public
    functions of its class by name, ``reset`` and ``get_reward`` aside)."""
    import inspect

    return [getattr(env, name) for name, _ in inspect.getmembers(type(env), predicate=inspect.isfunction)
            if not name.startswith("_") and name not in _NOT_TOOLS]


def _native_calls(reply: str, env) -> list[dict[str, Any]]:
    """A tag message's searches, info requests and calls as the environment's tool calls (TRL's form:
    arguments as a dict)."""
    episode = env._episode()
    parsed = parse_message(reply)
    calls = [(SEARCH_FUNCTION, {"query": q}) for q in parsed.searches]
    calls += [(INFO_FUNCTION, {"name": n}) for n in parsed.infos]
    has_call_tool = hasattr(env, "call_tool")
    for call in parsed.calls:
        arguments = call.arguments
        if arguments is None and call.name in episode.registry.names:
            arguments = default_arguments(episode.task, episode.registry.tools[episode.registry.names.index(call.name)])
        arguments = arguments or {}
        calls.append(("call_tool", {"name": call.name, "arguments": arguments}) if has_call_tool
                     else (call.name, arguments))
    return [{"type": "function", "function": {"name": name, "arguments": arguments}} for name, arguments in calls]


def play_expert(agent: Agent, env, row: dict[str, Any]) -> list[Message]:
    """Play a tags-protocol ``agent`` in the GRPO environment instance ``env`` on a dataset ``row`` (its
    ``prompt`` messages, ``task_id`` and ``seed``); return the whole conversation in TRL's form: the
    prompt with the task appended to its last message, then assistant messages with ``tool_calls`` and
    the tool messages answering them, and a last assistant message without a call (the completion
    signal). The episode is left for ``env.get_reward()`` to grade."""
    observation = env.reset(**row)
    prompt = [dict(m) for m in row["prompt"]]
    prompt[-1]["content"] += observation
    episode = env._episode()
    tags: list[Message] = [{"role": "user", "content": prompt[-1]["content"]}]  # the agent's tag view
    conversation: list[Message] = list(prompt)
    while not episode.done:
        reply = agent.respond([(tags, env._env)])[0]
        calls = _native_calls(reply, env)
        if not calls:
            break
        conversation.append({"role": "assistant", "content": "", "tool_calls": calls})
        results = [str(getattr(env, c["function"]["name"])(**c["function"]["arguments"])) for c in calls]
        conversation += [{"role": "tool", "name": c["function"]["name"], "content": r}
                         for c, r in zip(calls, results, strict=True)]
        tags += [{"role": "assistant", "content": reply}, {"role": "user", "content": "\n\n".join(results)}]
    conversation.append({"role": "assistant", "content": COMPLETION_MESSAGE})
    return conversation


def expert_outcomes(expert: str, env_class, rows: Sequence[dict[str, Any]],
                    transcripts: list[list[Message]] | None = None) -> list[dict[str, Any]]:
    """The graded outcome of ``scripted:<expert>`` on every row (as the GRPO evaluation records them);
    each conversation is appended to ``transcripts`` when given."""
    outcomes: list[dict[str, Any]] = []
    agent = make_scripted_agent(expert)
    env = env_class()
    env._outcomes = outcomes
    for row in rows:
        conversation = play_expert(agent, env, row)
        env.get_reward()
        if transcripts is not None:
            transcripts.append(conversation)
    return outcomes


def transcript_corpus(expert: str, env_class, rows: Sequence[dict[str, Any]]) -> list[str]:
    """The text of ``scripted:<expert>``'s transcripts of ``rows`` and of the environment's tool schemas, as
    a tool-calling chat template writes them (what a model from scratch's tokenizer learns from)."""
    from transformers.utils.chat_template_utils import get_json_schema

    transcripts: list[list[Message]] = []
    expert_outcomes(expert, env_class, rows, transcripts)
    texts = [json.dumps(get_json_schema(tool)) for tool in environment_tools(env_class())]
    for conversation in transcripts:
        for message in conversation:
            texts.append(str(message.get("content") or ""))
            texts += [json.dumps(call["function"]) for call in message.get("tool_calls") or ()]
    return texts


# --- rendering -----------------------------------------------------------------------------------------


def _ids(tokenizer, messages: Sequence[Message], generation_prompt: bool, tools=None) -> list[int]:
    return list(tokenizer.apply_chat_template(list(messages), tools=tools or None, tokenize=True, return_dict=False,
                                              add_generation_prompt=generation_prompt))


def assistant_ids(tokenizer, message: Message) -> list[int]:
    """The tokens a model generates for an assistant ``message``: its chat-template rendering after the
    generation prompt through the EOS token, or the whole rendering and then EOS for a template whose
    turns do not end with EOS (where TRL's tool loop appends its tool suffix)."""
    user = [{"role": "user", "content": "x"}]
    head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    whole = tokenizer.apply_chat_template([*user, message], tokenize=False)
    if not whole.startswith(head):
        raise ValueError("the chat template does not render an assistant message after its generation prompt")
    text = whole[len(head):]
    end = text.find(tokenizer.eos_token)
    text = text + tokenizer.eos_token if end < 0 else text[:end + len(tokenizer.eos_token)]
    return list(tokenizer.encode(text, add_special_tokens=False))


def tool_suffix_ids(tokenizer, tool_messages: Sequence[Message]) -> list[int]:
    """The tokens TRL's GRPO tool loop appends after a generated turn for its tool results, through the
    next generation prompt (``GRPOTrainer._get_tool_suffix_ids``'s rendering of a minimal conversation)."""
    call = {"type": "function", "function": {"name": tool_messages[0]["name"], "arguments": {}}}
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    prefix = _ids(tokenizer, dummy, False)
    eos = [i for i, t in enumerate(prefix) if t == tokenizer.eos_token_id]
    if eos:
        prefix = prefix[:eos[-1] + 1]
    full = _ids(tokenizer, [*dummy, *tool_messages], True)
    if full[:len(prefix)] != prefix:
        raise ValueError("the chat template renders tool results in a way TRL's tool loop cannot append")
    return full[len(prefix):]


def render_transcript(tokenizer, tools: Sequence[Callable], conversation: Sequence[Message]) -> dict[str, list[int]]:
    """``input_ids`` and ``completion_mask`` of a conversation from ``play_expert`` as a GRPO rollout
    holds them: the prompt (the messages before the first assistant one) with ``tools`` and the
    generation prompt (mask 0), each assistant message's generated tokens (mask 1), each run of tool
    messages as the tool suffix (mask 0)."""
    first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
    ids = _ids(tokenizer, conversation[:first], True, tools)
    mask = [0] * len(ids)
    i = first
    while i < len(conversation):
        generated = assistant_ids(tokenizer, conversation[i])
        ids += generated
        mask += [1] * len(generated)
        j = i + 1
        while j < len(conversation) and conversation[j]["role"] == "tool":
            j += 1
        if j > i + 1:
            suffix = tool_suffix_ids(tokenizer, conversation[i + 1:j])
            ids += suffix
            mask += [0] * len(suffix)
        i = j
    return {"input_ids": ids, "completion_mask": mask}


# --- the SFT stage -------------------------------------------------------------------------------------


def train_warm_start(settings, output_dir: Path, base: Path, model, tokenizer, env_class,
                     rows: Sequence[dict[str, Any]], resume: bool,
                     log: Callable[[str], None]) -> tuple[Path, dict[str, Any]]:
    """Fine-tune ``model`` (loaded from ``base``, with ``tokenizer``'s tool template) on
    ``settings.expert``'s transcripts of ``rows`` in ``output_dir/sft``; return the directory of the model GRPO starts from (the adapter merged
    into the base, or the fully trained model) and a summary of the stage (transcripts, their tokens and
    the expert's success on them, steps, loss, seconds)."""
    import time

    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer  # pyright: ignore[reportPrivateImportUsage]: exported lazily

    from resilibench.results import write_json_atomic

    from .training import (
        FINAL_DIR,
        SFTSettings,
        _common_args,
        _peft_config,
        _quiet,
        _quiet_trainer,
        _run,
        json_digest,
        merge_adapter,
        training_directory,
    )

    sft_dir = output_dir / SFT_DIR
    transcripts: list[list[Message]] = []
    started = time.monotonic()
    outcomes = expert_outcomes(settings.expert, env_class, rows, transcripts)
    tools = environment_tools(env_class())
    data = [render_transcript(tokenizer, tools, t) for t in transcripts]
    lengths = sorted(len(d["input_ids"]) for d in data)
    generated = sorted(sum(d["completion_mask"]) for d in data)
    completion = sorted(len(d["input_ids"]) - d["completion_mask"].index(1) for d in data)
    stage = {"expert": settings.expert, "transcripts": len(data),
             "expert_success": sum(o["level"] == "full_success" for o in outcomes) / len(outcomes),
             "tokens_median": lengths[len(lengths) // 2], "tokens_max": lengths[-1],
             "completion_tokens_median": completion[len(completion) // 2], "completion_tokens_max": completion[-1],
             "assistant_tokens_median": generated[len(generated) // 2],
             "over_max_completion_length": sum(c > settings.max_completion_length for c in completion) / len(data)}
    log(f"warm start: {len(data)} {settings.expert} transcripts (expert full success {stage['expert_success']:.3f}), "
        f"median {stage['tokens_median']} tokens, {stage['completion_tokens_median']} after the prompt")
    sft = SFTSettings(epochs=settings.sft_epochs, learning_rate=settings.sft_learning_rate, batch_size=1,
                      gradient_accumulation_steps=settings.sft_batch_size, max_length=lengths[-1],
                      lora=settings.lora, save_steps=settings.save_steps, logging_steps=settings.logging_steps,
                      seed=settings.seed)
    record = json.loads(json.dumps({"kind": "grpo-warm-start", "settings": asdict(sft),
                                    "rows_sha256": json_digest(data)}))
    with training_directory(sft_dir, record, resume) as (_, finished):
        if finished is None:
            sft_dir.mkdir(parents=True, exist_ok=True)
            with (sft_dir / TRANSCRIPTS_FILE).open("w") as handle:
                for row, conversation in zip(rows, transcripts, strict=True):
                    handle.write(json.dumps({"task_id": row["task_id"], "seed": row["seed"],
                                             "messages": conversation}) + "\n")
            with _quiet():
                args = SFTConfig(**_common_args(sft, sft_dir / "checkpoints", False), completion_only_loss=True)
                trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                     processing_class=tokenizer, peft_config=_peft_config(sft.lora))
                finished = _run(_quiet_trainer(trainer, False), sft_dir, resume)
    stage.update(steps=finished.steps, train_loss=finished.train_loss, seconds=round(time.monotonic() - started, 1))
    log(f"warm start: {finished.steps} SFT steps, loss {finished.train_loss}")
    start = sft_dir / FINAL_DIR
    if settings.lora is not None:
        start = merge_adapter(base, sft_dir / FINAL_DIR, sft_dir / MERGED_DIR)
    write_json_atomic(sft_dir / "stage.json", stage)
    return start, stage
