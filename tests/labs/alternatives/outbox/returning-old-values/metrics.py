"""What to watch on an outbox: how much is waiting, and how long events take to leave."""

from __future__ import annotations

from sqlalchemy import Engine, text


def pending_count(engine: Engine) -> int:
    """Rows not yet published (leased, backing off or waiting): a gauge, outbox_pending_count."""
    with engine.connect() as conn:
        return int(conn.execute(
            text("SELECT count(*) FROM outbox_event WHERE published_at IS NULL")).scalar_one())


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """Seconds since the oldest unpublished row was created; None when nothing is pending.
    The first number to alert on: it grows when the relay is stuck, even with no traffic."""
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT extract(epoch FROM clock_timestamp() - min(created_at)) "
            "FROM outbox_event WHERE published_at IS NULL")).scalar_one()
    return None if age is None else float(age)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """The `quantile` (0.5 = p50, 0.95 = p95) of publish age, published_at − created_at, over
    the events published in the last `window_seconds`; None when none were."""
    with engine.connect() as conn:
        age = conn.execute(
            text("SELECT percentile_disc(:q) WITHIN GROUP "
                 "(ORDER BY extract(epoch FROM published_at - created_at)) "
                 "FROM outbox_event WHERE published_at IS NOT NULL "
                 "AND published_at >= clock_timestamp() - make_interval(secs => :window)"),
            {"q": quantile, "window": window_seconds},
        ).scalar_one()
    return None if age is None else float(age)
