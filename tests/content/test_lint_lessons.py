"""lint_lessons on lesson.md: each rule of docs/content-format.md, named with file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.content import Problem, lint_lessons
from tests.content.conftest import DLQ, FIXTURE_ROOT, IDEM, ContentRoot

LESSON = DLQ / "lesson.md"


def problems_in(content: ContentRoot, relative: Path = LESSON) -> list[Problem]:
    return [p for p in lint_lessons(content.root) if p.path == content.path(relative)]


def only(content: ContentRoot, relative: Path = LESSON) -> Problem:
    found = problems_in(content, relative)
    assert len(found) == 1, "expected exactly one problem, got:\n" + "\n".join(map(str, found))
    return found[0]


def test_the_fixture_lessons_are_clean() -> None:
    assert lint_lessons(FIXTURE_ROOT) == []


def test_a_problem_prints_as_path_line_message() -> None:
    assert str(Problem(Path("lessons/x/lesson.md"), 7, "boom")) == "lessons/x/lesson.md:7: boom"


def test_a_missing_section_is_reported_where_it_should_be(content: ContentRoot) -> None:
    content.replace(LESSON, "## When I would not use it\n", "")
    problem = only(content)
    assert "missing section `## When I would not use it`" in problem.message
    assert problem.line == content.line_of(LESSON, "## Common mistakes")


def test_a_section_out_of_order_is_reported_at_its_heading(content: ContentRoot) -> None:
    content.replace(LESSON, "## Sources", "## Practise-later")
    content.replace(LESSON, "## Practise it", "## Sources")
    content.replace(LESSON, "## Practise-later", "## Practise it")
    found = problems_in(content)
    assert any("`Practise it` is out of order" in p.message
               and p.line == content.line_of(LESSON, "## Practise it") for p in found), found


def test_an_extra_section_may_follow_deep_dive(content: ContentRoot) -> None:
    content.replace(LESSON, "## When I would not use it", "## War stories\n\nOne.\n\n"
                                                          "## When I would not use it")
    assert problems_in(content) == []


def test_an_extra_section_elsewhere_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "## Sources", "## War stories\n\nOne.\n\n## Sources")
    assert "extra section `War stories`" in only(content).message


def _answer_of(content: ContentRoot, words: int) -> None:
    lesson = content.path(LESSON)
    text = lesson.read_text()
    start = text.index("A dead letter queue is a separate")
    end = text.index("nobody reads.") + len("nobody reads.")
    lesson.write_text(text[:start] + " ".join(["word"] * words) + text[end:])


def test_a_sixty_second_answer_of_119_words_is_too_short(content: ContentRoot) -> None:
    _answer_of(content, 119)
    problem = only(content)
    assert "has 119 words; it must have 120–180" in problem.message
    assert problem.line == content.line_of(LESSON, "## The 60-second answer")


def test_a_sixty_second_answer_of_181_words_is_too_long(content: ContentRoot) -> None:
    _answer_of(content, 181)
    assert "has 181 words" in only(content).message


@pytest.mark.parametrize("words", [120, 180])
def test_a_sixty_second_answer_at_either_bound_is_accepted(content: ContentRoot,
                                                           words: int) -> None:
    _answer_of(content, words)
    assert problems_in(content) == []


def test_an_empty_section_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "Whether you have run messaging in production: classification, "
                            "loss, operations.", "")
    assert "section `What the interviewer is measuring` is empty" in only(content).message


def test_the_mistakes_table_needs_its_exact_header(content: ContentRoot) -> None:
    content.replace(LESSON, "| Mistake | Consequence | Fix |", "| Mistake | Result | Fix |")
    problem = only(content)
    assert "header must be | Mistake | Consequence | Fix |" in problem.message
    assert problem.line == content.line_of(LESSON, "| Mistake | Result | Fix |")


def test_the_mistakes_table_needs_four_rows(content: ContentRoot) -> None:
    content.replace(LESSON, "| No alert on the DLQ | Nobody notices for weeks | Alert on arrivals,"
                            " name an owner |\n", "")
    assert "has 3 rows; it needs at least 4" in only(content).message


def test_a_mistakes_row_with_an_empty_cell_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "| Dead-letter it with context |", "| |")
    line = content.line_of(LESSON, "| Logging and committing |")
    found = [(p.line, p.message) for p in problems_in(content)]
    assert (line, "a mistakes row needs three non-empty cells: mistake, consequence, fix") \
        in found, found


def test_each_follow_up_level_must_be_there(content: ContentRoot) -> None:
    content.replace(LESSON, "### Level 2", "### Level two")
    messages = [p.message for p in problems_in(content)]
    assert any("missing `### Level 2`" in m for m in messages), messages
    assert any("`### Level two`: follow-ups are grouped" in m for m in messages), messages


def test_a_follow_up_question_without_an_answer_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "A: Fix the cause, then", "Fix the cause, then")
    problem = only(content)
    assert "no `A: …` answer" in problem.message
    assert problem.line == content.line_of(LESSON, "**Q: How do you replay?**")


def test_a_diagram_wider_than_76_columns_is_reported_at_its_line(content: ContentRoot) -> None:
    content.replace(LESSON, " [41] [42: poison] [43] [44]", " [41]" + " " * 68 + "[42]")
    problem = only(content)
    assert "77 columns wide; at most 76" in problem.message
    assert problem.line == content.line_of(LESSON, "[42]")


def test_box_drawing_characters_count_one_column_each(content: ContentRoot) -> None:
    content.replace(LESSON, " [41] [42: poison] [43] [44]", "─" * 76)
    assert problems_in(content) == []


def test_a_code_block_without_a_language_is_reported(content: ContentRoot) -> None:
    content.replace(IDEM / "lesson.md", "```sql", "```")
    assert "needs a language" in only(content, IDEM / "lesson.md").message


def test_a_link_to_an_unknown_lesson_is_reported(content: ContentRoot) -> None:
    content.replace(IDEM / "lesson.md", "see lesson:dead-letter-queue.", "see lesson:dlq.")
    problem = only(content, IDEM / "lesson.md")
    assert "lesson:dlq points at no lesson" in problem.message
    assert problem.line == content.line_of(IDEM / "lesson.md", "lesson:dlq")


def test_a_link_to_a_lesson_not_on_disk_is_unknown_whatever_is_planned(
        content: ContentRoot) -> None:
    content.replace(IDEM / "lesson.md", "see lesson:dead-letter-queue.", "see lesson:locking.")
    assert only(content, IDEM / "lesson.md").message == (
        "link lesson:locking points at no lesson under lessons/")


def test_a_link_to_an_unknown_section_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "#the-processed-table", "#processed-table")
    assert "no heading with this slug" in only(content).message


def test_a_related_id_must_exist(content: ContentRoot) -> None:
    content.replace(LESSON, "related: [idempotent-consumer]",
                    "related: [idempotent-consumer, saga]")
    problem = only(content)
    assert "related lesson 'saga' does not exist" in problem.message
    assert problem.line == content.line_of(LESSON, "related:")


def test_the_id_must_equal_the_folder_slug(content: ContentRoot) -> None:
    content.replace(IDEM / "lesson.md", "id: idempotent-consumer", "id: idempotency")
    messages = [p.message for p in problems_in(content, IDEM / "lesson.md")]
    assert "id 'idempotency' must equal the folder slug 'idempotent-consumer'" in messages


def test_two_lessons_with_one_id_are_reported(content: ContentRoot) -> None:
    copy = content.path("lessons/03-dead-letter-queue")
    copy.mkdir()
    for name in ("lesson.md", "cards.yaml"):
        (copy / name).write_text(content.path(DLQ / name).read_text())
    messages = [p.message for p in lint_lessons(content.root)]
    assert any("lesson id 'dead-letter-queue' is also used by" in m for m in messages), messages


def test_the_track_must_be_a_known_one(content: ContentRoot) -> None:
    content.replace(LESSON, "track: interview", "track: bonus")
    assert "must be one of interview, next, craft" in only(content).message


def test_a_missing_required_key_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "seconds: 60\n", "")
    assert "front matter is missing `seconds`" in only(content).message


def test_a_mistyped_order_is_reported_at_its_line(content: ContentRoot) -> None:
    content.replace(LESSON, "order: 1", "order: first")
    problem = only(content)
    assert "`order` must be a positive whole number" in problem.message
    assert problem.line == content.line_of(LESSON, "order: first")


def test_an_unknown_front_matter_key_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "seconds: 60", "seconds: 60\nlevel: senior")
    assert "unknown front matter key `level`" in only(content).message


def test_a_stage_id_is_checked_against_the_labs_lab_yaml(content: ContentRoot) -> None:
    content.replace(LESSON, "{lab: dlq, stage: replay}", "{lab: dlq, stage: redrive}")
    problem = only(content)
    assert problem.message == ("lab 'dlq' has no stage 'redrive' (per labs/dlq/lab.yaml: "
                               "classify, replay)")
    assert problem.line == content.line_of(LESSON, "stage: redrive")


def test_an_unknown_lab_is_reported(content: ContentRoot) -> None:
    content.replace(LESSON, "{lab: dlq, stage: replay}", "{lab: saga, stage: replay}")
    messages = [p.message for p in problems_in(content)]
    assert ("unknown lab 'saga': there is no labs/saga/lab.yaml (labs: dlq, outbox)"
            in messages), messages


def test_a_lab_the_docs_once_planned_is_unknown_until_it_is_on_disk(
        content: ContentRoot) -> None:
    content.replace(LESSON, "{lab: dlq, stage: replay}", "{lab: money, stage: transfer}")
    messages = [p.message for p in problems_in(content)]
    assert any(m.startswith("unknown lab 'money'") for m in messages), messages


def test_a_lab_command_in_practise_it_is_checked_too(content: ContentRoot) -> None:
    content.replace(LESSON, "--stage classify", "--stage classfy")
    problem = only(content)
    assert "no stage 'classfy'" in problem.message
    assert problem.line == content.line_of(LESSON, "--stage classfy")


def test_practise_it_must_not_say_coming(content: ContentRoot) -> None:
    content.replace(LESSON, "proves the classification.", "proves the classification (coming).")
    assert "do not write \"coming\"" in only(content).message


def test_a_lesson_without_cards_yaml_is_reported(content: ContentRoot) -> None:
    content.path(IDEM / "cards.yaml").unlink()
    assert "every lesson needs a cards.yaml" in only(content, IDEM / "cards.yaml").message


def test_a_stray_file_in_a_lesson_folder_is_reported(content: ContentRoot) -> None:
    content.path(DLQ / "notes.txt").write_text("draft")
    assert "holds only lesson.md and cards.yaml" in only(content, DLQ / "notes.txt").message
