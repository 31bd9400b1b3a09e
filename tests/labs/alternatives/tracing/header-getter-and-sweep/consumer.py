"""The shipping consumer: reads `order placed` records and records shipments, in the trace of
the request that placed the order."""

from __future__ import annotations

import logging
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.propagators.textmap import Getter
from opentelemetry.trace import SpanKind, Status, StatusCode

import shop
import telemetry

log = logging.getLogger("orders.consumer")


HeaderList = list[tuple[Any, Any]]


def _header_name(name: Any) -> str:
    text = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
    return text.lower()


class RecordHeaders(Getter[HeaderList]):
    """Lets the W3C propagator read a record's header list, (name, bytes or None) pairs, as
    it is: every value of a name, decoded leniently, headers without a value skipped."""

    def get(self, carrier: HeaderList, key: str) -> list[str] | None:
        values = [value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)
                  for name, value in carrier
                  if value is not None and _header_name(name) == key]
        return values or None

    def keys(self, carrier: HeaderList) -> list[str]:
        return [_header_name(name) for name, _ in carrier]


def record_context(record: Any) -> Context:
    """The producer's trace context from the record's headers (empty when there is none)."""
    return telemetry.PROPAGATOR.extract(list(record.headers() or []), context=Context(),
                                        getter=RecordHeaders())


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
    parent = record_context(record)
    continued = trace.get_current_span(parent).get_span_context().is_valid
    with deps.tracer.start_as_current_span("process order", context=parent,
                                           kind=SpanKind.CONSUMER, record_exception=False,
                                           set_status_on_exception=False) as span:
        if not continued:
            log.warning("record without trace context: started a new trace",
                        extra={"offset": record.offset()})
        for attempt in range(1, max_attempts + 1):
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
