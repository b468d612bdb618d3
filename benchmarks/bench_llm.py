"""Real small models in the text env: how fast, how well formed, how successful, beside bound (iii).

A fixed slice of world-v1 test tasks (the first test task of each of the first ``--tasks`` task types)
is played with every prompt type (baseline, cot, optimal, flawed with ``--flaw``) by each model of
``--models`` (``resilibench.agents.models``: packages that ship GGUF weights) through each backend of
``--backends``:

* ``llamacpp``: llama.cpp's OpenAI-compatible server started here on loopback (``models.llama_server``,
  one request at a time), reached through ``OpenAIBackend``;
* ``hf``: the transformers backend on the same GGUF (``hf:FILE.gguf``, dequantised to float32).

and with each protocol of ``--protocols`` (``tags``: the paper's text protocol; ``tools``: native tool
calls). Every episode goes through the evaluation harness (``run_eval``), one episode at a time, greedy
decoding. Per model, backend and protocol it reports: turns/s (agent messages per wall-clock second,
model loading excluded), tokens/s (generated tokens, counted with the model's tokenizer, per wall-clock
second), the parsed-call rate (agent messages holding at least one tool call the env runs as written: a
known tool with valid JSON arguments), then the paper's tables beside bound
(iii) for the same episodes played by two scripted references: ``scripted:names`` (copies the tool names
of the task text: the trivial baseline) and ``scripted:optimal`` (bound (iii)'s policy).

Run: ``nice python benchmarks/bench_llm.py --output-dir runs/bench_llm`` (minutes per episode on two
shared CPU cores; each run's rows, with the conversations, go to a JSONL file there). Ctrl-C stops it and
prints the figures and tables of the episodes that finished (the references play the same episodes).
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from resilibench.agents import models
from resilibench.agents.backends import make_backend
from resilibench.agents.harness import EvalJob, eval_jobs, run_eval
from resilibench.agents.report import format_tables, summarize_eval
from resilibench.agents.specs import make_scripted_agent
from resilibench.core.tasks.library import TASK_TYPE_NAMES
from resilibench.core.text.prompts import PromptSettings
from resilibench.core.text.toolbox import PROTOCOLS, UnknownToolError, parse_message, resolve_tool
from resilibench.core.world import load_tasks
from resilibench.envs.text.env import read_tool_calls
from resilibench.llm import GenerationConfig

PROMPTS = ("baseline", "cot", "optimal", "flawed")
BACKENDS = ("llamacpp", "hf")


def task_slice(n_types: int) -> list[Any]:
    """The first world-v1 test task of each of the first ``n_types`` task types."""
    tasks = load_tasks(split="test")
    return [next(t for t in tasks if t.task_type == kind) for kind in TASK_TYPE_NAMES[:n_types]]


def well_formed_call(message: dict[str, Any], protocol: str) -> bool:
    """Whether an agent message (as the env kept it) holds a tool call the env runs as written: a known
    tool (name or alias) with valid JSON arguments, read as the env of ``protocol`` reads it. Searches
    and info requests do not count (an echoed prompt example is one)."""
    parsed = parse_message(message["content"]) if protocol == "tags" else read_tool_calls(message)[0]
    return any(call.problem is None and known_tool(call.name) for call in parsed.calls)


def known_tool(name: str) -> bool:
    try:
        resolve_tool(name)
    except UnknownToolError:
        return False
    return True


@contextlib.contextmanager
def served(model: str, backend: str, threads: int) -> Iterator[str]:
    """The backend spec of ``model`` on ``backend``, live for the block (llama.cpp's server runs in it)."""
    if backend == "hf":
        yield f"hf:{models.gguf_path(model)}?batch_size=1&dtype=float32"
        return
    with models.llama_server(model, n_threads=threads) as url:
        yield f"openai:{url}?model={model}&timeout=900&max_concurrency=1&max_retries=0"


def figures(name: str, protocol: str, rows: list[dict[str, Any]], seconds: float, tokenizer: Any
            ) -> dict[str, Any]:
    """Throughput and form of finished episodes ``rows`` played in ``seconds``."""
    said = [m for row in rows for m in row.get("messages", ()) if m["role"] == "assistant"]
    tokens = sum(len(tokenizer(m["content"] or "", add_special_tokens=False)["input_ids"]) for m in said)
    return {"name": f"{name}/{protocol}", "episodes": len(rows), "messages": len(said), "seconds": seconds,
            "turns_per_s": len(said) / seconds, "tokens_per_s": tokens / seconds,
            "infra_errors": sum(row["level"] == "infra_error" for row in rows),
            "parsed_call_rate": sum(well_formed_call(m, protocol) for m in said) / max(1, len(said))}


FIGURE_HEADER = ("| model/backend/protocol | episodes | infra errors | agent messages | wall s | turns/s | tokens/s "
                 "| parsed-call rate |\n|---|---|---|---|---|---|---|---|")


def figure_line(f: dict[str, Any]) -> str:
    return (f"| {f['name']} | {f['episodes']} | {f['infra_errors']} | {f['messages']} | {f['seconds']:.0f} "
            f"| {f['turns_per_s']:.3f} | {f['tokens_per_s']:.1f} | {f['parsed_call_rate']:.2f} |")


def play(backend: Any, protocol: str, jobs: list[EvalJob], generation: GenerationConfig, output_dir: Path
         ) -> tuple[list[dict[str, Any]], float, bool]:
    """Run ``jobs`` with ``backend`` under ``protocol``, afresh (a resumed row has no timing), printing a
    line per episode. Returns the finished rows, the seconds until the last one finished, and whether
    Ctrl-C stopped the run (the finished episodes still count). Rows go to
    ``output_dir/MODEL-BACKEND-PROTOCOL/results.jsonl`` (a run directory)."""
    run_dir = output_dir / f"{backend.name.replace('/', '-')}-{protocol}"
    start = time.perf_counter()
    done: list[dict[str, Any]] = []
    last = [start]

    def finished(row: dict[str, Any]) -> None:
        done.append(row)
        last[0] = time.perf_counter()
        print(f"  {backend.name}/{protocol} {row['prompt']}: {row['level']}, {row['turns']} turns, "
              f"{last[0] - start:.0f} s", flush=True)

    try:
        run_eval(backend, jobs, generation=generation, batch_size=1, output_dir=run_dir, resume=False,
                 keep_messages=True, progress=False, on_result=finished,
                 env={"prompt": PromptSettings(protocol=protocol)})
    except KeyboardInterrupt:
        return done, last[0] - start, True
    return done, last[0] - start, False


def run_all(args: argparse.Namespace, jobs: list[EvalJob], generation: GenerationConfig, lines: list[str],
            rows: list[dict[str, Any]]) -> None:
    """Every model x backend x protocol of ``args``, appending figure lines and rows; returns at Ctrl-C."""
    from transformers import AutoTokenizer

    for model in args.models:
        gguf = models.gguf_path(model)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        for kind in args.backends:
            with served(model, kind, args.threads) as spec:
                backend = make_backend(f"{spec}&name={model}/{kind}")
                for protocol in args.protocols:
                    done, seconds, stopped = play(backend, protocol, jobs, generation, args.output_dir)
                    if done:  # the tables keep the protocols apart
                        rows += [{**row, "model": f"{row['model']}/{protocol}"} for row in done]
                        lines.append(figure_line(figures(backend.name, protocol, done, seconds, tokenizer)))
                        print(lines[-1], flush=True)
                    if stopped:
                        return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m"], choices=list(models.MODELS))
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--protocols", nargs="+", default=list(PROTOCOLS), choices=PROTOCOLS)
    parser.add_argument("--prompts", nargs="+", default=list(PROMPTS), choices=PROMPTS)
    parser.add_argument("--flaw", default="order", help="flaw type of the flawed prompt")
    parser.add_argument("--tasks", type=int, default=1, help="task types in the slice (one task each)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of torch and of llama.cpp")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/bench_llm"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    jobs = eval_jobs(task_slice(args.tasks), args.prompts, args.seeds, flaw_types=[args.flaw])
    generation = GenerationConfig(max_new_tokens=args.max_new_tokens)
    print(f"{len(jobs)} episodes per model, backend and protocol; {platform.machine()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", flush=True)

    lines, rows = [], []
    run_all(args, jobs, generation, lines, rows)
    played = {(row["task_id"], row["prompt"], row["flaw_type"], row["seed"]) for row in rows}
    jobs = [job for job in jobs if (job.task.instance_id, job.prompt, job.flaw_type, job.seed) in played]
    for kind in ("names", "optimal"):
        rows += run_eval(make_scripted_agent(kind), jobs, progress=False)

    print("\n" + FIGURE_HEADER)
    print("\n".join(lines))
    print()
    print(format_tables(summarize_eval(rows)))


if __name__ == "__main__":
    main()
