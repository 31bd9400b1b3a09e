"""The rules one lesson.md must follow on its own (docs/content-format.md).

Rules that need other lessons (ids, links, related) live in `dojo.content.lint`.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

from dojo.content.lab_links import known_labs, stage_ids
from dojo.content.lesson_parts import MISTAKES_HEADER, level_of, parse_mistakes_table
from dojo.content.lessons import LessonFile
from dojo.content.models import Lesson, Section
from dojo.content.problems import Problem
from dojo.content.text_measures import display_width, plain, words

SECTIONS = (
    "The 60-second answer",
    "What the interviewer is measuring",
    "Deep dive",
    "When I would not use it",
    "Common mistakes",
    "Follow-up questions",
    "Practise it",
    "Sources",
)
EXTRA_SECTIONS_AFTER = "Deep dive"  # extra H2s may sit between this and the next required one
ANSWER_WORDS = (120, 180)
MIN_MISTAKE_ROWS = 4
DIAGRAM_COLUMNS = 76
LESSON_FILES = frozenset({"lesson.md", "cards.yaml"})
_LAB_COMMAND = re.compile(r"dojo lab (?:start|check|reset|watch) ([a-z0-9-]+)"
                          r"(?:\s+--stage[ =]([a-z0-9-]+))?")


def lint_lesson_file(file: LessonFile, root: Path) -> Iterator[Problem]:
    """Every problem of one lesson folder that can be seen without the other lessons."""
    yield from _stray_files(file.dir)
    lesson = file.lesson
    if lesson is None or file.body is None:
        return
    if file.body.unclosed_fence_line is not None:
        yield Problem(lesson.path, file.body.unclosed_fence_line,
                      "this code fence is never closed; everything after it is code")
    yield from _section_order(lesson, file.body.last_line)
    by_title = {section.title: section for section in lesson.sections}
    for title in SECTIONS:
        section = by_title.get(title)
        if section is not None and not section.text:
            yield Problem(lesson.path, section.line, f"section `{title}` is empty")
    if "The 60-second answer" in by_title:
        yield from _sixty_second_answer(lesson, by_title["The 60-second answer"])
    if "Deep dive" in by_title and not by_title["Deep dive"].subsections:
        yield Problem(lesson.path, by_title["Deep dive"].line,
                      "`Deep dive` needs H3 subsections (`### …`)")
    if "Common mistakes" in by_title:
        yield from _mistakes(lesson, by_title["Common mistakes"])
    if "Follow-up questions" in by_title:
        yield from _follow_ups(lesson, by_title["Follow-up questions"])
    yield from _code_blocks(lesson)
    yield from _labs(lesson, root, by_title.get("Practise it"))


def _stray_files(lesson_dir: Path) -> Iterator[Problem]:
    for path in sorted(lesson_dir.iterdir()):
        if path.name not in LESSON_FILES and not path.name.startswith("."):
            yield Problem(path, 1, "a lesson folder holds only lesson.md and cards.yaml")


def _section_order(lesson: Lesson, last_line: int) -> Iterator[Problem]:
    present = [section for section in lesson.sections]
    seen: dict[str, int] = {}
    expected_index = 0
    for section in present:
        if section.title in seen:
            yield Problem(lesson.path, section.line, f"section `{section.title}` appears twice "
                                                     f"(first at line {seen[section.title]})")
            continue
        seen[section.title] = section.line
        if section.title in SECTIONS:
            index = SECTIONS.index(section.title)
            if index < expected_index:
                yield Problem(lesson.path, section.line,
                              f"section `{section.title}` is out of order; the order is: "
                              + " / ".join(SECTIONS))
            expected_index = max(expected_index, index + 1)
        else:
            after = SECTIONS.index(EXTRA_SECTIONS_AFTER) + 1
            if expected_index != after:
                yield Problem(lesson.path, section.line,
                              f"extra section `{section.title}` may only sit between "
                              f"`{EXTRA_SECTIONS_AFTER}` and `{SECTIONS[after]}`")
    for index, title in enumerate(SECTIONS):
        if title in seen:
            continue
        later = [seen[name] for name in SECTIONS[index + 1:] if name in seen]
        line = min(later) if later else last_line
        yield Problem(lesson.path, line, f"missing section `## {title}` (expected here)")


def _sixty_second_answer(lesson: Lesson, section: Section) -> Iterator[Problem]:
    count = len(words(plain(section.intro)))
    low, high = ANSWER_WORDS
    if not low <= count <= high:
        yield Problem(lesson.path, section.line,
                      f"the 60-second answer has {count} words; it must have {low}–{high} "
                      "(about a minute spoken)")
    paragraphs = [p for p in re.split(r"\n\s*\n", section.intro) if p.strip()]
    if len(paragraphs) > 2:
        yield Problem(lesson.path, section.line,
                      f"the 60-second answer has {len(paragraphs)} paragraphs; one or two")
    if section.subsections:
        yield Problem(lesson.path, section.subsections[0].line,
                      "the 60-second answer is spoken prose; no subsections")


def _mistakes(lesson: Lesson, section: Section) -> Iterator[Problem]:
    table = parse_mistakes_table(section)
    header = "| " + " | ".join(MISTAKES_HEADER) + " |"
    if table is None:
        yield Problem(lesson.path, section.line, f"`Common mistakes` needs a table {header}")
        return
    if table.header != MISTAKES_HEADER:
        yield Problem(lesson.path, table.header_line,
                      f"the mistakes table header must be {header}")
    for line in table.short_rows:
        yield Problem(lesson.path, line, "a mistakes row needs three non-empty cells: "
                                         "mistake, consequence, fix")
    if len(table.rows) < MIN_MISTAKE_ROWS:
        yield Problem(lesson.path, table.header_line,
                      f"the mistakes table has {len(table.rows)} rows; it needs at least "
                      f"{MIN_MISTAKE_ROWS}")


def _follow_ups(lesson: Lesson, section: Section) -> Iterator[Problem]:
    levels = [level_of(sub.title) for sub in section.subsections]
    for sub, level in zip(section.subsections, levels, strict=True):
        if level not in (1, 2, 3):
            yield Problem(lesson.path, sub.line,
                          f"`### {sub.title}`: follow-ups are grouped under `### Level 1`, "
                          "`### Level 2`, `### Level 3`")
    present = [level for level in levels if level in (1, 2, 3)]
    if present != sorted(set(present)):
        yield Problem(lesson.path, section.line, "follow-up levels must appear once each, "
                                                 "in order 1, 2, 3")
    for level in (1, 2, 3):
        items = [item for item in lesson.follow_ups if item.level == level]
        if level not in present:
            yield Problem(lesson.path, section.line, f"missing `### Level {level}` follow-ups")
        elif not items:
            sub = section.subsections[levels.index(level)]
            yield Problem(lesson.path, sub.line, f"Level {level} has no `**Q: …**` question "
                                                 "followed by an `A: …` answer")
        for item in items:
            if not item.question:
                yield Problem(lesson.path, item.line, "this follow-up has an empty question")
            if not item.answer:
                yield Problem(lesson.path, item.line,
                              "this follow-up question has no `A: …` answer after it")


def _code_blocks(lesson: Lesson) -> Iterator[Problem]:
    for block in lesson.code_blocks:
        if not block.info:
            yield Problem(lesson.path, block.line, "a code block needs a language "
                                                   "(java, yaml, python, sql, text, diagram)")
        if not block.is_diagram:
            continue
        for offset, line in enumerate(block.text.split("\n"), start=1):
            if "\t" in line:
                yield Problem(lesson.path, block.line + offset,
                              "a diagram line contains a tab; use spaces so it lines up")
            width = display_width(line.rstrip())
            if width > DIAGRAM_COLUMNS:
                yield Problem(lesson.path, block.line + offset,
                              f"diagram line is {width} columns wide; at most "
                              f"{DIAGRAM_COLUMNS} so it reads in an 80-column terminal")


def _labs(lesson: Lesson, root: Path, practise: Section | None) -> Iterator[Problem]:
    labs = known_labs(root)
    seen: set[tuple[str, str]] = set()
    for link in lesson.labs:
        if (link.lab, link.stage) in seen:
            yield Problem(lesson.path, link.line, f"lab stage {link.lab}/{link.stage} is listed "
                                                  "twice")
        seen.add((link.lab, link.stage))
        yield from _lab_stage(lesson.path, root, labs, link.lab, link.stage, link.line)
    if practise is None:
        return
    text = practise.text
    for offset, line in enumerate(text.split("\n")):
        number = practise.intro_line + offset
        if re.search(r"\bcoming\b", line, re.IGNORECASE):
            yield Problem(lesson.path, number, "do not write \"coming\" in `Practise it`: the app "
                                               "computes from labs/ which labs are built")
        for match in _LAB_COMMAND.finditer(line):
            yield from _lab_stage(lesson.path, root, labs, match.group(1), match.group(2),
                                  number)
    for lab in dict.fromkeys(link.lab for link in lesson.labs):
        if lab not in text:
            yield Problem(lesson.path, practise.line,
                          f"`Practise it` does not mention the lab `{lab}` from the front matter")


def _lab_stage(path: Path, root: Path, labs: tuple[str, ...], lab: str, stage: str | None,
               line: int) -> Iterator[Problem]:
    if lab not in labs:
        yield Problem(path, line, f"unknown lab {lab!r}: there is no labs/{lab}/lab.yaml "
                                  f"(labs: {', '.join(labs) or 'none'})")
        return
    if stage is None:
        return
    stages = stage_ids(root, lab)
    if stage not in stages:
        yield Problem(path, line, f"lab {lab!r} has no stage {stage!r} (per labs/{lab}/"
                                  f"lab.yaml: {', '.join(stages)})")
