"""The lessons in the repository follow docs/content-format.md: CI enforces it here."""

from __future__ import annotations

from dojo.content import content_root, lint_lessons, load_catalog


def test_every_lesson_in_the_repository_lints_clean() -> None:
    root = content_root()
    problems = [problem.relative_to(root) for problem in lint_lessons(root)]
    assert not problems, (f"{len(problems)} content problem(s); run `dojo lint`:\n"
                          + "\n".join(map(str, problems)))


def test_the_repository_catalog_loads_every_lesson_folder() -> None:
    root = content_root()
    folders = [path for path in (root / "lessons").iterdir() if path.is_dir()] \
        if (root / "lessons").is_dir() else []
    assert len(load_catalog(root).lessons) == len(folders)
