"""The ``resilibench`` command line: one module per command group (docs/cli.md), what they share in
``cli.common``.

``main(argv)`` returns the exit status (0 ok, 2 bad arguments or input, 1 a read or write the system refused,
130 interrupted) and never raises for bad input: every error is one line naming the option and the accepted
values. Building the parser imports no command's library code: each command adds its options when it runs.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from resilibench.cli import bounds, breaker, failures, metrics, proxy, robust, run, serve, tasks, tools, train
from resilibench.cli import eval as evaluation  # the `eval` group (its module is named after it)
from resilibench.cli.aliases import current
from resilibench.cli.common import PROG, CliError, Parser, error_text
from resilibench.errors import InputError, RunInterrupted
from resilibench.version import __version__

# In the order `resilibench --help` lists them.
COMMAND_MODULES = (tools, tasks, bounds, run, evaluation, serve, proxy, failures, metrics, train, robust, breaker)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PROG, description="ResiliBench: tools under failure, task libraries, exact bounds, "
                    "benchmarks of planners, policies and LLM agents.")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=Parser)
    for module in COMMAND_MODULES:
        module.add_commands(commands)
    return parser


def _print_warning(message: Warning | str, *_: Any, **__: Any) -> None:
    print(f"warning: {message}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status. Warnings are printed as one line each."""
    with warnings.catch_warnings():
        warnings.showwarning = _print_warning
        return _main(sys.argv[1:] if argv is None else argv)


def _main(argv: Sequence[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(current(argv))
        return int(args.func(args) or 0)
    except SystemExit as exc:  # argparse: --help, --version, usage errors
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    except CliError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except InputError as exc:  # the library's own: its field becomes the option's name
        print(f"{PROG}: error: {error_text(exc)}", file=sys.stderr)
        return 2
    except RunInterrupted as exc:  # the run directory is resumable
        print(f"\n{PROG}: {exc}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `resilibench tasks list | head`
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 0
    except OSError as exc:  # the system refused a read or write: a full disk, a read-only directory...
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1
