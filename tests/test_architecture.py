"""The import contract (docs/architecture.md): layers import downwards only, and a back-import fails."""

from __future__ import annotations

import importlib.util
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("importlinter", reason="needs the dev extra (import-linter)")


def _lint_imports_module():
    spec = importlib.util.spec_from_file_location("lint_imports", ROOT / ".ci" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lint = _lint_imports_module()


def _layers() -> list[list[str]]:
    contract = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"][0]
    return [[name.strip().strip("()") for name in layer.split(":")] for layer in contract["layers"]]


def test_the_package_keeps_its_layers(tmp_path):
    result = lint.lint_imports(lint.link_tree(ROOT, tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "imports"), [
    ("envs/tasks.py", "from resilibench.cli import format_table\n"),  # core -> CLI
    ("envs/text_env.py", "def f():\n    from resilibench.agents.harness import run_eval\n"),  # envs -> pipeline, lazily
    ("results.py", "from resilibench.core.tasks.library import Task\n"),  # foundation -> core
])
def test_a_back_import_breaks_the_contract(tmp_path, module, imports):
    """The mirrored package with one module given an import of a higher layer: lint-imports fails, naming it."""
    tree = lint.link_tree(ROOT, tmp_path)
    linked = tree / "resilibench" / module
    source = linked.read_text()
    linked.unlink()
    linked.write_text(source + "\n\n" + imports)
    result = lint.lint_imports(tree)
    name = "resilibench." + module.removesuffix(".py").replace("/", ".")
    assert result.returncode == 1
    assert f"{name} -> resilibench." in result.stdout and "0 kept, 1 broken" in result.stdout


def test_every_module_has_a_layer(tmp_path):
    """A new module must be placed in the contract (else nothing checks its imports)."""
    tree = lint.link_tree(ROOT, tmp_path)
    named = {name for layer in _layers() for name in layer}
    unplaced = []
    for path in sorted((tree / "resilibench").rglob("*.py")):
        parts = path.relative_to(tree / "resilibench").with_suffix("").parts
        if parts[-1] == "__init__":
            continue
        prefixes = {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
        if not prefixes & named:
            unplaced.append(".".join(parts))
    assert not unplaced, f"modules in no layer of pyproject's import contract: {unplaced}"
