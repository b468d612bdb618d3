"""`failures fit`: fit the failure model to a call log and write the fitted world config."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from resilibench.cli.common import add_group, fraction, output_file, positive_int


def cmd_fit(args: argparse.Namespace) -> int:
    from resilibench.envs.real_api.failure_fit import calibrate

    log = Path(args.log)
    out = output_file(args.output) or log.with_name(log.name.split(".")[0] + ".world.yaml")
    fit, config, report = calibrate(log, out, per_tool=args.per_tool, processes=args.processes or (),
                                    level=args.level, min_rows=args.min_calls)
    print(fit.table())
    print(f"\nworld config: {config}\nreport: {report}")
    return 0


def _fit_arguments(parser: argparse.ArgumentParser) -> None:
    from resilibench.envs.real_api.failure_fit import PROCESS_OPTIONS

    parser.add_argument("log", metavar="LOG.jsonl", help="the call log")
    parser.add_argument("--output", metavar="FILE.yaml",
                        help="the world config to write (default: LOG's name with .world.yaml); the report "
                        "goes beside it as FILE.report.json")
    parser.add_argument("--per-tool", action="store_true",
                        help="fit a base success per tool with at least --min-calls calls "
                        "(processes.tool_base_success)")
    parser.add_argument("--processes", nargs="+", choices=PROCESS_OPTIONS, metavar="PROCESS",
                        help=f"also fit these failure processes: {', '.join(PROCESS_OPTIONS)} (the outage "
                        "chain, the rate-limit probability and wait, the latency distribution and timeout)")
    parser.add_argument("--level", type=fraction(include_one=False), default=0.95, metavar="X",
                        help="confidence level in (0, 1) (default 0.95)")
    parser.add_argument("--min-calls", type=positive_int, default=30, metavar="N",
                        help="fewest informing calls that identify a parameter (default 30); a parameter "
                        "with fewer keeps its default, marked in the report")
    parser.set_defaults(func=cmd_fit)


def add_commands(commands: Any) -> None:
    """Add ``failures fit`` to the ``resilibench`` parser."""
    add_group(commands, "failures", "fit the failure model to a call log", {
        "fit": ("fit the failure model to a call log; write the fitted world config", _fit_arguments,
                "Maximum-likelihood fit of the failure model (the success formula's base and factors, optionally a "
                "base per tool, and failure processes) to a call log (JSON lines, as `resilibench run --call-log` "
                "and the HTTP tool client write them), with confidence intervals and goodness-of-fit checks; see "
                "docs/envs/real_apis.md."),
    })
