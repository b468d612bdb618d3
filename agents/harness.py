"""The batched evaluation harness: many text-env episodes at once, one agent call per round.

``run_eval`` keeps a pool of up to ``batch_size`` running ``ResiliBenchTextEnv`` episodes. Each round it
collects the conversation of every running episode and makes ONE ``agent.respond`` call (for an LLM: one
batched ``generate``, which is what makes vLLM fast), steps every env with its reply and refills the pool
from the job list as episodes end. One row per finished episode is written to a JSONL file at once, so an
interrupted run resumes where it stopped: rows are keyed by ``EVAL_KEY`` and a rerun skips the keys
already in the file (a truncated last line is repaired).

Episodes are paired: the env of (task, seed) is reset with ``task_seed(task_id, seed)``, so every model
and every prompt variant meets the same failure stream on the same task and seed, and the scripted
optimal agent plays exactly the episode ``ResiliBench-v1`` would give ``OptimalPlanner``.

The prompt settings' ``protocol`` picks how the agent uses tools: "tags" (the paper's text protocol) or
"tools" (native function calls); tags-only agents play the tools protocol through ``scripted.for_protocol``. An episode
whose reply the infrastructure could not produce (``InfraError``: a request that timed out, a prompt
longer than the model's context) ends at once as an infrastructure error: its row has level
``infra_error`` (counted apart from the agent's levels) and the run goes on. Such a row is a finished
row on resume, unless ``retry_infra_errors``.
"""

from __future__ import annotations

__all__ = [
    "EVAL_KEY", "PLAN_PROMPTS", "EvalJob", "eval_jobs", "as_agent", "episode_row", "run_eval",
    "eval_directory", "settled_rows",
]

import sys
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from resilibench.llm import GenerationConfig, InfraError
from resilibench.results import INFRA_ERROR, LEVEL_NAMES, run_metadata
from resilibench.rundir import RunDirectory

from ..core.config import WorldConfig
from ..core.registry import default_registry
from ..core.simulator import task_seed
from ..core.tasks.library import Task
from ..core.text.prompts import PromptSettings
from .scripted import Agent, LLMAgent, for_protocol

EVAL_KEY = ("model", "task_id", "prompt", "flaw_type", "seed")
PLAN_PROMPTS = ("optimal", "flawed")


@dataclass(frozen=True)
class EvalJob:
    """One episode to play: a task, a prompt variant (with its flaw type when flawed) and a run seed."""

    task: Task
    prompt: str
    flaw_type: str | None
    seed: int

    def key(self, model: str) -> tuple[Any, ...]:
        """The row key of this episode for ``model`` (the fields of ``EVAL_KEY``)."""
        return (model, self.task.instance_id, self.prompt, self.flaw_type, self.seed)


def eval_jobs(tasks: Sequence[Task], prompts: Sequence[str], seeds: Sequence[int],
              flaw_types: Sequence[str] = (), config: WorldConfig | None = None,
              rules: Mapping[str, Any] | None = None) -> list[EvalJob]:
    """Every (task, prompt variant, seed) episode in a fixed order; the flawed variant once per flaw type.

    A flaw type that cannot be injected into a task's plan (say, removing a middle step of a two-step
    plan) is left out for that task: ``config`` and ``rules`` are the text env's world, which decides the
    plan. ValueError for an unknown prompt variant or flaw type, or flawed prompts without
    flaw types."""
    from ..core.text.flaws import FLAW_TYPES
    from ..core.text.prompts import PROMPT_VARIANTS
    from ..envs.text.env import ResiliBenchTextEnv

    unknown = [p for p in prompts if p not in PROMPT_VARIANTS]
    if unknown:
        raise ValueError(f"prompt variant(s) {unknown} unknown; accepted: {', '.join(PROMPT_VARIANTS)}")
    bad = [f for f in flaw_types if f not in FLAW_TYPES]
    if bad:
        raise ValueError(f"flaw type(s) {bad} unknown; accepted: {', '.join(FLAW_TYPES)}")
    if "flawed" in prompts and not flaw_types:
        raise ValueError("the flawed prompt variant needs at least one flaw type")
    probe = None
    jobs = []
    for task in tasks:
        variants = []
        for prompt in prompts:
            if prompt != "flawed":
                variants.append((prompt, None))
                continue
            probe = probe or ResiliBenchTextEnv(split=None, tasks=tasks, config=config, rules=rules)
            variants += [(prompt, flaw) for flaw in flaw_types if probe.flaw_applies(task.instance_id, flaw)]
        jobs += [EvalJob(task, prompt, flaw, seed) for prompt, flaw in variants for seed in seeds]
    return jobs


