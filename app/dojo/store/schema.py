"""The progress tables. Bump SCHEMA_VERSION and add a step to `dojo.store.database.MIGRATIONS`
whenever a table changes; a database is never silently re-created."""

from __future__ import annotations

from datetime import UTC, datetime

from sqlalchemy import DateTime, Float, Index, Integer, String, Text, TypeDecorator
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA_VERSION = 1


class UTCDateTime(TypeDecorator[datetime]):
    """Aware UTC datetimes in, aware UTC datetimes out. SQLite has no time zones, so values
    are stored as naive UTC and the zone is put back on the way out."""

    impl = DateTime
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime: pass an aware one (datetime.now(UTC))")
        return value.astimezone(UTC).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        return value.replace(tzinfo=UTC) if value is not None else None


class Base(DeclarativeBase):
    pass


class SchemaVersion(Base):
    __tablename__ = "schema_version"
    version: Mapped[int] = mapped_column(Integer, primary_key=True)


class CardState(Base):
    """The FSRS state of one card, serialised by fsrs itself (Card.to_json)."""

    __tablename__ = "card_states"
    card_id: Mapped[str] = mapped_column(String, primary_key=True)
    fsrs_card: Mapped[str] = mapped_column(Text)
    due: Mapped[datetime] = mapped_column(UTCDateTime, index=True)
    review_count: Mapped[int] = mapped_column(Integer, default=0)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ReviewLogRow(Base):
    """One self-grade, as fsrs's ReviewLog has it; FSRS parameters can be re-fitted from these."""

    __tablename__ = "review_logs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    card_id: Mapped[str] = mapped_column(String, index=True)
    rating: Mapped[int] = mapped_column(Integer)
    reviewed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    review_duration_ms: Mapped[int | None] = mapped_column(Integer, nullable=True)


class QuizAnswer(Base):
    """A typed answer and how it scored."""

    __tablename__ = "quiz_answers"
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    card_id: Mapped[str] = mapped_column(String, index=True)
    answered_at: Mapped[datetime] = mapped_column(UTCDateTime)
    mode: Mapped[str] = mapped_column(String)  # drill | mock
    answer: Mapped[str] = mapped_column(Text)
    coverage: Mapped[float] = mapped_column(Float)
    raw_coverage: Mapped[float] = mapped_column(Float)
    matched_ids: Mapped[str] = mapped_column(Text)  # JSON list of key point ids
    keyword_list: Mapped[int] = mapped_column(Integer)
    seconds_used: Mapped[float | None] = mapped_column(Float, nullable=True)


class LessonRead(Base):
    """Where the learner is in a lesson, and whether they reached its end."""

    __tablename__ = "lesson_reads"
    lesson_id: Mapped[str] = mapped_column(String, primary_key=True)
    section: Mapped[str] = mapped_column(String)
    position: Mapped[int] = mapped_column(Integer)
    finished: Mapped[int] = mapped_column(Integer, default=0)
    first_read_at: Mapped[datetime] = mapped_column(UTCDateTime)
    last_read_at: Mapped[datetime] = mapped_column(UTCDateTime)


class LabStageResult(Base):
    """One run of one stage's checks; the history is kept, the latest row wins."""

    __tablename__ = "lab_stage_results"
    __table_args__ = (Index("ix_lab_stage_at", "lab", "stage", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    lab: Mapped[str] = mapped_column(String)
    stage: Mapped[str] = mapped_column(String)
    status: Mapped[str] = mapped_column(String)  # pass | fail | error | needs-backend
    message: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime] = mapped_column(UTCDateTime)


class LastPlace(Base):
    """Continue where you left off: one row per slot (the app uses "last")."""

    __tablename__ = "last_place"
    slot: Mapped[str] = mapped_column(String, primary_key=True)
    kind: Mapped[str] = mapped_column(String)  # lesson | lab | quiz
    target: Mapped[str] = mapped_column(String)  # lesson id, lab id, card id
    detail: Mapped[str] = mapped_column(String, default="")  # section slug, stage id, …
    at: Mapped[datetime] = mapped_column(UTCDateTime)
