"""Housekeeping: delete rows published longer ago than the retention, a bounded batch per
transaction, addressing the batch by physical row id (ctid) of rows locked in that same
transaction."""

from __future__ import annotations

from sqlalchemy import Engine, text

_DELETE_BATCH = text("""
DELETE FROM outbox_event
WHERE ctid = ANY(ARRAY(
    SELECT ctid FROM outbox_event
    WHERE published_at < clock_timestamp() - :retention * interval '1 second'
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED))
""")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published more than `retention_seconds` ago (never unpublished ones: NULL
    is not older than anything), `batch_size` at most per transaction, until a batch comes back
    short. Returns how many were deleted."""
    total = 0
    while True:
        with engine.begin() as conn:
            batch = conn.execute(_DELETE_BATCH, {"retention": float(retention_seconds),
                                                 "batch_size": batch_size}).rowcount
        total += batch
        if batch < batch_size:
            return total
