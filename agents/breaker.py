"""The breaker loop (docs/agents/breaker.md): propose a task, validate it, let the model under test try it four times,
grade every attempt, and keep the tasks that break the model (at least 3 of 4 attempts fail).

Per taxonomy and run, up to the taxonomy's iteration cap:

1. the generator proposes a task; after the first iteration it gets refinement feedback built from the
   previous iteration (which criteria the attempts failed, taxonomy-specific techniques);
2. the validator checks the task's reference answer against its criteria (PASS / FAIL, remarks);
3. the solver attempts the task ``ATTEMPTS`` times (independent sampling seeds, or episode seeds);
4. the judge grades each attempt, per criterion and overall;
5. ``fail_count >= BREAK_THRESHOLD``: the task is model-breaking, a row is saved and the run ends;
   otherwise the next iteration refines it; at the cap the run ends without a row.

Taxonomies: ``qc``, ``itf`` and ``mim`` (``LLMTaxonomy``: four LLM roles, prompts in
``agents.breaker_prompts``), and ``flaw`` (``FlawTaxonomy``): a ResiliBench task whose workflow plan
carries an injected flaw, validated exactly (the flaw must lower the plan's exact success), played in
``ResiliBenchText-v1`` by any text agent (LLMs, the scripted references, heuristic planners, PPO
policies through ``PlannerTextAgent``) and judged by the evaluator (PASS = full success).

Output (``run_breaker``), append-only and resumable: ``DIR/iterations.jsonl`` (every iteration, invalid
ones with the raw model output and the parse errors), ``DIR/rows.jsonl`` (one row per model-breaking
task, with the prompt's MiniLM embedding and its maximum cosine similarity to earlier rows) and
``DIR/meta.json``; ``export_csv`` writes the rows as CSV. Malformed model output gets one retry with
the parse error; after that the iteration is recorded ``invalid`` and the loop goes on.
"""

from __future__ import annotations

__all__ = [
    "LLM_TAXONOMIES", "TAXONOMIES", "ATTEMPTS", "BREAK_THRESHOLD", "KEEP_THRESHOLD", "JSON_ATTEMPTS",
    "Record", "ROW_FIELDS", "CSV_COLUMNS", "parse_runs", "parse_max_iterations", "derive_seed", "AnswerError",
    "Asked", "one_object", "ask_json", "parse_task", "parse_validation", "parse_grading", "refinement_report",
    "Taxonomy", "LLMTaxonomy", "FLAW_CRITERIA", "FlawTaxonomy", "prompt_embedding", "max_similarity",
    "BreakerSummary", "breaker_directory", "run_breaker", "export_csv",
]

import csv
import io
import json
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from resilibench.console import progress_bar
from resilibench.errors import InputError
from resilibench.llm import Backend, GenerationConfig, Message, ValidatedAnswer, ask_until_valid
from resilibench.results import run_metadata
from resilibench.rundir import RunDirectory

from ..core.config import WorldConfig
from ..envs.text.env import ResiliBenchTextEnv
from ..metrics.judge import json_objects
from . import breaker_prompts as bp
from .scripted import Agent

LLM_TAXONOMIES = ("qc", "itf", "mim")
TAXONOMIES = (*LLM_TAXONOMIES, "flaw")
ATTEMPTS = 4
BREAK_THRESHOLD = 3  # failed attempts (of ATTEMPTS) that make a task model-breaking
KEEP_THRESHOLD = 3  # a criterion failed by at least this many attempts is "keep intact"
JSON_ATTEMPTS = 2  # answers asked for before a malformed one makes the iteration invalid
Record = dict[str, Any]  # an iteration record (see ``_record``)
ROW_FIELDS = ("taxonomy", "run", "iteration", "generator", "prompt", "correct_response", "response_reference",
              "validator", "validator_status", "validator_remarks", "solver", "solver_responses", "judge",
              "judge_responses", "attempt_statuses", "fail_count", "criteria_failures", "details")
# The CSV columns of the breaker's original design, and the row field each one comes from.
CSV_COLUMNS = {"taxonomy": "taxonomy", "agent_01_model": "generator", "prompt": "prompt",
               "correct_response": "correct_response", "response_reference": "response_reference",
               "agent_01_judge_model": "validator", "agent_01_judge_model_remarks": "validator_remarks",
               "agent_01_correct_response_status": "validator_status", "agent_02_model": "solver",
               "agent_02_response": "solver_responses", "judge_response": "judge_responses",
               "status": "status", "embedding": "embedding", "max_similarity": "max_similarity"}


# --- command-line specs -----------------------------------------------------------------------------------


def parse_runs(text: str) -> dict[str, int]:
    """``"qc:8,itf:5"`` or ``"qc,itf"`` (a bare name is one run) -> ``{"qc": 8, "itf": 5}``; ValueError
    naming the bad entry and the valid taxonomies (``errors.InputError`` of field "runs")."""
    return _parse_counts(text, "runs", TAXONOMIES)


