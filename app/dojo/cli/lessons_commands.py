"""What `dojo lessons` and `dojo export anki` do (the parser is in `dojo.cli.lessons`)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dojo.cli.errors import CommandFailed
from dojo.cli.quiz_render import Style, use_colour
from dojo.content import Catalog, Lesson, content_root, lab_availability, load_catalog
from dojo.content.lab_links import LabAvailability
from dojo.content.models import TRACKS
from dojo.quiz.anki import write_anki_package
from dojo.quiz.schedule import ReviewScheduler
from dojo.store import LessonProgress, ProgressStore

TRACK_TITLES = {"interview": "The interview", "next": "What they ask next",
                "craft": "Interview craft"}
HEADERS = ("#", "lesson", "read", "mastery", "cards", "labs")
MIN_TITLE = 20


@dataclass(frozen=True)
class LabProgress:
    lab: str
    ready: bool
    passed: int
    stages: int  # the stages this lesson pairs with

    def __str__(self) -> str:
        return f"{self.lab} {self.passed}/{self.stages}" if self.ready else \
            f"{self.lab} (coming)"


@dataclass(frozen=True)
class LessonLine:
    """One lesson with the learner's progress: what the table and --json show."""

    lesson: Lesson
    read: str  # unread | reading | read
    mastery: float
    reviewed: int
    labs: tuple[LabProgress, ...]

    @property
    def number(self) -> str:
        return self.lesson.dir.name[:2]

    def as_dict(self) -> dict[str, object]:
        lesson = self.lesson
        return {"number": self.number, "id": lesson.id, "title": lesson.title,
                "track": lesson.track, "question": lesson.question, "read": self.read,
                "mastery": round(self.mastery, 3), "cards": len(lesson.cards),
                "reviewed": self.reviewed,
                "labs": [{"lab": lab.lab, "ready": lab.ready, "passed": lab.passed,
                          "stages": lab.stages} for lab in self.labs]}


def _read_status(progress: LessonProgress | None) -> str:
    if progress is None:
        return "unread"
    return "read" if progress.finished else "reading"


def _labs(lesson: Lesson, root: Path, store: ProgressStore) -> tuple[LabProgress, ...]:
    found = []
    for lab in dict.fromkeys(link.lab for link in lesson.labs):
        stages = [link.stage for link in lesson.labs if link.lab == lab]
        if lab_availability(root, lab) is LabAvailability.COMING:
            found.append(LabProgress(lab, False, 0, len(stages)))
            continue
        passed = store.passed_stages(lab) & set(stages)
        found.append(LabProgress(lab, True, len(passed), len(stages)))
    return tuple(found)


def lesson_lines(catalog: Catalog, store: ProgressStore) -> list[LessonLine]:
    """Every lesson in catalogue order with its read state, FSRS mastery and lab stages."""
    scheduler = ReviewScheduler(store)
    progress = store.lesson_progress()
    return [LessonLine(lesson, _read_status(progress.get(lesson.id)),
                       scheduler.lesson_mastery(lesson),
                       sum(scheduler.state(card.id) is not None for card in lesson.cards),
                       _labs(lesson, catalog.root, store))
            for lesson in catalog.lessons]


def lessons_table(lines: list[LessonLine], style: Style, width: int | None) -> str:
    """The catalogue by track, in aligned columns. `width` is the terminal's: titles longer
    than fits end in `…`; None (a pipe or a file) never cuts them."""
    rows: list[tuple[LessonLine, tuple[str, ...]]] = [
        (line, (line.number, line.lesson.title, line.read, f"{round(line.mastery * 100)}%",
                f"{line.reviewed}/{len(line.lesson.cards)}",
                ", ".join(str(lab) for lab in line.labs) or "—")) for line in lines]
    widths = [max([len(HEADERS[column])] + [len(values[column]) for _, values in rows])
              for column in range(len(HEADERS))]
    if width is not None:  # the title gives way, down to MIN_TITLE
        others = sum(widths) - widths[1] + 2 * len(HEADERS) + 2
        widths[1] = max(MIN_TITLE, min(widths[1], width - others))

    def cells(values: tuple[str, ...], paint: dict[int, Callable[[str], str]] | None = None
              ) -> str:
        out = []
        for column, value in enumerate(values):
            text = value if len(value) <= widths[column] else value[:widths[column] - 1] + "…"
            padding = " " * (widths[column] - len(text))
            if paint and column in paint:
                text = paint[column](text)
            out.append(padding + text if column in (3, 4) else text + padding)
        return ("  " + "  ".join(out)).rstrip()

    out: list[str] = [style.dim(cells(HEADERS))]
    for track in TRACKS:
        in_track = [row for row in rows if row[0].lesson.track == track]
        if not in_track:
            continue
        out += ["", style.bold(TRACK_TITLES[track])]
        for line, values in in_track:
            out.append(cells(values, {2: style.good} if line.read == "read" else None))
    return "\n".join(out)


def next_step_line(catalog: Catalog, lines: list[LessonLine], reviewed: set[str],
                   passed: dict[str, set[str]]) -> str:
    """The guided path in one line: how far the interview is, and what to do next (with the
    command that does it)."""
    from dojo.interview_path import interview_path

    built = {lab.lab for line in lines for lab in line.labs if lab.ready}
    path = interview_path(catalog, {line.lesson.id: line.read for line in lines}, reviewed,
                          passed, built)
    step = path.next_step
    question = step.question
    command = ""
    if question is not None:
        number = question.lesson.dir.name[:2]
        command = {"read": "open it in the app (dojo)",
                   "drill": f"dojo quiz --lesson {number}",
                   "lab": f"dojo lab check {step.lab} --stage {step.stage}"}[step.kind]
        where = f"question {question.number} of {len(path.questions)}: "
    else:
        where = ""
    return (f"Interview {round(path.fraction * 100)}% · next, {where}{step.describe()}"
            + (f" — {command}" if command else ""))


def run_lessons(args: argparse.Namespace) -> int:
    catalog = load_catalog(content_root())
    if not catalog.lessons:
        raise CommandFailed(f"no lessons under {catalog.root / 'lessons'} yet")
    with ProgressStore() as store:
        lines = lesson_lines(catalog, store)
        scheduler = ReviewScheduler(store)
        reviewed = {card.id for card in catalog.cards if scheduler.state(card.id) is not None}
        passed = {lab.lab: store.passed_stages(lab.lab)
                  for line in lines for lab in line.labs if lab.ready}
    if args.json:
        print(json.dumps([line.as_dict() for line in lines], indent=2, ensure_ascii=False))
    else:
        terminal = sys.stdout.isatty()
        width = shutil.get_terminal_size().columns if terminal else None
        style = Style(use_colour(sys.stdout))
        print(lessons_table(lines, style, width))
        if catalog.track("interview"):
            print("\n" + style.bold(next_step_line(catalog, lines, reviewed, passed)))
    if catalog.problems:
        print(f"\n{len(catalog.problems)} content problem(s); run `dojo lint`", file=sys.stderr)
    return 0


def run_export_anki(args: argparse.Namespace) -> int:
    catalog = load_catalog(content_root())
    if not catalog.cards:
        raise CommandFailed(f"no cards under {catalog.root / 'lessons'} to export")
    notes = write_anki_package(catalog, args.output)
    lessons = sum(1 for lesson in catalog.lessons if lesson.cards)
    print(f"wrote {notes} notes from {lessons} lessons to {args.output}")
    return 0
