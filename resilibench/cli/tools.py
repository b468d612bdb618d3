"""`tools`: the 30 tools as a table, or the registry's JSON export."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from resilibench.cli.common import output_file


def cmd_tools(args: argparse.Namespace) -> int:
    from resilibench.console import format_table
    from resilibench.core.registry import default_registry
    from resilibench.results import write_text_atomic

    output_file(args.output)
    registry = default_registry()
    if args.json or args.output:
        text = registry.to_json() + "\n"
        if args.output:
            write_text_atomic(args.output, text)
            print(f"wrote the registry of {len(registry)} tools to {args.output}")
        else:
            sys.stdout.write(text)
        return 0
    rows = [(t.name, t.category, t.role or "-", ", ".join(t.dependencies) or "-") for t in registry.tools]
    print(format_table(("name", "category", "role", "dependencies"), rows))
    return 0


def _arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the registry JSON export")
    parser.add_argument("--output", metavar="FILE", help="write the registry JSON to FILE (implies --json)")
    parser.set_defaults(func=cmd_tools)


def add_commands(commands: Any) -> None:
    """Add ``tools`` to the ``resilibench`` parser."""
    commands.add_parser("tools", help="list the 30 tools, or export the registry as JSON", arguments=_arguments)
