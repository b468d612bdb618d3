"""`eval`: LLM agents in the text env (batched harness)."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add this area's subcommands to the ``resilibench`` parser (none yet)."""
