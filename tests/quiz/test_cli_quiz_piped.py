"""`dojo quiz` end to end with piped stdin: no clock, answers end at an empty line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import fsrs

from dojo.quiz import ReviewScheduler, SelfGrade
from dojo.store import ProgressStore
from tests.quiz.cli_helpers import run_dojo

PARTIAL_DLQ = ("A DLQ is where the consumer parks a message it cannot process, so the stream "
               "keeps moving.\nWe retry timeouts with exponential backoff.\n")


def test_a_round_shows_coverage_points_and_the_model_answer(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "1"], tmp_path, PARTIAL_DLQ + "\n3\n")
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "What is a dead letter queue?" in out
    assert "Coverage 40%  (2 of 5 essentials)" in out
    assert "✓ It parks messages that cannot be processed" in out
    assert "✗ Permanent failures go to the DLQ at once" in out
    assert "Model answer" in out and "silent graveyard that" in out
    assert "→ 3 Good" in out
    assert "⏱" not in out  # no ticking when stdin is not a terminal


def test_the_round_is_recorded_and_scheduled(tmp_path: Path) -> None:
    run_dojo(["quiz", "-n", "1"], tmp_path, PARTIAL_DLQ + "\n3\n")
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        (review,) = store.reviews()
        (answer,) = store.answers()
    assert (review.card_id, review.rating) == ("fx-dlq-what", fsrs.Rating.Good)
    assert answer.matched_ids == ("parks", "backoff") and answer.coverage == 0.4


def test_enter_at_the_grade_takes_the_suggested_grade(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "1"], tmp_path, PARTIAL_DLQ + "\n\n")
    assert "[Enter = 2 Hard" in done.stdout and "→ 2 Hard" in done.stdout


def test_a_grade_that_is_not_one_to_four_is_asked_again(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "1"], tmp_path, PARTIAL_DLQ + "\n7\n4\n")
    assert "'7' is not a grade" in done.stdout and "→ 4 Easy" in done.stdout


def test_cards_follow_one_another_until_the_count(tmp_path: Path) -> None:
    answers = PARTIAL_DLQ + "\n3\n" + "The original payload and the trace id.\n\n3\n"
    done = run_dojo(["quiz", "-n", "2"], tmp_path, answers)
    assert "[1/2] Dead letter queues · headline" in done.stdout
    assert "[2/2] Dead letter queues · follow-up" in done.stdout
    assert "2 answered, mean coverage 45%." in done.stdout


def test_the_end_of_input_ends_the_session_cleanly(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "3"], tmp_path, PARTIAL_DLQ + "\n3\n")
    assert done.returncode == 0, done.stderr
    assert "1 answered" in done.stdout
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        assert len(store.reviews()) == 1  # the unanswered cards were not graded


def test_q_at_the_grade_stops_without_grading(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "-n", "3"], tmp_path, PARTIAL_DLQ + "\nq\nmore\n\n3\n")
    assert done.returncode == 0 and "[2/3]" not in done.stdout
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        assert store.reviews() == []


def test_lesson_limits_the_round_to_that_lessons_cards(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "--lesson", "idempotent-consumer", "-n", "1"], tmp_path,
                    "at least once\n\n1\n")
    assert "How do you make a consumer idempotent?" in done.stdout
    assert "dead letter queue?" not in done.stdout


def test_an_unknown_lesson_is_a_usage_error(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "--lesson", "saga"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("error: no lesson 'saga'; lessons: 01 dead-letter-queue, "
                                  "02 idempotent-consumer")


def test_due_with_nothing_due_says_so(tmp_path: Path) -> None:
    done = run_dojo(["quiz", "--due"], tmp_path)
    assert done.returncode == 0 and "Nothing is due." in done.stdout


def test_due_asks_a_card_whose_review_has_come(tmp_path: Path) -> None:
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        an_hour_ago = datetime.now(UTC) - timedelta(hours=1)
        ReviewScheduler(store).review("fx-dlq-what", SelfGrade.AGAIN, at=an_hour_ago)
    done = run_dojo(["quiz", "--due"], tmp_path, PARTIAL_DLQ + "\n3\n")
    assert "[1/1] Dead letter queues · headline" in done.stdout


def test_a_keyword_list_is_explained(tmp_path: Path) -> None:
    stuffed = "dlq, park, retry with backoff, malformed at once, pause consumption, alert owner\n"
    done = run_dojo(["quiz", "-n", "1"], tmp_path, stuffed + "\n\n")
    assert "this reads like a keyword list" in done.stdout
    assert "→ 1 Again" in done.stdout


def test_a_mock_interview_asks_follow_ups_and_reports(tmp_path: Path) -> None:
    answers = "".join(f"answer {n}: I do not know this one.\n\n" for n in range(4))
    done = run_dojo(["quiz", "--mock", "2", "--seed", "3"], tmp_path, answers)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert out.count("· headline") == 2 and out.count("· follow-up") == 2
    assert "Mock interview report — overall 0%" in out
    assert "Weakest lessons" in out and "lab: dojo lab start dlq  (stages: classify, replay)" in out
    assert "dojo quiz --lesson dead-letter-queue" in out
    with ProgressStore(tmp_path / "progress.sqlite3") as store:
        assert {answer.mode for answer in store.answers()} == {"mock"}
        assert len(store.answers()) == 4
        assert store.reviews() == []  # a mock interview does not self-grade
