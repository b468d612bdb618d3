"""Run pyright on the package and fail on any unresolved import or on a type error not in the baseline.

    .venv/bin/python .ci/typecheck.py                   # the CI check
    .venv/bin/python .ci/typecheck.py --write-baseline  # after fixing errors: record what is left

The baseline (.ci/pyright-baseline.json) counts the errors pyright reported when the check was introduced,
by (file, rule, message) and not by line, so that editing a file does not shift them. A new error, or one
more of a known kind in a file, fails the check; fixed ones are reported so the baseline can shrink.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / ".ci" / "pyright-baseline.json"
UNRESOLVED = ("reportMissingImports", "reportMissingModuleSource")
# Modules of extras CI does not install: vllm (CUDA machines only) and grpc (ray[client], the cluster extra).
NOT_INSTALLED = ("vllm", "grpc")


def run_pyright() -> list[dict]:
    """pyright's diagnostics on the package (configured in pyproject.toml's [tool.pyright])."""
    pyright = shutil.which("pyright", path=str(Path(sys.executable).parent)) or "pyright"
    done = subprocess.run([pyright, "--outputjson"], cwd=ROOT, capture_output=True, text=True)
    try:
        return json.loads(done.stdout)["generalDiagnostics"]
    except (ValueError, KeyError):
        sys.exit(f"pyright did not report (exit {done.returncode}): {done.stderr.strip() or done.stdout[:500]}")


def unresolved(diagnostics: list[dict]) -> list[dict]:
    """Imports pyright cannot resolve, other than modules of extras CI does not install."""
    return [d for d in diagnostics if d.get("rule") in UNRESOLVED
            and not any(f'"{name}' in d["message"] for name in NOT_INSTALLED)]


def error_counts(diagnostics: list[dict]) -> Counter[str]:
    """Errors keyed 'file | rule | message' (first line of the message)."""
    return Counter(f"{Path(d['file']).relative_to(ROOT)} | {d.get('rule', '-')} | {d['message'].splitlines()[0]}"
                   for d in diagnostics if d["severity"] == "error" and d.get("rule") not in UNRESOLVED)


def where(d: dict) -> str:
    return f"{Path(d['file']).relative_to(ROOT)}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-baseline", action="store_true", help="record the present errors as the baseline")
    args = parser.parse_args()
    diagnostics = run_pyright()
    missing = unresolved(diagnostics)
    for d in missing:
        print(f"unresolved import: {where(d)}")
    counts = error_counts(diagnostics)
    if args.write_baseline:
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {BASELINE.relative_to(ROOT)}: {sum(counts.values())} errors of {len(counts)} kinds")
        return 1 if missing else 0
    baseline = Counter(json.loads(BASELINE.read_text(encoding="utf-8")))
    new = counts - baseline
    fixed = baseline - counts
    for d in diagnostics:
        key = next(iter(error_counts([d])), None)
        if key in new:
            print(f"new type error: {where(d)} [{d.get('rule')}]")
    if fixed:
        print(f"{sum(fixed.values())} baseline errors are fixed: shrink the baseline with --write-baseline")
    print(f"pyright: {len(missing)} unresolved imports, {sum(new.values())} new errors, "
          f"{sum((counts & baseline).values())} known errors (baseline)")
    return 1 if missing or new else 0


if __name__ == "__main__":
    raise SystemExit(main())