def as_agent(agent_or_backend: Any, generation: GenerationConfig | None = None) -> Agent:
    """An ``Agent`` as is; a ``Backend`` wrapped in an ``LLMAgent`` with ``generation`` settings."""
    if hasattr(agent_or_backend, "respond"):
        return agent_or_backend
    if hasattr(agent_or_backend, "generate"):
        return LLMAgent(agent_or_backend, generation)
    raise TypeError(f"expected an agent (respond) or a backend (generate), got {type(agent_or_backend).__name__}")


def episode_row(model: str, job: EvalJob, env: Any, info: dict[str, Any], keep_messages: bool,
                infra_error: InfraError | None = None) -> dict[str, Any]:
    """The result row of a finished episode, or of one the infrastructure stopped (``infra_error``: its
    level and end reason are ``INFRA_ERROR``, its message is kept)."""
    from ..core.bounds import optimal_success

    episode, plan = env.unwrapped.episode, env.unwrapped.prompt.plan
    evaluation = info["evaluation"] or {"coverage": None, "completed": None}
    row = {
        "model": model,
        "task_id": job.task.instance_id,
        "task_type": job.task.task_type,
        "prompt": job.prompt,
        "flaw_type": job.flaw_type,
        "severity": env.unwrapped.prompt_settings.severity if job.prompt == "flawed" else None,
        "seed": job.seed,
        "protocol": env.unwrapped.protocol,
        "level": INFRA_ERROR if infra_error is not None else info["level"],
        "end_reason": INFRA_ERROR if infra_error is not None else info["end_reason"],
        "turns": episode.turns_used,
        "calls": len(episode.trace),
        "failed_calls": episode.n_failures,
        "coverage": evaluation["coverage"],
        "completed": evaluation["completed"],
        "required_tools": list(job.task.required_tools),
        "trace": info["trace"],
        "plan": None if plan is None else plan.to_dict(),  # the workflow the prompt showed, if any
        "injection": info["injection"],
        # Bound (iii) under the episode's own rules (strict dependencies in the text env); none for a live
        # API's own tools (the world's failure model says nothing of them).
        "bound_iii": optimal_success(job.task, episode.config) if episode.registry is default_registry() else None,
    }
    if infra_error is not None:
        row["infra_error"] = f"{type(infra_error).__name__}: {infra_error}"
    if keep_messages:
        row["messages"] = list(env.unwrapped.messages)
    return row


class _Slot:
    """One running episode of the pool."""

    __slots__ = ("env", "job")

    def __init__(self, env: Any):
        self.env = env
        self.job: EvalJob | None = None


