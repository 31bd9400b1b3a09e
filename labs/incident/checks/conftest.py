"""Fixtures for the incident checks: the run's seed and a recorded window to diagnose."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from types import SimpleNamespace
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


@pytest.fixture
def other_database(services: Any, database: Any) -> Iterator[Any]:
    """A second database on the same server, where the shop's own role may connect too (one
    application user in two databases, as real servers have): its sessions there are as
    visible to blocking_chain() as the shop's, and must be left out all the same. Returns an
    object like the `database` fixture whose `make_engine` logs in as the shop's role."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from dojo.checks.database import create_database, drop_database

    db = create_database(services, hint="other")
    try:
        with db.make_admin_engine().begin() as conn:
            from _live import SCHEMA

            conn.exec_driver_sql(SCHEMA)
            if database.role:
                conn.exec_driver_sql(f'GRANT CONNECT ON DATABASE "{db.name}" TO '
                                     f'"{database.role}"')
                conn.exec_driver_sql(f'GRANT SELECT, UPDATE ON stock, orders TO '
                                     f'"{database.role}"')
        shop_role_there = make_url(database.url).set(database=db.name).render_as_string(
            hide_password=False)

        def make_engine(**kwargs: Any) -> Any:
            engine = create_engine(shop_role_there, **kwargs)
            db._engines.append(engine)
            return engine

        yield SimpleNamespace(name=db.name, url=shop_role_there, engine=make_engine(),
                              make_engine=make_engine, make_admin_engine=db.make_admin_engine,
                              prepared=True)
    finally:
        drop_database(services, db)
