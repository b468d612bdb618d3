"""Every ```python block of README.md and docs/ runs on its own, in a fresh interpreter in an empty directory.

A block that cannot run there says why in its page, on the line before its fence, and is skipped with that
reason: ``<!-- not run: needs a CUDA GPU -->``. A block that takes more than a few seconds is marked there
too, and runs in the slow lane: ``<!-- slow: trains one PPO iteration -->``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARK = re.compile(r"^<!--\s*(not run|slow):\s*(.+?)\s*-->$")
TIMEOUT = {"fast": 120, "slow": 900}


def doc_blocks() -> list:
    """One pytest param per ```python block: its code, id ``page:line`` (the fence's line), skip or slow
    mark from the comment on the line before the fence."""
    params = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        start = None
        for number, line in enumerate(lines, 1):
            if start is None and line.strip() == "```python":
                start = number
            elif start is not None and line.strip() == "```":
                code = "\n".join(lines[start:number - 1]) + "\n"
                mark = MARK.match(lines[start - 2].strip()) if start > 1 else None
                kind = mark[1] if mark else "fast"
                marks = {"not run": [pytest.mark.skip(reason=mark and mark[2])], "slow": [pytest.mark.slow]}
                params.append(pytest.param(code, "slow" if kind == "slow" else "fast", marks=marks.get(kind, []),
                                           id=f"{page.relative_to(ROOT)}:{start}"))
                start = None
    return params


BLOCKS = doc_blocks()


def test_the_pages_have_python_blocks():
    assert len(BLOCKS) > 40


@pytest.mark.parametrize(("code", "lane"), BLOCKS)
def test_the_block_runs_on_its_own(code, lane, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=TIMEOUT[lane], check=False)
    assert result.returncode == 0, f"exit status {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
