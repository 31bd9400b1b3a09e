"""Outbox gauges. The two pending gauges walk the partial index (oldest first, one row); the
publish-age quantile is interpolated in Python from the ages in the window."""

from __future__ import annotations

import math

from sqlalchemy import Engine, text


def pending_count(engine: Engine) -> int:
    """Unpublished rows, leased and backing-off ones included."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM outbox_event WHERE published_at IS NULL")).scalar_one()


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """Seconds since the oldest unpublished row was created, or None."""
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT EXTRACT(EPOCH FROM clock_timestamp() - created_at) FROM outbox_event "
            "WHERE published_at IS NULL ORDER BY created_at LIMIT 1")).scalar_one_or_none()
    return None if age is None else float(age)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """The `quantile` of published_at − created_at over the rows published in the last
    `window_seconds`, linearly interpolated between the two nearest ranks (the definition of
    percentile_cont); None when nothing was published in the window."""
    with engine.connect() as conn:
        ages = sorted(float(age) for age in conn.execute(text(
            "SELECT EXTRACT(EPOCH FROM published_at - created_at) FROM outbox_event "
            "WHERE published_at >= clock_timestamp() - :window * interval '1 second'"),
            {"window": float(window_seconds)}).scalars())
    if not ages:
        return None
    rank = quantile * (len(ages) - 1)
    low, high = math.floor(rank), math.ceil(rank)
    return ages[low] + (ages[high] - ages[low]) * (rank - low)
