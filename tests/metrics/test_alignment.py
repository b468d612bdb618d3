"""Node alignment: similarity rules, pruning, the tie rule (checked against brute force), duplicates,
the embedding cache, and a few alignments with the real local MiniLM."""

import itertools
import random

import numpy as np
import pytest

from resilibench.core.workflow import Node, Workflow
from resilibench.metrics.alignment import NodeEmbedder, align, execution_order, match, similarity_matrix
from resilibench.metrics.structural import structural_scores


@pytest.fixture(scope="module")
def model():
    return NodeEmbedder("semantic")


def tools(*names: str) -> Workflow:
    return Workflow(tuple(Node(n) for n in names))


def texts(*steps: str) -> Workflow:
    return Workflow.chain([None] * len(steps), list(steps))


def test_tool_nodes_compare_by_name_without_embedding(model):
    pred = Workflow((Node("file_operations_reader", "read it"), Node("data_processing_parser", "parse")))
    ref = Workflow((Node("data_processing_parser", "read it"), Node("file_operations_reader", "load")))
    cached = len(model._cache)
    sims = similarity_matrix(pred, ref, model)
    assert sims.tolist() == [[0.0, 1.0], [1.0, 0.0]]  # identical text, different tool: 0
    assert len(model._cache) == cached  # nothing was embedded
    assert align(pred, ref, embedder=model).pairs == ((0, 1, 1.0), (1, 0, 1.0))


def test_text_nodes_use_the_real_model(model):
    pred = texts("load the input file", "parse records into a table", "send an email")
    ref = texts("read the input file", "parse the records", "write the report")
    alignment = align(pred, ref, embedder=model)
    assert [(p, r) for p, r, _ in alignment.pairs] == [(0, 0), (1, 1)]  # the email step matches nothing
    assert all(0.6 <= s < 1.0 for _, _, s in alignment.pairs)
    assert model.backend == "all-MiniLM-L6-v2"
    # A text-only step against a tool step without text: the tool is read as its operation phrase, or
    # as its name in words when the registry does not know it.
    mixed = similarity_matrix(texts("read the input file", "custom step"),
                              Workflow((Node("file_operations_reader"), Node("custom_step"))), model)
    assert 0.6 <= mixed[0, 0] < 1.0 and mixed[1, 1] == 1.0 and mixed[0, 1] < 0.6


