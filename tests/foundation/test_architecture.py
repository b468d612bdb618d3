"""The import contracts (docs/architecture.md): folders import downwards only, front ends only the front-end
folders below them, no cycles anywhere; each kind of breach fails the check, naming it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytest.importorskip("importlinter", reason="needs the dev extra (import-linter)")


def _lint_imports_module():
    spec = importlib.util.spec_from_file_location("lint_imports", ROOT / ".ci" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint = _lint_imports_module()
CONTRACTS = 3


def test_the_package_keeps_its_contracts(tmp_path):
    result = lint.lint_imports(lint.link_tree(ROOT, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{CONTRACTS} kept, 0 broken" in result.stdout


def _with_source(tmp_path, module: str, source: str) -> tuple[Path, str]:
    """The mirrored package with ``source`` appended to ``module`` (a path inside the package)."""
    tree = lint.link_tree(ROOT, tmp_path)
    linked = tree / "resilibench" / module
    before = linked.read_text() if linked.exists() else ""
    linked.unlink(missing_ok=True)
    linked.write_text(before + "\n\n" + source)
    return tree, "resilibench." + module.removesuffix(".py").replace("/", ".")


@pytest.mark.parametrize(("module", "imports", "target"), [
    ("core/tasks/library.py", "from resilibench.cli import main\n", "cli"),  # core -> CLI
    ("envs/text/env.py", "def f():\n    from ...agents.harness import run_eval\n", "agents"),  # envs -> pipeline, lazily
    ("results.py", "from resilibench.core.tasks.library import Task\n", "core"),  # foundation -> core
    ("envs/planner/env.py", "from ..text.env import ResiliBenchTextEnv\n", "envs.text"),  # front end -> a sibling's
])
def test_a_back_import_breaks_the_contract(tmp_path, module, imports, target):
    """A module given an import of a folder above it: lint-imports fails, naming the import (most such
    imports close a cycle too, which the third contract reports)."""
    tree, name = _with_source(tmp_path, module, imports)
    result = lint.lint_imports(tree)
    assert result.returncode == 1
    assert f"{name} -> resilibench.{target}" in result.stdout and "0 broken" not in result.stdout


def test_a_cycle_breaks_the_contract(tmp_path):
    """Two modules of one folder importing each other (the registry is imported by the simulator)."""
    tree, _ = _with_source(tmp_path, "core/registry.py", "def f():\n    from .simulator import Episode\n")
    result = lint.lint_imports(tree)
    assert result.returncode == 1
    assert "No cycles are allowed in resilibench.core." in result.stdout
    assert f"{CONTRACTS - 1} kept, 1 broken" in result.stdout


def test_a_new_top_level_module_must_be_placed(tmp_path):
    """A module added beside the foundation's is in no layer until the contract names it (exhaustive)."""
    tree, _ = _with_source(tmp_path, "helpers.py", "VALUE = 1\n")
    result = lint.lint_imports(tree)
    assert result.returncode == 1 and "resilibench.helpers" in result.stdout
