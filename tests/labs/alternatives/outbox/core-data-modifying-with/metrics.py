from __future__ import annotations

import math

from sqlalchemy import Engine, func, select

try:
    from .tables import outbox_event as ob
except ImportError:
    from tables import outbox_event as ob  # type: ignore[no-redef]


def pending_count(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(ob)
                                .where(ob.c.published_at.is_(None))).scalar_one())


def oldest_pending_age_seconds(engine: Engine) -> float | None:
    with engine.connect() as conn:
        row = conn.execute(select(func.clock_timestamp(), func.min(ob.c.created_at))
                           .where(ob.c.published_at.is_(None))).one()
    now, oldest = row
    return None if oldest is None else (now - oldest).total_seconds()


def publish_age_seconds(engine: Engine, quantile: float, *,
                        window_seconds: float = 900.0) -> float | None:
    since = func.clock_timestamp() - func.make_interval(0, 0, 0, 0, 0, 0, float(window_seconds))
    with engine.connect() as conn:
        ages = sorted((published - created).total_seconds() for created, published in conn.execute(
            select(ob.c.created_at, ob.c.published_at)
            .where(ob.c.published_at.is_not(None), ob.c.published_at >= since)))
    if not ages:
        return None
    # linear interpolation between closest ranks (what percentile_cont does)
    pos = quantile * (len(ages) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    return ages[lo] + (ages[hi] - ages[lo]) * (pos - lo)
