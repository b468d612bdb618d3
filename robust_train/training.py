"""Generator training with TRL and PEFT: instruction-augmented SFT and the weighted DPO loss of ScPO.

``train_sft`` fine-tunes a local causal LM on conversational prompt-completion rows (loss on the
completion only), with a LoRA adapter (RobustFlow A.4 defaults) or in full. ``train_preferences`` trains
a fresh LoRA adapter on a full model ``M_t`` with the ScPO loss (RobustFlow eq. 13)::

    L(q) = rho_q * [-log sigmoid(beta * (log-ratio(w+) - log-ratio(w-)))] + alpha * rho_q * NLL(w+ | q)

where the log-ratios are taken against ``M_t`` itself (the adapter disabled), NLL is the chosen
completion's mean token negative log-likelihood and ``rho_q`` is the row's ``weight``. TRL 1.16
expresses the bracket plus NLL as ``loss_type=["sigmoid", "sft"]``, ``loss_weights=[1, alpha]`` but has
no per-example weight; ``WeightedDPOTrainer`` adds it. ``merge_adapter`` folds an adapter into its base,
giving the next ``M_t``.

Every run writes ``output_dir/checkpoints/`` (Trainer checkpoints, resumed from the newest one) and, at
the end, ``output_dir/final/`` (the adapter or model, the tokenizer and ``train_result.json``), renamed
into place in one step. ``output_dir/run.json`` records what the run trains (model, settings, a digest
of the rows), so a resumed run never mixes two configurations.

torch, transformers, trl and peft are imported on first use (``pip install 'resilibench[llm]'``).
"""

from __future__ import annotations

__all__ = [
    "LLM_EXTRA", "FINAL_DIR", "CHECKPOINT_DIR", "RESULT_FILE", "RUN_FILE", "MERGE_FILE", "WEIGHT_SUFFIXES",
    "DIGEST_CHARS", "PROMPT_ROLES", "LoraSettings", "SFTSettings", "PreferenceSettings", "TrainResult",
    "DEFAULT_TORCH_THREADS", "set_torch_threads", "json_digest", "model_digest", "training_directory",
    "make_sft_trainer", "train_sft", "make_preference_trainer", "train_preferences", "merge_adapter",
    "publish_model", "trained_model",
]

import contextlib
import functools
import hashlib
import json
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from resilibench.errors import ConfigError
from resilibench.settings import AT_LEAST_ONE, Settings, setting

LLM_EXTRA = "pip install 'resilibench[llm]'"
FINAL_DIR = "final"
CHECKPOINT_DIR = "checkpoints"
RESULT_FILE = "train_result.json"
RUN_FILE = "run.json"
MERGE_FILE = "merge.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin")
DIGEST_CHARS = 16  # of a sha256 hex digest: plenty to tell inputs apart, short enough to read in a diff
PROMPT_ROLES = ("system", "user", "assistant")


# --- settings ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraSettings(Settings):
    """A LoRA adapter: rank, scaling alpha, dropout and the modules it wraps (PEFT's ``"all-linear"`` is
    every linear layer but the output head). Defaults: RobustFlow A.4's SFT stage; ScPO uses r = 8."""

    section = "LoraSettings"
    r: int = setting(16, bounds=AT_LEAST_ONE, flag="--lora-r", metavar="R", help="LoRA rank")
    alpha: int = setting(32, bounds=AT_LEAST_ONE, flag="--lora-alpha", metavar="A", help="LoRA alpha")
    dropout: float = setting(0.05, bounds=(0, 1), flag="--lora-dropout", metavar="P",
                             help="dropout on the adapter's input, below 1; 0 saves about a fifth of a "
                                  "training step on a CPU")
    target_modules: str | tuple[str, ...] = setting("all-linear", help="'all-linear' or module names")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dropout == 1:
            raise ConfigError("LoraSettings.dropout", f"LoraSettings.dropout must be in [0, 1), got {self.dropout!r}")
        if self.target_modules == ():
            raise ConfigError("LoraSettings.target_modules", "LoraSettings.target_modules must be 'all-linear' or "
                              "a non-empty list of module names, got ()")


