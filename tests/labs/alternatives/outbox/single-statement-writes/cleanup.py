"""Housekeeping: DELETE … USING a locked, bounded batch of expired published rows, one
transaction per batch."""

from __future__ import annotations

from sqlalchemy import Engine, text

_BATCH = text("""
DELETE FROM outbox_event AS e
USING (
    SELECT id FROM outbox_event
    WHERE published_at IS NOT NULL
      AND published_at <= clock_timestamp() - make_interval(secs => :retention)
    ORDER BY published_at, id
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
) AS expired
WHERE e.id = expired.id
""")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published more than `retention_seconds` ago, `batch_size` per transaction,
    until a batch is short; unpublished rows are never touched. Returns the total."""
    deleted = 0
    short = False
    while not short:
        with engine.begin() as conn:
            count = conn.execute(_BATCH, {"retention": retention_seconds,
                                          "batch_size": batch_size}).rowcount
        deleted += count
        short = count < batch_size
    return deleted
