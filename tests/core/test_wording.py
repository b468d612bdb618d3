"""Held out by wording: test descriptions use phrase-bank clauses that no train task uses, the split and
everything but the wording stay, and the shipped library is untouched."""

from __future__ import annotations

import re
from functools import cache

import pytest

from resilibench.core.tasks import phrases
from resilibench.core.tasks.wording import allowed_clauses, apply_wording, held_out_clauses, held_out_wording
from resilibench.core.workflow import Workflow
from resilibench.core.world import load_tasks


@cache
def _patterns() -> dict[tuple[str, int], re.Pattern[str]]:
    """Every bank clause as a pattern (its slots as non-empty text without a full stop), any case."""
    out = {}
    for tool, clauses in phrases.STEP_CLAUSES.items():
        for i, clause in enumerate(clauses):
            parts = re.split(r"\{\w+\}", clause)
            out[tool, i] = re.compile("[^.]+?".join(re.escape(p) for p in parts), re.IGNORECASE)
    return out


def _clauses_in(text: str, tools) -> set[tuple[str, int]]:
    return {(t, i) for (t, i), p in _patterns().items() if t in tools and p.search(text)}


@cache
def _worded():
    tasks = load_tasks()[::4]  # every task type and split, a quarter of the library (time)
    return tasks, held_out_wording(tasks)


def test_no_test_clause_appears_in_train_and_test_uses_only_held_out_clauses():
    held = held_out_clauses()
    assert set(held) == set(phrases.STEP_CLAUSES) and allowed_clauses("test") == {t: [i] for t, i in held.items()}
    original, worded = _worded()
    found = {"train": set(), "validation": set(), "test": set()}
    for task in worded:
        found[task.split] |= _clauses_in(task.description, task.required_tools)
    held_pairs = set(held.items())
    assert found["test"] and found["test"] <= held_pairs
    assert found["train"] and not found["train"] & held_pairs and not found["validation"] & held_pairs
    # The shipped wording uses held-out clauses in train: that is what the option removes.
    shipped_train = set().union(*(_clauses_in(t.description, t.required_tools) for t in original if t.split == "train"))
    assert shipped_train & held_pairs


def test_only_the_wording_changes_and_it_is_recorded():
    original, worded = _worded()
    for before, after in zip(original[:300], worded[:300], strict=True):
        assert after.description != before.description or after.split == "test"
        assert (after.instance_id, after.split, after.required_tools, after.inputs, after.expected_outputs) == (
            before.instance_id, before.split, before.required_tools, before.inputs, before.expected_outputs)
        assert after.original_description == after.description
        assert after.metadata["wording"]["option"] == "held_out"
        assert set(after.metadata["wording"]["clauses"]) == set(after.required_tools)
        assert str(before.inputs["source"]) in after.description  # the task's own data fills the slots
    assert held_out_wording(original[:20]) == worded[:20]  # deterministic, task by task
    assert apply_wording(original[:5], "shared") == original[:5]
    with pytest.raises(ValueError, match="wording must be one of shared, held_out"):
        apply_wording(original[:5], "other")
    with pytest.raises(ValueError, match="world v1 tasks only"):
        held_out_wording(load_tasks(world="v0")[:1])


def test_paraphrases_keep_each_split_s_clauses():
    from resilibench.robust_train.instructions import rule_variant, variant_rng

    _, worded = _worded()
    held_pairs = set(held_out_clauses().items())
    for split in ("train", "test"):
        for task in [t for t in worded if t.split == split][:40]:
            variant = rule_variant(task, Workflow(()), "paraphrase", variant_rng(0, task.instance_id, "paraphrase", 0))
            used = _clauses_in(variant.text, task.required_tools)
            assert used <= held_pairs if split == "test" else not used & held_pairs
