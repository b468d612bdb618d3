"""Command-line options built from settings dataclasses: one source for names, checks, defaults and help."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

import pytest

from resilibench.cli import build_parser, main
from resilibench.cli.common import Parser
from resilibench.cli.options import add_options, option_values
from resilibench.settings import UNIT, Settings, setting


@dataclass(frozen=True)
class Knobs(Settings):
    """A settings object of every kind of field the generator handles."""

    rate: float = setting(0.5, bounds=UNIT, help="a probability")
    steps: int | None = setting(None, bounds=(1, None), metavar="N", help="steps (default: until done)")
    mode: str = setting("fast", choices=("fast", "slow"), help="how")
    names: tuple[str, ...] = setting(("a",), choices=("a", "b", "c"), flag="--name", metavar="NAME")
    loud: bool = setting(False, help="print more")
    lr: float = setting(0.1, above=0, flag=("--learning-rate", "--lr"))


NAMES = ("rate", "steps", "mode", "names", "loud", "lr")


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="knobs")
    add_options(parser, Knobs, NAMES)
    return parser


def test_options_not_given_keep_the_dataclass_defaults():
    args = _parser().parse_args([])
    assert option_values(args, Knobs, NAMES) == {}
    assert Knobs(**option_values(args, Knobs, NAMES)) == Knobs()


def test_given_options_become_typed_field_values():
    args = _parser().parse_args(["--rate", "1", "--steps", "3", "--mode", "slow", "--name", "b", "--name", "c",
                                 "--name", "b", "--loud", "--lr", "0.01"])
    assert Knobs(**option_values(args, Knobs, NAMES)) == Knobs(rate=1.0, steps=3, mode="slow", names=("b", "c"),
                                                               loud=True, lr=0.01)
    assert option_values(_parser().parse_args(["--no-loud", "--learning-rate", "2"]), Knobs, NAMES) == {
        "loud": False, "lr": 2.0}


@pytest.mark.parametrize(("argv", "message"), [
    (["--rate", "1.5"], "argument --rate: rate must be a finite number in [0, 1], got 1.5"),
    (["--rate", "nan"], "argument --rate: rate must be a finite number, got nan"),
    (["--rate", "x"], "argument --rate: expected a number, got 'x'"),
    (["--steps", "0"], "argument --steps: steps must be an integer >= 1, got 0"),
    (["--steps", "2.5"], "argument --steps: expected an integer, got '2.5'"),
    (["--mode", "medium"], "argument --mode: invalid choice: 'medium'"),
    (["--name", "z"], "argument --name: invalid choice: 'z'"),
    (["--lr", "0"], "argument --learning-rate/--lr: lr must be a finite number > 0, got 0.0"),
])
def test_bad_values_are_one_line_errors_naming_option_and_field(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_help_comes_from_the_fields():
    text = " ".join(_parser().format_help().split())
    for piece in ("--rate X a probability (default 0.5)", "--steps N steps (default: until done)",
                  "--mode {fast,slow} how (default fast)", "--name NAME repeatable; one of a, b, c (default a)",
                  "--loud, --no-loud print more (default off)", "--learning-rate X, --lr X (default 0.1)"):
        assert piece in text, piece


def test_train_ppo_options_are_the_config_fields():
    """Every `train ppo` option built from PPOTrainConfig resolves to the field's default when not given and
    refuses a value outside the field's range with the field's own message."""
    from resilibench.cli.train import TRAIN_OPTIONS, _train_config
    from resilibench.policies.ppo.training import PPOTrainConfig

    cfg = _train_config(build_parser().parse_args(["train", "ppo", "--iterations", "5"]))
    defaults = PPOTrainConfig()
    for name in TRAIN_OPTIONS:
        if name not in ("iterations", "time_budget_min"):
            assert getattr(cfg, name) == getattr(defaults, name), name
    assert cfg.iterations == 5 and cfg.time_budget_min is None
    fields = {f.name: f for f in dataclasses.fields(PPOTrainConfig)}
    assert fields["num_learners"].metadata["bounds"] == (0, None)


@pytest.mark.parametrize(("argv", "message"), [
    (["train", "ppo", "--num-learners", "-1"], "--num-learners: num_learners must be an integer >= 0, got -1"),
    (["train", "ppo", "--split", "all"], "--split: invalid choice: 'all'"),
    (["robust", "sft", "m", "--clusters", "c", "--output-dir", "o", "--lora-r", "0"],
     "--lora-r: LoraSettings.r must be an integer >= 1, got 0"),
    (["robust", "scpo", "m", "--clusters", "c", "--output-dir", "o", "--temperature", "0"],
     "--temperature: temperature must be a finite number > 0 (ScPO samples), got 0.0"),
    (["robust", "demo", "--train-clusters", "0"], "--train-clusters: train_clusters must be an integer >= 1"),
    (["robust", "demo", "--search-hits", "-1"], "--search-hits: search_hits must be an integer >= 0"),
    (["robust", "evaluate", "m", "--clusters", "c", "--output-dir", "o", "--search-hits", "-1"],
     "--search-hits: search hits must be an integer >= 0, got '-1'"),
    (["robust", "demo", "--search-scores"], "search_scores needs search_hits >= 1"),
    (["robust", "demo", "--max-length", "0"], "--max-length: "),
    (["robust", "demo", "--clause-dropout", "0.5"], "clause_dropout must be in [0, 1) and needs search_hits_by_clause"),
    (["robust", "demo", "--clause-dropout", "1"], "--clause-dropout: clause_dropout must be a finite number in"),
    (["robust", "demo", "--search-hits", "2", "--search-hits-only", "--search-hits-by-clause"],
     "search_hits_by_clause needs search_hits >= 1 and not search_hits_only"),
    (["robust", "demo", "--tune-retriever"], "DemoSettings.tune_retriever needs search_hits >= 1"),
])
def test_generated_options_of_the_commands_refuse_bad_values(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def _help(command: list[str], capsys) -> str:
    assert main([*command, "--help"]) == 0
    return " ".join(capsys.readouterr().out.split())


def test_robust_help_shows_each_commands_own_defaults(capsys):
    """`robust sft` and `robust scpo` share the trainer options; each shows its settings' defaults."""
    sft, scpo = (_help(["robust", command], capsys) for command in ("sft", "scpo"))
    assert "--lora-r R LoRA rank (default 16)" in sft and "--lora-r R LoRA rank (default 8)" in scpo
    assert "--max-length N tokens (default 2048)" in sft and "--max-length N tokens (default 4096)" in scpo


def test_a_tuple_option_repeats_or_takes_several_values_as_its_field_says():
    @dataclass(frozen=True)
    class Picks(Settings):
        seeds: tuple[int, ...] = setting((0,), bounds=(0, None), several=True, help="seeds")
        names: tuple[str, ...] = setting((), help="names")

    parser = argparse.ArgumentParser()
    add_options(parser, Picks, ("seeds", "names"))
    args = parser.parse_args(["--seeds", "1", "2", "--seeds", "3", "--names", "a", "--names", "b"])
    assert Picks(**option_values(args, Picks, ("seeds", "names"))) == Picks(seeds=(1, 2, 3), names=("a", "b"))
    with pytest.raises(SystemExit):
        parser.parse_args(["--names", "a", "b"])  # a repeatable option takes one value each time
    assert "repeatable" not in parser.format_help().split("--seeds")[2].split("--names")[0]