@dataclass(frozen=True)
class _TrainerSettings(Settings):
    """What SFT and the preference stage share (their defaults: SFT's)."""

    epochs: float = setting(3.0, above=0, help="passes over the data")
    learning_rate: float = setting(1e-4, above=0, flag=("--learning-rate", "--lr"), help="peak learning rate")
    batch_size: int = setting(2, bounds=AT_LEAST_ONE, metavar="N", help="per device")
    gradient_accumulation_steps: int = setting(2, bounds=AT_LEAST_ONE, metavar="N", help="batches per optimiser step")
    warmup_ratio: float = setting(0.05, bounds=(0, 1), help="below 1")
    max_length: int = setting(2048, bounds=AT_LEAST_ONE, metavar="N", help="tokens")
    lora: LoraSettings | None = setting(LoraSettings(), help="null: fine-tune every weight")
    max_steps: int = setting(-1, bounds=(-1, None), metavar="N", help="stop after N optimiser steps (-1: epochs)")
    save_steps: int = setting(200, bounds=AT_LEAST_ONE)
    save_total_limit: int = setting(2, bounds=AT_LEAST_ONE)
    logging_steps: int = setting(10, bounds=AT_LEAST_ONE)
    seed: int = setting(0, bounds=(0, None), metavar="N", help="training seed")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.warmup_ratio == 1:
            raise ConfigError(f"{self.section}.warmup_ratio", f"{self.section}.warmup_ratio must be in [0, 1), got 1.0")
        if self.max_steps == 0:
            raise ConfigError(f"{self.section}.max_steps", f"{self.section}.max_steps must be -1 (use epochs) or "
                              ">= 1, got 0")


def _default(name: str, value: Any) -> Any:
    """The shared field ``name`` of ``_TrainerSettings`` with another default."""
    return setting(value, **{k: v for k, v in _TrainerSettings.__dataclass_fields__[name].metadata.items()})


@dataclass(frozen=True)
class SFTSettings(_TrainerSettings):
    """Supervised fine-tuning (RobustFlow A.4: 3 epochs, batch 2 x gradient accumulation 2, learning rate
    1e-4, warm-up 5 %, sequences up to 2,048 tokens). ``lora=None`` fine-tunes every weight;
    ``max_steps`` (when not -1) overrides ``epochs``; ``prompt_loss`` puts the loss on the prompt's tokens
    too (by default it is on the answer only)."""

    section = "SFTSettings"

    prompt_loss: bool = setting(False, help="train on the prompt's tokens too, not only the answer's (a model "
                                "from scratch learns the instructions' text as well)")


@dataclass(frozen=True)
class PreferenceSettings(_TrainerSettings):
    """The ScPO stage (RobustFlow A.4: beta 1, NLL weight alpha 0.1, 1 epoch, batch 1 x gradient
    accumulation 8, learning rate 1e-4, LoRA r 8 alpha 32, sequences up to 4,096 tokens)."""

    section = "PreferenceSettings"
    epochs: float = _default("epochs", 1.0)
    batch_size: int = _default("batch_size", 1)
    gradient_accumulation_steps: int = _default("gradient_accumulation_steps", 8)
    max_length: int = _default("max_length", 4096)
    lora: LoraSettings | None = _default("lora", LoraSettings(r=8, alpha=32))
    save_steps: int = _default("save_steps", 300)
    beta: float = setting(1.0, above=0, help="DPO beta")
    nll_alpha: float = setting(0.1, bounds=(0, None), metavar="ALPHA", help="weight of the NLL term")


@dataclass(frozen=True)
class TrainResult:
    """What a training run left: ``output`` (the adapter directory, or the full model directory when
    ``lora`` is None; loadable with its tokenizer), the optimizer steps taken, the mean training loss,
    the Trainer's log history, and whether it resumed from a checkpoint or found the finished output."""

    output: Path
    steps: int
    train_loss: float | None
    log: list[dict]
    resumed: bool


