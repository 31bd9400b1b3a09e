"""`load_catalog(root)`: every lesson under `root/lessons/`, sorted, with lookups by id."""

from __future__ import annotations

from pathlib import Path

from dojo.content.lessons import LessonFile, read_lesson
from dojo.content.models import TRACKS, Catalog, Lesson
from dojo.content.problems import Problem
from dojo.content.root import content_root


def lesson_dirs(root: Path) -> list[Path]:
    """The folders of `root/lessons/`, by name; hidden and `_` folders are not lessons."""
    lessons = root / "lessons"
    if not lessons.is_dir():
        return []
    return sorted(path for path in lessons.iterdir()
                  if path.is_dir() and not path.name.startswith((".", "_")))


def read_lessons(root: Path) -> list[LessonFile]:
    """Read every lesson folder under `root`, broken ones included."""
    return [read_lesson(path) for path in lesson_dirs(root)]


def _sort_key(lesson: Lesson) -> tuple[int, int, str]:
    return TRACKS.index(lesson.track), lesson.order, lesson.id


def catalog_from(root: Path, files: list[LessonFile]) -> Catalog:
    """Build the catalog out of already read lesson folders."""
    lessons = sorted((file.lesson for file in files if file.lesson is not None), key=_sort_key)
    problems: list[Problem] = [problem for file in files for problem in file.problems]
    return Catalog(root, tuple(lessons), tuple(problems))


def load_catalog(root: Path | None = None) -> Catalog:
    """Load every lesson and its cards. Malformed files never raise: the lessons that can be
    read are in `lessons`, and what went wrong is in `problems` with file and line."""
    root = (root or content_root()).resolve()
    return catalog_from(root, read_lessons(root))