def parse_max_iterations(text: str | None, runs: Mapping[str, int]) -> dict[str, int]:
    """Iteration caps per taxonomy of ``runs`` (default 1); every name must appear in ``runs``."""
    caps = dict.fromkeys(runs, 1)
    if text:
        given = _parse_counts(text, "max_iterations", TAXONOMIES)
        stray = [name for name in given if name not in runs]
        if stray:
            raise InputError("max_iterations", f"{', '.join(stray)} not in the runs ({', '.join(runs)})")
        caps.update(given)
    return caps


def _parse_counts(text: str, field: str, valid: Sequence[str]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for entry in (e.strip() for e in text.split(",")):
        name, sep, number = (p.strip() for p in entry.partition(":"))
        if name not in valid:
            raise InputError(field, f"unknown taxonomy {name!r} in {text!r}; valid: {', '.join(valid)}")
        if name in counts:
            raise InputError(field, f"{name} given twice in {text!r}")
        if not sep:
            counts[name] = 1
        elif number.isdigit() and int(number) > 0:
            counts[name] = int(number)
        else:
            raise InputError(field, f"{entry!r} needs a positive integer after ':' (e.g. {name}:3)")
    return counts


def derive_seed(seed: int, *labels: Any) -> int:
    """A 32-bit seed from ``seed`` and labels (taxonomy, run, iteration, attempt), stable across processes."""
    words = [int(seed)] + [zlib.crc32(str(label).encode()) for label in labels]
    return int(np.random.SeedSequence(words).generate_state(1)[0])


# --- JSON answers with one retry --------------------------------------------------------------------------


class AnswerError(ValueError):
    """A model answer that does not have the asked-for JSON form; the message says what is wrong."""


Asked = ValidatedAnswer  # the parsed value (None when none was valid), every raw answer and every error


def one_object(text: str, key: str) -> dict[str, Any]:
    """The one JSON object of ``text`` holding ``key`` (text around it is tolerated), else AnswerError."""
    objects = [o for o in json_objects(text) if isinstance(o, dict)]
    if not objects:
        raise AnswerError("no JSON object found")
    keyed = [o for o in objects if key in o]
    if len(keyed) != 1:
        raise AnswerError(f"expected exactly one JSON object with a {key!r} key, found {len(keyed)}")
    return keyed[0]


def ask_json(backend: Backend, conversations: Sequence[list[Message]], parse: Callable[[str], Any],
             config: GenerationConfig, attempts: int = JSON_ATTEMPTS) -> list[Asked]:
    """One parsed answer per conversation (``ask_until_valid``): an answer ``parse`` rejects is sent back
    with the error, up to ``attempts``; backend errors propagate."""
    return ask_until_valid(backend, conversations, lambda _, answer: parse(answer), attempts, config,
                           retry_message=bp.RETRY_PROMPT, record_backend_errors=False)


def _status(value: Any, where: str) -> str:
    if not isinstance(value, str) or value.strip().upper() not in ("PASS", "FAIL"):
        raise AnswerError(f"{where} must be \"PASS\" or \"FAIL\", got {json.dumps(value)}")
    return value.strip().upper()


def _text(data: dict[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value.strip():
        raise AnswerError(f"{key!r} must be a non-empty string, got {json.dumps(value)}")
    return value.strip()


def parse_task(text: str, taxonomy: str) -> dict[str, Any]:
    """A generator's task: taxonomy, prompt, correct_response and response_reference, a list of
    ``{"id", "criterion"}`` with unique ids (the criterion text may sit under any key starting "criteri")."""
    data = one_object(text, "prompt")
    if data.get("taxonomy", taxonomy) != taxonomy:
        raise AnswerError(f"'taxonomy' must be {taxonomy!r}, got {json.dumps(data.get('taxonomy'))}")
    criteria = data.get("response_reference")
    if not isinstance(criteria, list) or not criteria:
        raise AnswerError("'response_reference' must be a non-empty list of {\"id\", \"criterion\"} objects")
    checked = []
    for i, item in enumerate(criteria):
        item = item if isinstance(item, dict) else {}
        texts = [v for k, v in item.items() if k.lower().startswith("criteri")]
        if not (texts and isinstance(texts[0], str) and texts[0].strip() and isinstance(item.get("id"), str)):
            raise AnswerError(f"response_reference[{i}] must be {{\"id\": \"C{i + 1}\", \"criterion\": "
                              f"\"...\"}}, got {json.dumps(item)[:120]}")
        checked.append({"id": item["id"].strip(), "criterion": texts[0].strip()})
    ids = [c["id"] for c in checked]
    if len(set(ids)) != len(ids):
        raise AnswerError(f"criterion ids must be unique, got {ids}")
    return {"taxonomy": taxonomy, "prompt": _text(data, "prompt"),
            "correct_response": _text(data, "correct_response"), "response_reference": checked}


def parse_validation(text: str) -> dict[str, str]:
    """A validator verdict: ``{"status": "PASS" | "FAIL", "remarks": "..."}``."""
    data = one_object(text, "status")
    return {"status": _status(data["status"], "'status'"), "remarks": _text(data, "remarks")}


def parse_grading(text: str, ids: Sequence[str]) -> dict[str, Any]:
    """A judge verdict with a status for every criterion id and an overall status that agrees with them
    (PASS exactly when every criterion passes)."""
    data = one_object(text, "criteria")
    items = data["criteria"]
    if not isinstance(items, list):
        raise AnswerError("'criteria' must be a list of {\"id\", \"status\"} objects")
    graded: dict[str, str] = {}
    for item in items:
        if isinstance(item, dict) and item.get("id") in ids:
            graded[item["id"]] = _status(item.get("status"), f"the status of {item['id']}")
    missing = [i for i in ids if i not in graded]
    if missing:
        raise AnswerError(f"no status for criteria {missing} (ids: {list(ids)})")
    overall = _status(data.get("status"), "'status'")
    expected = "PASS" if all(s == "PASS" for s in graded.values()) else "FAIL"
    if overall != expected:
        raise AnswerError(f"overall status {overall} disagrees with the criteria ({graded})")
    return {"status": overall, "criteria": {i: graded[i] for i in ids}}


# --- iteration records ------------------------------------------------------------------------------------


def _record(taxonomy: str, run: int, iteration: int, **fields: Any) -> dict[str, Any]:
    """An iteration record with every field present (None where a stage was not reached)."""
    record = {"taxonomy": taxonomy, "run": run, "iteration": iteration, "status": "invalid", "reason": None}
    record |= {name: None for name in ROW_FIELDS if name not in record}
    record |= fields
    return record


def _invalid(record_args: tuple[str, int, int], stage: str, asked: Asked, **fields: Any) -> dict[str, Any]:
    error = asked.errors[-1] if asked.errors else "?"
    reason = f"{stage}: no valid JSON after {len(asked.raw)} answer(s): {error}"
    return _record(*record_args, status="invalid", reason=reason, **fields,
                   **{f"{stage}_raw": asked.raw, f"{stage}_errors": asked.errors})


def _outcome(statuses: list[str]) -> tuple[str, int]:
    fails = statuses.count("FAIL")
    return ("model_breaking" if fails >= BREAK_THRESHOLD else "not_breaking"), fails


def refinement_report(criteria: Sequence[dict[str, str]], failures: Mapping[str, int]) -> str:
    """One line per criterion: its failure count and "needs improvement" (< KEEP_THRESHOLD failures) or
    "keep intact"."""
    lines = []
    for c in criteria:
        n = failures.get(c["id"], 0)
        mark = "keep intact" if n >= KEEP_THRESHOLD else "needs improvement"
        lines.append(f"- {c['id']} ({n}/{ATTEMPTS} failed, {mark}): {c['criterion']}")
    return "\n".join(lines)


class Taxonomy(Protocol):
    """One taxonomy's iteration: ``iterate`` returns the iteration record (see ``_record``)."""

    name: str
    settings: dict[str, Any]

    def iterate(self, run: int, iteration: int, history: Sequence[Record], seed: int) -> Record: ...


# --- qc, itf, mim -----------------------------------------------------------------------------------------


@dataclass
class LLMTaxonomy:
    """A taxonomy judged by LLMs against criteria: generator, validator (default: the judge), solver,
    judge. ``generation`` drives the generator and the solver (sampled, seeded per iteration and attempt);
    the validator and the judge decode greedily with ``judging``."""

    name: str
    generator: Backend
    solver: Backend
    judge: Backend
    validator: Backend | None = None
    generation: GenerationConfig = field(
        default_factory=lambda: GenerationConfig(max_new_tokens=1024, temperature=0.7))
    judging: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=1024, seed=0))

    def __post_init__(self) -> None:
        if self.name not in LLM_TAXONOMIES:
            raise ValueError(f"LLM taxonomy must be one of {LLM_TAXONOMIES}, got {self.name!r}")
        self.validator = self.validator or self.judge

    @property
    def settings(self) -> dict[str, Any]:
        return {**self._names(), "generation": _generation(self.generation),
                "judging": _generation(self.judging)}

    def _names(self) -> dict[str, str]:
        assert self.validator is not None  # __post_init__ defaults it to the judge
        return {"generator": self.generator.name, "validator": self.validator.name,
                "solver": self.solver.name, "judge": self.judge.name}

    def generator_prompt(self, history: Sequence[Record]) -> str:
        """The generator's request: the taxonomy prompt, or feedback on the last valid iteration."""
        output = bp.OUTPUT_FORMAT.format(taxonomy=self.name)
        last = next((r for r in reversed(history) if r["status"] != "invalid"), None)
        if last is None:
            return "\n\n".join([bp.TAXONOMY_PROMPTS[self.name], bp.CRITERIA_RULES, output])
        answers = [a for a in last["solver_responses"] or [] if a]
        return bp.REFINEMENT_PROMPT.format(
            header=bp.PROMPT_HEADER, taxonomy_prompt=bp.TAXONOMY_PROMPTS[self.name],
            fail_count=last["fail_count"], attempts=ATTEMPTS, threshold=BREAK_THRESHOLD,
            prompt=last["prompt"], correct_response=last["correct_response"],
            validator_status=last["validator_status"], validator_remarks=last["validator_remarks"],
            criteria_report=refinement_report(last["response_reference"], last["criteria_failures"]),
            techniques=bp.REFINEMENT_TECHNIQUES[self.name], sample_answer=answers[0] if answers else "(none)",
            criteria_rules=bp.CRITERIA_RULES, output_format=output)

    def iterate(self, run: int, iteration: int, history: Sequence[Record], seed: int) -> Record:
        """Generate (or refine), validate, answer 4 times, grade; any unusable JSON ends it invalid."""
        key = (self.name, run, iteration)
        request = self.generator_prompt(history)
        names = {**self._names(), "generator_input": request}
        conversation = [{"role": "system", "content": bp.PROMPT_HEADER}, {"role": "user", "content": request}]
        gen_config = replace(self.generation, seed=derive_seed(seed, self.name, run, iteration, "generator"))
        (asked,) = ask_json(self.generator, [conversation], lambda t: parse_task(t, self.name), gen_config)
        if asked.value is None:
            return _invalid(key, "generator", asked, **names)
        task = asked.value
        fields = {**names, "prompt": task["prompt"], "correct_response": task["correct_response"],
                  "response_reference": task["response_reference"], "generator_raw": asked.raw,
                  "generator_errors": asked.errors}
        criteria = "\n".join(f"{c['id']}: {c['criterion']}" for c in task["response_reference"])
        check = bp.VALIDATOR_PROMPT.format(prompt=task["prompt"], correct_response=task["correct_response"],
                                           criteria=criteria)
        assert self.validator is not None  # __post_init__ defaults it to the judge
        (verdict,) = ask_json(self.validator, [[{"role": "user", "content": check}]], parse_validation,
                              self.judging)
        if verdict.value is None:
            return _invalid(key, "validator", verdict, **fields)
        fields |= {"validator_status": verdict.value["status"], "validator_remarks": verdict.value["remarks"]}
        answers = []
        for attempt in range(ATTEMPTS):  # one call per attempt: each with its own sampling seed
            attempt_seed = derive_seed(seed, self.name, run, iteration, "solver", attempt)
            config = replace(self.generation, seed=attempt_seed)
            answers += self.solver.generate([[{"role": "user", "content": task["prompt"]}]], config)[:1]
        fields["solver_responses"] = answers
        ids = [c["id"] for c in task["response_reference"]]
        gradings = ask_json(self.judge, [[{"role": "user", "content": bp.JUDGE_PROMPT.format(
            prompt=task["prompt"], criteria=criteria, answer=a)}] for a in answers],
            lambda t: parse_grading(t, ids), self.judging)
        fields["judge_responses"] = [
            {"output": g.raw[-1], "status": (g.value or {}).get("status"),
             "criteria": (g.value or {}).get("criteria"), "raw": g.raw, "errors": g.errors} for g in gradings]
        bad = next((a for a, g in enumerate(gradings) if g.value is None), None)
        if bad is not None:
            return _invalid(key, "judge", gradings[bad], **fields)
        statuses = [g.value["status"] for g in gradings]
        status, fails = _outcome(statuses)
        failures = {i: sum(g.value["criteria"][i] == "FAIL" for g in gradings) for i in ids}
        return _record(*key, status=status, attempt_statuses=statuses, fail_count=fails,
                       criteria_failures=failures, **fields)


def _generation(config: GenerationConfig) -> dict[str, Any]:
    return {"max_new_tokens": config.max_new_tokens, "temperature": config.temperature, "top_p": config.top_p}


# --- flaw -------------------------------------------------------------------------------------------------


FLAW_CRITERIA = [{"id": "C1", "criterion": "The episode ends in full success: every required tool succeeds, "
                  "in order, and the agent signals completion."}]


class FlawTaxonomy:
    """Flawed-plan tasks (see the module doc). ``tasks``: the pool; ``config``: the world (the text env's
    strict dependencies are applied); ``generator``: an optional LLM proposing (task, flaw, severity,
    position) as JSON, else the seeded scripted proposer; ``matcher``: tool similarity of the flaws."""

    name = "flaw"

    def __init__(self, solver: Agent, tasks: Sequence[Any], config: Any = None,
                 generator: Backend | None = None, generation: GenerationConfig | None = None,
                 matcher: str = "auto", candidates: int = 12):
        from ..core.matching import LexicalMatcher, make_matcher

        if not tasks:
            raise ValueError("the flaw taxonomy needs at least one task in its pool")
        self.solver, self.tasks, self.generator = solver, list(tasks), generator
        self.by_id = {t.instance_id: t for t in self.tasks}
        self.config = (config or WorldConfig()).replace(rules={"strict_dependencies": True})
        self.generation = generation or GenerationConfig(max_new_tokens=256, temperature=0.7)
        if matcher == "auto":  # pinned, so the record says which similarity the flaws used
            matcher = "lexical" if isinstance(make_matcher("auto"), LexicalMatcher) else "semantic"
        self.matcher = matcher
        self.candidates = candidates
        self._envs = [ResiliBenchTextEnv(split=None, tasks=self.tasks, config=self.config)
                      for _ in range(ATTEMPTS)]
        self._plans: dict[str, Any] = {}

    @property
    def settings(self) -> dict[str, Any]:
        return {"generator": self.generator.name if self.generator else "scripted", "validator": "exact",
                "solver": self.solver.name, "judge": "evaluator", "matcher": self.matcher,
                "generation": _generation(self.generation) if self.generator else None}

    # The plan of a task and the prompt around it.
    def base_prompt(self, task: Any) -> Any:
        """The task's optimal prompt; its plan (reference workflow with arguments) is what flaws change."""
        from ..core.text.prompts import PromptSettings, build_prompt

        if task.instance_id not in self._plans:
            settings = PromptSettings(variant="optimal", matcher=self.matcher)
            self._plans[task.instance_id] = build_prompt(task, settings, config=self.config)
        return self._plans[task.instance_id]

    def inject(self, proposal: Mapping[str, Any], seed: int) -> Any:
        """The ``FlawInjection`` of a proposal (FlawNotApplicable / ValueError when it cannot be made)."""
        from ..core.arguments import task_hints
        from ..core.text.flaws import inject_flaw

        task = self.by_id[proposal["task_id"]]
        return inject_flaw(self.base_prompt(task).plan, proposal["flaw_type"], severity=proposal["severity"],
                           seed=seed, position=proposal["position"], method=proposal.get("method"),
                           matcher=self.matcher, hints=task_hints(task))

    def flawed_prompt(self, task: Any, injection: Any) -> Any:
        """The optimal prompt with its plan replaced by the flawed one, as the ``flawed`` variant shows it."""
        from ..core.text.prompts import Prompt, render_plan

        base = self.base_prompt(task)
        shown, flawed = render_plan(base.plan), render_plan(injection.workflow)
        if base.text.count(shown) != 1:
            raise RuntimeError(f"the plan of {task.instance_id} is not found once in its prompt")
        return Prompt(base.text.replace(shown, flawed), "flawed", injection.workflow, injection, "numbered")

    # Proposals.
    def _order(self, run: int, seed: int) -> tuple[list[Any], list[str]]:
        from ..core.text.flaws import FLAW_TYPES

        rng = np.random.default_rng(derive_seed(seed, "flaw", run))
        tasks = [self.tasks[int(i)] for i in rng.permutation(len(self.tasks))]
        return tasks, [FLAW_TYPES[int(i)] for i in rng.permutation(len(FLAW_TYPES))]

    def _applicable(self, proposal: dict[str, Any], seed: int) -> bool:
        from ..core.text.flaws import FlawNotApplicable

        try:
            self.inject(proposal, seed)
        except FlawNotApplicable:
            return False
        return True

    def scripted_proposal(self, run: int, history: Sequence[Record], seed: int, flaw_seed: int) -> dict:
        """The rule-based proposal: a seeded task and flaw type at severity 0.5 first; then, from the last
        iteration: a harmless flaw (validator FAIL) or no failed attempt -> the next flaw type; some
        attempts passed -> severity + 0.25, at severity 1 the next applicable position, then the next type."""
        from ..core.text.flaws import applicable_positions

        tasks, types = self._order(run, seed)
        last = next((r["details"] for r in reversed(history) if r["status"] != "invalid"), None)
        if last is not None and last["validator_ok"] and last["passes"] < ATTEMPTS:
            if last["severity"] < 1.0:
                severity = min(1.0, last["severity"] + 0.25)
                return {**_pick(last), "severity": severity, "method": last["method"]}
            plan = self.base_prompt(self.by_id[last["task_id"]]).plan
            positions = applicable_positions(plan, last["flaw_type"], last["method"], matcher=self.matcher)
            current = last["position"] if last["position"] is not None else last["first_position"]
            later = [p for p in positions if p > current]
            if later:
                return {**_pick(last), "position": later[0], "method": last["method"]}
        tried = {(r["details"]["task_id"], r["details"]["flaw_type"]) for r in history
                 if r["status"] != "invalid"}
        start = tasks.index(self.by_id[last["task_id"]]) if last is not None else 0
        for task in tasks[start:] + tasks[:start]:
            for flaw_type in types:
                proposal = {"task_id": task.instance_id, "flaw_type": flaw_type, "severity": 0.5,
                            "position": None}
                if (task.instance_id, flaw_type) not in tried and self._applicable(proposal, flaw_seed):
                    return proposal
        if last is None:
            raise RuntimeError(f"no flaw type of {types} applies to a task of run {run}")
        return {**_pick(last), "method": last["method"]}  # everything tried: repeat the last proposal

    def generator_prompt(self, run: int, history: Sequence[Record], seed: int, flaw_seed: int) -> str:
        """The LLM generator's request: candidate tasks and flaw types, then feedback on the last valid
        iteration (with the scripted proposer's next step as the suggestion)."""
        from ..core.text.flaws import FLAW_METHODS

        lines = [f"- {t.instance_id} ({t.task_type}): "
                 + self.base_prompt(t).plan.to_plan().replace("\n", " | ")
                 for t in self._order(run, seed)[0][: self.candidates]]
        types = "\n".join(f"- {k}: {', '.join(v)}" for k, v in FLAW_METHODS.items())
        base = bp.FLAW_GENERATOR_PROMPT.format(flaw_types=types, tasks="\n".join(lines))
        last = next((r["details"] for r in reversed(history) if r["status"] != "invalid"), None)
        if last is None:
            return base
        hint = self.scripted_proposal(run, history, seed, flaw_seed)
        suggestion = ", ".join(f"{k} {hint[k]}" for k in ("flaw_type", "severity", "position")
                               if hint[k] != last[k])
        return bp.FLAW_FEEDBACK_PROMPT.format(
            base=base, attempts=ATTEMPTS, threshold=BREAK_THRESHOLD, levels=", ".join(last["levels"]),
            suggestion=suggestion or "a different flaw type", fail_count=ATTEMPTS - last["passes"],
            **{k: last[k] for k in ("task_id", "flaw_type", "method", "severity", "position",
                                    "success_flawed", "success_reference")})

    def parse_proposal(self, text: str, flaw_seed: int) -> dict[str, Any]:
        """An LLM proposal checked: a task of the pool, a known flaw type, severity in (0, 1], position an
        integer or null, and a flaw that can be injected there."""
        from ..core.text.flaws import FLAW_TYPES

        data = one_object(text, "flaw_type")
        if data.get("task_id") not in self.by_id:
            raise AnswerError(f"'task_id' must be one of the candidate task ids, got "
                              f"{json.dumps(data.get('task_id'))}")
        if data["flaw_type"] not in FLAW_TYPES:
            raise AnswerError(f"'flaw_type' must be one of {', '.join(FLAW_TYPES)}, got "
                              f"{json.dumps(data['flaw_type'])}")
        severity, position = data.get("severity"), data.get("position")
        if isinstance(severity, bool) or not isinstance(severity, int | float) or not 0 < severity <= 1:
            raise AnswerError(f"'severity' must be a number in (0, 1], got {json.dumps(severity)}")
        if position is not None and (isinstance(position, bool) or not isinstance(position, int)):
            raise AnswerError(f"'position' must be an integer or null, got {json.dumps(position)}")
        proposal = {"task_id": data["task_id"], "flaw_type": data["flaw_type"], "severity": float(severity),
                    "position": position}
        try:
            self.inject(proposal, flaw_seed)
        except ValueError as exc:  # FlawNotApplicable included
            raise AnswerError(f"the flaw cannot be injected: {exc}") from None
        return proposal

    # The iteration.
    def iterate(self, run: int, iteration: int, history: Sequence[Record], seed: int) -> Record:
        """Propose a flaw, check it exactly, play 4 episodes of the flawed prompt, grade by level."""
        from ..core.plan_follower import workflow_success
        from ..core.simulator import task_seed
        from ..core.text.prompts import render_plan

        key = (self.name, run, iteration)
        flaw_seed = derive_seed(seed, self.name, run, "injection")
        names = {"generator": self.settings["generator"], "validator": "exact", "solver": self.solver.name,
                 "judge": "evaluator"}
        if self.generator is None:
            proposal = self.scripted_proposal(run, history, seed, flaw_seed)
        else:
            request = self.generator_prompt(run, history, seed, flaw_seed)
            names["generator_input"] = request
            config = replace(self.generation, seed=derive_seed(seed, self.name, run, iteration, "generator"))
            (asked,) = ask_json(self.generator, [[{"role": "user", "content": request}]],
                                lambda t: self.parse_proposal(t, flaw_seed), config)
            if asked.value is None:
                return _invalid(key, "generator", asked, **names)
            proposal = asked.value
            names |= {"generator_raw": asked.raw, "generator_errors": asked.errors}
        task = self.by_id[proposal["task_id"]]
        injection = self.inject(proposal, flaw_seed)
        prompt = self.flawed_prompt(task, injection)
        flawed = workflow_success(task, injection.workflow, self.config)
        reference = workflow_success(task, injection.original, self.config)
        validator_ok = flawed < reference - 1e-12
        remarks = (f"exact success of following the plan: {flawed:.4f} with the flaw, {reference:.4f} "
                   "without it" + ("" if validator_ok else "; the flaw does not lower it"))
        # One episode per attempt seed; the same seeds at every iteration of a run, so refinements are paired.
        episode_seeds = [derive_seed(seed, self.name, run, "episode", a) for a in range(ATTEMPTS)]
        infos = self.play(task, prompt, [task_seed(task.instance_id, s) for s in episode_seeds])
        statuses = ["PASS" if info["level"] == "full_success" else "FAIL" for info in infos]
        status, fails = _outcome(statuses)
        details = {**proposal, "method": injection.method, "changes": [dict(c) for c in injection.changes],
                   "first_position": injection.changes[0]["position"] if injection.changes else None,
                   "success_flawed": round(flawed, 6), "success_reference": round(reference, 6),
                   "validator_ok": validator_ok, "passes": ATTEMPTS - fails,
                   "levels": [i["level"] for i in infos],
                   "episode_seeds": episode_seeds, "task_type": task.task_type}
        return _record(
            *key, status=status, **names, prompt=prompt.text,
            correct_response=render_plan(injection.original),
            response_reference=FLAW_CRITERIA, validator_status="PASS" if validator_ok else "FAIL",
            validator_remarks=remarks, solver_responses=[i["transcript"] for i in infos],
            judge_responses=[{"output": i["summary"], "status": s, "criteria": {"C1": s}}
                             for i, s in zip(infos, statuses, strict=True)],
            attempt_statuses=statuses, fail_count=fails, criteria_failures={"C1": fails}, details=details)

    def play(self, task: Any, prompt: Any, seeds: Sequence[int]) -> list[dict[str, Any]]:
        """Play one episode per seed with the solver, all at once (one ``respond`` call per round)."""
        for env, seed in zip(self._envs, seeds, strict=True):
            env.reset(seed=seed, options={"task_id": task.instance_id, "shown_prompt": prompt})
        running, infos = list(range(len(seeds))), [{} for _ in seeds]
        while running:
            replies = self.solver.respond([(self._envs[i].messages, self._envs[i]) for i in running])
            still = []
            for i, reply in zip(running, replies, strict=True):
                _, _, terminated, truncated, info = self._envs[i].step(reply)
                if terminated or truncated:
                    infos[i] = info
                else:
                    still.append(i)
            running = still
        out = []
        for env, info in zip(self._envs, infos, strict=True):
            calls = ", ".join(f"{c['tool']} {'ok' if c['success'] else c['error_code']}"
                              for c in info["trace"])
            out.append({"level": info["level"], "transcript": "\n".join(m["content"] for m in env.messages
                                                                         if m["role"] == "assistant"),
                        "summary": f"level {info['level']}; end {info['end_reason']}; {info['turn']} turns; "
                                   f"calls: {calls or 'none'}"})
        return out


def _pick(details: Mapping[str, Any]) -> dict[str, Any]:
    return {k: details[k] for k in ("task_id", "flaw_type", "severity", "position")}


# --- the loop and its files -------------------------------------------------------------------------------


def prompt_embedding(text: str) -> list[float]:
    """The unit-norm MiniLM embedding of ``text`` (local model), rounded to 6 decimals."""
    from ..core.matching import load_embedding_model

    vector = load_embedding_model().encode([text], normalize_embeddings=True, convert_to_numpy=True,
                                           show_progress_bar=False)[0]
    return [round(float(v), 6) for v in vector]


def max_similarity(embedding: Sequence[float], previous: Sequence[Sequence[float]]) -> float:
    """The largest cosine similarity of ``embedding`` to any of ``previous`` (0.0 without any), 4 decimals."""
    if not previous:
        return 0.0
    matrix, vector = np.asarray(previous, dtype=np.float64), np.asarray(embedding, dtype=np.float64)
    sims = matrix @ vector / (np.linalg.norm(matrix, axis=1) * np.linalg.norm(vector) + 1e-12)
    return round(float(sims.max()), 4)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


@dataclass
class BreakerSummary:
    """Per taxonomy: runs, finished runs, model-breaking rows, iterations and invalid iterations."""

    taxonomies: dict[str, dict[str, int]]
    rows_path: Path
    iterations_path: Path


def breaker_directory(directory: str | Path, identity: dict[str, Any] | None = None) -> RunDirectory:
    """The RunDirectory of a breaker run: ``rows.jsonl`` (one row per (taxonomy, run)), ``iterations.jsonl``
    and ``meta.json`` (the run config, checked against ``identity`` on resume). ``check()`` on it is cheap,
    so callers check before loading any model."""
    return RunDirectory(directory, identity or {"world": None, "tasks_sha256": None}, key=("taxonomy", "run"),
                        results="rows.jsonl", summary=None, meta="meta.json", logs=("iterations.jsonl",))


def run_breaker(directory: str | Path, taxonomies: Mapping[str, Taxonomy], runs: Mapping[str, int],
                max_iterations: Mapping[str, int], *, seed: int = 0, run_config: dict[str, Any] | None = None,
                identity: dict[str, Any] | None = None, resume: bool = True, progress: bool = True,
                embed: Callable[[str], list[float]] = prompt_embedding) -> BreakerSummary:
    """Run (or resume) the loop into ``directory``. ``taxonomies`` maps every name of ``runs`` to its
    ``Taxonomy``; ``identity`` (e.g. "world" and "tasks_sha256") must match what ``meta.json`` recorded,
    else the directory is refused (``errors.ConfigChanged``). A run already finished (it saved a row or
    reached its cap) is skipped; an unfinished one continues at its next iteration. ``resume=False``
    starts the directory's files afresh."""
    missing = [name for name in runs if name not in taxonomies]
    if missing:
        raise ValueError(f"no taxonomy object for {missing}")
    run = breaker_directory(directory, identity)
    config = {**(run_config or {}), **run.identity, "runs": dict(runs), "max_iterations": dict(max_iterations),
              "seed": seed, "taxonomies": {name: taxonomies[name].settings for name in runs}}
    with run.session(resume):
        run.write_meta(run_metadata(config, [seed]))
        summary = BreakerSummary({}, run.results_path, run.path / "iterations.jsonl")
        _loop(taxonomies, runs, max_iterations, seed, run.writer(summary.iterations_path.name),
              run.writer(summary.rows_path.name), embed, progress_bar if progress else None, summary)
        return summary


def _loop(taxonomies: Mapping[str, Taxonomy], runs: Mapping[str, int], caps: Mapping[str, int], seed: int,
          iterations: Any, rows: Any, embed: Callable[[str], list[float]], progress_bar: Callable | None,
          summary: BreakerSummary) -> None:
    """Every unfinished run of ``runs``, iteration by iteration, appending to the two JSONL writers."""
    history: dict[tuple[str, int], list[Record]] = {}
    for record in iterations.existing.rows:
        history.setdefault((record["taxonomy"], record["run"]), []).append(record)
    saved = {(r["taxonomy"], r["run"]): r for r in rows.existing.rows}
    embeddings = [r["embedding"] for r in rows.existing.rows]

    def save(record: dict[str, Any]) -> None:
        vector = embed(record["prompt"])
        row = {name: record[name] for name in ROW_FIELDS} | {
            "status": "FAIL", "embedding": vector, "max_similarity": max_similarity(vector, embeddings),
            "created": _now()}
        rows.write(row)
        embeddings.append(vector)
        saved[(record["taxonomy"], record["run"])] = row

    # A crash between an iteration record and its row: write the row now.
    for (name, run), records in history.items():
        if records[-1]["status"] == "model_breaking" and (name, run) not in saved:
            save(records[-1])
    for name, count in runs.items():
        taxonomy, cap = taxonomies[name], caps.get(name, 1)
        stats = summary.taxonomies[name] = {"runs": count, "finished": 0, "model_breaking": 0,
                                            "iterations": 0, "invalid": 0}
        bar = progress_bar(count, f"breaker {name}") if progress_bar else None
        for run in range(1, count + 1):
            records = history.setdefault((name, run), [])
            while not ((name, run) in saved or len(records) >= cap):
                iteration = len(records) + 1
                record = taxonomy.iterate(run, iteration, records, seed)
                record["created"] = _now()
                iterations.write(record)
                records.append(record)
                if record["status"] == "model_breaking":
                    save(record)
            stats["finished"] += 1
            stats["model_breaking"] += (name, run) in saved
            stats["iterations"] += len(records)
            stats["invalid"] += sum(r["status"] == "invalid" for r in records)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(broken=stats["model_breaking"])
        if bar is not None:
            bar.close()


def export_csv(rows_path: str | Path, csv_path: str | Path) -> int:
    """Write the rows of ``rows_path`` as CSV with the original design's columns (``CSV_COLUMNS``): lists
    and dicts as JSON, attempts keyed ``attempt_1`` ...; returns the number of rows."""
    from resilibench.results import read_jsonl, write_text_atomic

    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(CSV_COLUMNS)
    rows = read_jsonl(rows_path).rows
    for row in rows:
        cells = dict(row)
        cells["solver_responses"] = {f"attempt_{i}": a for i, a in enumerate(row["solver_responses"], 1)}
        cells["judge_responses"] = {f"attempt_{i}": {"judge_output": j["output"], "status": j["status"]}
                                    for i, j in enumerate(row["judge_responses"], 1)}
        cells["max_similarity"] = f"{row['max_similarity']:.4f}"
        values = [cells[f] for f in CSV_COLUMNS.values()]
        writer.writerow([v if isinstance(v, str) else json.dumps(v) for v in values])
    write_text_atomic(csv_path, out.getvalue())
    return len(rows)

