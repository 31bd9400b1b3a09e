"""Load one lesson folder (`lesson.md` + `cards.yaml`) into a `Lesson`, collecting problems."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from dojo.content.cards import read_cards
from dojo.content.front_matter import (
    FrontMatter,
    folder_slug,
    read_front_matter,
    split_front_matter,
)
from dojo.content.lesson_body import ParsedBody, parse_body
from dojo.content.lesson_parts import parse_follow_ups, parse_mistakes_table
from dojo.content.models import Lesson
from dojo.content.problems import Problem


@dataclass
class LessonFile:
    """What reading one lesson folder produced: the lesson (None when lesson.md or its front
    matter is unreadable), the problems met, and the raw parts the linter inspects."""

    dir: Path
    lesson: Lesson | None
    problems: list[Problem] = field(default_factory=list)
    front: FrontMatter | None = None
    body: ParsedBody | None = None
    cards_parsed: bool = False


def read_lesson(lesson_dir: Path) -> LessonFile:
    """Read `lesson_dir`; never raises on content, every problem is in the result.

    The lesson is None only when lesson.md is missing or its front matter cannot be parsed;
    anything less broken loads, and the problems say what is wrong.
    """
    path = lesson_dir / "lesson.md"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return LessonFile(lesson_dir, None,
                          [Problem(path, 1, "missing: every lesson folder needs a lesson.md")])
    except (OSError, UnicodeDecodeError) as exc:
        return LessonFile(lesson_dir, None, [Problem(path, 1, f"cannot read: {exc}")])
    split = split_front_matter(text)
    if split is None:
        return LessonFile(lesson_dir, None, [Problem(
            path, 1, "lesson.md must start with YAML front matter between `---` lines")])
    yaml_text, body_text, body_line = split
    front, problems = read_front_matter(path, yaml_text)
    if front is None:
        return LessonFile(lesson_dir, None, problems)
    slug = folder_slug(lesson_dir)
    if slug is None:
        problems.append(Problem(path, 1, f"folder {lesson_dir.name!r} must be named NN-slug "
                                         "(two digits, a hyphen, the lesson id)"))
    elif front.id and front.id != slug:
        problems.append(Problem(path, front.doc.line("id"),
                                f"id {front.id!r} must equal the folder slug {slug!r}"))
    lesson_id = front.id or slug or lesson_dir.name
    body = parse_body(body_text, body_line)
    follow_section = next((s for s in body.sections if s.title == "Follow-up questions"), None)
    mistakes_section = next((s for s in body.sections if s.title == "Common mistakes"), None)
    table = parse_mistakes_table(mistakes_section) if mistakes_section else None
    lesson = Lesson(
        id=lesson_id,
        title=front.title or lesson_id,
        track=front.track,
        order=front.order,
        question=front.question,
        seconds=front.seconds,
        labs=front.labs,
        related=tuple(related for related, _ in front.related),
        sources=front.sources,
        dir=lesson_dir,
        sections=body.sections,
        follow_ups=parse_follow_ups(follow_section) if follow_section else (),
        mistakes=table.rows if table else (),
        code_blocks=body.code_blocks,
        links=body.links,
    )
    cards = read_cards(lesson.cards_path, lesson_id)
    problems.extend(cards.problems)
    return LessonFile(lesson_dir, replace(lesson, cards=cards.cards), problems, front, body,
                      cards.parsed)
