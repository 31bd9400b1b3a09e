from __future__ import annotations

from sqlalchemy import Engine, text

_DELETE = text(
    "DELETE FROM outbox_event WHERE ctid = ANY(ARRAY("
    " SELECT ctid FROM outbox_event"
    " WHERE published_at < clock_timestamp() - CAST(:keep AS float8) * interval '1 second'"
    " LIMIT :n FOR UPDATE SKIP LOCKED))")


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    total = 0
    if batch_size <= 0:
        return 0
    while True:
        with engine.begin() as conn:
            n = conn.execute(_DELETE, {"keep": retention_seconds, "n": batch_size}).rowcount
        total += n
        if n < batch_size:
            return total
