"""Run pyright on the package and fail on any unresolved import or on a type error not in the baseline.

    .venv/bin/python .ci/typecheck.py                   # the CI check
    .venv/bin/python .ci/typecheck.py --write-baseline  # after fixing errors: record what is left

The baseline (.ci/pyright-baseline.json) counts the known errors by key, not by file and line, so that
editing a file or moving it to another folder keeps them. A key reads

    exact:monte_carlo_success | reportOptionalMemberAccess | "level" is not a known attribute of "None"

the module's name (the file's stem; the package's name for an __init__.py), the qualified name of the
innermost class or function around the error line (for a module-level line, the first name its statement
assigns or imports, else `<module>`), pyright's rule, and the first line of its message. Renaming the
module, the class or the function re-keys its errors. A new key, or one more error under a known key, fails
the check and is shown with its file and line; fixed errors are reported so the baseline can shrink.
"""

from __future__ import annotations

import argparse
import ast
import functools
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
SCOPES = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


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


def _assigned_name(statement: ast.stmt) -> str | None:
    """The first name a module-level assignment or import binds, if it binds one."""
    if isinstance(statement, ast.Assign | ast.AnnAssign | ast.AugAssign):
        targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
        return next((t.id for t in targets if isinstance(t, ast.Name)), None)
    if isinstance(statement, ast.Import | ast.ImportFrom):
        return (statement.names[0].asname or statement.names[0].name).split(".")[0]
    return None


@functools.cache
def _scopes(file: Path) -> tuple[tuple[int, int, str], ...]:
    """(first line, last line, qualified name) of each class, function and named module-level statement."""
    try:
        tree = ast.parse(file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return ()
    found: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, SCOPES):
                name = prefix + child.name
                found.append((child.lineno, child.end_lineno or child.lineno, name))
                visit(child, name + ".")
            elif not isinstance(child, ast.expr):
                visit(child, prefix)

    for statement in tree.body:
        name = _assigned_name(statement)
        if name:
            found.append((statement.lineno, statement.end_lineno or statement.lineno, name))
    visit(tree, "")
    return tuple(found)


def scope(file: Path, line: int) -> str:
    """The qualified name of the innermost class or function around ``line`` (1-based) of ``file``."""
    around = [(last - first, name) for first, last, name in _scopes(file) if first <= line <= last]
    return min(around)[1] if around else "<module>"


def module_name(file: Path) -> str:
    """The module's own name: the file's stem, or the package's name for an __init__.py."""
    return file.parent.name if file.stem == "__init__" else file.stem


def error_key(d: dict) -> str:
    """'module:scope | rule | message' (first line of the message); see the docstring of this script."""
    file = Path(d["file"])
    where_in = f"{module_name(file)}:{scope(file, d['range']['start']['line'] + 1)}"
    return f"{where_in} | {d.get('rule', '-')} | {d['message'].splitlines()[0]}"


def is_error(d: dict) -> bool:
    return d["severity"] == "error" and d.get("rule") not in UNRESOLVED


def error_counts(diagnostics: list[dict]) -> Counter[str]:
    """How many errors there are under each key."""
    return Counter(error_key(d) for d in diagnostics if is_error(d))


def compare(diagnostics: list[dict], baseline: Counter[str]) -> tuple[list[dict], Counter[str], Counter[str]]:
    """The errors under keys with more errors than the baseline counts, those new counts, and the fixed ones."""
    counts = error_counts(diagnostics)
    new, fixed = counts - baseline, baseline - counts
    return [d for d in diagnostics if is_error(d) and error_key(d) in new], new, fixed


def where(d: dict) -> str:
    file = Path(d["file"])
    shown = file.relative_to(ROOT) if file.is_relative_to(ROOT) else file
    return f"{shown}:{d['range']['start']['line'] + 1}: {d['message'].splitlines()[0]}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write-baseline", action="store_true", help="record the present errors as the baseline")
    args = parser.parse_args()
    diagnostics = run_pyright()
    missing = unresolved(diagnostics)
    for d in missing:
        print(f"unresolved import: {where(d)}")
    if args.write_baseline:
        counts = error_counts(diagnostics)
        BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n", encoding="utf-8")
        print(f"wrote {BASELINE.relative_to(ROOT)}: {counts.total()} errors under {len(counts)} keys")
        return 1 if missing else 0
    baseline = Counter(json.loads(BASELINE.read_text(encoding="utf-8")))
    new_errors, new, fixed = compare(diagnostics, baseline)
    for d in new_errors:
        print(f"new type error: {where(d)} [{d.get('rule')}] (key: {error_key(d)})")
    if fixed:
        print(f"{fixed.total()} baseline errors are fixed: shrink the baseline with --write-baseline")
    known = error_counts(diagnostics) & baseline
    print(f"pyright: {len(missing)} unresolved imports, {new.total()} new errors, "
          f"{known.total()} known errors (baseline)")
    return 1 if missing or new else 0


if __name__ == "__main__":
    raise SystemExit(main())
