"""Every `lesson#section` a lab mentions, checked against the real lesson headings.

A check's failure message, a README's "Read:" line and a hint all send the learner to a
lesson section; a renamed heading must not leave them pointing at nothing. Python files are
read with `ast`, so implicitly joined strings and f-strings built from module constants
(`f"{OUTBOX}#schema"`) are seen whole; Markdown and YAML are read line by line.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

from dojo.content.labs import Lab
from dojo.content.problems import Problem

_REF = re.compile(r"(?<![\w/.#-])(?P<prefix>lesson:)?(?P<lesson>[a-z0-9]+(?:-[a-z0-9]+)*)"
                  r"#(?P<section>[a-z0-9][a-z0-9_-]*)")
_WHOLE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*#[a-z0-9][a-z0-9_-]*$")
_STAGE_LESSON = re.compile(r"^\s*lesson:\s")  # stage links: the lab linter checks those


def _problems_in(text: str, path: Path, line: int, known: dict[str, frozenset[str]],
                 whole_string: bool) -> Iterator[Problem]:
    for match in _REF.finditer(text):
        lesson, section = match["lesson"], match["section"]
        if lesson in known:
            if section not in known[lesson]:
                yield Problem(path, line, f"{lesson}#{section}: lesson {lesson!r} has no "
                                          "section with that slug")
        elif match["prefix"] or (whole_string and _WHOLE.match(text)):
            yield Problem(path, line, f"{lesson}#{section}: there is no lesson {lesson!r} "
                                      "under lessons/")


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level `NAME = "text"` assignments, to read f-strings built from them."""
    found: dict[str, str] = {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            found[node.targets[0].id] = node.value.value
    return found


def _joined(node: ast.JoinedStr, names: dict[str, str]) -> str | None:
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value)
        elif (isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name)
              and value.value.id in names):
            parts.append(names[value.value.id])
        else:
            return None
    return "".join(parts)


def _python(path: Path, known: dict[str, frozenset[str]]) -> Iterator[Problem]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError, OSError):
        return  # the lab linter reports a check that does not parse
    names = _constants(tree)
    inside_fstring: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            inside_fstring.update(id(value) for value in node.values)
            text = _joined(node, names)
            if text is not None:
                yield from _problems_in(text, path, node.lineno, known, whole_string=True)
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in inside_fstring):
            yield from _problems_in(node.value, path, node.lineno, known, whole_string=True)


def _lines(path: Path, known: dict[str, frozenset[str]]) -> Iterator[Problem]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return
    for number, line in enumerate(text.splitlines(), 1):
        if path.suffix == ".yaml" and _STAGE_LESSON.match(line):
            continue
        yield from _problems_in(line, path, number, known, whole_string=False)


def lesson_refs(lab: Lab, known: dict[str, frozenset[str]]) -> list[Problem]:
    """Problems with the `lesson#section` references in a lab's checks, README and lab.yaml
    (beyond the stages' `lesson:` fields, which the lab linter checks)."""
    problems: list[Problem] = []
    if lab.checks_dir.is_dir():
        for path in sorted(lab.checks_dir.rglob("*.py")):
            if "__pycache__" not in path.parts:
                problems += _python(path, known)
    for path in (lab.readme, lab.manifest):
        if path.is_file():
            problems += _lines(path, known)
    return problems
