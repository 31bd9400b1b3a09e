"""Fixtures for the incident checks: the run's seed and a recorded window to diagnose."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from _history import CLOCK_SKEW_MS, Recorded, Scenario, build, record, write_logs
from _support import Sources, observability, run_seed

_SEED = run_seed()
# the recorded windows of this run, by kind (recording one takes a moment; it never changes)
_RECORDED: dict[str | None, tuple[Scenario, Recorded]] = {}


@pytest.fixture(scope="session")
def seed() -> int:
    """One seed for the whole run; every failure names it so the run can be replayed."""
    return _SEED


Window = tuple[Scenario, Recorded, Sources]


@pytest.fixture
def window(seed: int, tmp_path: Path) -> Iterator[Callable[[str | None], Window]]:
    """window(kind) → the scenario `kind` (None: healthy) recorded and served: its metrics
    endpoint and change log on 127.0.0.1, its logs in files."""
    stack = ExitStack()

    def make(kind: str | None) -> Window:
        if kind not in _RECORDED:
            _RECORDED[kind] = (build(kind, seed), record(build(kind, seed)))
        scenario, recorded = _RECORDED[kind]
        paths = write_logs(recorded, tmp_path / f"logs-{kind or 'healthy'}")
        sources = stack.enter_context(observability(scenario, recorded, list(paths.values())))
        sources.extra["paths"] = paths
        return scenario, recorded, sources

    with stack:
        yield make


def pytest_report_header(config: Any) -> str:
    return f"incident run {_SEED}"


@pytest.fixture
def shop(window: Callable[[str | None], Window], database: Any, kafka: Any
         ) -> Iterator[Callable[..., tuple[Any, Scenario, Sources]]]:
    """shop(kind) → the live shop broken the way `kind` says (None: healthy), its scenario
    and the sources (the recorded window, the logs the live services append to)."""
    from _live import SCHEMA, SKU, Logs, Shop
    from sqlalchemy import text

    with database.engine.begin() as conn:
        conn.exec_driver_sql(SCHEMA)
    stack = ExitStack()

    def make(kind: str | None, **options: Any) -> tuple[Any, Scenario, Sources]:
        scenario, _recorded, sources = window(kind)
        sources.database_url = database.url
        logs = Logs(sources.extra["paths"], scenario.end, CLOCK_SKEW_MS.get(kind or ""))
        if kind == "stock-lock":
            # the inventory job's transaction: a row lock held, the session idle
            blocker = database.make_engine(
                connect_args={"application_name": "inventory-sync"}).connect()
            blocker.execute(text("UPDATE stock SET qty = qty WHERE sku = :s"), {"s": SKU})
            stack.callback(blocker.close)
            stack.callback(blocker.rollback)
        shop = Shop(kind, database.engine, logs, kafka, kafka.topic(1, hint="orders"),
                    **options)
        stack.callback(shop.close)
        return shop, scenario, sources

    with stack:
        yield make
