"""The public names: ``import resilibench`` stays light and declares the names a user needs; each package
declares its own, lazily, and every ``__all__`` of the package names what its module defines."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import resilibench

ROOT = Path(__file__).resolve().parents[2]
SETUP = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found = {}
    for package, source in SETUP["package-dir"].items():
        for path in (ROOT / source).rglob("*.py"):
            relative = path.relative_to(ROOT / source).with_suffix("")
            if "__pycache__" in relative.parts or not (path.parent / "__init__.py").is_file():
                continue
            parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
            found[".".join([package, *parts])] = path
    return found


MODULES = _modules()


def _declared_all(tree: ast.Module) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return None


def _bound(tree: ast.Module) -> set[str]:
    """Names a module binds at its top level (definitions, assignments, imports; those inside a top-level
    ``if`` or ``try`` too)."""
    names, nodes = set(), list(tree.body)
    while nodes:
        node = nodes.pop()
        if isinstance(node, ast.If | ast.Try):
            nodes += [*node.body, *node.orelse, *getattr(node, "finalbody", []),
                      *(s for handler in getattr(node, "handlers", []) for s in handler.body)]
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
    return names


def _lazy_table(tree: ast.Module) -> dict[str, str]:
    """Name -> relative module of a package's ``lazy_exports`` call (empty when it has none)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "lazy_exports":
            return {name: module for module, names in ast.literal_eval(node.args[1]).items() for name in names}
    return {}


def _type_checking_imports(tree: ast.Module) -> dict[str, str]:
    """Name -> module of the imports under ``if TYPE_CHECKING:``, relative to the package."""
    imports = {}
    for node in tree.body:
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for statement in node.body:
                module = "." * statement.level + (statement.module or "")
                imports.update({alias.name: module for alias in statement.names})
    return imports


def _resolve(package: str, module: str) -> Path:
    return MODULES[importlib.util.resolve_name(module, package)]


LAZY_PACKAGES = sorted(m for m, p in MODULES.items() if _lazy_table(ast.parse(p.read_text())))


@pytest.mark.parametrize("module", sorted(m for m, p in MODULES.items() if _declared_all(ast.parse(p.read_text()))))
def test_every_name_in_all_is_defined(module):
    tree = ast.parse(MODULES[module].read_text())
    declared = _declared_all(tree)
    assert len(declared) == len(set(declared)), "a name listed twice"
    assert set(declared) - _bound(tree) == set()


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_lazy_names_agree_with_their_declarations(package):
    """A lazy package's table, its ``__all__`` and its type-checking imports name the same things, each
    defined in the module the table names, inside the package."""
    tree = ast.parse(MODULES[package].read_text())
    lazy = _lazy_table(tree)
    imports = _type_checking_imports(tree)
    assert {n: importlib.util.resolve_name(m, package) for n, m in imports.items()} == {
        n: importlib.util.resolve_name(m, package) for n, m in lazy.items()}
    assert set(lazy) <= set(_declared_all(tree))
    submodules = {p.stem if p.name != "__init__.py" else p.parent.name for p in MODULES[package].parent.iterdir()
                  if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert set(lazy) & submodules == set(), "a name that its submodule's import would shadow"
    for name, module in lazy.items():
        assert importlib.util.resolve_name(module, package).startswith(package + ".")
        assert name in _bound(ast.parse(_resolve(package, module).read_text())), (name, module)


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_the_public_names_resolve(package):
    """Each lazy name is its defining module's object, and ``dir`` lists every public name before its first
    use."""
    module = importlib.import_module(package)
    assert set(module.__all__) <= set(dir(module))
    for name, where in _lazy_table(ast.parse(MODULES[package].read_text())).items():
        assert getattr(module, name) is getattr(importlib.import_module(where, package), name)
    assert all(hasattr(module, name) for name in module.__all__)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="'resilibench' has no attribute 'WorldConfg'"):
        resilibench.WorldConfg  # noqa: B018


def test_import_resilibench_loads_no_front_end():
    """``import resilibench`` registers the env ids and loads no env module, policy, agent or metric (nor
    torch or Ray); using a name loads its module."""
    code = ("import sys, gymnasium, resilibench\n"
            "print(sorted(m for m in sys.modules if m.startswith(('resilibench.', 'torch', 'ray'))))\n"
            "print('ResiliBench-v1' in gymnasium.registry)\n"
            "resilibench.ResiliBenchTextEnv\n"
            "print('resilibench.envs.text.env' in sys.modules)\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT.parent, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    loaded = ast.literal_eval(out[0])
    assert {m.split(".")[1] for m in loaded} == {"core", "envs", "errors", "lazy", "settings", "version"}
    assert [m for m in loaded if m.startswith("resilibench.envs")] == ["resilibench.envs",
                                                                      "resilibench.envs.registration"]
    assert out[1:] == ["True", "True"]