def run_eval(
    agent_or_backend: Any,
    jobs: Sequence[EvalJob],
    *,
    env: Mapping[str, Any] | None = None,
    generation: GenerationConfig | None = None,
    batch_size: int = 32,
    output_dir: str | Path | RunDirectory | None = None,
    resume: bool = True,
    metadata: dict[str, Any] | None = None,
    keep_messages: bool = False,
    on_result: Callable[[dict[str, Any]], object] | None = None,
    progress: bool = True,
    retry_infra_errors: bool = False,
) -> list[dict[str, Any]]:
    """Play ``jobs`` with an agent (or a backend, wrapped in ``LLMAgent`` with ``generation``) and return
    one row per job, in job order.

    ``env``: the keyword arguments of every ``ResiliBenchTextEnv`` (``config``, ``rules``, ``prompt``: a
    ``PromptSettings`` whose ``protocol``, "tags" or "tools", the agent plays and whose ``severity`` and
    ``plan_style`` every flawed or planned prompt takes; ``search``, ``registry``, ``api``: real-API mode,
    ...); the env's own defaults otherwise (strict dependencies, as in the paper). ``batch_size``
    episodes run at once (one agent call per round for all of them). With ``output_dir`` (a directory, or
    a ``RunDirectory`` whose session the caller holds: ``eval_directory``) each row is appended to its
    ``results.jsonl`` as its episode ends (after a ``metadata`` record); with ``resume`` the jobs whose key
    is already there are not played again and their stored rows are returned. ``on_result`` sees each new
    row; ``retry_infra_errors`` plays again the jobs whose stored row is an infrastructure error.
    """
    env = dict(env or {})
    protocol = (env.get("prompt") or PromptSettings()).protocol
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    agent = for_protocol(as_agent(agent_or_backend, generation), protocol)
    jobs = list(jobs)
    keys = [job.key(agent.name) for job in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError("jobs contain the same (task, prompt, flaw type, seed) more than once")
    with ExitStack() as stack:
        if isinstance(output_dir, RunDirectory) or output_dir is None:
            run = output_dir
        else:
            run = stack.enter_context(eval_directory(output_dir).session(resume))
        done = settled_rows(run.existing.rows) if run is not None else {}
        if retry_infra_errors:
            done = {key: row for key, row in done.items() if row.get("level") != INFRA_ERROR}
        todo = [job for job, key in zip(jobs, keys, strict=True) if key not in done]
        if run is not None and todo:
            run.open_results(metadata or run_metadata({}, None))
        new_rows = _play(agent, todo, run, on_result, progress, env, batch_size, keep_messages)
    return [done[key] if key in done else new_rows[key] for key in keys]


def eval_directory(path: str | Path, identity: dict[str, Any] | None = None) -> RunDirectory:
    """The RunDirectory of an evaluation: rows keyed by ``EVAL_KEY``, each with a level (or an
    infrastructure error)."""
    return RunDirectory(path, identity, key=EVAL_KEY, stale=("summary.png",), level_fields=("level",),
                        levels=(*LEVEL_NAMES, INFRA_ERROR))


def settled_rows(rows: Sequence[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Each episode's row by ``EVAL_KEY``: the first one written, unless it is an infrastructure error that
    a later row (a retry, ``retry_infra_errors``) replaced."""
    settled: dict[tuple[Any, ...], dict[str, Any]] = {}
    for row in rows:
        key = tuple(row.get(f) for f in EVAL_KEY)
        if key not in settled or settled[key].get("level") == INFRA_ERROR:
            settled[key] = row
    return settled


def _play(agent: Agent, jobs: Sequence[EvalJob], run: RunDirectory | None,
          on_result: Callable[[dict[str, Any]], object] | None, progress: bool, env_kwargs: dict[str, Any],
          batch_size: int, keep_messages: bool) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Play ``jobs`` in a pool of ``batch_size`` text envs; the new rows by key, each written to ``run``."""
    from ..envs.text.env import ResiliBenchTextEnv

    model = agent.name
    todo = deque(jobs)
    new_rows: dict[tuple[Any, ...], dict[str, Any]] = {}
    tasks = list({job.task.instance_id: job.task for job in todo}.values())
    bar = _progress(len(todo), f"eval {model}", progress)
    slots: list[_Slot] = []
    try:
        if todo:
            slots = [_Slot(ResiliBenchTextEnv(split=None, tasks=tasks, **env_kwargs))
                     for _ in range(min(batch_size, len(todo)))]
            running: list[_Slot] = []
            while todo or running:
                for slot in slots:
                    if slot.job is None and todo:
                        job = slot.job = todo.popleft()
                        slot.env.reset(seed=task_seed(job.task.instance_id, job.seed),
                                       options={"task_id": job.task.instance_id, "prompt": job.prompt,
                                                "flaw_type": job.flaw_type})
                        running.append(slot)
                replies = agent.respond([(slot.env.messages, slot.env) for slot in running])
                if len(replies) != len(running):
                    raise RuntimeError(f"agent {model} answered {len(replies)} of {len(running)} episodes")
                still = []
                for slot, reply in zip(running, replies, strict=True):
                    failure = reply if isinstance(reply, InfraError) else None
                    if failure is None:
                        _, _, terminated, truncated, info = slot.env.step(reply)
                        if not (terminated or truncated):
                            still.append(slot)
                            continue
                    else:
                        info = slot.env.unwrapped.info()
                    assert slot.job is not None  # a running slot plays a job
                    row = episode_row(model, slot.job, slot.env, info, keep_messages, failure)
                    slot.job = None
                    new_rows[tuple(row[f] for f in EVAL_KEY)] = row
                    if run is not None:
                        run.write(row)
                    if on_result is not None:
                        on_result(row)
                    bar.update(1)
                running = still
    finally:
        bar.close()
        for slot in slots:  # a real-API env holds an HTTP client
            slot.env.close()
    return new_rows


def _progress(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="ep", dynamic_ncols=True, mininterval=0.5, file=sys.stderr,
                disable=not enabled or total == 0)
