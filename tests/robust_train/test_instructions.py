"""Instruction perturbations: protected spans survive every rule, noise rates fall in their ranges and
track the measured word edits, requirement variants keep the reference workflow feasible, paraphrases
keep tools and order, seeding, and the LLM route (scripted answers and a tiny real model) with
validation, error feedback and the fallback to the rules."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401  (fixture)

from helpers import ScriptedBackend
from resilibench.core.bounds import reference_workflow
from resilibench.core.registry import default_registry, named_tools
from resilibench.core.tasks.library import interleave_task_types
from resilibench.core.world import load_tasks
from resilibench.llm import GenerationConfig
from resilibench.robust_train.instructions import (
    NOISE_RATES,
    PERTURBATION_TYPES,
    STYLES,
    InstructionPerturber,
    InstructionRequest,
    VariantError,
    augment_requirements,
    check_variant,
    extract_answer,
    find_step_list,
    inject_noise,
    paraphrase_instruction,
    protected_texts,
    render_steps,
    reword_clause,
    rule_variant,
    step_count,
    tool_mentions,
    unprotected_words,
    variant_rng,
)

LIBRARY = load_tasks()
SAMPLE = LIBRARY[::25]  # about 200 tasks of every type and template
SAMPLE_V0 = load_tasks(world="v0")[::25]  # world v0: descriptions that name their tools in order


@pytest.fixture(scope="module")
def pairs():
    """Two world-v0 train tasks of each type with their reference workflows (the tests using them are
    about tool names in the text, which only v0 descriptions have)."""
    tasks = interleave_task_types(load_tasks(split="train", world="v0"))[:10]
    return [(t, reference_workflow(t)) for t in tasks]


@pytest.fixture(scope="module")
def pairs_v1():
    """Two world-v1 train tasks of each type with their reference workflows."""
    tasks = interleave_task_types(load_tasks(split="train"))[:10]
    return [(t, reference_workflow(t)) for t in tasks]


def in_order(spans: list[str], text: str) -> bool:
    position = 0
    for span in spans:
        found = text.find(span, position)
        if found < 0:
            return False
        position = found + len(span)
    return True


def word_edits(a: list[str], b: list[str]) -> int:
    """Levenshtein distance between two word sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


def test_protected_spans_of_a_description():
    text = ('Starting from the XML file data/orders_0006.xml, read with file_operations_reader, then post to '
            'https://api.example.com/v1/x_1.json. Keep "batch mode" and `id-7` at 3 retries (utf-8).')
    assert protected_texts(text) == ["XML", "data/orders_0006.xml", "file_operations_reader",
                                     "https://api.example.com/v1/x_1.json", '"batch mode"', "`id-7`", "3", "utf-8"]
    assert tool_mentions(text) == ["file_operations_reader"]


def test_rules_keep_every_protected_span_over_the_library():
    for task in SAMPLE:
        spans, tools = protected_texts(task.description), tool_mentions(task.description)
        for kind in ("paraphrase", "noise_heavy"):
            rng = variant_rng(3, task.instance_id, kind, 0)
            text = (paraphrase_instruction(task.description, rng)[0] if kind == "paraphrase"
                    else inject_noise(task.description, 0.8, rng)[0])
            assert in_order(spans, text), (kind, task.description, text)
            assert tool_mentions(text) == tools


WORDS = st.sampled_from(["read", "the", "data", "then", "parse", "records", "quickly", "and", "files", "with", "a"])
LITERALS = st.sampled_from(["data/x_1.csv", "file_operations_reader", "42", "JSON", '"two words"', "`a-b`",
                            "https://h.org/p?q=1", "3.5", "network_fetcher", "v2"])
SEPARATORS = st.sampled_from([" ", " ", ", ", ". ", ", then ", ": "])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.one_of(WORDS, LITERALS), SEPARATORS), min_size=1, max_size=30), st.integers(0, 2**16),
       st.floats(0, 1))
