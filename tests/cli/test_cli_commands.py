"""The command set: every command's help, the earlier spellings as hidden aliases, and what starting a
command imports."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from resilibench.cli import build_parser, main
from resilibench.cli.aliases import COMMANDS, OPTIONS, current

# Every command line the parser accepts, as command and action.
COMMAND_LINES = [["tools"], ["tasks", "generate"], ["tasks", "stats"], ["tasks", "show"], ["tasks", "list"],
                 ["bounds"], ["run"], ["eval", "agent"], ["eval", "policy"], ["serve", "mcp"], ["serve", "tools"],
                 ["failures", "fit"], ["metrics", "score"], ["metrics", "calibrate"], ["train", "ppo"],
                 ["train", "grpo"], ["robust", "clusters"], ["robust", "scratch"], ["robust", "sft"],
                 ["robust", "scpo"], ["robust", "evaluate"], ["robust", "demo"], ["breaker"]]
EARLIER = [*COMMANDS, *(old for renamed in OPTIONS.values() for old in renamed)]
# Each earlier spelling and today's, with the arguments that make a complete command line.
ALIASES = [
    (["serve-mcp", "--transport", "http", "--port", "0"], ["serve", "mcp", "--transport", "http", "--port", "0"]),
    (["serve-tools", "--port", "0", "--seed", "3"], ["serve", "tools", "--port", "0", "--seed", "3"]),
    (["calibrate-failures", "calls.jsonl", "--out", "w.yaml"], ["failures", "fit", "calls.jsonl", "--output", "w.yaml"]),
    (["calibrate-failures", "calls.jsonl", "--out=w.yaml"], ["failures", "fit", "calls.jsonl", "--output=w.yaml"]),
    (["eval-policy", "runs/ppo", "--seeds", "0"], ["eval", "policy", "runs/ppo", "--seeds", "0"]),
    (["eval", "--agent", "scripted:plan", "--limit", "2"], ["eval", "agent", "--agent", "scripted:plan", "--limit", "2"]),
    (["robust", "clusters", "--output-dir", "c", "--task-types", "basic_file_processing"],
     ["robust", "clusters", "--output-dir", "c", "--task-type", "basic_file_processing"]),
    (["train", "grpo", "--model", "m", "--time-budget-min", "5"], ["train", "grpo", "--model", "m", "--time-budget", "5"]),
]


def _help(argv: list[str], capsys) -> str:
    assert main([*argv, "--help"]) == 0, argv
    return capsys.readouterr().out


def test_every_command_has_help_without_earlier_spellings(capsys):
    groups = sorted({argv[0] for argv in COMMAND_LINES if len(argv) == 2})
    texts = {" ".join(argv): _help(argv, capsys) for argv in [[], *([group] for group in groups), *COMMAND_LINES]}
    for argv in COMMAND_LINES:  # each command is listed in the help of its group (or of the whole)
        assert re.search(rf"^    {argv[-1]}\s", texts[" ".join(argv[:-1])], re.MULTILINE), argv
    for command, text in texts.items():
        for old in EARLIER:
            assert not re.search(rf"(?<![\w-]){old}(?![\w-])", text), (command, old)
        assert "default: paper values" not in text and "cli_" not in text, command


@pytest.mark.parametrize(("old", "new"), ALIASES, ids=[" ".join(old) for old, _ in ALIASES])
def test_an_earlier_spelling_parses_as_todays(old, new):
    """An alias is the same command line: the same function with the same arguments."""
    assert current(old) == new
    parser = build_parser()
    assert vars(parser.parse_args(current(old))) == vars(build_parser().parse_args(new))


def test_an_earlier_spelling_runs_as_todays(tmp_path, capsys):
    """`calibrate-failures --out` is `failures fit --output`: the same check, named by today's option."""
    for argv in (["calibrate-failures", "calls.jsonl", "--out", str(tmp_path)],
                 ["failures", "fit", "calls.jsonl", "--output", str(tmp_path)]):
        assert main(argv) == 2
        assert capsys.readouterr().err == f"resilibench: error: --output: {tmp_path} is a directory; give the path of " \
                                          "a file\n"


def test_eval_alone_or_with_help_is_the_group():
    assert current(["eval", "--help"]) == ["eval", "--help"]
    assert current(["eval", "policy", "--seeds", "0"]) == ["eval", "policy", "--seeds", "0"]


# Imported only by the commands that need them.
HEAVY = ("mcp", "pydantic", "torch", "ray", "transformers", "starlette", "uvicorn", "httpx2", "scipy", "trl")


def _imported(code: str) -> list[str]:
    """The HEAVY packages a fresh interpreter has imported after running ``code``."""
    script = f"import sys, json\n{code}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    return json.loads(result.stdout.splitlines()[-1])


@pytest.mark.parametrize("argv", [None, ["--help"], ["run", "--help"], ["tools"], ["serve", "tools", "--help"]])
def test_starting_a_command_imports_only_what_it_needs(argv):
    code = ("from resilibench.cli import build_parser\nbuild_parser()" if argv is None else
            f"from resilibench.cli import main\ntry:\n    main({argv!r})\nexcept SystemExit:\n    pass")
    assert _imported(code) == []


def test_a_planner_run_imports_no_http_or_mcp_stack(tmp_path):
    argv = ["run", "--planners", "optimal", "--limit", "1", "--seeds", "0", "--output-dir", str(tmp_path / "run")]
    assert _imported(f"from resilibench.cli import main\nassert main({argv!r}) == 0") == []
