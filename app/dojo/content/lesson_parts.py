"""Pull the structured parts out of lesson sections: follow-ups by level, the mistakes table.

These parsers never fail: they return what they find, and the linter judges whether it is
enough (three levels, a Q and an A each, four table rows).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dojo.content.models import FollowUp, MistakeRow, Section

MISTAKES_HEADER = ("Mistake", "Consequence", "Fix")
_LEVEL = re.compile(r"level\s+(\d+)", re.IGNORECASE)
# `**Q: question?**` is the documented form; `**Q:** question?` renders the same and is
# accepted as the same thing.
_QUESTION = re.compile(r"^\s*\*\*Q:\s*(.*?)\*\*\s*(.*)$")
_ANSWER = re.compile(r"^\s*(?:\*\*A:\*\*|\*\*A\*\*:|A:)\s*(.*)$")
_SEPARATOR_CELL = re.compile(r":?-{3,}:?")


def level_of(title: str) -> int | None:
    """3 for `Level 3`; None for a heading that names no level."""
    match = _LEVEL.fullmatch(title.strip())
    return int(match.group(1)) if match else None


def parse_follow_ups(section: Section) -> tuple[FollowUp, ...]:
    """Every `**Q: …**` / `A: …` pair under the `### Level N` subsections of `section`."""
    found: list[FollowUp] = []
    for sub in section.subsections:
        level = level_of(sub.title)
        if level is None:
            continue
        question: tuple[str, int] | None = None
        answer: list[str] = []
        in_answer = False
        for offset, line in enumerate(sub.text.split("\n")):
            number = sub.text_line + offset
            q = _QUESTION.match(line)
            if q:
                if question:
                    found.append(FollowUp(level, question[0], _text(answer), question[1]))
                question = (" ".join(part for part in q.groups() if part).strip(), number)
                answer, in_answer = [], False
                continue
            a = _ANSWER.match(line)
            if question and not in_answer and a:
                answer, in_answer = [a.group(1)], True
            elif question and in_answer:
                answer.append(line)
        if question:
            found.append(FollowUp(level, question[0], _text(answer), question[1]))
    return tuple(found)


def _text(lines: list[str]) -> str:
    return "\n".join(lines).strip()


@dataclass(frozen=True)
class MistakesTable:
    """The first Markdown table of the common-mistakes section, as found."""

    header: tuple[str, ...]
    header_line: int
    rows: tuple[MistakeRow, ...]
    short_rows: tuple[int, ...]  # lines of rows without three non-empty cells


def split_cells(line: str) -> list[str]:
    """The cells of a Markdown table row; `\\|` is a literal pipe inside a cell."""
    inner = line.strip()
    inner = inner[1:] if inner.startswith("|") else inner
    inner = inner[:-1] if inner.endswith("|") and not inner.endswith("\\|") else inner
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", inner)]


def parse_mistakes_table(section: Section) -> MistakesTable | None:
    """The table in `section` (header, rows), or None when the section has no table."""
    # Only the intro: line numbers stay exact, and the table is never under an H3.
    lines = section.intro.split("\n")
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("|")), None)
    if start is None:
        return None
    header = tuple(split_cells(lines[start]))
    rows: list[MistakeRow] = []
    short: list[int] = []
    for offset in range(start + 1, len(lines)):
        line = lines[offset]
        if not line.lstrip().startswith("|"):
            break
        cells = split_cells(line)
        if all(_SEPARATOR_CELL.fullmatch(cell) for cell in cells):
            continue
        number = section.intro_line + offset
        if len(cells) != 3 or not all(cells):
            short.append(number)
            continue
        rows.append(MistakeRow(cells[0], cells[1], cells[2], number))
    return MistakesTable(header, section.intro_line + start, tuple(rows), tuple(short))
