"""Helpers shared by the Kafka conformance tests."""

from __future__ import annotations

import time
from typing import Any


def consume(consumer: Any, count: int, timeout: float = 20.0) -> list[Any]:
    """Poll until `count` records arrived or `timeout` passed; errors fail loudly."""
    records: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(records) < count and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            raise AssertionError(f"consumer error: {msg.error()}")
        records.append(msg)
    return records


def produce_all(producer: Any, topic: str, items: list[tuple[bytes | None, bytes]],
                **kwargs: Any) -> list[Any]:
    """Produce and wait for every acknowledgement; return the delivery reports' messages."""
    delivered: list[Any] = []
    errors: list[Any] = []

    def on_delivery(err: Any, msg: Any) -> None:
        (errors if err else delivered).append(err or msg)

    for key, value in items:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery, **kwargs)
    remaining = producer.flush(30)
    assert remaining == 0, f"{remaining} records not acknowledged within 30 s"
    assert not errors, f"delivery failed: {errors[:3]}"
    return delivered
