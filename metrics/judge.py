"""LLM-as-judge for workflows: a 0-5 rubric with a self-check, strict JSON verdicts, normalised to [0, 1].

The rubric (WorkflowPerturb app. B.6, after WorFBench's judge):

    5  perfect match: every reference step present, same dependencies, accurate and detailed
    4  very good: only one minor step missing or slightly less specific
    3  noticeable errors: a minor reordering, or one extra or missing non-critical step
    2  significant issues: several key steps omitted, or wrong steps added
    1  major flaws: the core logic of the workflow is broken
    0  completely incorrect or irrelevant to the task

The judge is told to (1) list the nodes and edges of both workflows, (2) match nodes by content,
(3) identify missing, extra and reordered steps, (4) give an initial score by the rubric, (5) check that
the score strictly follows the rubric, (6) adjust it if not. It answers with exactly one JSON object::

    {"analysis": "<step-by-step reasoning>", "initial_score": <int 0-5>,
     "self_check": "<does the initial score follow the rubric? what changed?>",
     "score": <int 0-5, the final score>, "reason": "<one-sentence justification>"}

Parsing is strict: the answer must contain exactly one JSON object with a ``score`` key (text around it,
such as a code fence, is tolerated); ``score`` must be an integer 0-5 (not 4.5, not "4", not true) and
``reason`` a non-empty string; ``initial_score``, when present, must be an integer 0-5. A malformed
answer is sent back with the problem named, up to ``attempts`` answers in all; after that the pair is
recorded as invalid (score None, every raw answer kept). All pending pairs go to the backend in one
``generate`` call per attempt.
"""

from __future__ import annotations

__all__ = [
    "MAX_SCORE", "RUBRIC", "SYSTEM_PROMPT", "RETRY_PROMPT", "VerdictError", "Verdict", "describe_workflow",
    "judge_messages", "json_objects", "parse_verdict", "Judge",
]

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from resilibench.llm import Backend, GenerationConfig, Message, ask_until_valid

from ..core.workflow import Workflow

MAX_SCORE = 5

RUBRIC = """\
5 = Perfect match: every reference step is present with the same dependencies; accurate and detailed.
4 = Very good: only one minor step is missing or slightly less specific.
3 = Noticeable errors: a minor reordering of steps, or one extra or missing non-critical step.
2 = Significant issues: several key steps omitted, or wrong steps added.
1 = Major flaws: the core logic of the workflow is broken.
0 = Completely incorrect or irrelevant to the task."""

SYSTEM_PROMPT = f"""\
You grade a candidate workflow against a reference (gold) workflow. A workflow is a list of numbered
steps (nodes) and dependency edges "a -> b" (step a must finish before step b starts).

Rubric (score 0-5):
{RUBRIC}

Anchors: a workflow missing one minor step scores 4; one that matches the reference perfectly scores 5;
one with a minor reordering of steps scores 3; one with extra irrelevant steps scores 2; one that is
completely wrong for the task scores 0. Rewording a step without changing what it does is not an error.

Procedure:
1. List the nodes and edges of both workflows.
2. Match candidate nodes to reference nodes by content.
3. Identify missing, extra and reordered steps.
4. Give an initial score by the rubric.
5. Self-check: confirm that the initial score strictly follows the rubric.
6. Adjust to a final score if necessary.

Answer with exactly one JSON object and nothing else:
{{"analysis": "<steps 1-3>", "initial_score": <integer 0-5>, "self_check": "<step 5>", \
"score": <integer 0-5, the final score>, "reason": "<one-sentence justification>"}}"""

RETRY_PROMPT = ("Your answer could not be used: {error}. Reply with exactly one JSON object with the keys "
                '"analysis", "initial_score", "self_check", "score" (an integer from 0 to 5) and "reason" '
                "(a non-empty string), and nothing else.")


class VerdictError(ValueError):
    """A judge answer that does not follow the output format; the message says what is wrong."""


@dataclass(frozen=True)
class Verdict:
    """The judge's verdict on one pair. ``score`` is None when no valid answer came within the attempts;
    ``raw`` keeps every answer received, in order, and ``errors`` the problem found in each invalid one."""

    score: int | None
    reason: str | None
    initial_score: int | None = None
    self_check: str | None = None
    raw: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()

    @property
    def valid(self) -> bool:
        return self.score is not None

    @property
    def normalized(self) -> float | None:
        """The score linearly mapped from 0-5 to [0, 1]."""
        return None if self.score is None else self.score / MAX_SCORE

    @property
    def attempts(self) -> int:
        return len(self.raw)

    def to_dict(self) -> dict[str, Any]:
        return {"score": self.score, "normalized": self.normalized, "reason": self.reason,
                "initial_score": self.initial_score, "self_check": self.self_check, "valid": self.valid,
                "attempts": self.attempts, "raw": list(self.raw), "errors": list(self.errors)}


