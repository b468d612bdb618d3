"""SFT and weighted DPO (the ScPO loss) with real TRL trainer steps on a tiny locally built model."""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
import warnings

import pytest
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401  (fixture)

torch = pytest.importorskip("torch")
pytest.importorskip("trl")
pytest.importorskip("peft")

from peft import PeftModel  # noqa: E402
from safetensors.torch import load_file  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402

from resilibench.robust_train.training import (  # noqa: E402
    LoraSettings,
    PreferenceSettings,
    SFTSettings,
    WeightedDPOTrainer,
    make_preference_trainer,
    merge_adapter,
    train_preferences,
    train_sft,
    trained_model,
)

# PEFT reads a renamed transformers property on every adapter load.
pytestmark = [pytest.mark.usefixtures("torch_one_thread"),
              pytest.mark.filterwarnings("ignore:.*is_gradient_checkpointing:FutureWarning")]

WORKFLOWS = ['{"nodes": ["file_operations_reader", "data_processing_parser"]}',
             '{"nodes": ["network_http_get"], "edges": []}',
             '{"nodes": ["file_operations_reader"]}']


def sft_rows(n: int = 4) -> list[dict]:
    return [{"prompt": [{"role": "system", "content": "Plan a workflow as JSON."},
                        {"role": "user", "content": f"Task {i}: read the input file and parse it."}],
             "completion": [{"role": "assistant", "content": WORKFLOWS[i % len(WORKFLOWS)]}]} for i in range(n)]


def preference_rows(weights=(0.5, 2.0, 1.0)) -> list[dict]:
    # Chosen and rejected of different lengths, so collated batches carry padding.
    return [{"prompt": [{"role": "user", "content": f"Task {i}: fetch a page, then store it."}],
             "chosen": [{"role": "assistant", "content": WORKFLOWS[i % 3]}],
             "rejected": [{"role": "assistant", "content": '{"nodes": []}' * (i + 1)}],
             "weight": w} for i, w in enumerate(weights)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return build_tiny_lm(tmp_path_factory.mktemp("model") / "tiny")


def digest(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def completion_nll(model, tokenizer, rows) -> float:
    """Mean token NLL of each row's completion given its prompt, averaged over rows (the model's own)."""
    losses = []
    with torch.no_grad():
        for row in rows:
            prompt = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
            full = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tokenize=False)
            ids = tokenizer(full, add_special_tokens=False, return_tensors="pt").input_ids
            n_prompt = len(tokenizer(prompt, add_special_tokens=False).input_ids)
            labels = ids.clone()
            labels[:, :n_prompt] = -100
            losses.append(model(input_ids=ids, labels=labels).loss.item())
    return sum(losses) / len(losses)


# --- SFT -----------------------------------------------------------------------------------------------


def test_sft_lora_lowers_completion_loss_and_trains_only_the_adapter(tiny, tmp_path):
    rows = sft_rows()
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    base = AutoModelForCausalLM.from_pretrained(tiny)
    before = completion_nll(base, tokenizer, rows)
    base_weights = digest(tiny / "model.safetensors")
    settings = SFTSettings(max_steps=8, learning_rate=5e-3, batch_size=2, gradient_accumulation_steps=1,
                           warmup_ratio=0.0, logging_steps=1)

    result = train_sft(tiny, rows, tmp_path / "sft", settings, progress=False)

    assert (result.steps, result.resumed) == (8, False)
    assert result.output == tmp_path / "sft" / "final"
    assert [entry["step"] for entry in result.log if "loss" in entry] == list(range(1, 9))
    assert math.isfinite(result.train_loss)
    assert digest(tiny / "model.safetensors") == base_weights  # the base model is untouched
    saved = load_file(result.output / "adapter_model.safetensors")
    assert saved and all("lora_A" in key or "lora_B" in key for key in saved)
    assert any(t.abs().max() > 0 for key, t in saved.items() if "lora_B" in key)  # moved from the zero init

    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), result.output)
    after = completion_nll(adapted, AutoTokenizer.from_pretrained(result.output), rows)
    assert after < before - 0.5, (before, after)
    ids = tokenizer("Task 0: read the input file", return_tensors="pt").input_ids
    with torch.no_grad(), adapted.disable_adapter():
        assert torch.equal(adapted(ids).logits, base(ids).logits)  # only LoRA weights changed

    again = train_sft(tiny, rows, tmp_path / "sft", settings, progress=False)  # finished: no training
    assert (again.output, again.steps, again.train_loss, again.resumed) == (
        result.output, 8, result.train_loss, True)
    with pytest.raises(ValueError, match="settings"):
        train_sft(tiny, rows, tmp_path / "sft", SFTSettings(max_steps=9), progress=False)
    with pytest.raises(ValueError, match="rows_sha256"):
        train_sft(tiny, rows[:3], tmp_path / "sft", settings, progress=False)


