"""Structural metrics against brute-force oracles on thousands of small random DAGs, plus fixed cases."""

import itertools
import math
import random
import time
from bisect import bisect_left

import networkx as nx
import pytest

from resilibench.core.workflow import Node, Workflow
from resilibench.metrics.alignment import align, execution_order
from resilibench.metrics.structural import (
    Score,
    chain_f1,
    kendall_tau,
    mcis_f1,
    reachability_f1,
    structural_scores,
)

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def random_dag(rng: random.Random, n: int, density: float, alphabet: str = LETTERS) -> Workflow:
    """n tool nodes named from ``alphabet``, edges along a random hidden order with the given density,
    node indices shuffled so that the listing is not always topological."""
    hidden = list(range(n))
    rng.shuffle(hidden)
    edges = [(hidden[i], hidden[j]) for i in range(n) for j in range(i + 1, n) if rng.random() < density]
    return Workflow(tuple(Node(rng.choice(alphabet)) for _ in range(n)), tuple(edges))


def perturb(rng: random.Random, w: Workflow) -> Workflow:
    """A variant: some nodes dropped, some renamed, some added, some edges removed/added/reversed."""
    keep = [i for i in range(len(w.nodes)) if rng.random() > 0.2]
    index = {old: new for new, old in enumerate(keep)}
    nodes = [Node(rng.choice(LETTERS[:8])) if rng.random() < 0.15 else w.nodes[i] for i in keep]
    edges = {(index[a], index[b]) for a, b in w.edges if a in index and b in index and rng.random() > 0.2}
    for _ in range(rng.randint(0, 2)):
        nodes.append(Node(rng.choice(LETTERS[:8])))
    n = len(nodes)
    for _ in range(rng.randint(0, 3)):
        if n >= 2:
            a, b = rng.sample(range(n), 2)
            edges.add((a, b))
    perm = list(range(n))
    rng.shuffle(perm)
    nodes = [nodes[perm.index(i)] for i in range(n)]
    edges = {(perm[a], perm[b]) for a, b in edges}
    graph = nx.DiGraph(list(edges))
    while not nx.is_directed_acyclic_graph(graph):
        graph.remove_edge(*nx.find_cycle(graph)[0])
    return Workflow(tuple(nodes), tuple(sorted(graph.edges)))


def renumber(w: Workflow, perm: list[int]) -> Workflow:
    """The same graph with node i renamed perm[i]."""
    nodes = [None] * len(w.nodes)
    for old, new in enumerate(perm):
        nodes[new] = w.nodes[old]
    return Workflow(tuple(nodes), tuple((perm[a], perm[b]) for a, b in w.edges))


def lis(seq: list[int]) -> int:
    tails: list[int] = []
    for x in seq:
        k = bisect_left(tails, x)
        tails[k:k + 1] = [x]
    return len(tails)


def closure(w: Workflow) -> dict[int, set[int]]:
    """Every node's descendants, by depth-first search from each node."""
    children = {i: [b for a, b in w.edges if a == i] for i in range(len(w.nodes))}
    out = {}
    for start in children:
        seen, stack = set(), list(children[start])
        while stack:
            v = stack.pop()
            if v not in seen:
                seen.add(v)
                stack.extend(children[v])
        out[start] = seen
    return out


def topological_orders(w: Workflow):
    """Every topological order, by recursive enumeration."""
    parents = {i: {a for a, b in w.edges if b == i} for i in range(len(w.nodes))}

    def extend(order: list[int], placed: set[int]):
        if len(order) == len(parents):
            yield order
        for v in parents:
            if v not in placed and parents[v] <= placed:
                yield from extend(order + [v], placed | {v})

    yield from extend([], set())


