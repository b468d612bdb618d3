"""LLM-as-judge: strict verdict parsing, retries with feedback, invalid verdicts, batching per attempt."""

from __future__ import annotations

import json

import pytest

from helpers import ScriptedBackend
from resilibench.core.workflow import Workflow
from resilibench.llm import GenerationConfig, Message
from resilibench.metrics.judge import Judge, VerdictError, judge_messages, parse_verdict

REF = Workflow.chain(["file_operations_reader", "data_processing_parser", "file_operations_writer"],
                     ["read the input file", "parse it", "write the result"])
PRED = Workflow.chain(["file_operations_reader", "file_operations_writer"], ["read the input file", "write the result"])


def verdict(score, reason="one step is missing", **extra) -> str:
    return json.dumps({"analysis": "compared", "initial_score": 4, "self_check": "consistent", "score": score,
                       "reason": reason, **extra})


def test_parse_valid_answer_and_normalise():
    v = parse_verdict(verdict(4))
    assert (v.score, v.initial_score, v.reason, v.valid) == (4, 4, "one step is missing", True)
    assert v.normalized == pytest.approx(0.8)
    assert parse_verdict(verdict(0)).normalized == 0.0 and parse_verdict(verdict(5)).normalized == 1.0


def test_parse_tolerates_text_around_the_json_object():
    fenced = "Here is my grade:\n```json\n" + verdict(3) + "\n```\nThanks."
    assert parse_verdict(fenced).score == 3
    # Braces in prose before the object do not confuse the scan.
    assert parse_verdict("set {a, b} differs; " + verdict(2)).score == 2


@pytest.mark.parametrize("answer, problem", [
    ("The candidate misses a step; I give it 4/5.", "no JSON object"),
    (verdict(6), "'score' must be an integer from 0 to 5, got 6"),
    (verdict(-1), "got -1"),
    (verdict(4.5), "got 4.5"),
    (verdict("4"), 'got "4"'),
    (verdict(True), "got true"),
    (verdict(4, reason=""), "'reason' must be a non-empty string"),
    (json.dumps({"score": 4}), "'reason' must be a non-empty string"),
    (verdict(4) + " " + verdict(2), "exactly one JSON object with a 'score' key, found 2"),
    ('{"analysis": "no score here", "reason": "x"}', "found 0"),
    (verdict(4, initial_score=9), "'initial_score' must be an integer"),
    ('{"score": 4, "reason": "cut off', "no JSON object"),
])
def test_parse_rejects_malformed_answers(answer, problem):
    with pytest.raises(VerdictError, match=problem.replace("(", r"\(")):
        parse_verdict(answer)


def test_messages_list_nodes_and_edges_and_rubric():
    system, user = judge_messages(PRED, REF, task="convert a file")
    assert "0 = Completely incorrect" in system["content"] and "Self-check" in system["content"]
    assert "Task: convert a file" in user["content"]
    assert "1. file_operations_reader: read the input file" in user["content"] and "2 -> 3" in user["content"]


def test_retry_then_valid_invalid_after_attempts_and_one_call_per_attempt():
    """Pair 0 answers well at once; pair 1 is malformed once, then fine; pair 2 never answers well."""

    def answer(conversation: list[Message]) -> str:
        attempt = sum(m["role"] == "user" for m in conversation)
        pair = "Task: p1" in conversation[1]["content"] and 1 or "Task: p2" in conversation[1]["content"] and 2 or 0
        if pair == 0:
            return verdict(5, reason="identical")
        if pair == 1:
            return "I think 3." if attempt == 1 else "```json\n" + verdict(3) + "\n```"
        return verdict(7) if attempt % 2 else "no idea"

    backend = ScriptedBackend(answer)
    judge = Judge(backend, attempts=3)
    verdicts = judge.judge([(PRED, REF)] * 3, tasks=["p0", "p1", "p2"])
    assert backend.calls == [3, 2, 1]  # every pending pair in one call per attempt
    assert [v.score for v in verdicts] == [5, 3, None]
    assert [v.attempts for v in verdicts] == [1, 2, 3]
    assert verdicts[1].errors == ("no JSON object found",) and verdicts[1].raw[0] == "I think 3."
    invalid = verdicts[2]
    assert not invalid.valid and invalid.normalized is None and invalid.reason is None
    assert invalid.raw == (verdict(7), "no idea", verdict(7))  # every raw answer kept
    assert "got 7" in invalid.errors[0] and invalid.errors[1] == "no JSON object found"
    assert invalid.to_dict()["valid"] is False


def test_retry_feeds_the_error_back():
    seen: list[list[Message]] = []

    def answer(conversation: list[Message]) -> str:
        seen.append(conversation)
        return verdict(9) if len(seen) == 1 else verdict(2)

    verdicts = Judge(ScriptedBackend(answer), attempts=2).judge([(PRED, REF)])
    assert verdicts[0].score == 2
    retry = seen[1]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert retry[2]["content"] == verdict(9) and "got 9" in retry[3]["content"]


def test_one_attempt_and_bad_settings():
    verdicts = Judge(ScriptedBackend(lambda c: "nothing"), attempts=1).judge([(PRED, REF), (REF, REF)])
    assert [v.attempts for v in verdicts] == [1, 1] and not any(v.valid for v in verdicts)
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        Judge(ScriptedBackend(lambda c: ""), attempts=0)
    with pytest.raises(ValueError, match="one entry per pair"):
        Judge(ScriptedBackend(lambda c: "")).judge([(PRED, REF)], tasks=["a", "b"])
    assert Judge(ScriptedBackend(lambda c: "")).judge([]) == []


def test_tiny_transformers_judge_records_invalid_without_crashing(tiny_lm_backend):
    """A real (random) transformers model cannot follow the format: every pair ends invalid, raw kept."""
    judge = Judge(tiny_lm_backend, attempts=2, generation=GenerationConfig(max_new_tokens=6, seed=0))
    (v,) = judge.judge([(PRED, REF)])
    assert not v.valid and v.score is None and v.attempts == 2 and len(v.errors) == 2
    assert all(isinstance(r, str) for r in v.raw)


@pytest.fixture(scope="module")
def tiny_lm_backend(tmp_path_factory):
    from tiny_lm import build_tiny_lm

    from resilibench.agents.backends import TransformersBackend

    return TransformersBackend(build_tiny_lm(tmp_path_factory.mktemp("tiny")))
