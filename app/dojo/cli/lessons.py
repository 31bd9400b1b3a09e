"""`dojo lessons` (the catalogue with your progress) and `dojo export anki`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dojo.cli.quiz_render import Style, use_colour
from dojo.content import Catalog, Lesson, content_root, lab_availability, load_catalog
from dojo.content.lab_links import LabAvailability
from dojo.content.models import TRACKS
from dojo.quiz.anki import write_anki_package
from dojo.quiz.schedule import ReviewScheduler
from dojo.store import LessonProgress, ProgressStore

TRACK_TITLES = {"interview": "The interview", "next": "What they ask next",
                "craft": "Interview craft"}
DEFAULT_APKG = Path("interview-dojo.apkg")
TITLE_WIDTH = 34


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("lessons", help="the lessons by track, with your progress")
    parser.set_defaults(handler=run_lessons)
    export = sub.add_parser("export", help="export cards to other tools")
    formats = export.add_subparsers(dest="format", metavar="FORMAT")
    anki = formats.add_parser("anki", help="an Anki package (.apkg) with stable note ids")
    anki.add_argument("-o", "--output", type=Path, default=DEFAULT_APKG,
                      help=f"where to write it (default ./{DEFAULT_APKG})")
    anki.set_defaults(handler=run_export_anki)

    def _usage(_args: argparse.Namespace) -> int:
        export.print_help()
        return 2

    export.set_defaults(handler=_usage)


def _read_status(progress: LessonProgress | None) -> str:
    if progress is None:
        return "unread"
    return "read" if progress.finished else "reading"


def _lab_column(lesson: Lesson, root: Path, store: ProgressStore) -> str:
    parts = []
    for lab in dict.fromkeys(link.lab for link in lesson.labs):
        stages = [link.stage for link in lesson.labs if link.lab == lab]
        if lab_availability(root, lab) is LabAvailability.COMING:
            parts.append(f"{lab} (coming)")
            continue
        passed = store.passed_stages(lab) & set(stages)
        parts.append(f"{lab} {len(passed)}/{len(stages)}")
    return ", ".join(parts) or "—"


def lessons_table(catalog: Catalog, store: ProgressStore, style: Style) -> str:
    """The catalogue by track: read state, FSRS mastery, lab stages passed."""
    scheduler = ReviewScheduler(store)
    progress = store.lesson_progress()
    width = min(TITLE_WIDTH, max((len(lesson.title) for lesson in catalog.lessons), default=10))
    lines: list[str] = []
    for track in TRACKS:
        lessons = catalog.track(track)
        if not lessons:
            continue
        lines += ["", style.bold(TRACK_TITLES[track])]
        for lesson in lessons:
            reviewed = sum(scheduler.state(card.id) is not None for card in lesson.cards)
            mastery = round(scheduler.lesson_mastery(lesson) * 100)
            status = _read_status(progress.get(lesson.id))
            shown = style.good(f"{status:<7}") if status == "read" else f"{status:<7}"
            title = lesson.title if len(lesson.title) <= width else lesson.title[:width - 1] + "…"
            lines.append(f"  {lesson.dir.name[:2]}  {title:<{width}}  {shown}  "
                         f"mastery {mastery:>3}% ({reviewed}/{len(lesson.cards)} cards)  "
                         f"labs: {_lab_column(lesson, catalog.root, store)}")
    return "\n".join(lines).lstrip("\n")


def run_lessons(_args: argparse.Namespace) -> int:
    catalog = load_catalog(content_root())
    if not catalog.lessons:
        print(f"no lessons under {catalog.root / 'lessons'} yet", file=sys.stderr)
        return 1
    with ProgressStore() as store:
        print(lessons_table(catalog, store, Style(use_colour(sys.stdout))))
    if catalog.problems:
        print(f"\n{len(catalog.problems)} content problem(s); run `dojo lint`", file=sys.stderr)
    return 0


def run_export_anki(args: argparse.Namespace) -> int:
    catalog = load_catalog(content_root())
    if not catalog.cards:
        print(f"error: no cards under {catalog.root / 'lessons'} to export", file=sys.stderr)
        return 1
    notes = write_anki_package(catalog, args.output)
    lessons = sum(1 for lesson in catalog.lessons if lesson.cards)
    print(f"wrote {notes} notes from {lessons} lessons to {args.output}")
    return 0