def oracle_chain_length(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> int:
    """WorFBench/WorkflowPerturb literally: LIS of the mapped predicted chain, max over ALL topological
    orders of the reference."""
    chain = [mapping[p] for p in execution_order(pred) if p in mapping]
    best = 0
    for order in topological_orders(ref):
        position = {v: i for i, v in enumerate(order)}
        best = max(best, lis([position[r] for r in chain]))
        if best == len(chain):
            break
    return best


def oracle_mcis(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> int:
    """Largest subset of aligned pairs whose induced edge sets coincide, by trying every subset."""
    pe, ge = set(pred.edges), set(ref.edges)
    pairs = sorted(mapping.items())
    for k in range(len(pairs), 0, -1):
        for subset in itertools.combinations(pairs, k):
            if all(((p1, p2) in pe) == ((r1, r2) in ge) for (p1, r1), (p2, r2) in itertools.permutations(subset, 2)):
                return k
    return 0


def oracle_reachability(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> tuple[int, int, int]:
    """Reflexive-transitive closures of the whole workflows as sets; predicted pairs renamed through the
    mapping (an unaligned step keeps a name no reference pair has)."""
    cp, cg = closure(pred), closure(ref)
    name = {u: mapping.get(u, ("unaligned", u)) for u in range(len(pred.nodes))}
    r_pred = {(name[u], name[v]) for u in cp for v in cp[u] | {u}}
    r_ref = {(x, y) for x in cg for y in cg[x] | {x}}
    return len(r_pred & r_ref), len(r_pred), len(r_ref)


def oracle_tau(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> float:
    cp, cg = closure(pred), closure(ref)

    def sign(reach, u, v):
        return 1 if v in reach[u] else -1 if u in reach[v] else 0

    pairs = list(itertools.combinations(sorted(mapping.items()), 2))
    sp = [sign(cp, p1, p2) for (p1, _), (p2, _) in pairs]
    sg = [sign(cg, r1, r2) for (_, r1), (_, r2) in pairs]
    np_, ng = sum(map(abs, sp)), sum(map(abs, sg))
    if not np_ and not ng:
        return float(len(mapping) == len(pred.nodes) == len(ref.nodes))
    if not np_ or not ng:
        return 0.0
    return sum(a * b for a, b in zip(sp, sg, strict=True)) / math.sqrt(np_ * ng)


def random_pairs(count: int, seed: int, max_nodes: int = 6):
    rng = random.Random(seed)
    for i in range(count):
        n = rng.randint(1, max_nodes)
        density = rng.choice([0.0, 0.0, 0.2, 0.4, 0.7, 1.0])  # antichains often
        alphabet = LETTERS[:rng.choice([3, 5, 26])]  # small alphabets give duplicate steps
        ref = random_dag(rng, n, density, alphabet)
        if i % 3 == 0:
            pred = random_dag(rng, rng.randint(1, max_nodes), rng.choice([0.0, 0.3, 0.7]), alphabet)
        else:
            pred = perturb(rng, ref)
        if pred.nodes:
            yield pred, ref


def test_metrics_match_brute_force_oracles():
    """Chain l against every topological order, MCIS k against every subset, reachability and tau
    against networkx, on 2,500 random pairs (antichains, duplicates, unmatched nodes included)."""
    checked = wide = 0
    for pred, ref in random_pairs(2500, seed=7):
        alignment = align(pred, ref)
        mapping = alignment.mapping
        chain = chain_f1(pred, ref, alignment)
        assert chain.size == oracle_chain_length(pred, ref, mapping), (pred, ref)
        assert chain.precision == chain.size / len(pred.nodes) and chain.recall == chain.size / len(ref.nodes)
        assert mcis_f1(pred, ref, alignment).size == oracle_mcis(pred, ref, mapping), (pred, ref)
        reach = reachability_f1(pred, ref, alignment)
        shared, n_pred, n_ref = oracle_reachability(pred, ref, mapping)
        assert (reach.size, reach.precision, reach.recall) == (shared, shared / n_pred, shared / n_ref)
        assert kendall_tau(pred, ref, alignment) == pytest.approx(oracle_tau(pred, ref, mapping))
        checked += 1
        wide += not ref.edges and len(ref.nodes) >= 4
    assert checked > 2400 and wide > 100


def test_chain_matches_oracle_on_wider_dags():
    """Wider references (up to 8 nodes, up to 40,320 orders) against full enumeration."""
    for pred, ref in random_pairs(60, seed=11, max_nodes=8):
        alignment = align(pred, ref)
        assert chain_f1(pred, ref, alignment).size == oracle_chain_length(pred, ref, alignment.mapping)


def test_renumbered_identical_graph_scores_one_everywhere():
    """WorFBench compares edges by raw index; through the alignment a renumbering changes nothing."""
    rng = random.Random(3)
    for _ in range(300):
        n = rng.randint(1, 9)
        ref = random_dag(rng, n, rng.choice([0.0, 0.3, 0.6, 1.0]), LETTERS[:n].upper() + LETTERS)
        ref = Workflow(tuple(Node(t) for t in rng.sample(LETTERS, n)), ref.edges)  # distinct steps
        perm = list(range(n))
        rng.shuffle(perm)
        scores = structural_scores(renumber(ref, perm), ref)
        assert set(scores.values()) == {1.0}, scores


def test_valid_linearisation_of_wide_dag_scores_one():
    """Any valid execution order of a wide DAG is a perfect chain (WorFBench's 20-order cap can give 0.43)."""
    ref = Workflow(tuple(Node(t) for t in "sabcdefghijt"), tuple([(0, i) for i in range(1, 11)] + [(i, 11) for i in range(1, 11)]))
    rng = random.Random(5)
    for _ in range(20):
        middle = list("abcdefghij")
        rng.shuffle(middle)
        pred = Workflow.chain(["s", *middle, "t"])
        score = chain_f1(pred, ref)
        assert (score.precision, score.recall, score.f1, score.size) == (1.0, 1.0, 1.0, 12)
        assert mcis_f1(pred, ref).f1 < 1.0  # the chain's extra edges are a different graph
        assert reachability_f1(pred, ref).recall == 1.0  # every dependency kept
    invalid = Workflow.chain(list("abcdefghij") + ["s", "t"])  # s after its dependents
    assert chain_f1(invalid, ref).size == 11


def test_chain_is_the_prediction_execution_order():
    """A plan listed out of order is read in its own topological order, not its listing order."""
    ref = Workflow.chain(list("abc"))
    listed_backwards = Workflow((Node("c"), Node("b"), Node("a")), ((2, 1), (1, 0)))
    assert chain_f1(listed_backwards, ref).f1 == 1.0
    # Without edges the listing is the order: c, b, a against a -> b -> c keeps one step.
    assert chain_f1(Workflow((Node("c"), Node("b"), Node("a"))), ref).size == 1


def test_empty_and_single_node_workflows():
    empty, one, other = Workflow(()), Workflow((Node("a"),)), Workflow((Node("b"),))
    ones, zeros = dict.fromkeys(structural_scores(one, one), 1.0), dict.fromkeys(structural_scores(one, one), 0.0)
    assert structural_scores(empty, empty) == ones
    assert structural_scores(empty, one) == zeros and structural_scores(one, empty) == zeros
    assert structural_scores(one, one) == ones
    assert structural_scores(other, one) == zeros
    two = Workflow.chain(["a", "b"])
    assert chain_f1(one, two) == Score(1.0, 0.5, 2 / 3, 1)
    assert reachability_f1(one, two) == Score(1.0, 1 / 3, 0.5, 1)  # {aa} against {aa, bb, ab}
    assert mcis_f1(one, two).f1 == pytest.approx(2 / 3)
    assert kendall_tau(one, two) == 0.0  # no ordered pair to compare, and b is left out


def test_unrelated_workflows_sharing_one_step_cannot_score_one():
    """Regression: with at most one aligned step, reachability F1 and Kendall tau were 1.0 by convention."""
    rng = random.Random(5)
    for n in range(2, 9):
        for density in (0.0, 0.5, 1.0):
            ref = random_dag(rng, n, density, "a" + LETTERS[1:].upper())
            pred = random_dag(rng, n, density, "a" + LETTERS[1:])  # shares only step "a" (if drawn)
            scores = structural_scores(pred, ref)
            assert scores["reachability_f1"] <= 2 / (n + 1) and scores["kendall_tau"] == 0.0, (pred, ref)
    antichain = Workflow(tuple(Node(t) for t in "abcde"))
    assert structural_scores(antichain, antichain)["kendall_tau"] == 1.0  # identical antichains still agree
    assert structural_scores(Workflow(tuple(Node(t) for t in "axyzw")), antichain)["reachability_f1"] == 0.2


def test_worked_examples():
    ref = Workflow.chain(list("abcde"))
    swapped = Workflow.chain(list("abdce"))
    s = structural_scores(swapped, ref)
    assert s["chain_f1"] == 0.8  # l = 4 (a, b, c, e or a, b, d, e)
    assert s["reachability_f1"] == 14 / 15  # 5 + 10 pairs each (steps reach themselves), 14 shared
    assert s["mcis_f1"] == 0.6  # {a, b} + {e}: b-c, c-d, d-e edges differ; best is 3 steps
    assert s["kendall_tau"] == 0.8  # one discordant pair of 10
    missing = Workflow.chain(list("abde"))  # c dropped, order kept
    s = structural_scores(missing, ref)
    assert s["chain_precision"] == 1.0 and s["chain_recall"] == 0.8
    assert s["reachability_precision"] == 1.0  # b ~> d through c in the reference still counts
    assert s["reachability_recall"] == 10 / 15  # c's own pair and its four paths are missed
    assert s["kendall_tau"] == 1.0
    reversed_chain = Workflow.chain(list("edcba"))
    assert structural_scores(reversed_chain, ref)["kendall_tau"] == -1.0
    assert chain_f1(reversed_chain, ref).size == 1


def test_metrics_accept_only_matching_alignment():
    a, b = Workflow.chain(["a", "b"]), Workflow.chain(["a", "b", "c"])
    with pytest.raises(ValueError, match="alignment is for 2 x 3"):
        chain_f1(b, a, align(a, b))


def networkx_mcis(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> int:
    """k by networkx's exact maximum clique on the compatibility graph of the aligned pairs."""
    pairs = sorted(mapping.items())
    pe, ge = set(pred.edges), set(ref.edges)
    compat = nx.Graph()
    compat.add_nodes_from(range(len(pairs)))
    compat.add_edges_from(
        (i, j) for (i, (p1, r1)), (j, (p2, r2)) in itertools.combinations(enumerate(pairs), 2)
        if ((p1, p2) in pe) == ((r1, r2) in ge) and ((p2, p1) in pe) == ((r2, r1) in ge))
    return len(nx.max_weight_clique(compat, weight=None)[0])


def test_mcis_exact_and_fast_on_larger_workflows():
    """20-step DAGs with edits and shuffled chains of 20-40 steps (sparse but tangled conflicts), against
    networkx's maximum clique; under 50 ms each on average."""
    rng = random.Random(20)
    cases = []
    for density in (0.1, 0.3, 0.5):
        for _ in range(4):
            ref = random_dag(rng, 20, density, LETTERS[:20])
            ref = Workflow(tuple(Node(t) for t in rng.sample(LETTERS, 20)), ref.edges)
            cases.append((perturb(rng, ref), ref))
    for n in (20, 30, 40):
        names = [f"t{i}" for i in range(n)]
        cases.append((Workflow.chain(rng.sample(names, n)), Workflow.chain(names)))
    elapsed = 0.0
    for pred, ref in cases:
        alignment = align(pred, ref)
        start = time.process_time()
        k = mcis_f1(pred, ref, alignment).size
        elapsed += time.process_time() - start
        assert k == networkx_mcis(pred, ref, alignment.mapping)
    assert elapsed / len(cases) < 0.05


def test_documented_differences_from_worfbench():
    """The examples of docs/metrics/structural.md, scored by our definitions."""
    antichain7 = Workflow(tuple(Node(t) for t in "abcdefg"))
    assert chain_f1(Workflow.chain(list("abcdefg")), antichain7).f1 == 1.0  # WorFBench: 0.43
    antichain8 = Workflow(tuple(Node(t) for t in "abcdefgh"))
    assert chain_f1(Workflow.chain(list("hgfedcba")), antichain8).f1 == 1.0  # WorFBench: 0.111
    assert chain_f1(Workflow.chain(["x", "y"]), Workflow.chain(["a", "b"])).size == 0  # WorFBench: l = 1
    chain = Workflow.chain(list("abcde"))
    renumbered = Workflow(tuple(Node(t) for t in "edcba"), ((4, 3), (3, 2), (2, 1), (1, 0)))
    assert set(structural_scores(renumbered, chain).values()) == {1.0}  # WorFBench graph F1: 0.143
    extra_edge = Workflow(tuple(Node(t) for t in "abc"), ((0, 1), (1, 2), (0, 2)))
    reference = Workflow.chain(list("abc"))
    assert mcis_f1(extra_edge, reference).f1 == pytest.approx(2 / 3)  # WorFBench (largest component): 1.0
    assert reachability_f1(extra_edge, reference).f1 == 1.0
    # Reachability through an omitted step still counts; the omitted step's pairs are missed.
    # (RobustFlow's released scorer, with START and END as steps: 0.75.)
    assert reachability_f1(Workflow.chain(["a", "c"]), reference) == Score(1.0, 0.5, 2 / 3, 3)
    # A longest path over pairwise-compatible steps would say 3 here; the exact l is 2.
    assert chain_f1(Workflow.chain(list("cba")), Workflow(tuple(Node(t) for t in "abc"), ((0, 2),))).size == 2


def test_docs_example_runs_as_printed():
    reference = Workflow.from_plan(
        "1. file_operations_reader: read and retrieve data from files\n"
        "2. data_processing_validator: validate data against a schema and report violations (after 1)\n"
        "3. data_processing_transformer: transform data from one format or shape into another (after 1)\n"
        "4. file_operations_writer: write and export results to a file destination (after 2, 3)")
    prediction = Workflow.chain(["file_operations_reader", "data_processing_transformer", "data_processing_validator"])
    alignment = align(prediction, reference)
    assert alignment.pairs == ((0, 0, 1.0), (1, 2, 1.0), (2, 1, 1.0))
    scores = {k: round(v, 3) for k, v in structural_scores(prediction, reference, alignment).items()}
    assert scores == {"chain_precision": 1.0, "chain_recall": 0.75, "chain_f1": 0.857,
                      "reachability_precision": 0.833, "reachability_recall": 0.556, "reachability_f1": 0.667,
                      "mcis_precision": 0.667, "mcis_recall": 0.5, "mcis_f1": 0.571, "kendall_tau": 0.816}


def test_mcis_past_its_budget_reports_bounds_not_an_approximation():
    """A 100-step chain against a shuffled copy needs hundreds of search calls: a small budget gives
    exact=False with bounds that contain the exact k found without a budget."""
    rng = random.Random(0)
    names = [f"t{i}" for i in range(100)]
    pred, ref = Workflow.chain(rng.sample(names, 100)), Workflow.chain(names)
    alignment = align(pred, ref)
    exact = mcis_f1(pred, ref, alignment, budget=None)
    assert exact.exact and exact.f1_bounds == (exact.f1, exact.f1) and exact.size_upper is None
    bounded = mcis_f1(pred, ref, alignment, budget=20)
    assert not bounded.exact
    assert bounded.size <= exact.size <= bounded.size_upper and bounded.size < bounded.size_upper
    low, high = bounded.f1_bounds
    assert low == bounded.f1 <= exact.f1 <= high == bounded.f1_upper
    assert bounded.f1 == 2 * bounded.size / 200
    small = Workflow.chain(list("abcde"))  # settled within any budget: exact
    assert mcis_f1(Workflow.chain(list("acbde")), small, budget=1).exact


def test_cyclic_predictions_score_zero_structurally():
    """A prediction read leniently from a graph with a cycle or a self-loop is not executable: every
    structural metric is 0, even when the rest of its graph equals the reference."""
    ref = Workflow.chain(list("abc"))
    nodes = tuple(Node(t) for t in "abc")
    cyclic = Workflow.lenient(nodes, [(0, 1), (1, 2), (2, 0)])
    looped = Workflow.lenient(nodes, [(0, 1), (1, 2), (1, 1)])
    duplicated = Workflow.lenient(nodes, [(0, 1), (1, 2), (0, 1)])
    assert cyclic.edges == ref.edges and cyclic.repairs.cycle_edges == ((2, 0),)
    zeros = dict.fromkeys(structural_scores(ref, ref), 0.0)
    assert structural_scores(cyclic, ref) == zeros and structural_scores(looped, ref) == zeros
    assert set(structural_scores(duplicated, ref).values()) == {1.0}  # a repeated edge costs nothing
    assert structural_scores(ref, cyclic) == zeros  # a cyclic reference likewise
