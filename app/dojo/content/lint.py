"""`lint_lessons(root)`: every rule of docs/content-format.md, as problems with file and line."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from dojo.content.card_lint import lint_cards
from dojo.content.catalog import catalog_from, read_lessons
from dojo.content.lesson_lint import lint_lesson_file
from dojo.content.lessons import LessonFile
from dojo.content.models import Catalog
from dojo.content.problems import Problem
from dojo.content.root import content_root
from dojo.content.seed_lint import seed_mentions


def lint_lessons(root: Path | None = None) -> list[Problem]:
    """All problems of `root/lessons/`, sorted by file and line; empty means clean."""
    root = (root or content_root()).resolve()
    files = read_lessons(root)
    catalog = catalog_from(root, files)
    problems = list(catalog.problems)
    for file in files:
        problems.extend(lint_lesson_file(file, root))
        problems.extend(seed_mentions(file.dir / "lesson.md"))
        if file.lesson is not None:
            problems.extend(lint_cards(file.lesson, file.cards_parsed))
    problems.extend(_across_lessons(files, catalog))
    return sorted(set(problems))


def _across_lessons(files: list[LessonFile], catalog: Catalog) -> Iterator[Problem]:
    first_id: dict[str, Path] = {}
    first_order: dict[tuple[str, int], str] = {}
    for file in files:
        lesson, front = file.lesson, file.front
        if lesson is None or front is None:
            continue
        line = front.doc.line("id")
        if lesson.id in first_id:
            yield Problem(lesson.path, line, f"lesson id {lesson.id!r} is also used by "
                                             f"{first_id[lesson.id]}")
        first_id.setdefault(lesson.id, lesson.path)
        if lesson.order:
            key = (lesson.track, lesson.order)
            if key in first_order:
                yield Problem(lesson.path, front.doc.line("order"),
                              f"order {lesson.order} in track {lesson.track!r} is also "
                              f"lesson {first_order[key]!r}'s")
            first_order.setdefault(key, lesson.id)
        for related, related_line in front.related:
            if related == lesson.id:
                yield Problem(lesson.path, related_line, "a lesson is not related to itself")
            elif not catalog.has_lesson(related):
                yield Problem(lesson.path, related_line,
                              f"related lesson {related!r} does not exist under lessons/")
        for link in lesson.links:
            if not catalog.has_lesson(link.lesson_id):
                yield Problem(lesson.path, link.line, f"link lesson:{link.lesson_id} points at "
                                                      "no lesson under lessons/")
            elif link.section and link.section not in catalog.lesson(link.lesson_id).anchors():
                yield Problem(lesson.path, link.line,
                              f"link lesson:{link.lesson_id}#{link.section}: that lesson has "
                              "no heading with this slug")
    owner: dict[str, str] = {}
    for lesson in catalog.lessons:
        for card in lesson.cards:
            if card.id in owner:
                yield Problem(card.path, card.line, f"card id {card.id!r} is already used in "
                                                    f"lesson {owner[card.id]!r}; ids are global")
            owner.setdefault(card.id, lesson.id)
