"""Split a lesson's Markdown body into H2 sections, H3 subsections, code blocks and links.

A small line scanner rather than a Markdown library: the format (docs/content-format.md) only
needs headings, fences, tables and `lesson:` links, and every piece must keep its file line.
Headings inside fenced blocks are code, not structure, so fences are tracked first.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dojo.content.models import CodeBlock, LessonLink, Section, Subsection

_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$")
_H2 = re.compile(r"^##\s+(.+?)\s*#*\s*$")
_H3 = re.compile(r"^###\s+(.+?)\s*#*\s*$")
_LESSON_LINK = re.compile(r"lesson:([a-z0-9][a-z0-9-]*)(?:#([\w-]+))?")
_INLINE_CODE = re.compile(r"`[^`\n]*`")


def slugify(title: str) -> str:
    """The anchor of a heading as GitHub renders it: lower case, punctuation dropped,
    spaces to hyphens ("The 60-second answer" -> "the-60-second-answer")."""
    kept = re.sub(r"[^\w\- ]", "", title.strip().lower())
    return kept.replace(" ", "-")


@dataclass(frozen=True)
class ParsedBody:
    """The structure of a lesson body; lines are file lines."""

    sections: tuple[Section, ...]
    code_blocks: tuple[CodeBlock, ...]
    links: tuple[LessonLink, ...]
    unclosed_fence_line: int | None
    last_line: int


@dataclass
class _Open:
    title: str
    line: int
    lines: list[str]


def parse_body(text: str, first_line: int) -> ParsedBody:
    """Parse `text`, the Markdown after the front matter, starting at file line `first_line`."""
    sections: list[Section] = []
    blocks: list[CodeBlock] = []
    links: list[LessonLink] = []
    h2: _Open | None = None
    intro: list[str] = []
    subs: list[Subsection] = []
    h3: _Open | None = None
    fence: tuple[str, str, int, list[str]] | None = None  # marker, info, line, lines
    lines = text.split("\n")
    last_line = first_line + len(lines) - 1

    def close_h3() -> None:
        nonlocal h3
        if h3 is not None:
            text, text_line = _join(h3.lines, h3.line + 1)
            subs.append(Subsection(h3.title, slugify(h3.title), text, h3.line, text_line))
            h3 = None

    def close_h2(end_line: int) -> None:
        nonlocal h2, intro, subs
        close_h3()
        if h2 is not None:
            text, text_line = _join(intro, h2.line + 1)
            sections.append(Section(h2.title, slugify(h2.title), h2.line, text, text_line,
                                    tuple(subs), end_line))
        h2, intro, subs = None, [], []

    for index, line in enumerate(lines):
        number = first_line + index
        target = h3.lines if h3 is not None else intro
        if fence is not None:
            marker, info, start, body = fence
            if re.fullmatch(rf" {{0,3}}{re.escape(marker[0])}{{{len(marker)},}}\s*", line):
                blocks.append(CodeBlock(info, "\n".join(body), start))
                fence = None
            else:
                body.append(line)
            target.append(line)
            continue
        opening = _FENCE.match(line)
        if opening:
            fence = (opening.group(1), opening.group(2), number, [])
            target.append(line)
            continue
        if (match := _H2.match(line)) and not line.startswith("###"):
            close_h2(number - 1)
            h2 = _Open(match.group(1), number, [])
            continue
        if (match := _H3.match(line)) and not line.startswith("####"):
            close_h3()
            h3 = _Open(match.group(1), number, [])
            continue
        for link in _LESSON_LINK.finditer(_INLINE_CODE.sub("", line)):
            links.append(LessonLink(link.group(1), link.group(2) or "", number))
        target.append(line)
    unclosed = None
    if fence is not None:
        unclosed = fence[2]
        blocks.append(CodeBlock(fence[1], "\n".join(fence[3]), fence[2]))
    close_h2(last_line)
    return ParsedBody(tuple(sections), tuple(blocks), tuple(links), unclosed, last_line)


def _join(lines: list[str], first_line: int) -> tuple[str, int]:
    """The lines as text without surrounding blank lines, and the file line it starts at."""
    start = 0
    while start < len(lines) and not lines[start].strip():
        start += 1
    return "\n".join(lines[start:]).rstrip(), first_line + start