# --- input checks --------------------------------------------------------------------------------------


DEFAULT_TORCH_THREADS = 1


def set_torch_threads(threads: int = DEFAULT_TORCH_THREADS) -> None:
    """Give torch ``threads`` intra-op threads for this process (call it before the work starts). One
    thread by default, as for PPO: on a busy machine torch's default (one per core) made a training step
    6-9x slower here (docs/robust_train/generation.md); raise it on a machine whose cores are free. Freed
    memory is kept for reuse (``_reuse_freed_memory``)."""
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        raise ValueError(f"torch_threads must be a positive integer, got {threads!r}")
    _require_llm()
    import torch

    torch.set_num_threads(threads)
    _reuse_freed_memory()


M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)


def _reuse_freed_memory() -> None:
    """On glibc, serve large blocks from the heap and keep freed memory for reuse. By default freed tensor
    buffers went back to the system and every training step page-faulted them in again: 16-23% of the
    demo's CPU was system time (docs/robust_train/generation.md). Elsewhere nothing changes."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the interpreter runs on
    except (OSError, AttributeError):
        return
    mallopt(M_MMAP_THRESHOLD, 32 << 20)  # glibc's largest: blocks up to 32 MiB come from the heap
    mallopt(M_TRIM_THRESHOLD, 1 << 30)  # return free heap memory only past 1 GiB


def _require_llm() -> None:
    """ImportError naming the extra when torch, transformers, trl or peft is missing."""
    try:
        import peft  # noqa: F401
        import torch  # noqa: F401
        import transformers  # noqa: F401
        import trl  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"training needs torch, transformers, trl and peft: {LLM_EXTRA} ({exc})") from None


def _check_model_dir(path: str | Path, field: str = "model_path") -> Path:
    """The path of a local transformers model directory; ValueError otherwise."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ValueError(f"{field} {str(path)!r}: not a local transformers model directory (no config.json); "
                         "models load from local paths only")
    return path


def _check_messages(value: Any, where: str, roles: Sequence[str]) -> list[dict[str, str]]:
    """``value`` as a non-empty list of ``{"role", "content"}`` messages with roles from ``roles``."""
    if not isinstance(value, list) or not value:
        raise ValueError(f"{where} must be a non-empty list of messages, got {value!r:.80}")
    for j, message in enumerate(value):
        if not isinstance(message, dict) or message.get("role") not in roles or \
                not isinstance(message.get("content"), str):
            raise ValueError(f"{where}[{j}] must be a message {{'role': one of {'/'.join(roles)}, 'content': str}}, "
                             f"got {message!r:.80}")
    return [{"role": m["role"], "content": m["content"]} for m in value]


def _check_rows(rows: Sequence[dict], keys: Sequence[str]) -> list[dict]:
    """The rows reduced to ``keys`` (prompt/completion/chosen/rejected messages, a weight >= 0); one
    ValueError naming the first bad row and field."""
    if not isinstance(rows, Sequence) or isinstance(rows, str) or not rows:
        raise ValueError("rows must be a non-empty list of training rows")
    checked = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"rows[{i}] must be a dict with keys {', '.join(keys)}, got {type(row).__name__}")
        missing = [key for key in keys if key not in row]
        if missing:
            raise ValueError(f"rows[{i}] is missing {', '.join(map(repr, missing))} (rows need {', '.join(keys)})")
        out: dict[str, Any] = {"prompt": _check_messages(row["prompt"], f"rows[{i}]['prompt']", PROMPT_ROLES)}
        for key in keys:
            if key in ("completion", "chosen", "rejected"):
                out[key] = _check_messages(row[key], f"rows[{i}][{key!r}]", ("assistant",))
        if "weight" in keys:
            weight = row["weight"]
            if isinstance(weight, bool) or not isinstance(weight, int | float) or not math.isfinite(weight) \
                    or weight < 0:
                raise ValueError(f"rows[{i}]['weight'] must be a finite number >= 0, got {weight!r}")
            out["weight"] = float(weight)
        checked.append(out)
    return checked


