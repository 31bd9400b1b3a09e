"""What to watch on an outbox, second design: percentile_disc and epoch arithmetic."""

from __future__ import annotations

from sqlalchemy import Engine, text


def pending_count(engine: Engine) -> int:
    """Every unpublished row, leased and backing-off ones included."""
    with engine.connect() as conn:
        return int(conn.execute(text(
            "SELECT count(*) FILTER (WHERE published_at IS NULL) FROM outbox_event")).scalar_one())


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    """now − created_at of the oldest unpublished row, as a difference of epochs."""
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT extract(epoch FROM clock_timestamp()) - extract(epoch FROM min(created_at)) "
            "FROM outbox_event WHERE published_at IS NULL")).scalar_one()
    return None if age is None else float(age)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """percentile_disc of published_at − created_at over rows published in the window."""
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT percentile_disc(CAST(:q AS double precision)) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM published_at) - extract(epoch FROM created_at)) "
            "FROM outbox_event WHERE published_at IS NOT NULL "
            "AND published_at > clock_timestamp() "
            "    - CAST(:window AS double precision) * interval '1 second'"),
            {"q": quantile, "window": float(window_seconds)}).scalar_one()
    return None if age is None else float(age)