def test_spans_survive_any_text(parts, seed, rate):
    text = "".join(w + s for w, s in parts).strip()
    spans = protected_texts(text)
    rng = np.random.default_rng(seed)
    noisy, _ = inject_noise(text, rate, rng)
    assert in_order(spans, noisy)
    assert tool_mentions(noisy) == tool_mentions(text)
    paraphrased, _ = paraphrase_instruction(text, rng)
    assert in_order(spans, paraphrased) and paraphrased != text
    assert tool_mentions(paraphrased) == tool_mentions(text)


def test_noise_rates_fall_in_range_and_track_the_edits():
    rates, measured = [], {level: [] for level in NOISE_RATES}
    for task in SAMPLE[:60]:
        original = [m.group(0) for m in unprotected_words(task.description)]
        n = len(original)
        for level, (lo, hi) in NOISE_RATES.items():
            variant = rule_variant(task, None, level, variant_rng(0, task.instance_id, level, 0))  # type: ignore[arg-type]
            assert lo <= variant.rate <= hi
            touched = round(variant.rate * n)
            assert sum(2 if op["op"] == "swap" else 1 for op in variant.notes["ops"]) == touched
            assert variant.notes["words"] == n
            assert {op["op"] for op in variant.notes["ops"]} <= {"substitute", "insert", "swap", "delete"}
            # The word-level edit distance is at most the words touched; it can be lower, since Levenshtein
            # aligns a deletion next to an insertion as one substitution.
            edits = word_edits(original, [m.group(0) for m in unprotected_words(variant.text)])
            assert 0.5 * touched <= edits <= touched, (level, edits, touched, n)
            rates.append(variant.rate)
            measured[level].append(edits / n)
    means = [float(np.mean(measured[level])) for level in NOISE_RATES]
    assert means[0] < means[1] < means[2]
    for (lo, hi), mean in zip(NOISE_RATES.values(), means, strict=True):
        assert 0.75 * lo <= mean <= hi
    order = [x for task_i in range(60) for x in (measured[level][task_i] for level in NOISE_RATES)]
    assert np.corrcoef(rates, order)[0, 1] > 0.8


