"""WorkflowPerturb perturbations: exact node counts for every type and rate, structure kept, determinism,
golden workflows from the task library, and the LLM route with validation and error feedback."""

from __future__ import annotations

import json

import networkx as nx
import numpy as np
import pytest

from helpers import ScriptedBackend
from resilibench.core.bounds import reference_workflow
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks
from resilibench.llm import GenerationConfig
from resilibench.metrics.perturb import (
    PERTURBATIONS,
    RATES,
    LLMPerturber,
    PerturbRequest,
    affected_count,
    expected_node_count,
    expected_score,
    golden_workflows,
    merge_text,
    paraphrase,
    perturb,
    perturbation_rng,
    remove_steps,
)

TEXTS = ["read and retrieve data from files", "parse raw input into a structured format",
         "validate data against a schema and report violations", "transform data from one format or shape into another",
         "aggregate, combine and merge records into summaries", "analyze data and compute statistics and insights",
         "write and export results to a file destination", "notify users or systems about results",
         "log events and messages for auditing", "cache intermediate results for reuse"]


def dag(n: int) -> Workflow:
    """A branching DAG of n steps: step i depends on i-1 and, for even i, on i-2."""
    nodes = tuple(Node(f"tool_{i}", TEXTS[i % len(TEXTS)]) for i in range(n))
    edges = {(i - 1, i) for i in range(1, n)} | {(i - 2, i) for i in range(2, n, 2)}
    return Workflow(nodes, tuple(sorted(edges)))


def reach(workflow: Workflow) -> set[tuple[str, str]]:
    """Reachability between step labels (tools)."""
    g = workflow.to_networkx()
    return {(workflow.nodes[a].tool, workflow.nodes[b].tool) for a in g for b in nx.descendants(g, a)}


@pytest.mark.parametrize("n, counts", [(5, (1, 2, 3)), (6, (1, 2, 3)), (7, (1, 2, 4)), (8, (1, 2, 4)),
                                       (10, (1, 3, 5)), (2, (1, 1, 1))])
def test_affected_counts(n, counts):
    assert tuple(affected_count("missing_steps", n, r) for r in RATES) == counts
    assert [expected_node_count("missing_steps", n, r) for r in RATES] == [n - k for k in counts]
    assert [expected_node_count("description_change", n, r) for r in RATES] == [n] * 3


@pytest.mark.parametrize("n", [2, 3, 5, 6, 7, 8, 10])
@pytest.mark.parametrize("kind", PERTURBATIONS)
@pytest.mark.parametrize("rate", RATES)
def test_node_counts_exact_for_every_type_and_rate(n, kind, rate):
    golden = dag(n)
    for seed in range(5):
        p = perturb(golden, kind, rate, np.random.default_rng(seed))
        k = affected_count(kind, n, rate)
        assert len(p.workflow.nodes) == expected_node_count(kind, n, rate)
        assert nx.is_directed_acyclic_graph(p.workflow.to_networkx())
        if kind == "missing_steps":
            assert len(p.changed) == k
            kept = [i for i in range(n) if i not in p.changed]
            assert p.workflow.nodes == tuple(golden.nodes[i] for i in kept)  # order and content kept
            assert reach(p.workflow) == {(a, b) for a, b in reach(golden)
                                         if a in p.workflow.tools and b in p.workflow.tools}
        elif kind == "compressed_steps":
            merged = [node for node in p.workflow.nodes if node.tool is None]
            assert k + 1 <= len(p.changed) <= 2 * k and 1 <= len(merged) <= k
            assert all(", then " in node.text for node in merged)
        else:
            assert len(p.changed) == k and p.workflow.edges == golden.edges and p.workflow.tools == golden.tools
            changed = [i for i in range(n) if p.workflow.nodes[i].text != golden.nodes[i].text]
            assert changed == list(p.changed)


