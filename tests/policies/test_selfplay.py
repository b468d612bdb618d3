"""Self-play on adversarial_v0: the masked module, the paired evaluation, and a real RLlib run."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("ray.rllib")
torch = pytest.importorskip("torch")

from resilibench.envs.adversarial.game import ADVERSARY, EXECUTOR, NO_FLAW  # noqa: E402
from resilibench.envs.adversarial_v0 import parallel_env  # noqa: E402
from resilibench.policies import selfplay  # noqa: E402
from resilibench.policies.selfplay import SelfPlayConfig, evaluate, run_selfplay  # noqa: E402

SMALL = {"task_types": ("basic_file_processing",), "matcher": "lexical", "eval_episodes": 12}


def follow_hint(observation: dict) -> int:
    """The literal plan follower, read off the executor's observation (its last 30 floats)."""
    hint = np.flatnonzero(observation["observation"][-30:])
    return int(hint[0]) if len(hint) else 30


def first_flaw(observation: dict) -> int:
    legal = np.flatnonzero(observation["action_mask"])
    return int(legal[1]) if len(legal) > 1 else NO_FLAW


def test_evaluation_is_paired_and_deterministic():
    cfg = SelfPlayConfig(**SMALL)
    result = evaluate(first_flaw, follow_hint, cfg)
    assert result == evaluate(first_flaw, follow_hint, cfg)
    # An executor that follows its plan is the literal follower: same episodes, same outcomes.
    assert result["executor_clean"] == result["follower_clean"]
    assert result["executor_flawed"] == result["follower_flawed"]
    assert result["follower_clean"] >= 0.75  # following the optimal plan mostly succeeds
    assert sum(result["adversary_choices"].values()) == cfg.eval_episodes * cfg.budget
    assert "no flaw" not in result["adversary_choices"]
    # Flaws hurt the literal follower (same tasks and random streams as the clean episodes).
    assert result["follower_flawed"] < result["follower_clean"]


def test_masked_module_masks_and_ignores_idle_rows():
    env = parallel_env(task_types=["basic_file_processing"], matcher="lexical")
    from ray.rllib.core.columns import Columns
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    module = RLModuleSpec(module_class=selfplay._module_class(), observation_space=env.observation_space(EXECUTOR),
                          action_space=env.action_space(EXECUTOR), model_config={"hiddens": [16]}).build()
    env.reset(seed=0)
    waiting = env.game.observe(EXECUTOR)  # the adversary's turn: the executor's mask is all zeros
    env.step({ADVERSARY: NO_FLAW})
    on_turn = env.game.observe(EXECUTOR)
    assert not waiting["action_mask"].any() and on_turn["action_mask"].any()
    batch = {k: torch.as_tensor(np.stack([on_turn[k], waiting[k]])) for k in on_turn}
    logits = module.forward_train({Columns.OBS: batch})[Columns.ACTION_DIST_INPUTS]
    legal = torch.as_tensor(on_turn["action_mask"]) > 0
    assert legal[logits[0].argmax()] and torch.all(logits[0][~legal] == torch.finfo(logits.dtype).min)
    assert torch.all(logits[1] == 0)  # the idle row: uniform
    logits[1].logsumexp(-1).backward()
    assert all(p.grad is None or torch.all(p.grad == 0) for p in module.parameters())
    values = module.compute_values({Columns.OBS: batch})
    assert values.shape == (2,)


def test_config_and_cli_errors():
    with pytest.raises(ValueError, match="iterations"):
        SelfPlayConfig(iterations=-1)
    with pytest.raises(ValueError, match="train_batch_size"):
        SelfPlayConfig(train_batch_size=0)
    with pytest.raises(SystemExit) as exc:
        selfplay.main(["--iterations", "-2"])
    assert exc.value.code == 2


@pytest.mark.slow
def test_selfplay_trains_and_reports_before_and_after():
    cfg = SelfPlayConfig(iterations=2, train_batch_size=300, minibatch_size=150, num_epochs=2, **SMALL)
    result = run_selfplay(cfg, progress=False)
    assert len(result.iterations) == 2
    assert 0 < result.iterations[0]["env_steps"] < result.iterations[1]["env_steps"]
    for stage in (result.before, result.after):
        for key in ("executor_clean", "executor_flawed", "follower_clean", "follower_flawed"):
            assert 0.0 <= stage[key] <= 1.0
        assert stage["follower_clean"] >= 0.75
        assert sum(stage["adversary_choices"].values()) == cfg.eval_episodes
    for curve in result.iterations:  # zero-sum returns
        assert curve["executor_return"] == pytest.approx(-curve["adversary_return"])
    report = selfplay.format_report(result)
    assert "before training" in report and "after training" in report and "executor clean" in report