def describe_workflow(workflow: Workflow) -> str:
    """Explicit node and edge lists (1-based), the form the judge reads."""
    lines = ["Nodes:"]
    for i, node in enumerate(workflow.nodes, 1):
        label = f"{node.tool}: {node.text}" if node.tool and node.text else node.label
        lines.append(f"{i}. {label}")
    lines.append("Edges:")
    lines += [f"{a + 1} -> {b + 1}" for a, b in sorted(workflow.edges)] or ["(none)"]
    return "\n".join(lines)


def judge_messages(pred: Workflow, ref: Workflow, task: str | None = None) -> list[Message]:
    """The conversation that asks for one verdict."""
    parts = [f"Task: {task}"] if task else []
    parts += [f"Reference workflow:\n{describe_workflow(ref)}", f"Candidate workflow:\n{describe_workflow(pred)}",
              "Grade the candidate workflow against the reference workflow."]
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n\n".join(parts)}]


def json_objects(text: str) -> list[Any]:
    """Every top-level JSON value that starts with '{' in ``text``, in order."""
    decoder = json.JSONDecoder()
    found, i = [], text.find("{")
    while i >= 0:
        try:
            value, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        found.append(value)
        i = text.find("{", end)
    return found


def _score_field(data: dict[str, Any], key: str) -> int:
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise VerdictError(f"{key!r} must be an integer from 0 to {MAX_SCORE}, got {json.dumps(value)}")
    if not 0 <= value <= MAX_SCORE:
        raise VerdictError(f"{key!r} must be an integer from 0 to {MAX_SCORE}, got {value}")
    return value


def parse_verdict(text: str) -> Verdict:
    """The verdict in one answer, or VerdictError naming what is wrong (rules in the module docstring)."""
    objects = [o for o in json_objects(text) if isinstance(o, dict)]
    if not objects:
        raise VerdictError("no JSON object found")
    scored = [o for o in objects if "score" in o]
    if len(scored) != 1:
        raise VerdictError(f"expected exactly one JSON object with a 'score' key, found {len(scored)}")
    data = scored[0]
    score = _score_field(data, "score")
    reason = data.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        raise VerdictError(f"'reason' must be a non-empty string, got {json.dumps(reason)}")
    initial = _score_field(data, "initial_score") if data.get("initial_score") is not None else None
    check = data.get("self_check")
    return Verdict(score, reason.strip(), initial, None if check is None else str(check), (text,))


@dataclass
class Judge:
    """Grades (candidate, reference) workflow pairs through any ``Backend``.

    ``attempts``: answers asked for per pair before it is recorded invalid (>= 1). ``generation``: the
    sampling settings (greedy by default, so a verdict is reproducible with a deterministic backend).
    """

    backend: Backend
    attempts: int = 3
    generation: GenerationConfig = field(default_factory=lambda: GenerationConfig(max_new_tokens=768, seed=0))

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")

    @property
    def settings(self) -> dict[str, Any]:
        """What determines the verdicts (for results metadata)."""
        return {"backend": getattr(self.backend, "name", type(self.backend).__name__), "attempts": self.attempts,
                "max_new_tokens": self.generation.max_new_tokens, "temperature": self.generation.temperature,
                "seed": self.generation.seed}

    def judge(self, pairs: Sequence[tuple[Workflow, Workflow]], tasks: Sequence[str | None] | None = None
              ) -> list[Verdict]:
        """One verdict per (pred, ref) pair, in order; ``tasks`` optionally gives each pair's task text."""
        if tasks is not None and len(tasks) != len(pairs):
            raise ValueError(f"tasks must have one entry per pair, got {len(tasks)} for {len(pairs)} pairs")
        conversations = [judge_messages(p, r, tasks[i] if tasks else None) for i, (p, r) in enumerate(pairs)]
        answers = ask_until_valid(self.backend, conversations, lambda _, answer: parse_verdict(answer),
                                  self.attempts, self.generation, retry_message=RETRY_PROMPT,
                                  record_backend_errors=False)
        return [Verdict(got.value.score, got.value.reason, got.value.initial_score, got.value.self_check,
                        tuple(got.raw), tuple(got.errors)) if got.value is not None
                else Verdict(None, None, raw=tuple(got.raw), errors=tuple(got.errors)) for got in answers]
