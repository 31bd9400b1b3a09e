"""The 'seed' rule: `dojo lint` names file and line wherever learner text says "seed".

Lesson bodies, lab READMEs and lab.yaml files (stage texts and hints) are read by learners;
they cite documents a reader can find, never our internal seed documents.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from dojo.content import lint_lessons
from dojo.content.lab_lint import lint_labs
from dojo.content.seed_lint import MESSAGE, learner_text_files, seed_mentions
from tests.content.conftest import DLQ, FIXTURE_ROOT, ContentRoot
from tests.content.test_cli_lint import lint


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


def test_lessons_and_the_learner_files_of_labs_are_the_files_checked(tmp_path: Path) -> None:
    for name in ("lessons/01-a/lesson.md", "lessons/01-a/cards.yaml", "labs/x/README.md",
                 "labs/x/lab.yaml", "labs/x/checks/test_x.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x\n", encoding="utf-8")
    assert [p.relative_to(tmp_path).as_posix() for p in learner_text_files(tmp_path)] == [
        "labs/x/README.md", "labs/x/lab.yaml", "lessons/01-a/cards.yaml",
        "lessons/01-a/lesson.md"]


def test_lint_lessons_reports_a_lesson_line_that_cites_a_seed(content: ContentRoot) -> None:
    content.replace(DLQ / "lesson.md", "## What the interviewer is measuring\n",
                    "## What the interviewer is measuring\n\nAs seed 002 says, it matters.\n")
    line = content.line_of(DLQ / "lesson.md", "As seed 002 says")
    problems = [p for p in lint_lessons(content.root) if p.message == MESSAGE]
    assert [(p.path.name, p.line) for p in problems] == [("lesson.md", line)]


def test_lint_lessons_reports_a_card_line_that_cites_a_seed(content: ContentRoot) -> None:
    text = (content.root / DLQ / "cards.yaml").read_text(encoding="utf-8")
    first_answer = next(line for line in text.splitlines() if line.startswith("    answer: |"))
    content.replace(DLQ / "cards.yaml", first_answer + "\n",
                    first_answer + "\n      The seed's design says so.\n")
    line = content.line_of(DLQ / "cards.yaml", "The seed's design")
    problems = [p for p in lint_lessons(content.root) if p.message == MESSAGE]
    assert [(p.path.name, p.line) for p in problems] == [("cards.yaml", line)]


def test_lint_labs_reports_seed_in_a_readme_and_in_a_hint(tmp_path: Path) -> None:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_ROOT, root)
    readme, manifest = root / "labs/dlq/README.md", root / "labs/dlq/lab.yaml"
    readme.write_text(readme.read_text(encoding="utf-8") + "\nThe seed's relay does this.\n",
                      encoding="utf-8")
    hint_line = next(n for n, line in enumerate(manifest.read_text().splitlines(), 1)
                     if line.strip().startswith("- \""))
    lines = manifest.read_text(encoding="utf-8").splitlines()
    lines[hint_line - 1] = lines[hint_line - 1].replace('- "', '- "Per the seeds, ', 1)
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    found = sorted((p.path.relative_to(root).as_posix(), p.line)
                   for p in lint_labs(root) if p.message == MESSAGE)
    readme_line = len(readme.read_text(encoding="utf-8").splitlines())
    assert found == [("labs/dlq/README.md", readme_line), ("labs/dlq/lab.yaml", hint_line)]


def test_dojo_lint_prints_the_seed_problem_and_fails(tmp_path: Path) -> None:
    root = tmp_path / "content"
    shutil.copytree(FIXTURE_ROOT, root)
    lesson = root / DLQ / "lesson.md"
    lesson.write_text(lesson.read_text(encoding="utf-8") + "\nSeed 000 gives a table.\n",
                      encoding="utf-8")
    last = len(lesson.read_text(encoding="utf-8").splitlines())
    done = lint(root, tmp_path)
    assert done.returncode == 1
    assert f"content/lessons/01-dead-letter-queue/lesson.md:{last}: {MESSAGE}" \
        in done.stdout.splitlines()
