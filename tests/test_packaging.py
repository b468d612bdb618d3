"""The package layout static tools and users see: py.typed shipped, sibling folders found from a checkout."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_the_package_ships_py_typed():
    assert (resources.files("resilibench") / "py.typed").is_file()


def test_the_checkout_root_imports_the_sibling_package_folders():
    """From the checkout's root (its `resilibench/` first on sys.path, as `python -m pytest` there puts it),
    `resilibench.envs` is the checkout's `envs/` folder, whatever kind of install is present."""
    code = "import resilibench.envs.config as c, resilibench.agents.base as b; print(c.__file__); print(b.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(ROOT / "envs" / "config.py"), str(ROOT / "agents" / "base.py")]


def test_the_install_serves_this_checkouts_code(tmp_path):
    """From elsewhere the installed package is used (the strict editable install's link tree), and its
    modules are this checkout's files."""
    code = "import resilibench.envs.config as c; print(c.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True)
    assert Path(out.stdout.strip()).resolve() == ROOT / "envs" / "config.py"
