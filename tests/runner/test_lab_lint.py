"""The lab linter finds each kind of problem and names the file and line to fix."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dojo.content.lab_lint import lint_labs
from tests.runner.conftest import FIXTURES


def _problems(root: Path) -> list[tuple[str, int, str]]:
    return [(str(p.path.relative_to(root)), p.line, p.message) for p in lint_labs(root)]


def _only(root: Path) -> tuple[str, int, str]:
    problems = _problems(root)
    assert len(problems) == 1, f"expected exactly one problem, got {problems}"
    return problems[0]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_the_fixture_lab_is_clean() -> None:
    assert _problems(FIXTURES) == []


def test_a_stage_without_hints(content: Path) -> None:
    manifest = content / "labs/tally/lab.yaml"
    _edit(manifest, '    hints:\n      - "Remember the event ids you have applied."\n', "")
    path, line, message = _only(content)
    assert (path, line) == ("labs/tally/lab.yaml", 16)
    assert "stage 'dedupe' has no hints" in message


def test_an_empty_hint(content: Path) -> None:
    _edit(content / "labs/tally/lab.yaml", '"collections.Counter does the counting for you."',
          '""')
    assert _only(content) == ("labs/tally/lab.yaml", 15, "stage 'count': hint 2 is empty")


def test_stray_files_in_the_lab_and_the_solution(content: Path) -> None:
    (content / "labs/tally/notes.txt").write_text("todo")
    (content / "solutions/tally/helpers.py").write_text("")
    (content / "labs/tally/starter/__pycache__").mkdir()  # caches are never stray
    problems = _problems(content)
    assert [(p, line) for p, line, _ in problems] == [
        ("labs/tally/notes.txt", 1), ("solutions/tally/helpers.py", 1)]
    assert "stray file in the lab" in problems[0][2]
    assert "helpers.py is not in lab.yaml `files`" in problems[1][2]


def test_a_starter_missing_a_listed_file(content: Path) -> None:
    _edit(content / "labs/tally/lab.yaml", "files: [tally.py]", "files: [tally.py, store.py]")
    problems = _problems(content)
    for folder in ("starter/", "solutions/tally/"):
        assert ("labs/tally/lab.yaml", 6,
                f"{folder} lacks store.py, which `files` lists") in problems


def test_a_lab_without_a_solution(content: Path) -> None:
    shutil.rmtree(content / "solutions/tally")
    path, line, message = _only(content)
    assert (path, line) == ("labs/tally/lab.yaml", 2) and "no reference solution" in message


def test_a_stage_with_no_check(content: Path) -> None:
    (content / "labs/tally/checks/test_03_persist.py").unlink()
    path, line, message = _only(content)
    assert (path, line) == ("labs/tally/lab.yaml", 22)
    assert message.startswith("stage 'persist' has no check")


def test_a_check_marked_with_a_stage_that_does_not_exist(content: Path) -> None:
    _edit(content / "labs/tally/checks/test_03_persist.py",
          '@pytest.mark.needs_kafka("transactions")',
          '@pytest.mark.stage("replay")\n@pytest.mark.needs_kafka("transactions")')
    path, line, message = _only(content)
    assert (path, line) == ("labs/tally/checks/test_03_persist.py", 24)
    assert "stage 'replay', which lab.yaml does not define" in message


def test_a_check_without_any_stage_marker(content: Path) -> None:
    (content / "labs/tally/checks/test_04_extra.py").write_text(
        "\n\ndef test_unowned():\n    assert True\n")
    assert _only(content) == ("labs/tally/checks/test_04_extra.py", 3,
                              "check 'unowned' has no stage marker: add "
                              "@pytest.mark.stage(\"<stage id>\")")


def test_a_mutant_naming_a_check_that_does_not_exist(content: Path) -> None:
    _edit(content / "labs/tally/mutants/case-sensitive/mutant.yaml",
          "check: ignores_case", "check: ignore_case")
    assert _only(content) == ("labs/tally/mutants/case-sensitive/mutant.yaml", 3,
                              "mutant names check 'ignore_case', which no checks/test_*.py "
                              "defines")


def test_a_mutant_naming_a_stage_that_does_not_exist(content: Path) -> None:
    _edit(content / "labs/tally/mutants/case-sensitive/mutant.yaml",
          "stage: count", "stage: counting")
    assert _only(content) == ("labs/tally/mutants/case-sensitive/mutant.yaml", 2,
                              "mutant names stage 'counting', which lab.yaml does not define")


@pytest.mark.parametrize("field", ["mistake", "stage", "check", "mentions"])
def test_a_mutant_yaml_missing_a_field(content: Path, field: str) -> None:
    manifest = content / "labs/tally/mutants/dedupe-by-word/mutant.yaml"
    manifest.write_text("".join(line for line in manifest.read_text().splitlines(True)
                                if not line.startswith(f"{field}:")))
    problems = _problems(content)
    assert ("labs/tally/mutants/dedupe-by-word/mutant.yaml", 1,
            f"mutant.yaml: `{field}` is missing or empty") in problems


MUTANT = "labs/tally/mutants/case-sensitive"


def test_a_mutant_that_makes_no_mistake(content: Path) -> None:
    (content / MUTANT / "tally.py.patch").unlink()
    assert _only(content) == (f"{MUTANT}/mutant.yaml", 1,
                              "the mutant changes nothing: it has no <file>.patch overlay, so "
                              "it makes no mistake")


def test_a_mutant_whose_overlay_no_longer_applies_names_the_patch_and_solution_line(
        content: Path) -> None:
    _edit(content / "solutions/tally/tally.py",
          "return dict(Counter(word.lower() for word in text.split()))",
          "return dict(Counter(w.lower() for w in text.split()))")
    path, line, message = _only(content)
    assert (path, line) == (f"{MUTANT}/tally.py.patch", 3), "the hunk's @@ line"
    assert message.startswith("hunk 1 no longer applies to solutions/tally/tally.py: line 13 "
                              "expected '    return dict(Counter(word.lower() for word in "
                              "text.split()))'"), message


def test_a_solution_edit_away_from_the_mutation_still_applies(content: Path) -> None:
    _edit(content / "solutions/tally/tally.py", "from collections import Counter",
          "from collections import Counter\n\n# a new comment far from the mistake")
    assert _problems(content) == []


def test_a_mutant_that_duplicates_another(content: Path) -> None:
    twin = content / "labs/tally/mutants/case-sensitive-again"
    shutil.copytree(content / MUTANT, twin)
    assert _only(content) == ("labs/tally/mutants/case-sensitive-again/mutant.yaml", 1,
                              "the mutant makes exactly the same change as "
                              "mutants/case-sensitive/: one of them is redundant")


def test_a_full_copy_in_a_mutant_is_refused(content: Path) -> None:
    shutil.copy(content / "solutions/tally/tally.py", content / MUTANT / "tally.py")
    path, line, message = _only(content)
    assert (path, line) == (f"{MUTANT}/tally.py", 1)
    assert message.startswith("a full copy of tally.py: mutants store only what they change")


def test_an_overlay_of_a_file_that_is_not_a_learner_file(content: Path) -> None:
    (content / MUTANT / "tally.py.patch").rename(content / MUTANT / "store.py.patch")
    problems = _problems(content)
    assert (f"{MUTANT}/store.py.patch", 1, "the overlay changes store.py, which is not a "
            "learner file (lab.yaml `files`)") in problems


def test_a_mutant_without_a_golden_message(content: Path) -> None:
    (content / MUTANT / "expected.txt").unlink()
    assert _only(content) == (f"{MUTANT}/mutant.yaml", 1,
                              "no golden message: record expected.txt with `dojo dev golden "
                              "tally --mutant case-sensitive`")


def test_a_readme_missing_a_stage_section(content: Path) -> None:
    _edit(content / "labs/tally/README.md", "## Stage 2: Count each event once", "Stage 2")
    path, line, message = _only(content)
    assert (path, line) == ("labs/tally/README.md", 14), "where the section belongs"
    assert "no `## …` section for stage 'dedupe'" in message


def test_a_yaml_syntax_error_names_its_line(content: Path) -> None:
    _edit(content / "labs/tally/lab.yaml", "services: [postgres]", "services: [postgres")
    path, line, message = _only(content)
    assert path == "labs/tally/lab.yaml" and line in (5, 6, 7) and "invalid YAML" in message


def test_a_solution_without_a_lab(content: Path) -> None:
    (content / "solutions/ghost").mkdir()
    assert _only(content) == ("solutions/ghost", 1,
                              "a solution without a lab: labs/ghost/ does not exist")


def test_a_stage_linking_a_lesson_section_that_does_not_exist(content: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "lessons/10-idempotent-consumer",
                    content / "lessons/10-idempotent-consumer")
    problems = _problems(content)
    messages = [message for _, _, message in problems]
    assert any("'idempotent-consumer#the-idea'" in m and "no section with that slug" in m
               for m in messages), problems
    manifest = content / "labs/tally/lab.yaml"
    for stale in ("the-idea", "dedupe-key", "upsert"):
        _edit(manifest, f'"idempotent-consumer#{stale}"',
              '"idempotent-consumer#marker-and-effect-in-one-transaction"')
    assert _problems(content) == []


def _with_lesson(content: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    shutil.copytree(repo / "lessons/10-idempotent-consumer",
                    content / "lessons/10-idempotent-consumer")
    manifest = content / "labs/tally/lab.yaml"
    for stale in ("the-idea", "dedupe-key", "upsert"):
        _edit(manifest, f'"idempotent-consumer#{stale}"',
              '"idempotent-consumer#marker-and-effect-in-one-transaction"')


def test_lesson_sections_named_in_checks_are_checked_against_the_headings(
        content: Path) -> None:
    _with_lesson(content)
    check = content / "labs/tally/checks/test_02_dedupe.py"
    check.write_text(check.read_text()
                     + '\nLESSON = "idempotent-consumer"\n'
                       'READ = f"{LESSON}#no-such-heading"\n'
                       'OK = ("idempotent-consumer#marker-and-effect-"\n'
                       '      "in-one-transaction")\n'
                       'GONE = "vanished-lesson#intro"\n')
    problems = _problems(content)
    assert problems == [
        ("labs/tally/checks/test_02_dedupe.py", 27, "idempotent-consumer#no-such-heading: "
         "lesson 'idempotent-consumer' has no section with that slug"),
        ("labs/tally/checks/test_02_dedupe.py", 30, "vanished-lesson#intro: there is no "
         "lesson 'vanished-lesson' under lessons/")], problems


def test_lesson_sections_named_in_the_readme_are_checked(content: Path) -> None:
    _with_lesson(content)
    readme = content / "labs/tally/README.md"
    readme.write_text(readme.read_text() + "\nRead: `lesson:idempotent-consumer#nope`.\n")
    problems = _problems(content)
    assert len(problems) == 1 and problems[0][0] == "labs/tally/README.md", problems
    assert problems[0][2] == ("idempotent-consumer#nope: lesson 'idempotent-consumer' has no "
                              "section with that slug")
