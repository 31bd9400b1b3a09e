"""The shipping consumer: reads `order placed` records and records shipments.

It works, but nothing in it is traced yet. Each TO DO says which stage adds what.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import shop

log = logging.getLogger("orders.consumer")


def dead_letter(deps: shop.Deps, record: Any, error: BaseException) -> None:
    """Park the record on deps.dlt_topic: the same key and value, every original header
    (traceparent and tracestate with them), plus headers of your own saying why; wait for
    the acknowledgement."""
    raise NotImplementedError(
        "dead_letter: produce key, value and list(record.headers() or []) + your headers to "
        "deps.dlt_topic, then flush (README, stage 7)")


def handle_record(deps: shop.Deps, record: Any, *, max_attempts: int = 3) -> bool:
    """Ship the order in `record`; after `max_attempts` failed attempts, dead-letter it.

    TO DO (stage 5): extract the context from the record's headers and run this in a
    CONSUMER span "process order", a child of the producer's span (a new trace, and a
    WARNING saying so, when the record has no valid traceparent). (Stage 7: record each
    failed attempt on the span, status ERROR when dead-lettered.)

    Returns:
        True when shipped, False when dead-lettered.
    """
    for attempt in range(1, max_attempts + 1):
        try:
            order_id = shop.ship_order(deps.engine, record.value())
        except Exception as exc:
            if attempt < max_attempts:
                log.warning("attempt %d of %d failed: %s", attempt, max_attempts, exc)
                continue
            log.error("dead-lettering the record after %d attempts", max_attempts,
                      exc_info=exc)
            dead_letter(deps, record, exc)
            return False
        log.info("order shipped", extra={"order_id": str(order_id)})
        return True
    return False


def consume(deps: shop.Deps, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            max_attempts: int = 3) -> int:
    """Given: handle up to `max_records` records from `consumer` (already assigned its
    partitions), giving up after `timeout_seconds`. Returns how many it handled."""
    handled = 0
    deadline = time.monotonic() + timeout_seconds
    while handled < max_records and time.monotonic() < deadline:
        record = consumer.poll(0.1)
        if record is None:
            continue
        if record.error():
            log.warning("consumer error: %s", record.error())
            continue
        handle_record(deps, record, max_attempts=max_attempts)
        handled += 1
    return handled
