"""Housekeeping: published outbox rows are kept for a retention window, then deleted in small
batches so the delete never holds many locks or writes a burst of WAL at once.
"""

from __future__ import annotations

from sqlalchemy import Engine, text


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published more than `retention_seconds` ago, at most `batch_size` per
    transaction, until none are left. Unpublished rows are never deleted, however old.

    Returns:
        How many rows were deleted.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}")
    total = 0
    while True:
        with engine.begin() as conn:
            deleted = conn.execute(
                text("DELETE FROM outbox_event WHERE id IN ("
                     " SELECT id FROM outbox_event"
                     " WHERE published_at IS NOT NULL"
                     "   AND published_at <= clock_timestamp() - make_interval(secs => :keep)"
                     " ORDER BY published_at LIMIT :batch_size FOR UPDATE SKIP LOCKED)"),
                {"keep": retention_seconds, "batch_size": batch_size},
            ).rowcount
        total += deleted
        if deleted < batch_size:
            return total
