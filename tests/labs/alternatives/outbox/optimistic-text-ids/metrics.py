"""Outbox metrics, computed with different SQL than the reference."""

from __future__ import annotations

from sqlalchemy import Engine, text


def pending_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FILTER (WHERE published_at IS NULL) FROM outbox_event")
        ).scalar_one()


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT extract(epoch FROM clock_timestamp() - created_at) FROM outbox_event "
            "WHERE published_at IS NULL ORDER BY created_at LIMIT 1")).scalar_one_or_none()
    return None if age is None else float(age)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    """Nearest-rank quantile (percentile_disc) over rows published within the window."""
    with engine.connect() as conn:
        age = conn.execute(text(
            "SELECT percentile_disc(CAST(:q AS float8)) WITHIN GROUP "
            "(ORDER BY extract(epoch FROM published_at - created_at)) FROM outbox_event "
            "WHERE published_at > clock_timestamp() - :w * interval '1 second'"),
            {"q": quantile, "w": float(window_seconds)}).scalar_one()
    return None if age is None else float(age)
