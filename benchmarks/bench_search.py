"""Tool search: many queries in one embedding batch (``search_tools_many``) against one by one
(``search_tools``, the anchor), measured in the same run.

The queries are the clauses ``scripted:search`` sends for test-split descriptions (``SearchTextAgent
.searches``), the queries the generator's search hits line is made of (``robust_train.generator
.search_hints``, batches of ``HINTS_BATCH``). The anchor's per-query cache is cleared before each of its
runs, so that both sides embed every query. Both must name the same hits in the same order (checked); a
score may differ in its fourth place, since a batch pads the queries and float sums round differently
(counted). Figures are
queries per CPU second of this process (torch on one thread, as ``embed`` runs), the median of
interleaved repeats after a warm-up (``compare`` of ``bench_env.py``).

    python benchmarks/bench_search.py [--queries 1000] [--k 5] [--method semantic] [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_env import compare, machine  # noqa: E402

from resilibench.agents.text_baselines import SearchTextAgent
from resilibench.core.text import toolbox
from resilibench.core.world import load_tasks
from resilibench.robust_train.generator import HINTS_BATCH


class OneByOne:
    """``search_tools`` for each query, its per-query cache cleared first (the anchor)."""

    def __init__(self, queries: list[str], k: int, method: str):
        self.actions, self.k, self.method = queries, k, method

    def hits(self, queries: list[str]) -> list[list[toolbox.ToolHit]]:
        toolbox._ranking.cache_clear()
        return [toolbox.search_tools(q, self.k, method=self.method) for q in queries]

    def run(self, queries: list[str]) -> float:
        start = time.process_time()
        self.hits(queries)
        return len(queries) / (time.process_time() - start)


class Batched(OneByOne):
    """``search_tools_many`` over batches of ``HINTS_BATCH`` queries, as the generator's hits line is made."""

    def hits(self, queries: list[str]) -> list[list[toolbox.ToolHit]]:
        return [hits for start in range(0, len(queries), HINTS_BATCH)
                for hits in toolbox.search_tools_many(queries[start:start + HINTS_BATCH], self.k, method=self.method)]


def test_clauses(count: int) -> list[str]:
    """The first ``count`` distinct clauses ``scripted:search`` sends for test-split descriptions."""
    queries: dict[str, None] = {}
    for task in load_tasks(split="test"):
        queries.update(dict.fromkeys(SearchTextAgent.searches(task.description)))
        if len(queries) >= count:
            break
    return list(queries)[:count]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=1000, help="distinct clauses searched per run (default 1000)")
    parser.add_argument("--k", type=int, default=5, help="hits per query (default 5)")
    parser.add_argument("--method", choices=("semantic", "lexical"), default="semantic")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved repeats (default 5)")
    parser.add_argument("--quick", action="store_true", help="200 queries, 3 repeats (noisier figures)")
    args = parser.parse_args(argv)
    count, repeats = (200, 3) if args.quick else (args.queries, args.repeats)

    print(f"machine: {machine()}")
    queries = test_clauses(count)
    anchor, ours = OneByOne(queries, args.k, args.method), Batched(queries, args.k, args.method)
    one_by_one, batched = anchor.hits(queries), ours.hits(queries)  # also the warm-up: the model, the tools
    if [[h.name for h in hits] for hits in one_by_one] != [[h.name for h in hits] for hits in batched]:
        raise SystemExit("search_tools_many and search_tools name different hits")
    gaps = [abs(a.score - b.score) for x, y in zip(one_by_one, batched, strict=True)
            for a, b in zip(x, y, strict=True)]
    print(f"{len(queries)} distinct clauses of test descriptions, k={args.k}, {args.method} search: the same hits; "
          f"{sum(g > 0 for g in gaps)} of {len(gaps)} scores differ, by at most {max(gaps):.4f}")
    anchor_rate, our_rate, ratio = compare(anchor, ours, repeats)
    print(f"search_tools one by one (anchor): {anchor_rate:,.1f} queries/CPU s = {1e3 / anchor_rate:.1f} ms a query")
    print(f"search_tools_many, batches of {HINTS_BATCH}: {our_rate:,.1f} queries/CPU s = {1e3 / our_rate:.1f} ms a query")
    print(f"ratio (median of {repeats} interleaved repeats): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