def test_embeddings_are_cached_and_normalised(model):
    vectors = model.encode(["alpha step", "beta step", "alpha step"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert np.array_equal(vectors[0], vectors[2])
    size = len(model._cache)
    model.similarity(["alpha step"], ["beta step"])
    assert len(model._cache) == size
    assert model.similarity(["same words"], ["same words"])[0, 0] == 1.0


def test_lexical_backend_is_deterministic_and_named():
    lexical = NodeEmbedder("lexical")
    assert lexical.backend == "lexical"
    pred, ref = texts("read input files", "write output reports"), texts("reading input file", "compress archives")
    first = align(pred, ref, embedder=lexical)
    assert first.pairs == align(pred, ref, embedder=lexical).pairs == ((0, 0, 1.0),)  # same stems
    assert lexical.similarity(["a b"], ["a b"])[0, 0] == 1.0  # identical texts, even without tokens
    with pytest.raises(RuntimeError, match="lexical"):
        lexical.encode(["x"])
    with pytest.raises(ValueError, match="'auto', 'semantic' or 'lexical'"):
        NodeEmbedder("bert")


def test_beta_prunes_below_and_keeps_equal():
    sims = np.array([[0.6, 0.0], [0.0, 0.5999]])
    rank = np.arange(2)
    assert match(sims, 0.6, rank, rank) == ((0, 0, 0.6),)
    assert match(sims, 0.59, rank, rank) == ((0, 0, 0.6), (1, 1, 0.5999))
    with pytest.raises(ValueError, match="beta must be in"):
        align(tools("a"), tools("a"), beta=0.0)


def test_ties_prefer_more_pairs():
    # Two pairs of 0.9 and three pairs of 0.6 both weigh 1.8; the three pairs win.
    sims = np.array([[0.9, 0.6, 0.0], [0.0, 0.9, 0.6], [0.6, 0.0, 0.0]])
    rank = np.arange(3)
    assert [(p, r) for p, r, _ in match(sims, 0.6, rank, rank)] == [(0, 1), (1, 2), (2, 0)]


def test_duplicates_align_in_order():
    pred = tools("x", "a", "x", "x")
    ref = tools("x", "x", "b", "x")
    assert [(p, r) for p, r, _ in align(pred, ref).pairs] == [(0, 0), (2, 1), (3, 3)]
    # More duplicates in the prediction: the first ones are aligned, in order.
    assert [(p, r) for p, r, _ in align(tools("x", "x", "x"), tools("x", "x")).pairs] == [(0, 0), (1, 1)]
    assert [(p, r) for p, r, _ in align(tools("x", "x"), tools("y", "x", "x", "x")).pairs] == [(0, 1), (1, 2)]


def test_duplicates_align_in_execution_order(model):
    # Listed backwards but chained forwards: the i-th step to run aligns with the i-th step to run.
    pred = Workflow((Node(text="check the file"),) * 3, ((2, 1), (1, 0)))
    ref = texts("check the file", "check the file", "check the file")
    assert [(p, r) for p, r, _ in align(pred, ref, embedder=model).pairs] == [(0, 2), (1, 1), (2, 0)]


def brute_force_best(sims: np.ndarray, beta: float, rank_p: np.ndarray, rank_g: np.ndarray) -> tuple:
    """The stated tie rule, literally: max over every matching of (total similarity, pairs, order bonus)."""
    n_p, n_g = sims.shape
    n = max(n_p, n_g)
    allowed = [(i, j) for i in range(n_p) for j in range(n_g) if sims[i, j] >= beta]
    best = (0, 0, 0)
    for k in range(1, min(n_p, n_g) + 1):
        for subset in itertools.combinations(allowed, k):
            if len({i for i, _ in subset}) == k == len({j for _, j in subset}):
                key = (sum(round(sims[i, j] * 10**4) for i, j in subset), k,
                       sum((n - rank_p[i]) * (n - rank_g[j]) for i, j in subset))
                best = max(best, key)
    return best


def test_matching_follows_the_tie_rule_exactly():
    """Random small matrices drawn from few values (many ties) against enumeration of all matchings."""
    rng = random.Random(1)
    for _ in range(400):
        n_p, n_g = rng.randint(1, 5), rng.randint(1, 5)
        sims = np.array([[rng.choice([0.0, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]) for _ in range(n_g)] for _ in range(n_p)])
        rank_p, rank_g = np.array(rng.sample(range(n_p), n_p)), np.array(rng.sample(range(n_g), n_g))
        pairs = match(sims, 0.6, rank_p, rank_g)
        n = max(n_p, n_g)
        got = (sum(round(s * 10**4) for _, _, s in pairs), len(pairs),
               sum((n - rank_p[i]) * (n - rank_g[j]) for i, j, _ in pairs))
        assert got == brute_force_best(sims, 0.6, rank_p, rank_g)
        assert len({i for i, _, _ in pairs}) == len(pairs) == len({j for _, j, _ in pairs})


def test_matching_is_exact_on_large_workflows():
    """Past the size where the order criterion fits in float64 the weight criterion is still exact."""
    rng = np.random.default_rng(0)
    for n in (30, 200):
        sims = np.round(rng.uniform(0.55, 1.0, size=(n, n)), 4)
        pairs = match(sims, 0.6, np.arange(n), np.arange(n))
        allowed = np.where(sims >= 0.6, np.rint(sims * 10**4), 0)
        from scipy.optimize import linear_sum_assignment
        rows, cols = linear_sum_assignment(allowed, maximize=True)
        assert sum(round(s * 10**4) for _, _, s in pairs) == int(allowed[rows, cols].sum())


def test_execution_order_matches_workflow_topological_order():
    rng = random.Random(2)
    for _ in range(200):
        n = rng.randint(0, 9)
        edges = tuple((a, b) for a in range(n) for b in range(n) if a != b and rng.random() < 0.25
                      and (min(a, b) * 7 + max(a, b)) % 3 and (a < b) == (rng.random() < 0.8))
        try:
            w = Workflow(tuple(Node(str(i)) for i in range(n)), edges)
        except ValueError:
            continue
        assert list(execution_order(w)) == w.topological_order()


def test_alignment_records_its_inputs():
    pred, ref = tools("a", "b", "c"), tools("c", "a")
    alignment = align(pred, ref)
    assert (alignment.n_pred, alignment.n_ref, alignment.beta) == (3, 2, 0.6)
    assert alignment.mapping == {0: 1, 2: 0} and alignment.weight == 2.0
    assert not alignment.similarity.flags.writeable
    with pytest.raises(ValueError, match="alignment is for 3 x 2"):
        alignment.check(ref, pred)


def test_paraphrased_workflow_keeps_every_structural_score(model):
    """A description change leaves the structure: WorkflowPerturb expects full structural scores."""
    ref = Workflow(tuple(Node(text=t) for t in ("read the sales records from the CSV file",
                                                 "remove rows with missing values", "compute the monthly totals",
                                                 "write the summary report to disk")),
                   ((0, 1), (0, 2), (1, 3), (2, 3)))
    pred = Workflow(tuple(Node(text=t) for t in ("load the sales records from the CSV file",
                                                  "calculate totals for each month",
                                                  "drop rows that have missing values", "save the summary report to disk")),
                    ((0, 1), (0, 2), (1, 3), (2, 3)))
    assert set(structural_scores(pred, ref, embedder=model).values()) == {1.0}
    # Dropping a step lowers the recalls but keeps every remaining order right.
    shorter = Workflow(pred.nodes[:3], ((0, 1), (0, 2)))
    scores = structural_scores(shorter, ref, embedder=model)
    assert scores["chain_recall"] == scores["mcis_recall"] == 0.75
    assert scores["reachability_recall"] == 5 / 9  # 4 steps + 5 paths in the reference; the summary's are missed
    assert scores["reachability_precision"] == scores["kendall_tau"] == 1.0
