"""Fixtures for the DLQ checks (on top of the kit's database, kafka and learner)."""

from __future__ import annotations

from typing import Any

import pytest
from _support import DLQLab
from sqlalchemy import Engine

from dojo.checks import InstantClock, apply_schema


@pytest.fixture
def lab(kafka: Any, learner: Any) -> DLQLab:
    """The learner's code bound to this test's topics."""
    return DLQLab(kafka, learner)


@pytest.fixture
def ledger_db(database: Any, learner: Any) -> Engine:
    """A fresh database with the learner's schema.sql applied; its engine."""
    apply_schema(database.engine, learner.dir)
    return database.engine


@pytest.fixture
def clock() -> InstantClock:
    """Real time plus every second slept: backoff costs no real time."""
    return InstantClock()
