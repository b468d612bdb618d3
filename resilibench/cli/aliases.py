"""The earlier spellings of commands and options, kept working and kept out of ``--help``: ``current(argv)``
rewrites them to today's before parsing, so an old command line runs the very same code (the table of
both is in docs/cli.md)."""

from __future__ import annotations

from collections.abc import Sequence

# An earlier command word -> today's command and action.
COMMANDS: dict[str, tuple[str, ...]] = {
    "serve-mcp": ("serve", "mcp"),
    "serve-tools": ("serve", "tools"),
    "calibrate-failures": ("failures", "fit"),
    "eval-policy": ("eval", "policy"),
}
# Today's command and action -> {an earlier option: today's}.
OPTIONS: dict[tuple[str, ...], dict[str, str]] = {
    ("failures", "fit"): {"--out": "--output"},
    ("robust", "clusters"): {"--task-types": "--task-type"},
    ("train", "grpo"): {"--time-budget-min": "--time-budget"},
}
HELP = ("-h", "--help")


def current(argv: Sequence[str]) -> list[str]:
    """``argv`` in today's spelling. ``eval`` followed by an option (other than --help) is the LLM-agent
    evaluation, `eval agent`, as it was before `eval policy` joined it."""
    words = list(argv)
    if words and words[0] in COMMANDS:
        words[:1] = COMMANDS[words[0]]
    elif words[:1] == ["eval"] and len(words) > 1 and words[1].startswith("-") and words[1] not in HELP:
        words.insert(1, "agent")
    for command, renamed in OPTIONS.items():
        if tuple(words[:len(command)]) == command:
            words[len(command):] = [_option(word, renamed) for word in words[len(command):]]
    return words


def _option(word: str, renamed: dict[str, str]) -> str:
    """``word`` with an earlier option name replaced (``--out FILE`` and ``--out=FILE`` alike)."""
    name, equals, value = word.partition("=")
    return renamed[name] + equals + value if name in renamed else word
