"""Outbox gauges: pending count and oldest age in one scan, and the publish-age quantile
computed by percentile_cont over intervals."""

from __future__ import annotations

from sqlalchemy import Engine, text

_PENDING = text("""
SELECT count(*) AS pending,
       EXTRACT(EPOCH FROM clock_timestamp() - min(created_at)) AS oldest_age
FROM outbox_event
WHERE published_at IS NULL
""")


def pending_count(engine: Engine) -> int:
    """Unpublished rows, leased and backing-off ones included."""
    with engine.connect() as conn:
        return int(conn.execute(_PENDING).one().pending)


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """Seconds since the oldest unpublished row was created; None when none is pending."""
    with engine.connect() as conn:
        age = conn.execute(_PENDING).one().oldest_age
    return None if age is None else float(age)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """The `quantile` of publish age over the rows published in the last `window_seconds`."""
    with engine.connect() as conn:
        age = conn.execute(text("""
            SELECT EXTRACT(EPOCH FROM
                   percentile_cont(CAST(:q AS float8)) WITHIN GROUP
                       (ORDER BY published_at - created_at))
            FROM outbox_event
            WHERE published_at > clock_timestamp() - make_interval(secs => :window)
        """), {"q": quantile, "window": window_seconds}).scalar_one()
    return None if age is None else float(age)
