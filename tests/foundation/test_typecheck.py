"""The type-check baseline's keys (.ci/typecheck.py): they survive a move of the file and a shift of its lines,
and one more error of a known kind in the same function fails the check. Hand-made diagnostics, no pyright."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SOURCE = '''\
"""A module."""
import os

LIMIT: int = os.cpu_count()


class Env:
    def step(self, action):
        def inner():
            return action.name
        return inner().upper()


def helper(x):
    return x.attr
'''
MESSAGE = '"upper" is not a known attribute of "None"'


def _typecheck_module():
    spec = importlib.util.spec_from_file_location("typecheck", ROOT / ".ci" / "typecheck.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


typecheck = _typecheck_module()


def _write(path: Path, source: str = SOURCE) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(source)
    return path


def _line_of(file: Path, text: str) -> int:
    """The 1-based line of ``file`` that holds ``text``."""
    return next(n for n, line in enumerate(file.read_text().splitlines(), 1) if text in line)


def _diagnostic(file: Path, line: int, message: str = MESSAGE, rule: str = "reportOptionalMemberAccess") -> dict:
    return {"file": str(file), "severity": "error", "rule": rule, "message": message + "\n  detail",
            "range": {"start": {"line": line - 1, "character": 4}, "end": {"line": line - 1, "character": 9}}}


def test_a_key_names_the_module_the_innermost_scope_the_rule_and_the_message(tmp_path):
    file = _write(tmp_path / "envs" / "game.py")
    keys = [typecheck.error_key(_diagnostic(file, _line_of(file, text))) for text in
            ("return inner()", "return action.name", "return x.attr", "LIMIT", "import os", '"""A module')]
    assert [key.split(" | ")[0] for key in keys] == [
        "game:Env.step", "game:Env.step.inner", "game:helper", "game:LIMIT", "game:os", "game:<module>"]
    assert keys[0] == f"game:Env.step | reportOptionalMemberAccess | {MESSAGE}"
    package = _write(tmp_path / "envs" / "planner" / "__init__.py")
    assert typecheck.error_key(_diagnostic(package, 15)).startswith("planner:helper | ")


def test_moving_a_file_keeps_its_keys(tmp_path):
    before = _write(tmp_path / "core" / "text" / "game.py")
    after = _write(tmp_path / "envs" / "game.py", "# moved, and shifted by some lines\n\n\n" + SOURCE)
    errors_before = [_diagnostic(before, _line_of(before, "return inner()")),
                     _diagnostic(before, _line_of(before, "return x.attr"), '"attr" is not a known attribute')]
    errors_after = [_diagnostic(after, _line_of(after, "return inner()")),
                    _diagnostic(after, _line_of(after, "return x.attr"), '"attr" is not a known attribute')]
    baseline = typecheck.error_counts(errors_before)
    assert typecheck.error_counts(errors_after) == baseline
    assert typecheck.compare(errors_after, baseline) == ([], Counter(), Counter())


def test_a_new_error_of_a_known_kind_in_the_same_function_fails(tmp_path, monkeypatch, capsys):
    source = SOURCE.replace("        return inner()", "        action.other.upper()\n        return inner()")
    file = _write(tmp_path / "envs" / "game.py", source)
    known = _diagnostic(file, _line_of(file, "return inner()"))
    baseline = typecheck.error_counts([known])
    another = _diagnostic(file, _line_of(file, "action.other.upper()"))
    new_errors, new, fixed = typecheck.compare([known, another], baseline)
    assert new == Counter({typecheck.error_key(another): 1}) and not fixed
    assert another in new_errors
    monkeypatch.setattr(typecheck, "ROOT", tmp_path)
    monkeypatch.setattr(typecheck, "BASELINE", tmp_path / "baseline.json")
    monkeypatch.setattr(typecheck, "run_pyright", lambda: [known])
    monkeypatch.setattr("sys.argv", ["typecheck.py", "--write-baseline"])
    assert typecheck.main() == 0
    monkeypatch.setattr("sys.argv", ["typecheck.py"])
    assert typecheck.main() == 0
    monkeypatch.setattr(typecheck, "run_pyright", lambda: [known, another])
    capsys.readouterr()
    assert typecheck.main() == 1
    assert f"new type error: envs/game.py:{_line_of(file, 'action.other.upper()')}: {MESSAGE}" in capsys.readouterr().out


def test_a_fixed_error_is_counted_as_fixed(tmp_path):
    file = _write(tmp_path / "envs" / "game.py")
    baseline = typecheck.error_counts([_diagnostic(file, _line_of(file, "return inner()"))])
    assert typecheck.compare([], baseline) == ([], Counter(), baseline)