def test_compressed_steps_merge_neighbours_in_execution_order():
    golden = Workflow.chain(["a", "b", "c", "d", "e", "f"], TEXTS[:6])
    p = perturb(golden, "compressed_steps", 0.1, np.random.default_rng(3))
    (i, j) = p.changed
    assert j == i + 1
    assert p.workflow.nodes[i] == Node(None, merge_text([TEXTS[i], TEXTS[j]]))
    assert p.workflow.edges == tuple((x, x + 1) for x in range(4))
    assert merge_text(["read the file.", "parse it"]) == "read the file, then parse it"


def test_remove_steps_bridges_dependencies():
    golden = Workflow.chain(["a", "b", "c"])
    assert remove_steps(golden, [1]) == Workflow.chain(["a", "c"])


def test_determinism_and_independent_streams():
    golden = dag(8)
    for kind in PERTURBATIONS:
        first = perturb(golden, kind, 0.3, perturbation_rng(7, "task_1", kind, 0.3))
        again = perturb(golden, kind, 0.3, perturbation_rng(7, "task_1", kind, 0.3))
        assert first == again
    draws = {perturb(golden, "missing_steps", 0.3, perturbation_rng(7, f"task_{i}", "missing_steps", 0.3)).changed
             for i in range(20)}
    assert len(draws) > 3  # different tasks draw different steps


def test_paraphrase_keeps_meaning_words_and_always_changes():
    rng = np.random.default_rng(0)
    for text in TEXTS:
        out = paraphrase(text, rng)
        assert out != text and out.strip()
    assert paraphrase("zzz qqq", np.random.default_rng(1)) != "zzz qqq"  # no bank word: a frame is used
    assert paraphrase("Read the files", np.random.default_rng(2)) == paraphrase("Read the files", np.random.default_rng(2))


def test_expected_scores_and_bad_arguments():
    assert [expected_score("missing_steps", r) for r in RATES] == pytest.approx([0.9, 0.7, 0.5])
    assert [expected_score("description_change", r) for r in RATES] == [1.0] * 3
    with pytest.raises(ValueError, match="kind must be one of"):
        affected_count("shuffled", 5, 0.1)
    with pytest.raises(ValueError, match=r"rate must be in \(0, 1\)"):
        expected_score("missing_steps", 1.5)
    with pytest.raises(ValueError, match="at least 2 steps"):
        perturb(Workflow.chain(["a"]), "missing_steps", 0.5, np.random.default_rng(0))


def test_golden_workflows_deduplicate_and_keep_the_task_mapping():
    library = load_tasks(world="v0")  # v0 repeats workflows across tasks: what deduplication is for
    tasks = [t for t in library if t.task_type == "complex_validation_pipeline"][:10]
    small = [t for t in library if t.task_type == "simple_data_transformation"][:5]
    gs = golden_workflows([*small, *tasks], min_nodes=5)
    assert gs.examined == 15 and gs.too_small == 5 and len(gs.task_ids) == 10
    assert sum(len(g.task_ids) for g in gs.goldens) == 10 and len(gs.goldens) < 10
    by_id = {t.instance_id: t for t in tasks}
    for task_id, golden in gs.golden_of().items():
        assert reference_workflow(by_id[task_id]).canonical_key() == golden.workflow.canonical_key()
    limited = golden_workflows(tasks, limit=3, text_only=True)
    assert len(limited.task_ids) == 3 and all(n.tool is None for g in limited.goldens for n in g.workflow.nodes)


# --- LLM route ------------------------------------------------------------------------------------------

GOLDEN = Workflow.chain([f"tool_{i}" for i in range(5)], TEXTS[:5])


def answer_json(texts, edges=None) -> str:
    edges = [[i, i + 1] for i in range(len(texts) - 1)] if edges is None else edges
    return "Sure:\n" + json.dumps({"nodes": [{"text": t} for t in texts], "edges": edges})