@pytest.mark.slow
def test_sft_full_finetune(tiny, tmp_path):
    rows = sft_rows(2)
    tokenizer = AutoTokenizer.from_pretrained(tiny)
    before = completion_nll(AutoModelForCausalLM.from_pretrained(tiny), tokenizer, rows)
    settings = SFTSettings(max_steps=3, learning_rate=3e-3, batch_size=2, gradient_accumulation_steps=1,
                           warmup_ratio=0.0, lora=None)
    result = train_sft(tiny, rows, tmp_path / "full", settings, progress=False)
    assert not (result.output / "adapter_config.json").exists()
    model = AutoModelForCausalLM.from_pretrained(result.output)
    assert completion_nll(model, AutoTokenizer.from_pretrained(result.output), rows) < before - 0.3


class StopAt(TrainerCallback):
    """Simulates a crash at a step (after the previous step's checkpoint was written)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            raise KeyboardInterrupt(f"stopped at step {self.step}")


@pytest.mark.slow
def test_sft_resume_continues_from_the_checkpoint(tiny, tmp_path):
    rows = sft_rows()
    settings = SFTSettings(max_steps=4, save_steps=2, learning_rate=5e-3, batch_size=2,
                           gradient_accumulation_steps=1, warmup_ratio=0.0, logging_steps=1)
    with pytest.raises(KeyboardInterrupt):
        train_sft(tiny, rows, tmp_path / "cut", settings, progress=False, callbacks=[StopAt(3)])
    assert (tmp_path / "cut" / "checkpoints" / "checkpoint-2").is_dir()
    assert not (tmp_path / "cut" / "final").exists()

    resumed = train_sft(tiny, rows, tmp_path / "cut", settings, progress=False)
    straight = train_sft(tiny, rows, tmp_path / "straight", settings, progress=False)
    assert (resumed.steps, resumed.resumed, straight.resumed) == (4, True, False)
    # Steps 1-2 come from the checkpoint's history, 3-4 were trained after resuming.
    assert [e["step"] for e in resumed.log if "loss" in e] == [1, 2, 3, 4]
    a = load_file(resumed.output / "adapter_model.safetensors")
    b = load_file(straight.output / "adapter_model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


# --- weighted DPO --------------------------------------------------------------------------------------


def sequence_logps(model, batch) -> torch.Tensor:
    """Per-row summed log-probability of the completion tokens, and their count, from the model's logits."""
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    logps = logits[:, :-1].log_softmax(-1).gather(-1, batch["input_ids"][:, 1:, None])[..., 0]
    mask = batch["completion_mask"][:, 1:].float()
    return (logps * mask).sum(1), mask.sum(1)


def expected_scpo_loss(policy, reference, batch, weights, beta: float, alpha: float) -> float:
    """RobustFlow eq. 13 from scratch: mean over examples of w * (DPO sigmoid + alpha * mean NLL(chosen))."""
    logps, counts = sequence_logps(policy, batch)
    ref_logps, _ = sequence_logps(reference, batch)
    n = len(weights)
    ratio = logps - ref_logps
    dpo = -torch.nn.functional.logsigmoid(beta * (ratio[:n] - ratio[n:]))
    nll = -logps[:n] / counts[:n]
    return float((torch.tensor(weights) * (dpo + alpha * nll)).mean())


def collate(trainer, indices, weights):
    examples = [dict(trainer.train_dataset[i], weight=w) for i, w in zip(indices, weights, strict=True)]
    return trainer.data_collator(examples)


