"""Fixtures for the outbox checks (on top of the kit's database, kafka and learner)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _support import session_zone
from sqlalchemy import Engine, text

from dojo.checks import apply_schema, call

_PRODUCERS: dict[str, Any] = {}  # one idempotent producer per distinct config, for the session


@pytest.fixture
def outbox(database: Any, learner: Any) -> Engine:
    """A fresh database with the learner's schema.sql applied; its engine.

    Its sessions run in a time zone hours away from this process's (README: "the database's
    clock"), as a database server elsewhere would: a naive `datetime.now()` compared with a
    timestamptz is then read in the session's zone and is off by hours, not by nothing."""
    engine = database.engine
    with engine.connect() as conn:
        conn.execute(text(f"ALTER DATABASE \"{database.name}\" SET timezone TO "
                          f"'{session_zone()}'"))
        conn.commit()
    engine.dispose()  # new sessions take the database's setting
    apply_schema(engine, learner.dir)
    return engine


@pytest.fixture
def relay_producer(kafka: Any, learner: Any) -> Iterator[Callable[..., Any]]:
    """make(**overrides) → a confluent-kafka Producer built from the learner's
    relay.producer_config(base), base being the check's broker settings plus `overrides`.

    Producers are kept for the session (an idempotent producer spends ~0.5 s getting its id);
    each test flushes what it left behind.
    """
    from confluent_kafka import Producer

    used: list[Any] = []

    def make(**overrides: Any) -> Any:
        relay = learner.module("relay")
        config = call(relay.producer_config, kafka.producer_config(**overrides))
        key = json.dumps(config, sort_keys=True, default=str)
        if key not in _PRODUCERS:
            producer = Producer(config)
            # An idempotent producer's first send waits ~0.5-1 s for its producer id; pay that
            # here, so a check's timings measure the learner's code and not librdkafka's.
            producer.produce(kafka.topic(1, hint="warmup"), value=b"warm-up")
            producer.flush(10)
            _PRODUCERS[key] = producer
        used.append(_PRODUCERS[key])
        return _PRODUCERS[key]

    yield make
    for producer in used:
        producer.flush(5)
