"""Housekeeping, second design: each batch is one DELETE … USING a locked pick of ids."""

from __future__ import annotations

from sqlalchemy import Engine, text

DELETE_SQL = text("""
WITH doomed AS (
    SELECT id FROM outbox_event
    WHERE published_at IS NOT NULL
      AND published_at <= clock_timestamp() - CAST(:keep AS double precision) * interval '1 second'
    LIMIT :batch_size
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_event e USING doomed WHERE e.id = doomed.id
""")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published at least `retention_seconds` ago, `batch_size` per transaction."""
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    total = 0
    while True:
        with engine.begin() as conn:
            deleted = conn.execute(DELETE_SQL, {"keep": float(retention_seconds),
                                                "batch_size": batch_size}).rowcount
        total += deleted
        if deleted < batch_size:
            return total
