"""What to watch on an outbox: how much is waiting, and how long events take to leave."""

from __future__ import annotations

from sqlalchemy import Engine


def pending_count(engine: Engine) -> int:
    """Rows not yet published (leased, backing off or waiting): the outbox_pending_count
    gauge."""
    raise NotImplementedError("pending_count: count the rows with published_at IS NULL")


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """Seconds since the oldest unpublished row was created; None when nothing is pending."""
    raise NotImplementedError(
        "oldest_pending_age_seconds: now − min(created_at) over the unpublished rows")


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """The `quantile` (0.5 = p50, 0.95 = p95) of publish age, published_at − created_at, over
    the events published in the last `window_seconds`; None when none were."""
    raise NotImplementedError(
        "publish_age_seconds: percentile_cont(:quantile) WITHIN GROUP (ORDER BY "
        "published_at − created_at) over the rows published in the window")
