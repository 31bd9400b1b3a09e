"""The shipping consumer: reads `order placed` records and records shipments, in the trace of
the request that placed the order."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

import shop
import telemetry

log = logging.getLogger("orders.consumer")


def record_headers(record: Any) -> dict[str, str]:
    """A record's headers as text (confluent-kafka gives a list of (name, bytes))."""
    return {name: value.decode("utf-8", "replace")
            for name, value in (record.headers() or []) if value is not None}


def root_cause(exc: BaseException) -> BaseException:
    """The innermost exception of a chain (`raise … from …`, or raised while handling)."""
    while True:
        inner = exc.__cause__ or exc.__context__
        if inner is None or inner is exc:
            return exc
        exc = inner


def dead_letter(deps: shop.Deps, record: Any, error: BaseException) -> None:
    """Park the record on the dead letter topic: same key and value, every original header
    (traceparent and tracestate with them), and why."""
    cause = root_cause(error)
    headers = list(record.headers() or []) + [
        ("dlt-original-topic", record.topic().encode()),
        ("dlt-original-offset", str(record.offset()).encode()),
        ("dlt-error", f"{type(cause).__name__}: {cause}".encode()),
    ]
    deps.producer.produce(deps.dlt_topic, key=record.key(), value=record.value(),
                          headers=headers)
    if deps.producer.flush(10):
        raise shop.DownstreamError("dead letter record not acknowledged")


def handle_record(deps: shop.Deps, record: Any, *, max_attempts: int = 3) -> bool:
    """Ship the order in `record`, in a CONSUMER span that continues the producer's trace.

    Returns:
        True when shipped, False when dead-lettered after `max_attempts` failed attempts.
    """
    parent = telemetry.extract(record_headers(record))
    continued = trace.get_current_span(parent).get_span_context().is_valid
    # One CONSUMER span per attempt, each a child of the producer's span.
    for attempt in range(1, max_attempts + 1):
        span = deps.tracer.start_span("process order", context=parent, kind=SpanKind.CONSUMER,
                                      attributes={"messaging.attempt": attempt})
        if not continued:
            # later attempts stay in the trace this first attempt started
            parent = trace.set_span_in_context(span)
            continued = True
            with trace.use_span(span):
                log.warning("record without trace context: started a new trace",
                            extra={"offset": record.offset()})
        with trace.use_span(span, end_on_exit=True, record_exception=False,
                            set_status_on_exception=False):
            try:
                order_id = shop.ship_order(deps.engine, record.value())
            except Exception as exc:
                span.record_exception(exc)
                if attempt < max_attempts:
                    log.warning("attempt %d of %d failed: %s", attempt, max_attempts,
                                root_cause(exc))
                    continue
                span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
                log.error("dead-lettering the record after %d attempts", max_attempts,
                          exc_info=exc)
                dead_letter(deps, record, exc)
                return False
            log.info("order shipped", extra={"order_id": str(order_id)})
            return True
    return False  # max_attempts < 1: nothing tried



def consume(deps: shop.Deps, consumer: Any, *, max_records: int, timeout_seconds: float = 10.0,
            max_attempts: int = 3) -> int:
    """Handle up to `max_records` records from `consumer` (already assigned its partitions),
    giving up after `timeout_seconds`. Returns how many it handled."""
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
