"""The 'seed' rule finds the word with its file and line, and leaves lookalikes alone."""

from __future__ import annotations

from pathlib import Path

from dojo.content.seed_lint import learner_text_files, seed_mentions


def test_each_line_that_says_seed_is_reported_with_its_line(tmp_path: Path) -> None:
    lesson = tmp_path / "lesson.md"
    lesson.write_text("Intro.\nAs the seed's list says.\nFine.\nSeeds 000 and 004.\n"
                      "Hibernate seeded it.\n", encoding="utf-8")
    assert [problem.line for problem in seed_mentions(lesson)] == [2, 4, 5]
    assert all(problem.path == lesson for problem in seed_mentions(lesson))


def test_words_that_only_contain_seed_are_not_reported(tmp_path: Path) -> None:
    lesson = tmp_path / "lesson.md"
    lesson.write_text("The proceeds were seedless; linseed oil.\n", encoding="utf-8")
    assert list(seed_mentions(lesson)) == []


def test_lessons_and_lab_readmes_are_the_files_checked(tmp_path: Path) -> None:
    for name in ("lessons/01-a/lesson.md", "lessons/01-a/cards.yaml", "labs/x/README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    assert [p.relative_to(tmp_path).as_posix() for p in learner_text_files(tmp_path)] == [
        "labs/x/README.md", "lessons/01-a/lesson.md"]
