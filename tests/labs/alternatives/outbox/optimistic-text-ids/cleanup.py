"""Delete published rows past retention, one small transaction per batch (ctid-based)."""

from __future__ import annotations

from sqlalchemy import Engine, text

_DELETE = text("""
WITH doomed AS (
    SELECT ctid FROM outbox_event
    WHERE published_at IS NOT NULL
      AND published_at <= clock_timestamp() - :keep * interval '1 second'
    LIMIT :n
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_event o USING doomed WHERE o.ctid = doomed.ctid
RETURNING o.id
""")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    total = 0
    while True:
        with engine.begin() as conn:
            n = len(conn.execute(_DELETE, {"keep": float(retention_seconds),
                                           "n": batch_size}).all())
        total += n
        if n < batch_size:
            return total
