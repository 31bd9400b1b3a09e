from __future__ import annotations

from sqlalchemy import Engine, text

_DELETE = text("""
WITH doomed AS (
    SELECT id FROM outbox_event
    WHERE published_at IS NOT NULL
      AND published_at < clock_timestamp() - make_interval(secs => CAST(:keep AS float8))
    LIMIT :n
    FOR UPDATE SKIP LOCKED
)
DELETE FROM outbox_event e USING doomed WHERE e.id = doomed.id
""")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    deleted = 0
    short = False
    while not short:
        with engine.begin() as conn:
            n = conn.execute(_DELETE, {"keep": float(retention_seconds), "n": batch_size}).rowcount
        deleted += n
        short = n < batch_size
    return deleted