# --- shared run machinery ------------------------------------------------------------------------------


def _device_args(lora: bool, checkpointing: bool | None = None) -> tuple[dict[str, Any], Any]:
    """Trainer arguments for this machine and the dtype to load the model in: CUDA with bf16 where the
    GPU supports it (a LoRA base model loads in bf16, a fully trained one in fp32 under autocast), else
    CPU in fp32. Activation checkpointing follows ``checkpointing``; None: on a GPU only (on a CPU it
    costs time and is needed only for long sequences)."""
    import torch

    cuda = torch.cuda.is_available()
    checkpoint = cuda if checkpointing is None else checkpointing
    if cuda:
        bf16 = torch.cuda.is_bf16_supported()
        dtype = torch.bfloat16 if bf16 and lora else torch.float32
        return {"use_cpu": False, "bf16": bf16, "fp16": False, "activation_checkpointing": checkpoint}, dtype
    return {"use_cpu": True, "bf16": False, "fp16": False, "activation_checkpointing": checkpoint}, torch.float32


def _common_args(settings: SFTSettings | PreferenceSettings, checkpoints: Path, progress: bool) -> dict[str, Any]:
    """TrainingArguments shared by SFT and DPO runs."""
    device, _ = _device_args(settings.lora is not None)
    return {
        "output_dir": str(checkpoints), "num_train_epochs": settings.epochs, "max_steps": settings.max_steps,
        "learning_rate": settings.learning_rate, "per_device_train_batch_size": settings.batch_size,
        "gradient_accumulation_steps": settings.gradient_accumulation_steps,
        # A float below 1 is a fraction of the total steps (transformers 5).
        "warmup_steps": float(settings.warmup_ratio), "max_length": settings.max_length,
        "save_strategy": "steps", "save_steps": settings.save_steps, "save_total_limit": settings.save_total_limit,
        "logging_steps": settings.logging_steps, "seed": settings.seed, "data_seed": settings.seed,
        "report_to": "none", "disable_tqdm": not progress, "dataloader_num_workers": 0, **device,
    }


def _peft_config(lora: LoraSettings | None):
    """PEFT's LoraConfig for ``lora`` (None when training every weight)."""
    if lora is None:
        return None
    from peft import LoraConfig

    modules = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
    return LoraConfig(r=lora.r, lora_alpha=lora.alpha, lora_dropout=lora.dropout, target_modules=modules,
                      task_type="CAUSAL_LM")


