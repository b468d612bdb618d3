"""Time the structural metrics on every (golden, variant) pair of the WorkflowPerturb calibration set.

Anchors measured in the same run: (a) embedding the distinct step texts of the set once with the local
MiniLM (the only model work the structural metrics need; later alignments read the cache) and
(b) sacrebleu sentence BLEU on the same pairs. Printed: pairs/s of the structural metrics (one alignment
and chain, reachability and MCIS F1 and Kendall tau per pair) and the ratio to BLEU pairs/s.

    python benchmarks/bench_calibration.py [--limit N] [--text-only]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from resilibench.core.world import load_tasks
from resilibench.metrics.alignment import NodeEmbedder, align, node_text
from resilibench.metrics.calibration import plan_calibration
from resilibench.metrics.lexical import bleu
from resilibench.metrics.perturb import golden_workflows
from resilibench.metrics.structural import structural_scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=None, help="use only the first N tasks with >= 5 steps")
    parser.add_argument("--text-only", action="store_true", help="drop tool names (every step aligned by text)")
    args = parser.parse_args()

    start = time.perf_counter()
    goldens = golden_workflows(load_tasks(), limit=args.limit, text_only=args.text_only)
    plan = plan_calibration(goldens)
    counts = plan.counts()
    pairs = [(item.perturbation.workflow, item.golden.workflow) for item in plan.items]
    print(f"calibration set: {counts['tasks']} tasks ({counts['distinct_goldens']} distinct goldens), "
          f"{counts['task_variants']} task variants, {len(pairs)} distinct pairs; built in "
          f"{time.perf_counter() - start:.1f} s")

    embedder = NodeEmbedder("semantic")
    texts = sorted({node_text(n) for pair in pairs for w in pair for n in w.nodes})
    start = time.perf_counter()
    embedder.encode(texts)
    embed_seconds = time.perf_counter() - start
    print(f"anchor (a): embedding the {len(texts)} distinct step texts once: {embed_seconds:.2f} s")

    bleu(*pairs[0])  # imports sacrebleu outside the timing
    start = time.perf_counter()
    for pred, ref in pairs:
        bleu(pred, ref)
    bleu_rate = len(pairs) / (time.perf_counter() - start)
    print(f"anchor (b): sacrebleu sentence BLEU: {bleu_rate:,.0f} pairs/s")

    start = time.perf_counter()
    for pred, ref in pairs:
        structural_scores(pred, ref, align(pred, ref, embedder=embedder))
    structural_seconds = time.perf_counter() - start
    rate = len(pairs) / structural_seconds
    print(f"structural metrics (alignment + chain, reachability, MCIS F1 + Kendall tau): {len(pairs)} pairs in "
          f"{structural_seconds:.1f} s = {rate:,.0f} pairs/s")
    print(f"ratios: structural / BLEU pairs/s = {rate / bleu_rate:.2f}; structural time / embedding time = "
          f"{structural_seconds / embed_seconds:.3f}")


if __name__ == "__main__":
    main()