def test_weighted_dpo_loss_is_eq13_against_the_unadapted_model(tiny, tmp_path):
    settings = PreferenceSettings(batch_size=3, gradient_accumulation_steps=1, max_steps=1, warmup_ratio=0.0,
                                  learning_rate=2e-2, logging_steps=1)
    trainer = make_preference_trainer(tiny, preference_rows(), tmp_path / "dpo", settings, progress=False)
    assert isinstance(trainer, WeightedDPOTrainer)
    reference = AutoModelForCausalLM.from_pretrained(tiny).eval()
    batch = next(iter(trainer.get_train_dataloader()))  # the weights survive column pruning and collation
    weights = batch["weight"].tolist()
    assert sorted(weights) == [0.5, 1.0, 2.0]

    # Before any update the adapter is zero: the DPO term is log 2 for every pair.
    loss = trainer.compute_loss(trainer.model, dict(batch)).item()
    assert loss == pytest.approx(expected_scpo_loss(trainer.model, reference, batch, weights, 1.0, 0.1), rel=1e-5)
    no_nll = make_preference_trainer(tiny, preference_rows(), tmp_path / "dpo0",
                                     PreferenceSettings(nll_alpha=0.0, batch_size=3), progress=False)
    assert no_nll.compute_loss(no_nll.model, dict(batch)).item() == pytest.approx(
        sum(weights) / 3 * math.log(2), rel=1e-5)

    trainer.train()  # one real optimizer step moves the adapter away from the reference
    trainer.model.eval()
    loss = trainer.compute_loss(trainer.model, dict(batch)).item()
    policy_logps = sequence_logps(trainer.model, batch)[0]
    reference_logps = sequence_logps(reference, batch)[0]
    assert (policy_logps - reference_logps).abs().max() > 1e-2
    with trainer.model.disable_adapter():  # the reference: M_t itself
        assert sequence_logps(trainer.model, batch)[0].tolist() == pytest.approx(reference_logps.tolist(), rel=1e-5)
    assert loss == pytest.approx(expected_scpo_loss(trainer.model, reference, batch, weights, 1.0, 0.1), rel=1e-5)
    for w in ([1.0, 1.0, 1.0], [3.0, 0.0, 0.25]):
        assert trainer.compute_loss(trainer.model, dict(batch, weight=torch.tensor(w))).item() == pytest.approx(
            expected_scpo_loss(trainer.model, reference, batch, w, 1.0, 0.1), rel=1e-5)
    # Evaluation asks for the outputs too: the same weighted loss, with TRL's outputs beside it.
    with warnings.catch_warnings():  # TRL deprecates the outputs of compute_loss (FutureWarning)
        warnings.simplefilter("ignore", FutureWarning)
        with_outputs, outputs = trainer.compute_loss(trainer.model, dict(batch), return_outputs=True)
    assert with_outputs.item() == pytest.approx(loss, rel=1e-5) and outputs is not None


def lora_grads(trainer, batch) -> list[torch.Tensor]:
    trainer.model.zero_grad()
    trainer.compute_loss(trainer.model, dict(batch)).backward()
    return [p.grad.clone() for name, p in trainer.model.named_parameters() if p.requires_grad]


def test_weights_scale_gradients_and_zero_weight_gives_none(tiny, tmp_path):
    settings = PreferenceSettings(batch_size=2, gradient_accumulation_steps=1)
    trainer = make_preference_trainer(tiny, preference_rows(), tmp_path / "dpo", settings, progress=False)
    # Move the adapter off zero so that both LoRA matrices get gradients.
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1, generator=torch.Generator().manual_seed(0))
    trainer.model.train()
    zero = lora_grads(trainer, collate(trainer, [0], [0.0]))
    assert zero and all(g.abs().max() == 0 for g in zero)
    alone = lora_grads(trainer, collate(trainer, [1], [1.0]))
    mixed = lora_grads(trainer, collate(trainer, [0, 1], [0.0, 2.0]))  # (0 * l0 + 2 * l1) / 2 = l1
    assert any(g.abs().max() > 0 for g in alone)
    assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-7) for a, b in zip(alone, mixed, strict=True))


