"""Fixed costs of commands, and the cost of a semantic tool search, against anchors measured in the same run.

(a) CPU seconds (user + system, of the child process) of fresh ``resilibench`` processes: ``--help``, a small
    ``run``, and ``eval agent --agent scripted:optimal --limit 50`` (targets: under 0.5 s, no MCP SDK or
    torch imported by ``run``, under 4 s). Anchor: a fresh interpreter importing numpy and gymnasium (what
    any command of the suite needs at least). Each line also names the heavy packages the process imported.
(b) One semantic ``tool_search`` query (MiniLM, model loaded, query cache cleared) on one torch thread, as
    the suite runs it, against the same query on torch's default thread count; and the lexical search.

Repeats are interleaved (every command once per round); each figure is the median. Run:
``python benchmarks/bench_startup.py`` (``--rounds N``, default 3; ``--part commands|search``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

HEAVY = ("mcp", "pydantic", "torch", "sentence_transformers", "transformers", "ray", "starlette", "uvicorn")
REPORT = (f"import atexit, json, sys\natexit.register(lambda: print('HEAVY=' + json.dumps(sorted(m for m in "
          f"{HEAVY!r} if m in sys.modules)), file=sys.stderr))\n")


def child_cpu(code: str) -> tuple[float, list[str]]:
    """CPU seconds (user + system) of ``python -c code`` and the heavy packages it imported."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run([sys.executable, "-c", REPORT + code], capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"{code!r} failed: {result.stderr[-2000:]}")
    heavy = next(line for line in result.stderr.splitlines() if line.startswith("HEAVY="))
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), json.loads(heavy[6:])


def cli(argv: list[str]) -> str:
    return f"from resilibench.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass"


def commands(rounds: int) -> None:
    out = tempfile.mkdtemp(prefix="bench-startup-")
    cases = {
        "anchor: import numpy, gymnasium": "import numpy, gymnasium",
        "resilibench --help": cli(["--help"]),
        "resilibench run --limit 20": cli(["run", "--limit", "20", "--output-dir", os.path.join(out, "run"),
                                           "--no-resume"]),
        "resilibench eval agent --agent scripted:optimal --limit 50": cli(
            ["eval", "agent", "--agent", "scripted:optimal", "--limit", "50", "--output-dir",
             os.path.join(out, "eval"), "--no-resume"]),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    imported: dict[str, list[str]] = {}
    for _ in range(rounds):
        for name, code in cases.items():
            seconds, imported[name] = child_cpu(code)
            times[name].append(seconds)
    anchor = statistics.median(times["anchor: import numpy, gymnasium"])
    print(f"(a) CPU seconds of a fresh process (user + system), median of {rounds} interleaved rounds")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"    {name:60s} {median:6.2f} s  ({median / anchor:5.1f}x the anchor)  imports {imported[name] or '-'}")


def search(rounds: int) -> None:
    import torch

    from resilibench.core.matching import load_embedding_model
    from resilibench.core.text import toolbox

    load_embedding_model()
    queries = ["read a csv file from disk", "send the report by email", "validate the json schema",
               "aggregate the numbers", "post the result to an api"]

    def per_query(method: str) -> float:
        toolbox._ranking.cache_clear()
        toolbox._tool_embeddings.cache_clear()
        toolbox.search_tools(queries[0], method=method)  # tool embeddings, once
        start = time.process_time()
        for q in queries * 4:
            toolbox._ranking.cache_clear()
            toolbox.search_tools(q, method=method)
        return (time.process_time() - start) / (len(queries) * 4) * 1000

    default_threads = torch.get_num_threads()
    ours, anchor, lexical = [], [], []
    for _ in range(rounds):
        ours.append(per_query("semantic"))
        torch.set_num_threads(default_threads)  # the anchor: encode as sentence-transformers does by default
        model = load_embedding_model()
        start = time.process_time()
        for q in queries * 4:
            model.encode([q], normalize_embeddings=True, convert_to_numpy=True)
        anchor.append((time.process_time() - start) / (len(queries) * 4) * 1000)
        lexical.append(per_query("lexical"))
    ours_ms, anchor_ms = statistics.median(ours), statistics.median(anchor)
    print(f"(b) tool_search, CPU ms per query, median of {rounds} interleaved rounds")
    print(f"    semantic, one torch thread (ours)          {ours_ms:7.2f} ms")
    print(f"    anchor: encoding on torch's {default_threads} threads      {anchor_ms:7.2f} ms  (ours / anchor = "
          f"{ours_ms / anchor_ms:.2f})")
    print(f"    lexical                                    {statistics.median(lexical):7.2f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--part", choices=("all", "commands", "search"), default="all")
    args = parser.parse_args(argv)
    if args.part in ("all", "commands"):
        commands(args.rounds)
    if args.part in ("all", "search"):
        search(args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
