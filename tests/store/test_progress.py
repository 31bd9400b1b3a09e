"""ProgressStore: what is recorded comes back, in one transaction per write."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import fsrs
import pytest

from dojo.store import SCHEMA_VERSION, ProgressStore, StoreError, database_path

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def reviewed(rating: fsrs.Rating, card: fsrs.Card | None = None,
             at: datetime = T0) -> tuple[fsrs.Card, fsrs.ReviewLog]:
    scheduler = fsrs.Scheduler(enable_fuzzing=False)
    return scheduler.review_card(card or fsrs.Card(card_id=7), rating, at)


def test_the_database_lives_in_dojo_data_dir(data_dir: Path) -> None:
    assert database_path() == data_dir / "progress.sqlite3"
    ProgressStore().close()
    assert (data_dir / "progress.sqlite3").is_file()


def test_the_schema_is_created_on_first_use_with_its_version(store: ProgressStore) -> None:
    with sqlite3.connect(store.path) as conn:
        tables = {name for (name,) in conn.execute("select name from sqlite_master "
                                                   "where type = 'table'")}
        version = conn.execute("select version from schema_version").fetchall()
    assert {"card_states", "review_logs", "quiz_answers", "lesson_reads",
            "lab_stage_results", "last_place", "schema_version"} <= tables
    assert version == [(SCHEMA_VERSION,)]


def test_a_database_from_a_newer_dojo_is_refused(store: ProgressStore) -> None:
    store.close()
    with sqlite3.connect(store.path) as conn:
        conn.execute("update schema_version set version = ?", (SCHEMA_VERSION + 1,))
    with pytest.raises(StoreError, match="Upgrade dojo"):
        ProgressStore(store.path)


def test_the_journal_is_write_ahead(store: ProgressStore) -> None:
    with sqlite3.connect(store.path) as conn:
        assert conn.execute("pragma journal_mode").fetchone() == ("wal",)


def test_a_review_stores_the_fsrs_card_and_its_log(store: ProgressStore) -> None:
    card, log = reviewed(fsrs.Rating.Good)
    store.record_review("dlq-what", card, log)
    assert store.card_state("dlq-what") is not None
    assert store.card_state("dlq-what").to_dict() == card.to_dict()  # type: ignore[union-attr]
    (review,) = store.reviews("dlq-what")
    assert (review.rating, review.reviewed_at) == (fsrs.Rating.Good, T0)


def test_each_review_replaces_the_state_and_adds_a_log(store: ProgressStore) -> None:
    card, log = reviewed(fsrs.Rating.Again)
    store.record_review("dlq-what", card, log)
    card, log = reviewed(fsrs.Rating.Easy, card, T0 + timedelta(minutes=5))
    store.record_review("dlq-what", card, log)
    assert store.review_count("dlq-what") == 2
    assert [r.rating for r in store.reviews("dlq-what")] == [fsrs.Rating.Again,
                                                            fsrs.Rating.Easy]
    assert store.card_state("dlq-what").due == card.due  # type: ignore[union-attr]


def test_a_card_never_reviewed_has_no_state(store: ProgressStore) -> None:
    assert store.card_state("never") is None
    assert store.review_count("never") == 0


def test_answers_come_back_newest_first_with_their_matched_points(
        store: ProgressStore) -> None:
    store.record_answer("a", "first", coverage=0.25, raw_coverage=0.5, matched_ids=["x"],
                        keyword_list=True, at=T0)
    store.record_answer("a", "second", coverage=1.0, raw_coverage=1.0, matched_ids=["x", "y"],
                        keyword_list=False, mode="mock", seconds_used=41.5,
                        at=T0 + timedelta(seconds=1))
    latest, first = store.answers("a")
    assert (latest.answer, latest.matched_ids, latest.mode, latest.seconds_used) == (
        "second", ("x", "y"), "mock", 41.5)
    assert (first.keyword_list, first.coverage, first.raw_coverage) == (True, 0.25, 0.5)


def test_a_lesson_read_keeps_the_latest_place_and_the_first_time(store: ProgressStore) -> None:
    store.record_lesson_read("dead-letter-queue", "deep-dive", 12, at=T0)
    store.record_lesson_read("dead-letter-queue", "sources", 40, at=T0 + timedelta(hours=1))
    progress = store.lesson_progress()["dead-letter-queue"]
    assert (progress.section, progress.position) == ("sources", 40)
    assert (progress.first_read_at, progress.last_read_at) == (T0, T0 + timedelta(hours=1))


def test_a_finished_lesson_stays_finished_when_reopened(store: ProgressStore) -> None:
    store.record_lesson_read("dead-letter-queue", "sources", 40, finished=True)
    store.record_lesson_read("dead-letter-queue", "the-60-second-answer", 0)
    assert store.lesson_progress()["dead-letter-queue"].finished


def test_the_latest_stage_result_wins(store: ProgressStore) -> None:
    store.record_stage_result("outbox", "claim", "pass", at=T0)
    store.record_stage_result("outbox", "claim", "fail", "two relays got row 3",
                              at=T0 + timedelta(minutes=1))
    store.record_stage_result("outbox", "schema", "pass", at=T0)
    results = store.stage_results("outbox")
    assert results[("outbox", "claim")].status == "fail"
    assert results[("outbox", "claim")].message == "two relays got row 3"
    assert store.passed_stages("outbox") == {"schema"}


def test_the_last_place_is_the_most_recent_one(store: ProgressStore) -> None:
    assert store.last_place() is None
    store.set_last_place("lesson", "dead-letter-queue", "deep-dive")
    store.set_last_place("lab", "outbox", "claim")
    place = store.last_place()
    assert place is not None and (place.kind, place.target, place.detail) == (
        "lab", "outbox", "claim")


def test_a_second_store_on_the_same_file_sees_the_writes(store: ProgressStore) -> None:
    # The TUI and a CLI command run side by side on one database.
    with ProgressStore(store.path) as other:
        other.record_stage_result("dlq", "classify", "pass")
    assert store.passed_stages("dlq") == {"classify"}


def test_naive_datetimes_are_refused(store: ProgressStore) -> None:
    with pytest.raises(Exception, match="naive datetime"):
        store.record_stage_result("dlq", "classify", "pass", at=datetime(2026, 1, 1))