def test_train_preferences_step_moves_adapter_and_merge_matches(tiny, tmp_path):
    settings = PreferenceSettings(batch_size=1, gradient_accumulation_steps=2, max_steps=2, warmup_ratio=0.0,
                                  learning_rate=2e-2, logging_steps=1, lora=LoraSettings(r=4, alpha=8))
    result = train_preferences(tiny, preference_rows(), tmp_path / "scpo", settings, progress=False)
    assert (result.steps, result.resumed) == (2, False)
    first = result.log[0]
    assert first["step"] == 1 and first["rewards/chosen"] == 0.0 and first["rewards/rejected"] == 0.0
    assert result.log[1]["rewards/margins"] != 0.0
    config = json.loads((result.output / "adapter_config.json").read_text())
    assert config["r"] == 4
    saved = load_file(result.output / "adapter_model.safetensors")
    assert any(t.abs().max() > 0 for key, t in saved.items() if "lora_B" in key)

    merged_dir = merge_adapter(tiny, result.output, tmp_path / "m1")
    merged = AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    adapted = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny), result.output).eval()
    tokenizer = AutoTokenizer.from_pretrained(merged_dir)
    text = tokenizer.apply_chat_template(preference_rows()[0]["prompt"], add_generation_prompt=True, tokenize=False)
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt").input_ids
    kwargs = {"max_new_tokens": 12, "do_sample": False, "pad_token_id": tokenizer.pad_token_id}
    with torch.no_grad():
        assert torch.equal(merged.generate(ids, **kwargs), adapted.generate(ids, **kwargs))
        assert torch.allclose(merged(ids).logits, adapted(ids).logits, atol=1e-4)
        assert not torch.allclose(merged(ids).logits, AutoModelForCausalLM.from_pretrained(tiny)(ids).logits,
                                  atol=1e-4)
    assert merge_adapter(tiny, result.output, merged_dir) == merged_dir  # done already: returned as is
    with pytest.raises(ValueError, match="already exists"):
        merge_adapter(tiny, result.output, tmp_path / "scpo")


def test_full_finetune_preferences_move_every_weight_and_publish_the_model(tiny, tmp_path):
    """``lora=None``: DPO trains every weight against a frozen copy; ``trained_model`` publishes the
    trained model itself (no adapter to merge), and publishing again replaces the copy."""
    settings = PreferenceSettings(batch_size=3, gradient_accumulation_steps=1, max_steps=1, warmup_ratio=0.0,
                                  learning_rate=2e-2, lora=None)
    result = train_preferences(tiny, preference_rows(), tmp_path / "scpo", settings, progress=False)
    assert not (result.output / "adapter_config.json").exists()
    model_dir = trained_model(tiny, result, None, tmp_path / "model")
    before = load_file(tiny / "model.safetensors")
    after = load_file(model_dir / "model.safetensors")
    assert before.keys() == after.keys()
    assert all(not torch.equal(before[k], after[k]) for k in before if k.endswith("q_proj.weight"))
    AutoTokenizer.from_pretrained(model_dir)  # the tokenizer travels with it
    (model_dir / "stale").write_text("left by an interrupted run")
    assert trained_model(tiny, result, None, model_dir) == model_dir and not (model_dir / "stale").exists()
    assert digest(model_dir / "model.safetensors") == digest(result.output / "model.safetensors")


# --- input checks --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("rows", "message"), [
    ([], "non-empty"),
    ([{"prompt": [{"role": "user", "content": "x"}], "chosen": [{"role": "assistant", "content": "a"}],
       "weight": 1.0}], r"rows\[0\] is missing 'rejected'"),
    (preference_rows((1.0, -0.5)), r"rows\[1\]\['weight'\] must be a finite number >= 0"),
    ([dict(preference_rows()[0], chosen=[{"role": "user", "content": "a"}])], r"rows\[0\]\['chosen'\]\[0\]"),
])
def test_bad_preference_rows(tiny, tmp_path, rows, message):
    with pytest.raises(ValueError, match=message):
        train_preferences(tiny, rows, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_bad_model_paths_settings_and_sft_rows(tiny, tmp_path):
    with pytest.raises(ValueError, match="model_path .*no config.json"):
        train_sft(tmp_path / "nowhere", sft_rows(), tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match=r"rows\[1\] is missing 'completion'"):
        train_sft(tiny, [sft_rows()[0], {"prompt": sft_rows()[0]["prompt"]}], tmp_path / "out", progress=False)
    with pytest.raises(ValueError, match="adapter_dir"):
        merge_adapter(tiny, tmp_path, tmp_path / "merged")
    with pytest.raises(ValueError, match="SFTSettings.batch_size"):
        SFTSettings(batch_size=0)
    with pytest.raises(ValueError, match="PreferenceSettings.nll_alpha"):
        PreferenceSettings(nll_alpha=-0.1)
    with pytest.raises(ValueError, match="LoraSettings.target_modules"):
        LoraSettings(target_modules=())


def test_import_is_light():
    code = "import sys, resilibench.robust_train.training; print(sorted({'trl', 'peft', 'torch'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
