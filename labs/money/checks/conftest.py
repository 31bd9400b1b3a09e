"""Fixtures for the money checks (on top of the kit's database and learner)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
from _provider import FxProvider
from _support import ClientKit, ExchangeKit, StoppedClock
from sqlalchemy import Engine

from dojo.checks import apply_schema, call, require_tables

# Enough connections for the widest race (40 workers) without queueing on the pool.
RACE_POOL = {"pool_size": 45, "max_overflow": 0, "pool_timeout": 20}


@pytest.fixture
def bank(database: Any, learner: Any) -> Engine:
    """A fresh database with the learner's schema.sql applied; an engine with a pool wide
    enough for the races."""
    engine = database.make_engine(**RACE_POOL)
    apply_schema(engine, learner.dir)
    return engine


@pytest.fixture
def ledger_tables(bank: Engine) -> Engine:
    from _support import TABLES

    require_tables(bank, TABLES, "schema")
    return bank


@pytest.fixture
def accounts(learner: Any, ledger_tables: Engine) -> ModuleType:
    return learner.module("accounts")


@pytest.fixture
def funded(accounts: ModuleType, bank: Engine) -> Callable[..., int]:
    """funded("100.00", currency="USD") -> a new customer account holding that much, opened
    and funded through the learner's open_account and deposit."""
    def make(amount: str = "0", currency: str = "USD") -> int:
        account_id = call(accounts.open_account, bank, currency=currency)
        if Decimal(amount) > 0:
            call(accounts.deposit, bank, account_id, Decimal(amount))
        return int(account_id)

    return make


@pytest.fixture
def provider() -> Iterator[FxProvider]:
    fx = FxProvider().start()
    try:
        yield fx
    finally:
        fx.stop()


@pytest.fixture
def clock() -> Any:
    """A clock that stands still, years from the wall clock, until the check moves it on
    (`advance`) past a TTL or an age. The circuit-breaker checks override it with one that
    moves with real time (they time calls)."""
    return StoppedClock()


@pytest.fixture
def kit(learner: Any, accounts: ModuleType, bank: Engine, provider: FxProvider,
        clock: Any) -> ExchangeKit:
    from _support import LATER_TABLES

    require_tables(bank, LATER_TABLES, "exchange")
    return ExchangeKit(learner.module("fx_client"), learner.module("breaker"), provider, clock,
                       accounts=accounts, exchange=learner.module("exchange"), engine=bank)


@pytest.fixture
def client_kit(learner: Any, provider: FxProvider, clock: Any) -> ClientKit:
    """The provider client and the breaker alone: no database for checks that need none."""
    return ClientKit(learner.module("fx_client"), learner.module("breaker"), provider, clock)
