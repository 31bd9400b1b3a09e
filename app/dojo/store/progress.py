"""`ProgressStore`: everything the learner has done, behind one small API.

The TUI, the CLI, the quiz and the lab engine record through it; nobody else touches the
tables. Each method that writes is one transaction, so a process killed at any instant leaves
either the whole write or none of it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import fsrs
from sqlalchemy import Engine, func, select
from sqlalchemy.dialects.sqlite import insert
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session

from dojo.store.database import WRITE_OPTION, corrupt_store, ensure_schema, open_engine
from dojo.store.paths import database_path
from dojo.store.schema import (
    CardState,
    LabStageResult,
    LastPlace,
    LessonRead,
    QuizAnswer,
    ReviewLogRow,
)

LAST_SLOT = "last"


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class StoredReview:
    """A self-grade as it was recorded."""

    card_id: str
    rating: fsrs.Rating
    reviewed_at: datetime
    review_duration_ms: int | None


@dataclass(frozen=True)
class StoredAnswer:
    """A typed answer and its score as recorded."""

    card_id: str
    answered_at: datetime
    mode: str
    answer: str
    coverage: float
    raw_coverage: float
    matched_ids: tuple[str, ...]
    keyword_list: bool
    seconds_used: float | None


@dataclass(frozen=True)
class LessonProgress:
    """How far the learner got in a lesson."""

    lesson_id: str
    section: str
    position: int
    finished: bool
    first_read_at: datetime
    last_read_at: datetime


@dataclass(frozen=True)
class StageRecord:
    """The latest result of one lab stage."""

    lab: str
    stage: str
    status: str
    message: str
    at: datetime


@dataclass(frozen=True)
class Place:
    """Where the learner was last: a lesson section, a lab stage, a quiz card."""

    kind: str
    target: str
    detail: str
    at: datetime


class ProgressStore:
    """The progress database (SQLite). Tables are created on first use.

    Args:
        path: the database file; default `database_path()` (DOJO_DATA_DIR or the user's
            data dir).
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path or database_path()
        self._engine: Engine = open_engine(self.path)
        self._writer = self._engine.execution_options(**{WRITE_OPTION: True})
        try:
            ensure_schema(self._engine)
        except DatabaseError as exc:
            self._engine.dispose()
            raise corrupt_store(self.path, exc) from exc

    def close(self) -> None:
        """Release the database file (connections are pooled until then)."""
        self._engine.dispose()

    def __enter__(self) -> ProgressStore:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    @contextmanager
    def _write(self) -> Iterator[Session]:
        with Session(self._writer) as session, session.begin():
            yield session

    @contextmanager
    def _read(self) -> Iterator[Session]:
        with Session(self._engine) as session, session.begin():
            yield session

    # --- FSRS card states and review logs -------------------------------------------------

    def record_review(self, card_id: str, card: fsrs.Card, log: fsrs.ReviewLog) -> None:
        """Store a card's new FSRS state and the review that produced it, atomically."""
        at = log.review_datetime
        statement = insert(CardState).values(
            card_id=card_id, fsrs_card=card.to_json(), due=card.due, review_count=1,
            updated_at=at)
        statement = statement.on_conflict_do_update(
            index_elements=[CardState.card_id],
            set_={"fsrs_card": statement.excluded.fsrs_card, "due": statement.excluded.due,
                  "updated_at": statement.excluded.updated_at,
                  "review_count": CardState.review_count + 1})
        with self._write() as session:
            session.execute(statement)
            session.add(ReviewLogRow(card_id=card_id, rating=int(log.rating), reviewed_at=at,
                                     review_duration_ms=log.review_duration))

    def card_state(self, card_id: str) -> fsrs.Card | None:
        """The stored FSRS card, or None when the card was never reviewed."""
        with self._read() as session:
            row = session.get(CardState, card_id)
            return fsrs.Card.from_json(row.fsrs_card) if row else None

    def card_states(self) -> dict[str, fsrs.Card]:
        """Every reviewed card's FSRS state, by card id."""
        with self._read() as session:
            rows = session.execute(select(CardState.card_id, CardState.fsrs_card)).all()
        return {card_id: fsrs.Card.from_json(text) for card_id, text in rows}

    def review_count(self, card_id: str) -> int:
        """How many times the card was self-graded."""
        with self._read() as session:
            row = session.get(CardState, card_id)
            return row.review_count if row else 0

    def reviews(self, card_id: str | None = None) -> list[StoredReview]:
        """Review logs, oldest first; all cards, or one."""
        query = select(ReviewLogRow).order_by(ReviewLogRow.id)
        if card_id is not None:
            query = query.where(ReviewLogRow.card_id == card_id)
        with self._read() as session:
            return [StoredReview(row.card_id, fsrs.Rating(row.rating), row.reviewed_at,
                                 row.review_duration_ms) for row in session.scalars(query)]

    # --- quiz answers -----------------------------------------------------------------------

    def record_answer(self, card_id: str, answer: str, *, coverage: float, raw_coverage: float,
                      matched_ids: Sequence[str], keyword_list: bool, mode: str = "drill",
                      seconds_used: float | None = None, at: datetime | None = None) -> None:
        """Store a typed answer with its score."""
        with self._write() as session:
            session.add(QuizAnswer(
                card_id=card_id, answered_at=at or _now(), mode=mode, answer=answer,
                coverage=coverage, raw_coverage=raw_coverage,
                matched_ids=json.dumps(list(matched_ids)), keyword_list=int(keyword_list),
                seconds_used=seconds_used))

    def answers(self, card_id: str | None = None, limit: int | None = None) -> list[StoredAnswer]:
        """Recorded answers, newest first."""
        query = select(QuizAnswer).order_by(QuizAnswer.id.desc())
        if card_id is not None:
            query = query.where(QuizAnswer.card_id == card_id)
        if limit is not None:
            query = query.limit(limit)
        with self._read() as session:
            return [StoredAnswer(row.card_id, row.answered_at, row.mode, row.answer,
                                 row.coverage, row.raw_coverage,
                                 tuple(json.loads(row.matched_ids)), bool(row.keyword_list),
                                 row.seconds_used) for row in session.scalars(query)]

    # --- lessons ----------------------------------------------------------------------------

    def record_lesson_read(self, lesson_id: str, section: str, position: int = 0, *,
                           finished: bool = False, at: datetime | None = None) -> None:
        """Remember where the learner is in a lesson. `finished` sticks once set."""
        at = at or _now()
        statement = insert(LessonRead).values(
            lesson_id=lesson_id, section=section, position=position, finished=int(finished),
            first_read_at=at, last_read_at=at)
        statement = statement.on_conflict_do_update(
            index_elements=[LessonRead.lesson_id],
            set_={"section": statement.excluded.section,
                  "position": statement.excluded.position,
                  "last_read_at": statement.excluded.last_read_at,
                  "finished": func.max(LessonRead.finished, statement.excluded.finished)})
        with self._write() as session:
            session.execute(statement)

    def lesson_progress(self) -> dict[str, LessonProgress]:
        """Every lesson the learner opened, by lesson id."""
        with self._read() as session:
            return {row.lesson_id: LessonProgress(row.lesson_id, row.section, row.position,
                                                  bool(row.finished), row.first_read_at,
                                                  row.last_read_at)
                    for row in session.scalars(select(LessonRead))}

    # --- labs -------------------------------------------------------------------------------

    def record_stage_result(self, lab: str, stage: str, status: str, message: str = "", *,
                            at: datetime | None = None) -> None:
        """Store the outcome of running one stage's checks (pass | fail | error |
        needs-backend)."""
        with self._write() as session:
            session.add(LabStageResult(lab=lab, stage=stage, status=status, message=message,
                                       at=at or _now()))

    def stage_results(self, lab: str | None = None) -> dict[tuple[str, str], StageRecord]:
        """The latest result of every stage run, by (lab, stage)."""
        query = select(LabStageResult).order_by(LabStageResult.at, LabStageResult.id)
        if lab is not None:
            query = query.where(LabStageResult.lab == lab)
        latest: dict[tuple[str, str], StageRecord] = {}
        with self._read() as session:
            for row in session.scalars(query):
                latest[(row.lab, row.stage)] = StageRecord(row.lab, row.stage, row.status,
                                                           row.message, row.at)
        return latest

    def passed_stages(self, lab: str) -> set[str]:
        """The stages of `lab` whose latest run passed."""
        return {stage for (_, stage), record in self.stage_results(lab).items()
                if record.status == "pass"}

    # --- continue where you left off ----------------------------------------------------------

    def set_last_place(self, kind: str, target: str, detail: str = "", *,
                       at: datetime | None = None) -> None:
        """Remember the learner's place (kind lesson | lab | quiz, the id, a section or stage)."""
        statement = insert(LastPlace).values(slot=LAST_SLOT, kind=kind, target=target,
                                             detail=detail, at=at or _now())
        statement = statement.on_conflict_do_update(
            index_elements=[LastPlace.slot],
            set_={"kind": statement.excluded.kind, "target": statement.excluded.target,
                  "detail": statement.excluded.detail, "at": statement.excluded.at})
        with self._write() as session:
            session.execute(statement)

    def last_place(self) -> Place | None:
        """Where the learner was last, if anywhere."""
        with self._read() as session:
            row = session.get(LastPlace, LAST_SLOT)
            return Place(row.kind, row.target, row.detail, row.at) if row else None
