"""Outbox gauges with SQLAlchemy Core."""

from __future__ import annotations

from sqlalchemy import (Column, DateTime, Engine, Float, MetaData, Table, Uuid, bindparam,
                        func, select)

_outbox = Table(
    "outbox_event", MetaData(),
    Column("id", Uuid, primary_key=True),
    Column("created_at", DateTime(timezone=True)),
    Column("published_at", DateTime(timezone=True)),
)
_pending = _outbox.c.published_at.is_(None)


def pending_count(engine: Engine) -> int:
    """Unpublished rows, whatever their lease or backoff."""
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(_outbox).where(_pending)).scalar_one()


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """now − created_at of the oldest unpublished row; None when none is pending."""
    age = func.extract("epoch", func.clock_timestamp() - func.min(_outbox.c.created_at))
    with engine.connect() as conn:
        value = conn.execute(select(age).where(_pending)).scalar_one()
    return None if value is None else float(value)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """The `quantile` of published_at − created_at (seconds, interpolated) over the rows
    published in the last `window_seconds`; None when none were."""
    age = func.extract("epoch", _outbox.c.published_at - _outbox.c.created_at)
    since = func.clock_timestamp() - func.make_interval(
        0, 0, 0, 0, 0, 0, bindparam("window", window_seconds, type_=Float))
    statement = (select(func.percentile_cont(bindparam("q", quantile, type_=Float))
                        .within_group(age))
                 .where(_outbox.c.published_at.is_not(None), _outbox.c.published_at >= since))
    with engine.connect() as conn:
        value = conn.execute(statement).scalar_one()
    return None if value is None else float(value)
