"""`calibrate-failures`: fit the failure model to a call log and write the fitted world config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from resilibench.cli import output_file, positive_int


def _level(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a confidence level in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"expected a confidence level in (0, 1), got {text}")
    return value


# The command's choices, without importing scipy at start-up (envs.real_api.failure_fit.PROCESS_OPTIONS; a test checks).
PROCESS_OPTIONS = ("outages", "rate-limits", "latency")


def cmd_calibrate_failures(args: argparse.Namespace) -> int:
    from resilibench.envs.real_api.failure_fit import calibrate

    log = Path(args.log)
    out = output_file(args.out, "--out") or log.with_name(log.name.split(".")[0] + ".world.yaml")
    fit, config, report = calibrate(log, out, per_tool=args.per_tool, processes=args.processes or (),
                                    level=args.level, min_rows=args.min_calls)
    print(fit.table())
    print(f"\nworld config: {config}\nreport: {report}")
    return 0


def add_commands(commands: Any, parents: dict[str, argparse.ArgumentParser]) -> None:
    """Add ``calibrate-failures`` to the ``resilibench`` parser."""
    calibrate = commands.add_parser(
        "calibrate-failures", help="fit the failure model to a call log; write the fitted world config",
        description="Maximum-likelihood fit of the failure model (the success formula's base and factors, "
        "optionally a base per tool, and failure processes) to a call log (JSON lines, as `resilibench run --call-log` and the HTTP "
        "tool client write them), with confidence intervals and goodness-of-fit checks; see "
        "docs/envs/real_apis.md.")
    calibrate.add_argument("log", metavar="LOG.jsonl", help="the call log")
    calibrate.add_argument("--out", metavar="FILE.yaml",
                           help="the world config to write (default: LOG's name with .world.yaml); the report "
                           "goes beside it as FILE.report.json")
    calibrate.add_argument("--per-tool", action="store_true",
                           help="fit a base success per tool with at least --min-calls calls "
                           "(processes.tool_base_success)")
    calibrate.add_argument("--processes", nargs="+", choices=PROCESS_OPTIONS, metavar="PROCESS",
                           help=f"also fit these failure processes: {', '.join(PROCESS_OPTIONS)} (the outage "
                           "chain, the rate-limit probability and wait, the latency distribution and timeout)")
    calibrate.add_argument("--level", type=_level, default=0.95, help="confidence level (default 0.95)")
    calibrate.add_argument("--min-calls", type=positive_int, default=30, metavar="N",
                           help="fewest informing calls that identify a parameter (default 30); a parameter "
                           "with fewer keeps its default, marked in the report")
    calibrate.set_defaults(func=cmd_calibrate_failures)
