"""The package layout static tools and users see: py.typed shipped, sibling folders found from a checkout."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_ships_py_typed():
    assert (resources.files("resilibench") / "py.typed").is_file()


def test_the_checkout_root_imports_the_sibling_package_folders():
    """From the checkout's root (its `resilibench/` first on sys.path, as `python -m pytest` there puts it),
    `resilibench.envs` is the checkout's `envs/` folder, whatever kind of install is present."""
    code = ("import resilibench.core.config as c, resilibench.envs.planner.env as e, resilibench.llm as b; "
            "print(c.__file__); print(e.__file__); print(b.__file__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(ROOT / "core" / "config.py"), str(ROOT / "envs" / "planner" / "env.py"),
                                  str(ROOT / "resilibench" / "llm.py")]


def test_the_install_serves_this_checkouts_code(tmp_path):
    """From elsewhere the installed package is used (the strict editable install's link tree), and its
    modules are this checkout's files."""
    code = "import resilibench.core.config as c; print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve() == ROOT / "core" / "config.py"


def test_every_package_folder_is_installed():
    """Every folder of the package (one with an ``__init__.py``) is listed in pyproject's packages, and its
    data files ship (a folder missing there would import from a checkout and fail from a wheel)."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = set()
    for package, source in setup["package-dir"].items():
        for init in (ROOT / source).rglob("__init__.py"):
            relative = init.parent.relative_to(ROOT / source)
            if "__pycache__" not in relative.parts:
                found.add(".".join([package, *relative.parts]))
    assert found == set(setup["packages"])
    for package, patterns in setup["package-data"].items():
        root = resources.files(package)
        assert all(list(Path(str(root)).glob(pattern)) for pattern in patterns), package
