"""`train ppo` and `eval-policy`: RLlib PPO planners."""

from __future__ import annotations

import argparse
from typing import Any


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add this area's subcommands to the ``resilibench`` parser (none yet)."""
