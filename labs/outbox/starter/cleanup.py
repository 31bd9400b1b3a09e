"""Housekeeping: published outbox rows are kept for a retention window, then deleted in small
batches so the delete never holds many locks or writes a burst of WAL at once.
"""

from __future__ import annotations

from sqlalchemy import Engine


def delete_published(engine: Engine, *, retention_seconds: float, batch_size: int = 1000) -> int:
    """Delete rows published more than `retention_seconds` ago, at most `batch_size` per
    transaction, until none are left. Unpublished rows are never deleted, however old.

    Returns:
        How many rows were deleted.
    """
    raise NotImplementedError(
        "delete_published: loop { with engine.begin(): DELETE … WHERE id IN (SELECT id … "
        "WHERE published_at < now − retention LIMIT :batch_size) } until a batch comes back "
        "short")
