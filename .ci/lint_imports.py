"""Check the import contracts of pyproject.toml ([tool.importlinter]) on the package as it installs.

The package maps ``resilibench.envs`` to ``envs/`` (and so on: ``[tool.setuptools] package-dir``), which
import-linter cannot follow from the source tree, so this mirrors the package in a temporary tree of links
and runs ``lint-imports`` there. Usage: ``python .ci/lint_imports.py`` (exit status of lint-imports).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def link_tree(root: Path, target: Path) -> Path:
    """Mirror every package of ``root``'s package-dir mapping under ``target`` (real folders, linked
    ``.py`` files); returns ``target``."""
    setup = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, source in setup["package-dir"].items():
        for folder, _, files in os.walk(root / source):
            relative = Path(folder).relative_to(root / source)
            if "__init__.py" not in files or "__pycache__" in relative.parts:
                continue
            mirror = target.joinpath(*package.split("."), relative)
            mirror.mkdir(parents=True, exist_ok=True)
            for name in files:
                if name.endswith(".py") and not (mirror / name).exists():
                    (mirror / name).symlink_to(Path(folder) / name)
    return target


def lint_imports(tree: Path, root: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``lint-imports`` on the mirrored package in ``tree`` with ``root``'s contracts."""
    command = [str(Path(sys.executable).with_name("lint-imports")), str(root / "pyproject.toml"), "--no-cache"]
    return subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        result = lint_imports(link_tree(ROOT, Path(tmp)))
    sys.stdout.write(result.stdout)
    sys.stderr.write(result.stderr)
    return result.returncode


if __name__ == "__main__":
    raise SystemExit(main())