@pytest.mark.parametrize("world", ["pairs", "pairs_v1"])
def test_same_seed_same_variants_other_seed_different(world, request):
    pairs = request.getfixturevalue(world)
    for task, reference in pairs:
        for kind in PERTURBATION_TYPES:
            a = rule_variant(task, reference, kind, variant_rng(0, task.instance_id, kind, 0))
            b = rule_variant(task, reference, kind, variant_rng(0, task.instance_id, kind, 0))
            assert a == b
    differ = {kind: 0 for kind in PERTURBATION_TYPES}
    for task, reference in pairs:
        for kind in PERTURBATION_TYPES:
            a = rule_variant(task, reference, kind, variant_rng(0, task.instance_id, kind, 0))
            c = rule_variant(task, reference, kind, variant_rng(1, task.instance_id, kind, 0))
            differ[kind] += a.text != c.text
    assert all(count >= len(pairs) // 2 for count in differ.values()), differ


@pytest.mark.parametrize("world", ["pairs", "pairs_v1"])
def test_requirements_keep_the_reference_feasible_and_the_tool_order(world, request):
    pairs = request.getfixturevalue(world)
    for task, reference in pairs:
        for seed in range(4):
            text, added = augment_requirements(task, reference, variant_rng(seed, task.instance_id, "requirements", 0))
            assert text.startswith(task.description.rstrip(".")) and len(text) > len(task.description)
            assert tool_mentions(text) == tool_mentions(task.description)
            assert 2 <= len(added) <= 4
            for req in added:
                assert req["text"] in text
                if req["kind"] == "step_cap":
                    assert req["value"] >= len(reference.nodes)
                    assert f"{req['value']} steps" in req["text"]
                if req["kind"] == "retry_cap":
                    assert req["value"] == task.max_retries
                if req["kind"] == "time_limit":
                    assert req["value"] == task.constraints["timeout"]
            check_variant(task.description, text, "requirements", reference)
            assert named_tools(text) == named_tools(task.description)  # none added, none at all on v1


def test_paraphrases_keep_tools_order_and_length():
    kinds_of_rule = set()
    for task in SAMPLE_V0:
        text, rules = paraphrase_instruction(task.description, variant_rng(0, task.instance_id, "paraphrase", 0))
        check_variant(task.description, text, "paraphrase")  # spans in order, same tools, length within 20%
        assert text != task.description
        kinds_of_rule.update(rules)
    assert {"opening", "connectors", "split", "steps"} <= kinds_of_rule


def test_v1_step_lists_parse_in_every_style_and_render_back():
    styles = set()
    for task in LIBRARY:
        steps = find_step_list(task.description)
        if len(task.required_tools) == 1:
            assert steps is None
            continue
        assert steps is not None, task.description
        styles.add(steps.style)
        assert step_count(task.description) == len(steps.clauses) == len(task.required_tools)
    assert styles == set(STYLES)
    rng = np.random.default_rng(0)
    for task in SAMPLE:
        steps = find_step_list(task.description)
        if steps is None:
            continue
        for style in STYLES:
            rendered = render_steps(steps.clauses, style, rng)
            again = find_step_list(rendered)
            assert again is not None and again.style == style and again.clauses == steps.clauses, rendered


def test_v1_paraphrases_keep_literals_steps_and_length():
    kinds_of_rule, styles, changed_clauses = set(), set(), 0
    for task in SAMPLE:
        text, rules = paraphrase_instruction(task.description, variant_rng(0, task.instance_id, "paraphrase", 0))
        check_variant(task.description, text, "paraphrase")  # literals in order, steps kept, length within 20%
        assert text != task.description and named_tools(text) == []
        assert in_order(protected_texts(task.description), text)
        if step_count(text) is not None:
            assert step_count(text) == len(task.required_tools)
            styles.add(find_step_list(text).style)
            changed_clauses += find_step_list(text).clauses != find_step_list(task.description).clauses
        kinds_of_rule.update(rules)
    assert {"opening", "restyle", "connectors", "steps", "modal", "merge"} <= kinds_of_rule
    assert styles == set(STYLES) and changed_clauses >= len(SAMPLE) // 4


def test_v1_clause_rewording_uses_the_bank_and_keeps_values():
    registry = default_registry()
    rng = np.random.default_rng(1)
    clause = "load the sales records from data/sales_records_0001.csv"
    reworded = {reword_clause(clause, rng, registry) for _ in range(20)}
    # the other reader clause with the same slots (dataset and source), filled with the same values
    assert reworded == {"open data/sales_records_0001.csv and read the sales records it holds"}
    validator = "check every record against the v2 order schema and reject violations"
    assert {reword_clause(validator, rng, registry) for _ in range(10)} == {
        "make sure that each row satisfies the v2 order rules"}
    # a clause of no bank entry gets synonyms outside its protected spans
    free = reword_clause("read and filter the data at data/x_1.csv", rng, registry)
    assert free != "read and filter the data at data/x_1.csv" and free.endswith(" data/x_1.csv")


def one_step_fewer(text: str) -> str:
    """``text`` with the last two steps of its step list merged into one, as a numbered list."""
    steps = find_step_list(text)
    clauses = [*steps.clauses[:-2], f"{steps.clauses[-2]} and {steps.clauses[-1]}"]
    return text[:steps.start] + render_steps(clauses, "numbered", np.random.default_rng(0)) + text[steps.end:]


def test_v1_check_variant_counts_steps(pairs_v1):
    task = next(t for t, _ in pairs_v1 if len(t.required_tools) > 2)
    d = task.description
    n = len(task.required_tools)
    with pytest.raises(VariantError, match=f"lists {n - 1} steps; the original has {n}"):
        check_variant(d, one_step_fewer(d), "paraphrase")
    steps = find_step_list(d)
    for style in STYLES:  # every style, same steps: valid (item numbers are not literals)
        restyled = d[:steps.start] + render_steps(steps.clauses, style, np.random.default_rng(1)) + d[steps.end:]
        if restyled != d:
            check_variant(d, restyled, "paraphrase")
    with pytest.raises(VariantError, match="added"):
        check_variant(d, d.replace(" the ", " the file_operations_reader ", 1), "paraphrase")


def test_llm_v1_dropped_step_is_sent_back(pairs_v1):
    def answer(conversation):
        text = instruction_of(conversation)
        if find_step_list(text) is None:
            return f"<answer>Please do this: {text}</answer>"
        return f"<answer>{one_step_fewer(text)}</answer>"

    variants = InstructionPerturber(ScriptedBackend(answer), attempts=2).perturb(requests_for(pairs_v1, "paraphrase"))
    assert {v.source for v in variants} == {"rules", "llm"}
    for (task, _), v in zip(pairs_v1, variants, strict=True):
        if len(task.required_tools) > 1:
            assert v.source == "rules" and all("steps; the original has" in e for e in v.notes["errors"])
        else:
            assert v.source == "llm" and v.text.startswith("Please do this: ")
        check_variant(task.description, v.text, "paraphrase")


def test_check_variant_names_what_is_wrong(pairs):
    task, reference = pairs[0]
    d = task.description
    tools = tool_mentions(d)
    with pytest.raises(VariantError, match="empty"):
        check_variant(d, "  ", "paraphrase")
    with pytest.raises(VariantError, match="identical"):
        check_variant(d, d, "paraphrase")
    with pytest.raises(VariantError, match=re.escape(repr(tools[-1]))):
        check_variant(d, d.replace(tools[-1], "the last tool"), "paraphrase")
    with pytest.raises(VariantError, match="added"):
        check_variant(d, d.replace(" then ", " then use utility_helper, then ", 1), "requirements")
    with pytest.raises(VariantError, match="characters"):
        check_variant(d, d + " In other words, do all of it carefully and well." * 4, "paraphrase")
    with pytest.raises(VariantError, match="infeasible"):
        check_variant(d, d + f" Use at most {len(reference.nodes) - 1} steps.", "requirements", reference)
    check_variant(d, d + f" Use at most {len(reference.nodes)} steps.", "requirements", reference)
    with pytest.raises(VariantError, match="malformed"):
        extract_answer("Sure! Here it is: no tags")
    with pytest.raises(VariantError, match="</answer> is missing"):
        extract_answer("<answer>cut short")
    assert extract_answer("x <answer>\n hello \n</answer> y") == "hello"


# --- LLM route ----------------------------------------------------------------------------------------


def instruction_of(conversation) -> str:
    """The instruction in the first user message of a perturbation conversation."""
    return conversation[1]["content"].split("Instruction:\n", 1)[1].split("\n\nLiterals", 1)[0]


def requests_for(pairs, kind):
    return [InstructionRequest(t, r, kind, 0, variant_rng(0, t.instance_id, kind, 0)) for t, r in pairs]


def test_llm_valid_answers_are_used(pairs):
    def answer(conversation):
        text = instruction_of(conversation)
        if "append two to four" in conversation[0]["content"]:
            return f"<answer>{text} Retry a failed call at most 3 times. Report the output in full.</answer>"
        return "<answer>" + text.replace(", then ", ", next ").replace(" with ", " using ") + "</answer>"

    backend = ScriptedBackend(answer)
    perturber = InstructionPerturber(backend)
    variants = perturber.perturb(requests_for(pairs, "paraphrase") + requests_for(pairs, "requirements"))
    assert backend.calls == [2 * len(pairs)]  # one batched call for every variant
    assert all(v.source == "llm" and v.notes["attempts"] == 1 for v in variants)
    assert variants[0].text == pairs[0][0].description.replace(", then ", ", next ").replace(" with ", " using ")
    assert [v.variant_id for v in variants[:2]] == ["paraphrase-0", "paraphrase-0"]


def test_llm_dropped_tool_retries_then_falls_back_to_rules(pairs):
    seen: list[list[dict[str, str]]] = []

    def answer(conversation):
        seen.append(conversation)
        text = instruction_of(conversation)
        return "<answer>" + text.replace(tool_mentions(text)[-1], "a suitable tool") + "</answer>"

    backend = ScriptedBackend(answer)
    variants = InstructionPerturber(backend, attempts=3).perturb(requests_for(pairs[:3], "paraphrase"))
    assert backend.calls == [3, 3, 3]
    for (task, reference), v in zip(pairs[:3], variants, strict=True):
        assert v.source == "rules" and "no valid answer in 3 attempt(s)" in v.notes["fallback_reason"]
        assert tool_mentions(task.description)[-1] in v.notes["fallback_reason"]
        assert len(v.notes["errors"]) == 3
        expected = rule_variant(task, reference, "paraphrase", variant_rng(0, task.instance_id, "paraphrase", 0))
        assert v.text == expected.text  # the same rules variant an offline build gives
        check_variant(task.description, v.text, "paraphrase")
    last = seen[-1]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert "missing" in last[3]["content"] or "out of order" in last[3]["content"]


def test_llm_error_feedback_fixes_an_infeasible_cap_and_malformed_answers(pairs):
    def answer(conversation):
        text = instruction_of(conversation)
        turn = (len(conversation) - 2) // 2
        if conversation[0]["content"].startswith("You rewrite"):
            return ["no tags at all", "<answer>unterminated", "{\"answer\": 1}"][turn]
        return f"<answer>{text} Use at most {1 if turn == 0 else 9} steps.</answer>"

    backend = ScriptedBackend(answer)
    variants = InstructionPerturber(backend, attempts=3).perturb(
        requests_for(pairs[:2], "requirements") + requests_for(pairs[:2], "paraphrase"))
    assert backend.calls == [4, 4, 2]
    for v in variants[:2]:
        assert v.source == "llm" and v.notes["attempts"] == 2 and "infeasible" in v.notes["errors"][0]
    for v in variants[2:]:
        assert v.source == "rules" and "malformed" in v.notes["fallback_reason"]
        assert [("</answer> is missing" in e) for e in v.notes["errors"]] == [False, True, False]


def test_llm_backend_failure_falls_back(pairs):
    class Broken:
        name = "broken"

        def generate(self, conversations, config):
            return ["<answer>x</answer>"]  # one answer for several conversations

    variants = InstructionPerturber(Broken()).perturb(requests_for(pairs[:2], "paraphrase"))
    assert all(v.source == "rules" and v.notes["fallback_reason"].startswith("backend error") for v in variants)
    with pytest.raises(ValueError, match="attempts"):
        InstructionPerturber(Broken(), attempts=0)


def test_tiny_real_model_falls_back_cleanly(pairs, tmp_path_factory, torch_one_thread):  # noqa: F811
    from resilibench.agents.backends import TransformersBackend

    backend = TransformersBackend(build_tiny_lm(tmp_path_factory.mktemp("tiny") / "lm"))
    perturber = InstructionPerturber(backend, attempts=2, generation=GenerationConfig(max_new_tokens=24, seed=0))
    variants = perturber.perturb(requests_for(pairs[:2], "paraphrase") + requests_for(pairs[:1], "requirements"))
    assert len(variants) == 3
    for (task, reference), v in zip([*pairs[:2], pairs[0]], variants, strict=True):
        assert v.source == "rules" and v.notes["fallback_reason"] and len(v.notes["errors"]) == 2
        check_variant(task.description, v.text, v.perturbation, reference)
