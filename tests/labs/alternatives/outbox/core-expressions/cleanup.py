"""Housekeeping with SQLAlchemy Core: delete rows published longer ago than the retention,
one bounded batch per transaction."""

from __future__ import annotations

from sqlalchemy import (Column, DateTime, Engine, Float, MetaData, Table, Uuid, bindparam,
                        delete, func, select)

_outbox = Table(
    "outbox_event", MetaData(),
    Column("id", Uuid, primary_key=True),
    Column("published_at", DateTime(timezone=True)),
)


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published more than `retention_seconds` ago, at most `batch_size` per
    statement and transaction, until a batch comes back short. Returns the total."""
    cutoff = func.clock_timestamp() - func.make_interval(
        0, 0, 0, 0, 0, 0, bindparam("retention", retention_seconds, type_=Float))
    victims = (select(_outbox.c.id)
               .where(_outbox.c.published_at.is_not(None), _outbox.c.published_at < cutoff)
               .order_by(_outbox.c.published_at)
               .limit(batch_size)
               .with_for_update(skip_locked=True)
               .scalar_subquery())
    statement = delete(_outbox).where(_outbox.c.id.in_(victims))
    total = 0
    while True:
        with engine.begin() as conn:
            deleted = conn.execute(statement).rowcount
        total += deleted
        if deleted < batch_size:
            return total