def test_llm_missing_steps_retry_with_count_feedback_then_valid():
    prompts = []

    def answer(conversation):
        prompts.append(conversation)
        attempt = sum(m["role"] == "user" for m in conversation)
        return answer_json(TEXTS[:3] if attempt == 1 else [TEXTS[0], TEXTS[1], TEXTS[3], TEXTS[4]])

    backend = ScriptedBackend(answer)
    request = PerturbRequest(GOLDEN, "missing_steps", 0.1, np.random.default_rng(0))
    (p,) = LLMPerturber(backend, attempts=3).perturb([request])
    assert "remove exactly 1 of its 5 steps (10%)" in prompts[0][0]["content"]
    feedback = prompts[1][-1]["content"]
    assert feedback.startswith("Your output had 3 nodes instead of 4 for a 10% removal.")
    assert p.valid and p.method == "llm" and p.changed == (2,) and len(p.raw) == 2
    assert p.workflow == remove_steps(GOLDEN, [2])  # structure comes from the golden, tools kept


def test_llm_description_change_must_touch_exactly_the_chosen_steps():
    calls = []

    def answer(conversation):
        calls.append(conversation)
        if len(calls) == 1:
            return answer_json([t.upper() for t in TEXTS[:5]])  # rewords every step: rejected
        which = prompt_steps(conversation[0]["content"])
        return answer_json([t + ", carefully" if i in which else t for i, t in enumerate(TEXTS[:5])])

    request = PerturbRequest(GOLDEN, "description_change", 0.3, np.random.default_rng(4))
    (p,) = LLMPerturber(ScriptedBackend(answer), attempts=2).perturb([request])
    assert p.valid and len(p.changed) == 2 and p.workflow.tools == GOLDEN.tools and p.workflow.edges == GOLDEN.edges
    assert "You changed steps [0, 1, 2, 3, 4], but exactly steps" in p.errors[0]


def prompt_steps(prompt: str) -> list[int]:
    """The step numbers a description-change prompt names ("... these 2 steps (30% of 5): 1, 3. Keep ...")."""
    listed = prompt.split("):", 1)[1].split(".", 1)[0]
    return [int(x) for x in listed.split(",")]


def test_llm_compressed_steps_and_invalid_after_retries_in_one_batch():
    merged = [TEXTS[0], TEXTS[1] + " and " + TEXTS[2], TEXTS[3], TEXTS[4]]

    def answer(conversation):
        if "merge consecutive steps" in conversation[0]["content"]:
            return answer_json(merged)
        return "I cannot do that."

    backend = ScriptedBackend(answer)
    requests = [PerturbRequest(GOLDEN, "compressed_steps", 0.1, np.random.default_rng(0)),
                PerturbRequest(GOLDEN, "missing_steps", 0.5, np.random.default_rng(0))]
    good, bad = LLMPerturber(backend, attempts=3).perturb(requests)
    assert backend.calls == [2, 1, 1]  # every pending request in one call per attempt
    assert good.valid and len(good.workflow.nodes) == 4 and good.changed == (1, 2)
    assert good.workflow.nodes[0] == GOLDEN.nodes[0] and good.workflow.nodes[1].tool is None
    assert not bad.valid and bad.workflow is None and len(bad.raw) == 3
    assert all("No JSON workflow found" in e for e in bad.errors)
    assert bad.to_dict()["valid"] is False and bad.to_dict()["raw"] == ["I cannot do that."] * 3


def test_llm_perturber_with_tiny_transformers_model_records_invalid(tmp_path):
    from tiny_lm import build_tiny_lm

    from resilibench.agents.backends import TransformersBackend

    backend = TransformersBackend(build_tiny_lm(tmp_path / "tiny"))
    perturber = LLMPerturber(backend, attempts=2, generation=GenerationConfig(max_new_tokens=6, seed=0))
    (p,) = perturber.perturb([PerturbRequest(GOLDEN, "missing_steps", 0.3, np.random.default_rng(0))])
    assert not p.valid and len(p.raw) == 2 and len(p.errors) == 2
