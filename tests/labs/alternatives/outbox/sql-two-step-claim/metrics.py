from __future__ import annotations

from sqlalchemy import Engine, text


def pending_count(engine: Engine) -> int:
    with engine.begin() as conn:
        return conn.execute(text("SELECT count(*) FILTER (WHERE published_at IS NULL) "
                                 "FROM outbox_event")).scalar_one()


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    with engine.begin() as conn:
        v = conn.execute(text(
            "SELECT extract(epoch FROM clock_timestamp()) - extract(epoch FROM created_at) "
            "FROM outbox_event WHERE published_at IS NULL ORDER BY created_at LIMIT 1")).scalar()
    return None if v is None else float(v)


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    # nearest rank: the ceil(q*n)-th smallest age, with exact decimal arithmetic
    with engine.begin() as conn:
        v = conn.execute(text(
            "WITH a AS (SELECT extract(epoch FROM published_at) - extract(epoch FROM created_at)"
            "   AS age FROM outbox_event WHERE published_at IS NOT NULL"
            "   AND published_at > clock_timestamp() - CAST(:w AS float8) * interval '1 second'),"
            " r AS (SELECT age, row_number() OVER (ORDER BY age) AS rn, count(*) OVER () AS n"
            "   FROM a)"
            " SELECT age FROM r WHERE rn = greatest(1, ceil(CAST(CAST(:q AS float8) AS numeric) * n))"),
            {"q": quantile, "w": window_seconds}).scalar()
    return None if v is None else float(v)