def _load_model(model_path: Path, lora: bool):
    """The model (in the dtype ``_device_args`` picks) and its tokenizer, which must carry a chat template."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(f"model_path {str(model_path)!r}: the tokenizer has no chat template")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    _, dtype = _device_args(lora)
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype), tokenizer


@contextlib.contextmanager
def _renamed_checkpointing_calls_silenced() -> Iterator[None]:
    """PEFT and TRL call transformers' checkpointing methods by their old names (``gradient_...``), which
    warn on every model wrap and every generation."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*", category=FutureWarning)
        yield


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the dataset-preparation and weight-loading progress bars of datasets and transformers
    (restored afterwards; the training bar is ``_progress_bar_class``'s) and the renamed checkpointing
    calls."""
    import datasets
    from transformers.utils import logging as hf_logging

    datasets_on = not datasets.are_progress_bars_disabled()
    hf_on = hf_logging.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    hf_logging.disable_progress_bar()
    try:
        with _renamed_checkpointing_calls_silenced():
            yield
    finally:
        if datasets_on:
            datasets.enable_progress_bars()
        if hf_on:
            hf_logging.enable_progress_bar()


@functools.cache
def _progress_bar_class():
    """Transformers' training progress bar without its per-log-step printing."""
    from transformers.trainer_callback import ProgressCallback

    class ProgressBar(ProgressCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            return None

    return ProgressBar


def _quiet_trainer(trainer, progress: bool):
    """``trainer`` without transformers' per-log-step printing: a bare progress bar when ``progress``."""
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    trainer.remove_callback(ProgressCallback)
    trainer.remove_callback(PrinterCallback)
    if progress:
        trainer.add_callback(_progress_bar_class())
    return trainer


def json_digest(value: Any) -> str:
    """sha256 (first ``DIGEST_CHARS``) of ``value`` as JSON with sorted keys."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:DIGEST_CHARS]


def model_digest(model_dir: str | Path) -> str:
    """sha256 (first ``DIGEST_CHARS``) of a model directory's config.json and weight files: the model's
    identity, wherever it lies."""
    digest = hashlib.sha256()
    for path in sorted(Path(model_dir).iterdir()):
        if path.name == "config.json" or path.suffix in WEIGHT_SUFFIXES:
            digest.update(path.name.encode())
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
    return digest.hexdigest()[:DIGEST_CHARS]


@contextlib.contextmanager
def training_directory(output_dir: Path, record: dict, resume: bool, summary: str | None = None,
                       stale: Sequence[str] = ()) -> Iterator[tuple[Any, TrainResult | None]]:
    """A training run's ``RunDirectory`` session, ``record`` kept in ``run.json``, and the finished result of
    the same record when resuming one (else None). A run recorded with other settings, rows or model is
    refused (``errors.ConfigChanged``); ``resume=False`` clears the previous run's checkpoints and output."""
    from resilibench.results import run_metadata
    from resilibench.rundir import RunDirectory

    run = RunDirectory(output_dir, record, summary=summary, meta=RUN_FILE, stale=stale)
    final = output_dir / FINAL_DIR
    with run.session(resume):
        if resume and run.meta_path is not None and run.meta_path.is_file() and (final / RESULT_FILE).is_file():
            result = json.loads((final / RESULT_FILE).read_text())
            yield run, TrainResult(final, result["steps"], result["train_loss"], result["log"], resumed=True)
            return
        if not resume:
            for old in (final, output_dir / CHECKPOINT_DIR):
                shutil.rmtree(old, ignore_errors=True)
        run.write_meta(run_metadata(record, None))
        yield run, None


def _train_in(output_dir: Path, record: dict, resume: bool, make_trainer: Callable[[], Any]) -> TrainResult:
    """Train ``make_trainer()`` in ``output_dir`` under its lock (``training_directory``); resuming a
    finished run returns its result at once."""
    with training_directory(output_dir, record, resume) as (_, finished):
        if finished is not None:
            return finished
        trainer = make_trainer()
        with _quiet():
            return _run(trainer, output_dir, resume)


def _run(trainer, output_dir: Path, resume: bool) -> TrainResult:
    """Train (from the newest checkpoint when resuming), then write ``final/`` atomically."""
    from transformers.trainer_utils import get_last_checkpoint

    checkpoints = output_dir / CHECKPOINT_DIR
    last = get_last_checkpoint(str(checkpoints)) if resume and checkpoints.is_dir() else None
    with _renamed_checkpointing_calls_silenced():
        output = trainer.train(resume_from_checkpoint=last)
    log = [dict(entry) for entry in trainer.state.log_history]
    result = TrainResult(output_dir / FINAL_DIR, trainer.state.global_step, output.training_loss, log,
                         resumed=last is not None)
    tmp = output_dir / f".{FINAL_DIR}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    trainer.processing_class.save_pretrained(str(tmp))
    (tmp / RESULT_FILE).write_text(json.dumps(
        {"steps": result.steps, "train_loss": result.train_loss, "log": log}, indent=1))
    shutil.rmtree(result.output, ignore_errors=True)  # an earlier run's output that run.json did not record
    os.replace(tmp, result.output)
    return result


def _run_record(kind: str, model_path: Path, settings: SFTSettings | PreferenceSettings,
                rows: list[dict]) -> dict:
    """What a run trains, as stored in ``run.json`` (JSON-normalised so it compares with a re-read)."""
    return json.loads(json.dumps({"kind": kind, "model_path": str(model_path.resolve()),
                                  "settings": asdict(settings), "rows_sha256": json_digest(rows)}))


# --- SFT -----------------------------------------------------------------------------------------------


def make_sft_trainer(model_path: str | Path, rows: Sequence[dict], output_dir: str | Path,
                     settings: SFTSettings = SFTSettings(), *, progress: bool = True,
                     callbacks: Sequence[Any] = ()):
    """A ready TRL ``SFTTrainer`` for ``rows`` (see ``train_sft``); checkpoints go to
    ``output_dir/checkpoints``. Exposed for callers that drive the trainer themselves."""
    _require_llm()
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer  # pyright: ignore[reportPrivateImportUsage]: exported lazily

    model_path = _check_model_dir(model_path)
    rows = _check_rows(rows, ("prompt", "completion"))
    with _quiet():
        model, tokenizer = _load_model(model_path, settings.lora is not None)
        args = SFTConfig(**_common_args(settings, Path(output_dir) / CHECKPOINT_DIR, progress),
                         completion_only_loss=not settings.prompt_loss)
        trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                             peft_config=_peft_config(settings.lora), callbacks=list(callbacks) or None)
    return _quiet_trainer(trainer, progress)


def train_sft(model_path: str | Path, rows: Sequence[dict], output_dir: str | Path,
              settings: SFTSettings = SFTSettings(), *, resume: bool = True, progress: bool = True,
              callbacks: Sequence[Any] = ()) -> TrainResult:
    """Supervised fine-tuning of the local causal LM at ``model_path`` on conversational
    prompt-completion rows, ``{"prompt": [system/user messages], "completion": [assistant message]}``,
    with the loss on the completion only. Writes ``output_dir/final/`` (the LoRA adapter, or the full
    model when ``settings.lora`` is None, with the tokenizer). ``callbacks`` are extra
    ``transformers.TrainerCallback`` objects."""
    _require_llm()
    model_path = _check_model_dir(model_path)
    checked = _check_rows(rows, ("prompt", "completion"))
    output_dir = Path(output_dir)
    return _train_in(output_dir, _run_record("sft", model_path, settings, checked), resume, lambda: make_sft_trainer(
        model_path, checked, output_dir, settings, progress=progress, callbacks=callbacks))


# --- weighted DPO --------------------------------------------------------------------------------------


class _WithWeights:
    """A preference collator that also passes each example's ``weight`` on, as a float tensor."""

    def __init__(self, collator: Callable[[list[dict]], dict]):
        self.collator = collator

    def __call__(self, examples: list[dict]) -> dict:
        import torch

        batch = self.collator(examples)
        if "weight" in examples[0]:
            batch["weight"] = torch.tensor([float(e["weight"]) for e in examples], dtype=torch.float32)
        return batch


def _example(inputs: dict, i: int, n: int) -> dict:
    """Example ``i`` of a collated preference batch of ``n`` (rows ``i`` and ``n + i`` of the stacked
    chosen/rejected tensors, per-example tensors at ``i``), cut to its own length: trailing columns that
    both of its sequences pad are dropped, which changes nothing for a causal LM."""
    rows = [i, n + i]
    attention = inputs["attention_mask"][rows]
    length = int(attention.any(dim=0).nonzero().max()) + 1
    out = {}
    for key, value in inputs.items():
        if value.size(0) == 2 * n:
            out[key] = value[rows][:, :length] if value.dim() >= 2 else value[rows]
        else:
            out[key] = value[i:i + 1]
    return out


@functools.cache
def _weighted_dpo_trainer_class():
    """Build ``WeightedDPOTrainer`` on first use, so importing this module does not import TRL."""
    from trl import DPOTrainer  # pyright: ignore[reportPrivateImportUsage]: exported lazily

    class WeightedDPOTrainer(DPOTrainer):
        """TRL's ``DPOTrainer`` with a per-example weight: a ``weight`` column (float >= 0) survives
        column pruning and collation, and each example's loss (every term of ``loss_type``, e.g. the
        DPO sigmoid and the SFT/NLL term) is multiplied by its weight before the batch mean.

        The loss is computed one example at a time (TRL returns only the batch mean), so a batch of B
        costs B forward passes of one pair; at ScPO's batch size of 1 that is exactly TRL's loss. For
        B > 1 the SFT term is each chosen completion's own mean token NLL (RobustFlow eq. 13's
        1/|w+| log M(w+|q)) where TRL averages over all chosen tokens of the batch. A dataset without
        a ``weight`` column trains exactly as ``DPOTrainer``."""

        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.data_collator = _WithWeights(self.data_collator)

        def _set_signature_columns_if_needed(self):
            super()._set_signature_columns_if_needed()
            if "weight" not in self._signature_columns:
                self._signature_columns = [*self._signature_columns, "weight"]

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            weights = inputs.pop("weight", None)
            if weights is None:
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            n = weights.numel()
            if n == 1:
                result = super().compute_loss(model, inputs, return_outputs)
                return (result[0] * weights[0], result[1]) if return_outputs else result * weights[0]
            loss = 0.0
            for i in range(n):
                loss = loss + super().compute_loss(model, _example(inputs, i, n)) * weights[i]
            if return_outputs:  # evaluation: TRL's outputs (for compute_metrics) of the whole batch
                return loss / n, super().compute_loss(model, inputs, True)[1]
            return loss / n

    WeightedDPOTrainer.__module__ = __name__
    return WeightedDPOTrainer


def __getattr__(name: str) -> Any:
    if name == "WeightedDPOTrainer":
        return _weighted_dpo_trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def make_preference_trainer(model_path: str | Path, rows: Sequence[dict], output_dir: str | Path,
                            settings: PreferenceSettings = PreferenceSettings(), *, progress: bool = True,
                            callbacks: Sequence[Any] = ()):
    """A ready ``WeightedDPOTrainer`` for ``rows`` (see ``train_preferences``): DPO sigmoid plus
    ``nll_alpha`` times the SFT term, weighted per row. Exposed for callers that drive the trainer."""
    _require_llm()
    from datasets import Dataset
    from trl import DPOConfig  # pyright: ignore[reportPrivateImportUsage]: exported lazily

    model_path = _check_model_dir(model_path)
    rows = _check_rows(rows, ("prompt", "chosen", "rejected", "weight"))
    loss_type, loss_weights = ["sigmoid"], [1.0]
    if settings.nll_alpha > 0:
        loss_type, loss_weights = ["sigmoid", "sft"], [1.0, float(settings.nll_alpha)]
    with _quiet():
        model, tokenizer = _load_model(model_path, settings.lora is not None)
        args = DPOConfig(**_common_args(settings, Path(output_dir) / CHECKPOINT_DIR, progress),
                         beta=settings.beta, loss_type=loss_type, loss_weights=loss_weights)
        # Without an adapter the reference is a second, frozen copy of M_t.
        ref_model = None if settings.lora is not None else _load_model(model_path, False)[0]
        trainer = _weighted_dpo_trainer_class()(
            model=model, ref_model=ref_model, args=args, train_dataset=Dataset.from_list(rows),
            processing_class=tokenizer, peft_config=_peft_config(settings.lora), callbacks=list(callbacks) or None)
    return _quiet_trainer(trainer, progress)


def train_preferences(model_path: str | Path, rows: Sequence[dict], output_dir: str | Path,
                      settings: PreferenceSettings = PreferenceSettings(), *, resume: bool = True,
                      progress: bool = True, callbacks: Sequence[Any] = ()) -> TrainResult:
    """One ScPO update: weighted DPO (beta) plus the weighted NLL term (``nll_alpha``) on rows
    ``{"prompt": [messages], "chosen": [assistant message], "rejected": [assistant message],
    "weight": float >= 0}``. ``model_path`` is the full model ``M_t``; a fresh LoRA adapter is trained
    on it and the reference is ``M_t`` itself (the adapter disabled), as RobustFlow eq. 13 wants. With
    ``settings.lora=None`` every weight trains against a frozen copy. Writes ``output_dir/final/``."""
    _require_llm()
    model_path = _check_model_dir(model_path)
    checked = _check_rows(rows, ("prompt", "chosen", "rejected", "weight"))
    output_dir = Path(output_dir)
    return _train_in(output_dir, _run_record("preferences", model_path, settings, checked), resume,
                     lambda: make_preference_trainer(model_path, checked, output_dir, settings, progress=progress,
                                                     callbacks=callbacks))


# --- merging -------------------------------------------------------------------------------------------


def publish_model(source: str | Path, target: str | Path) -> Path:
    """Copy a finished model directory to ``target`` (via a temporary name, so it appears whole; a copy
    left by an interrupted run is replaced)."""
    source, target = Path(source), Path(target)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


def trained_model(base_model_path: str | Path, result: TrainResult, lora: LoraSettings | None,
                  out_dir: str | Path) -> Path:
    """The full model a training made, in ``out_dir``: its adapter merged into the base
    (``merge_adapter``), or, when every weight trained (``lora=None``), the trained model copied."""
    if lora is None:
        return publish_model(result.output, out_dir)
    return merge_adapter(base_model_path, result.output, out_dir)


def merge_adapter(base_model_path: str | Path, adapter_dir: str | Path, out_dir: str | Path) -> Path:
    """Fold the LoRA adapter in ``adapter_dir`` into the model at ``base_model_path`` (PEFT
    ``merge_and_unload``) and save the result with the tokenizer (the adapter's when it has one, else
    the base's) in ``out_dir``, written to a temporary directory and renamed into place: the next
    ``M_t``, loadable by ``AutoModelForCausalLM`` and by vLLM. Returns ``out_dir``.

    ``out_dir/merge.json`` names the base and the adapter's digest; when ``out_dir`` already holds this
    same merge it is returned as it is (a resumed pipeline), any other existing ``out_dir`` is refused."""
    _require_llm()
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base_model_path = _check_model_dir(base_model_path, "base_model_path")
    adapter_dir = Path(adapter_dir)
    weights = adapter_dir / "adapter_model.safetensors"
    if not (adapter_dir / "adapter_config.json").is_file() or not weights.is_file():
        raise ValueError(f"adapter_dir {str(adapter_dir)!r}: not a PEFT adapter directory "
                         "(adapter_config.json and adapter_model.safetensors)")
    record = {"base_model_path": str(base_model_path.resolve()),
              "adapter_sha256": hashlib.sha256(weights.read_bytes()).hexdigest()}
    out_dir = Path(out_dir)
    if out_dir.exists():
        done = out_dir / MERGE_FILE
        if done.is_file() and json.loads(done.read_text()) == record:
            return out_dir
        raise ValueError(f"out_dir {str(out_dir)!r} already exists and does not hold this merge; "
                         "choose a new directory")
    with _quiet():
        base = AutoModelForCausalLM.from_pretrained(base_model_path, dtype="auto")
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
        has_tokenizer = (adapter_dir / "tokenizer_config.json").is_file()
        tokenizer = AutoTokenizer.from_pretrained(adapter_dir if has_tokenizer else base_model_path)
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        tmp = out_dir.with_name(f".{out_dir.name}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        merged.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        (tmp / MERGE_FILE).write_text(json.dumps(record, indent=1))
    os.replace(tmp, out_dir)
    return out_dir
