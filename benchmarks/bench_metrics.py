"""Time the exact structural metrics against brute-force anchors measured in the same run.

1. Chain F1 on references of 8 and 10 steps, antichains and random partial orders (whose shuffled
   predictions contradict reference paths, so the bipartite matching runs: checked), against enumerating
   every topological order of the reference (what WorFBench's scorer does, without its 20-order cap).
   Both must give the same l.
2. Alignment and metric throughput on reference workflows of the task library
   (``reference_workflow``) against random variants: tool steps (exact-name path) and text steps
   (sentence embeddings, cached per text), with brute-force chain F1 on the same pairs as the anchor.
3. MCIS on 20-step workflows against networkx's maximal-clique enumeration of the same compatibility
   graph, and on long shuffled chains under the default search budget (exact, or reported bounds).
4. `resilibench metrics score --input-format worfbench` end to end (a new process reading WorFBench's gold
   and prediction files, loading the embedding model, writing JSONL) against the anchor of the same
   command on the same pairs in the native JSON format (`--pairs`); both must give the same scores.

Times are CPU seconds of this process pinned to one core, so other load on a shared machine does not
inflate them.

    python benchmarks/bench_metrics.py [--tasks 300] [--variants 10] [--sizes 8 10] [--cli-tasks 100]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from bisect import bisect_left
from pathlib import Path

import networkx as nx
import numpy as np

from resilibench.core.bounds import reference_workflow
from resilibench.core.registry import default_registry
from resilibench.core.workflow import Node, Workflow
from resilibench.core.world import load_tasks
from resilibench.metrics.alignment import NodeEmbedder, align, execution_order
from resilibench.metrics.structural import DEFAULT_MCIS_BUDGET, chain_f1, mcis_f1, structural_scores


def lis(seq: list[int]) -> int:
    tails: list[int] = []
    for x in seq:
        k = bisect_left(tails, x)
        tails[k:k + 1] = [x]
    return len(tails)


def brute_force_chain_length(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> int:
    """l by trying every permutation of the reference that respects its edges."""
    chain = [mapping[p] for p in execution_order(pred) if p in mapping]
    best = 0
    for order in itertools.permutations(range(len(ref.nodes))):
        position = [0] * len(order)
        for i, v in enumerate(order):
            position[v] = i
        if all(position[a] < position[b] for a, b in ref.edges):
            best = max(best, lis([position[r] for r in chain]))
    return best


def per_call(fn, repeats: int) -> float:
    start = time.process_time()
    for _ in range(repeats):
        fn()
    return (time.process_time() - start) / repeats


def has_conflict(pred: Workflow, ref: Workflow, mapping: dict[int, int]) -> bool:
    """Whether two aligned steps come in the predicted chain in an order a reference path contradicts:
    only then does chain F1 run its bipartite matching (antichains never do)."""
    graph = nx.DiGraph(list(ref.edges))
    graph.add_nodes_from(range(len(ref.nodes)))
    chain = [mapping[p] for p in execution_order(pred) if p in mapping]
    return any(nx.has_path(graph, b, a) for i, a in enumerate(chain) for b in chain[i + 1:])


def bench_chain_f1(sizes: list[int]) -> None:
    """Chain F1 against every topological order, on antichains (no conflict: the matching is skipped)
    and on random partial orders (each pair of a hidden order joined with probability 0.3), where the
    shuffled prediction contradicts reference paths and the matching runs."""
    rng = random.Random(0)
    for n in sizes:
        hidden = rng.sample(range(n), n)
        partial = tuple(sorted((hidden[i], hidden[j]) for i in range(n) for j in range(i + 1, n)
                               if rng.random() < 0.3))
        for kind, edges in (("antichain", ()), ("partial order", partial)):
            ref = Workflow(tuple(Node(f"step_{i}") for i in range(n)), edges)
            order = rng.sample(range(n), n)
            pred = Workflow.chain([f"step_{i}" for i in order[1:]] + ["unrelated"])  # one missing, one extra
            alignment = align(pred, ref)
            assert has_conflict(pred, ref, alignment.mapping) == bool(edges), kind
            ours = per_call(lambda: chain_f1(pred, ref, alignment), 200)  # noqa: B023
            start = time.process_time()
            brute = brute_force_chain_length(pred, ref, alignment.mapping)
            brute_seconds = time.process_time() - start
            assert brute == chain_f1(pred, ref, alignment).size
            print(f"{kind} of {n} ({len(edges)} edges): exact chain F1 {ours * 1e6:.0f} us; anchor (all "
                  f"{math.factorial(n):,} orders) {brute_seconds:.2f} s; ratio anchor/exact "
                  f"{brute_seconds / ours:,.0f}x; l = {brute}")


def variant(rng: random.Random, ref: Workflow, names: list[str], as_text: bool) -> Workflow:
    """A random edit of a reference: drop a step, swap two steps' listing, change a tool, add a step,
    drop or add an edge. ``as_text``: steps carry only (lightly reworded) texts, no tool names."""
    nodes = list(ref.nodes)
    edges = set(ref.edges)
    edit = rng.randrange(5)
    if edit == 0 and len(nodes) > 1:
        gone = rng.randrange(len(nodes))
        nodes.pop(gone)
        edges = {(a - (a > gone), b - (b > gone)) for a, b in edges if gone not in (a, b)}
    elif edit == 1 and len(nodes) > 1:
        i = rng.randrange(len(nodes) - 1)
        nodes[i], nodes[i + 1] = nodes[i + 1], nodes[i]
        swap = {i: i + 1, i + 1: i}
        edges = {(swap.get(a, a), swap.get(b, b)) for a, b in edges}
    elif edit == 2:
        i = rng.randrange(len(nodes))
        nodes[i] = Node(rng.choice(names), nodes[i].text)
    elif edit == 3:
        nodes.append(Node(rng.choice(names), "carry out an extra step"))
        edges.add((rng.randrange(len(nodes) - 1), len(nodes) - 1))
    elif edges:
        edges.discard(rng.choice(sorted(edges)))
    if as_text:
        prefixes = ("", "then ", "next, ", "finally ", "first ")
        nodes = [Node(None, rng.choice(prefixes) + n.text) for n in nodes]
    graph = nx.DiGraph(list(edges))
    graph.add_nodes_from(range(len(nodes)))
    return Workflow(tuple(nodes), tuple(sorted(e for e in edges if nx.is_directed_acyclic_graph(graph))))


def throughput(label: str, pairs: list[tuple[Workflow, Workflow]], fn) -> float:
    start = time.process_time()
    for pred, ref in pairs:
        fn(pred, ref)
    rate = len(pairs) / (time.process_time() - start)
    print(f"  {label}: {rate:,.0f} pairs/s")
    return rate


def bench_library(n_tasks: int, n_variants: int) -> None:
    tasks = load_tasks()
    tasks = tasks[:: max(1, len(tasks) // n_tasks)][:n_tasks]
    refs = [reference_workflow(t) for t in tasks]
    names = list(default_registry().names)
    rng = random.Random(1)
    sizes = [len(r.nodes) for r in refs]
    print(f"library: {len(refs)} reference workflows ({min(sizes)}-{max(sizes)} steps, mean "
          f"{np.mean(sizes):.1f}) x {n_variants} random variants")
    for as_text in (False, True):
        pairs = [(variant(rng, r, names, as_text), r) for r in refs for _ in range(n_variants)]
        embedder = NodeEmbedder("auto") if as_text else None
        print(f" {'text steps (embeddings)' if as_text else 'tool steps (exact names)'}:")
        if as_text:
            throughput("align, cold embedding cache", pairs, lambda p, r: align(p, r, embedder=embedder))  # noqa: B023
        align_rate = throughput("align" + (", warm cache" if as_text else ""), pairs,
                                lambda p, r: align(p, r, embedder=embedder))  # noqa: B023
        alignments = [align(p, r, embedder=embedder) for p, r in pairs]
        aligned = iter(alignments)
        metric_rate = throughput("4 structural metrics, given the alignment", pairs,
                                 lambda p, r: structural_scores(p, r, next(aligned)))  # noqa: B023
        aligned = iter(alignments)
        brute_rate = throughput("anchor: chain l by brute-force orders", pairs,
                                lambda p, r: brute_force_chain_length(p, r, next(aligned).mapping))  # noqa: B023
        print(f"  ratio metrics/anchor: {metric_rate / brute_rate:.2f}; end to end "
              f"{1 / (1 / align_rate + 1 / metric_rate):,.0f} pairs/s")


def bench_mcis_20(count: int = 30) -> None:
    rng = random.Random(2)
    names = [f"tool_{i}" for i in range(20)]
    ours, anchor, sizes = [], [], []
    for k in range(count):
        hidden = rng.sample(range(20), 20)
        density = (0.1, 0.25, 0.5)[k % 3]
        ref_edges = [(hidden[i], hidden[j]) for i in range(20) for j in range(i + 1, 20) if rng.random() < density]
        ref = Workflow(tuple(Node(n) for n in names), tuple(ref_edges))
        pred_edges = {e for e in ref_edges if rng.random() > 0.15}
        pred_edges |= {(hidden[i], hidden[j]) for i in range(20) for j in range(i + 1, 20) if rng.random() < 0.03}
        pred = Workflow(ref.nodes, tuple(sorted(pred_edges)))
        alignment = align(pred, ref)
        start = time.process_time()
        size = mcis_f1(pred, ref, alignment).size
        ours.append(time.process_time() - start)
        start = time.process_time()
        pe, ge = set(pred.edges), set(ref.edges)
        compat = nx.Graph()
        compat.add_nodes_from(range(20))
        compat.add_edges_from((i, j) for i, j in itertools.combinations(range(20), 2)
                              if ((i, j) in pe) == ((i, j) in ge) and ((j, i) in pe) == ((j, i) in ge))
        best = max(len(c) for c in nx.find_cliques(compat))
        anchor.append(time.process_time() - start)
        assert best == size
        sizes.append(size)
    print(f"MCIS on {count} pairs of 20-step workflows (k from {min(sizes)} to {max(sizes)}): mean "
          f"{np.mean(ours) * 1e3:.2f} ms, max {max(ours) * 1e3:.2f} ms; anchor networkx find_cliques mean "
          f"{np.mean(anchor) * 1e3:.2f} ms; ratio anchor/ours {np.mean(anchor) / np.mean(ours):.1f}x")
    for n in (50, 100, 152, 253):  # a hard case: two unrelated orders of the same steps tangle every conflict
        names = [f"tool_{i}" for i in range(n)]
        pred, ref = Workflow.chain(rng.sample(names, n)), Workflow.chain(names)
        alignment = align(pred, ref)
        start = time.process_time()
        score = mcis_f1(pred, ref, alignment)
        outcome = f"k = {score.size}" if score.exact else (
            f"budget of {DEFAULT_MCIS_BUDGET:,} calls spent: k in [{score.size}, {score.size_upper}], "
            f"F1 in [{score.f1:.3f}, {score.f1_upper:.3f}]")
        print(f"MCIS of a chain of {n} steps and a shuffled copy: {outcome} in "
              f"{(time.process_time() - start) * 1e3:.1f} ms")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_cli(arguments: list[str]) -> float:
    """CPU seconds (user + system) of one `resilibench metrics score` process."""
    before = children_cpu()
    subprocess.run([sys.executable, "-m", "resilibench", "metrics", "score", *arguments], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ | {"HF_HUB_OFFLINE": "1"})
    return children_cpu() - before


def bench_worfbench_cli(n_tasks: int, n_variants: int) -> None:
    """Library references and reworded variants written as WorFBench's files, scored through the CLI."""
    tasks = load_tasks()
    tasks = tasks[:: max(1, len(tasks) // n_tasks)][:n_tasks]
    refs = [reference_workflow(t) for t in tasks]
    refs = [Workflow(tuple(Node(None, n.text) for n in r.nodes), r.edges) for r in refs]
    names = list(default_registry().names)
    rng = random.Random(4)
    pairs = [(variant(rng, r, names, True), r) for r in refs for _ in range(n_variants)]
    metrics = ["chain_f1", "mcis_f1", "reachability_f1", "kendall_tau"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        gold = [{"id": f"q{i}", "conversations": [{"role": "user", "content": "plan the task"},
                                                  {"role": "assistant", "content": r.to_worfbench()}]}
                for i, (_, r) in enumerate(pairs)]
        (folder / "gold.json").write_text(json.dumps(gold))
        (folder / "pred.json").write_text(json.dumps([{"workflow": p.to_worfbench()} for p, _ in pairs]))
        (folder / "pairs.jsonl").write_text("".join(json.dumps({"id": f"q{i}", "pred": p.to_dict(), "ref": r.to_dict()})
                                                    + "\n" for i, (p, r) in enumerate(pairs)))
        worfbench = run_cli(["--input-format", "worfbench", "--pred", str(folder / "pred.json"), "--ref",
                             str(folder / "gold.json"), "--metrics", *metrics, "--output", str(folder / "w.jsonl")])
        native = run_cli(["--pairs", str(folder / "pairs.jsonl"), "--metrics", *metrics,
                          "--output", str(folder / "n.jsonl")])
        rows = [[json.loads(line)["scores"] for line in (folder / f).read_text().splitlines()]
                for f in ("w.jsonl", "n.jsonl")]
        assert rows[0] == rows[1], "the WorFBench reader and the native reader disagree"
    sizes = [len(r.nodes) for r in refs]
    print(f"CLI end to end, {len(pairs)} pairs (WorFBench gold + prediction files, {min(sizes)}-{max(sizes)} text "
          f"steps, 4 structural metrics, model load included): {worfbench:.1f} CPU s = "
          f"{len(pairs) / worfbench:,.0f} pairs/s; anchor, the same pairs as native JSONL (--pairs): "
          f"{native:.1f} CPU s = {len(pairs) / native:,.0f} pairs/s; ratio worfbench/native {worfbench / native:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=300, help="reference workflows from the task library")
    parser.add_argument("--variants", type=int, default=10, help="random variants per reference")
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 10], help="chain F1 reference sizes")
    parser.add_argument("--cli-tasks", type=int, default=100,
                        help="references for the CLI row (times --variants pairs)")
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})  # one core
    bench_chain_f1(args.sizes)
    bench_mcis_20()
    bench_library(args.tasks, args.variants)
    bench_worfbench_cli(args.cli_tasks, args.variants)


if __name__ == "__main__":
    main()
