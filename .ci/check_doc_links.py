"""Check that every link to a page of the docs resolves, anchors and cited sections included.

Two kinds of reference are checked, in every Markdown, Python, TOML and YAML file of the checkout (build
outputs, virtual environments and .git left out):

* Markdown links outside code blocks, ``[text](path)`` and ``[text](path#anchor)``, relative to the file
  (web addresses are not checked): the path must exist and the anchor must be a heading of the target (as
  GitHub writes heading anchors) or an explicit ``<a id=...>``;
* references written as text, in prose, docstrings, comments and error messages: ``docs/<page>.md``,
  ``docs/<page>.md#<anchor>`` and ``docs/<page>.md, "<section>"`` (the section named by the start of a
  heading), relative to the repository root.

Usage: ``python .ci/check_doc_links.py`` (exit status 1 and one line per broken reference, else 0).
"""

from __future__ import annotations

import re
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", "build", "node_modules", "__pycache__", ".pytest_cache", ".ruff_cache"}
SUFFIXES = {".md", ".py", ".toml", ".yaml", ".yml"}

FENCE = re.compile(r"^\s*(```|~~~)")
LINK = re.compile(r"(?<!!)\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
INLINE_CODE = re.compile(r"`[^`\n]*`")
TEXT_REF = re.compile(r"\bdocs/[\w./-]+?\.md(?:#[\w-]+)?(?:,?\s*\"([^\"\n]+)\")?")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
EXPLICIT_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"")


def files(root: Path = ROOT) -> list[Path]:
    found = []
    for path in sorted(root.rglob("*")):
        if path.suffix in SUFFIXES and path.is_file() and not SKIP.intersection(path.relative_to(root).parts):
            found.append(path)
    return found


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    # HTML tags are dropped, but not inside code spans (`<tool_call>` is text there)
    text = "".join(part if index % 2 else re.sub(r"<[^>]+>", "", part)
                   for index, part in enumerate(text.split("`"))).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def outside_code(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    kept, fenced = [], False
    for number, line in enumerate(lines, 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            kept.append((number, line))
    return kept


@cache
def headings(page: Path) -> tuple[tuple[str, ...], frozenset[str]]:
    """(heading texts, anchors) of a Markdown page; repeated anchors get -1, -2, ... as on GitHub."""
    texts, anchors, seen = [], set(), {}
    for _, line in outside_code(page.read_text(encoding="utf-8").splitlines()):
        anchors.update(EXPLICIT_ANCHOR.findall(line))
        match = HEADING.match(line)
        if not match:
            continue
        texts.append(match.group(2))
        anchor = slug(match.group(2))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        anchors.add(anchor if count == 0 else f"{anchor}-{count}")
    return tuple(texts), frozenset(anchors)


def plain(text: str) -> str:
    return re.sub(r"[`*_]", "", text).strip().lower()


def check_target(target: Path, anchor: str | None, section: str | None) -> str | None:
    """What is wrong with a reference to ``target`` (and its anchor or cited section), or None."""
    if not target.exists():
        return "no such file"
    if target.is_dir() or target.suffix != ".md":
        return None if anchor is None else "an anchor into something that is not a Markdown page"
    texts, anchors = headings(target)
    if anchor is not None and anchor not in anchors:
        return f"no heading with anchor #{anchor}"
    if section is not None and not any(plain(text).startswith(plain(section)) for text in texts):
        return f"no section starting {section!r}"
    return None


def check_file(path: Path, root: Path = ROOT) -> list[str]:
    problems = []
    text = path.read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    name = path.relative_to(root)
    if path.suffix == ".md":
        for number, line in outside_code(lines):
            for match in LINK.finditer(INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)):
                href = match.group(1).strip("<>")
                if re.match(r"^[a-z][a-z0-9+.-]*:", href, re.I):
                    continue  # a web address, mailto:, ...
                location, _, anchor = href.partition("#")
                target = (path.parent / location).resolve() if location else path
                problem = check_target(target, anchor or None, None)
                if problem:
                    problems.append(f"{name}:{number}: link {href}: {problem}")
    for number, line in enumerate(lines, 1):
        if path.suffix == ".md":
            line = re.sub(r"\]\([^)]*\)", "]()", line)  # link targets were checked above
        for match in TEXT_REF.finditer(line):
            reference = match.group(0)
            location = re.match(r"docs/[\w./-]+?\.md", reference).group(0)
            anchor = reference.split("#", 1)[1].split(",")[0].split()[0].split('"')[0] if "#" in reference else None
            problem = check_target(root / location, anchor, match.group(1))
            if problem:
                problems.append(f"{name}:{number}: {reference}: {problem}")
    return problems


def main() -> int:
    problems = [problem for path in files() for problem in check_file(path)]
    for problem in problems:
        print(problem)
    print(f"{len(problems)} broken reference(s) in {len(files())} files", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
