"""Kafka helpers for the outbox checks: the outbox's records as a table, records delivered to
the learner's consumer, and a consumer proxy that checks every offset commit against the
database. Reading a topic completely is the kit's `read_topic`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Engine, text

from dojo.checks import table
from dojo.checks.observers import Record

# -- Kafka ------------------------------------------------------------------------------------

def records_table(records: Sequence[Record], limit: int = 12) -> str:
    """The outbox's records: where each landed, its key, event id and type."""
    return table([{"partition": r.partition, "offset": r.offset, "key": r.key_text,
                   "event-id": r.text("event-id"), "event-type": r.text("event-type")}
                  for r in records], ("partition", "offset", "key", "event-id", "event-type"),
                 limit)


def unknown_event_ids(records: Sequence[Record], row_ids: Sequence[str]) -> list[Record]:
    """The records whose `event-id` header names no outbox row (missing, or another id)."""
    known = set(row_ids)
    return [r for r in records if (r.text("event-id") or "") not in known]


def unknown_ids_text(records: Sequence[Record]) -> str:
    """Those records, with their key and the event-id header they carry."""
    return table([{"partition": r.partition, "offset": r.offset, "key": r.key_text,
                   "event-id header": r.text("event-id")} for r in records],
                 ("partition", "offset", "key", "event-id header"), limit=8)


# -- acknowledgements as the relay sees them ------------------------------------------------

class AckWatch:
    """Around a producer (a SlowProducer, so that acknowledgements come late): at the moment the
    first delivery report is about to reach the relay's code — it is then inside flush() or
    poll(), waiting — call `at_first_ack()` and keep what it returns in `seen`.

    The look happens before the relay's own callback runs, so it shows what the relay did
    *before* any acknowledgement: rows it already marked, transactions it left open.
    """

    def __init__(self, producer: Any, at_first_ack: Callable[[], Any]) -> None:
        self._producer = producer
        self._look = at_first_ack
        self._lock = threading.Lock()
        self.looked = False
        self.seen: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, callback = _take_callback(args, kwargs)

        def on_delivery(err: Any, msg: Any) -> None:
            with self._lock:
                first, self.looked = not self.looked, True
            if first:
                self.seen = self._look()
            if callback is not None:
                callback(err, msg)

        return self._producer.produce(*args, on_delivery=on_delivery, **kwargs)


_CALLBACK_POSITION = 4  # produce(topic, value, key, partition, on_delivery, …)


def _take_callback(args: tuple[Any, ...], kwargs: dict[str, Any]
                   ) -> tuple[tuple[Any, ...], dict[str, Any], Any]:
    """produce()'s arguments without the learner's delivery callback (given by name or by
    position), and that callback: the wrappers below put their own in its place."""
    kwargs = dict(kwargs)
    callback = kwargs.pop("on_delivery", None) or kwargs.pop("callback", None)
    if callback is None and len(args) > _CALLBACK_POSITION:
        callback = args[_CALLBACK_POSITION]
        args = args[:_CALLBACK_POSITION] + (None,) + args[_CALLBACK_POSITION + 1:]
    return args, kwargs, callback


class FailedReports:
    """Around a producer: records whose `event-id` header is in `failing` are sent, but their
    delivery report says MSG_TIMED_OUT (the broker may have written them; the relay cannot
    know). The other records' reports are the broker's own."""

    def __init__(self, producer: Any, failing: set[str]) -> None:
        self._producer = producer
        self._failing = failing

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer)

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        from confluent_kafka import KafkaError

        args, kwargs, callback = _take_callback(args, kwargs)
        headers = kwargs.get("headers") or (args[6] if len(args) > 6 else None) or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        event_id = next((bytes(v).decode(errors="replace") if isinstance(v, bytes | bytearray)
                         else str(v) for k, v in pairs if k == "event-id"), "")
        fail = event_id in self._failing

        def on_delivery(err: Any, msg: Any) -> None:
            if callback is not None:
                callback(KafkaError(KafkaError._MSG_TIMED_OUT) if fail and err is None else err,
                         msg)

        return self._producer.produce(*args, on_delivery=on_delivery, **kwargs)


def deliver(kafka: Any, events: Sequence[tuple[str, str, Any]], *,
            extra_headers: Sequence[tuple[str, bytes]] = ()) -> list[Any]:
    """Produce (event_id, event_type, payload) records to a fresh one-partition topic, in the
    given order (duplicates included), and return the real Kafka messages read back."""
    from confluent_kafka import TopicPartition

    topic = kafka.topic(1, hint="consumer")
    producer = kafka.producer(**{"linger.ms": 0})
    for event_id, event_type, payload in events:
        value = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        producer.produce(topic, value=value, key=b"k", headers=[
            ("event-id", event_id.encode()), ("event-type", event_type.encode()),
            *extra_headers])
    producer.flush(10)
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(topic, 0, 0)])
    out: list[Any] = []
    deadline = time.monotonic() + 10
    while len(out) < len(events) and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            out.append(msg)
    consumer.close()
    if len(out) != len(events):
        raise RuntimeError(f"the check read back {len(out)} of {len(events)} records it wrote")
    return out


# -- a consumer proxy that checks every offset commit against the database ------------------

class CommitWatch:
    """Wraps the consumer given to consume(): at each commit it counts (from another session)
    whether every record below the committed offset already has its processed_event row."""

    def __init__(self, consumer: Any, engine: Engine) -> None:
        self._consumer = consumer
        self._engine = engine
        self.polled: list[Any] = []
        self.commits: list[dict[str, Any]] = []
        self.violations: list[dict[str, Any]] = []
        self.asynchronous: list[dict[int, int]] = []  # commits that did not wait for the broker

    def __getattr__(self, name: str) -> Any:
        return getattr(self._consumer, name)

    def poll(self, *args: Any, **kwargs: Any) -> Any:
        msg = self._consumer.poll(*args, **kwargs)
        if msg is not None and not msg.error():
            self.polled.append(msg)
        return msg

    def consume(self, *args: Any, **kwargs: Any) -> list[Any]:
        msgs = self._consumer.consume(*args, **kwargs)
        self.polled.extend(m for m in msgs if not m.error())
        return msgs

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        message = kwargs.get("message", args[0] if args and not isinstance(args[0], list)
                             else None)
        offsets = kwargs.get("offsets", args[0] if args and isinstance(args[0], list) else None)
        if message is not None:
            upto = {message.partition(): message.offset() + 1}
        elif offsets is not None:
            upto = {tp.partition: tp.offset for tp in offsets}
        else:
            upto = {}
            for msg in self.polled:
                upto[msg.partition()] = max(upto.get(msg.partition(), 0), msg.offset() + 1)
        below = [m for m in self.polled if m.offset() < upto.get(m.partition(), -1)]
        # Counted, not matched by id: whatever key the code stores, each record below the
        # committed offset must already have its committed marker row.
        with self._engine.connect() as conn:
            markers = int(conn.execute(text("SELECT count(*) FROM processed_event")).scalar_one())
        distinct = {dict(m.headers() or []).get("event-id", b"").decode() for m in below}
        if markers < len(distinct):
            self.violations.append({"partition": below[-1].partition(),
                                    "committed up to": upto[below[-1].partition()],
                                    "records below it": len(distinct),
                                    "processed_event rows": markers})
        self.commits.append(upto)
        # confluent-kafka's commit() is asynchronous unless told otherwise: it returns None at
        # once and the offset reaches the broker later (or never, if the process dies first)
        # commit(message=None, offsets=None, asynchronous=True): positional arguments too
        if kwargs.get("asynchronous", args[2] if len(args) > 2 else True) is not False:
            self.asynchronous.append(upto)
        return self._consumer.commit(*args, **kwargs)




class HeldReports:
    """Around a producer: records whose `event-id` header is in `held` are sent, but their
    delivery reports never reach the caller (a partition whose leader is gone); the others'
    reports arrive as the broker gives them. flush(timeout) then waits its whole timeout and
    returns how many are still unreported, as librdkafka's does."""

    def __init__(self, producer: Any, held: set[str]) -> None:
        self._producer = producer
        self._held = held
        self.waiting = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def __len__(self) -> int:
        return len(self._producer) + self.waiting

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs, callback = _take_callback(args, kwargs)
        headers = kwargs.get("headers") or (args[6] if len(args) > 6 else None) or []
        pairs = headers.items() if isinstance(headers, dict) else headers
        event_id = next((bytes(v).decode(errors="replace") if isinstance(v, bytes | bytearray)
                         else str(v) for k, v in pairs if k == "event-id"), "")
        if event_id in self._held:
            self.waiting += 1
            callback = None  # its report is held back past any timeout
        return self._producer.produce(*args, on_delivery=callback, **kwargs)

    def flush(self, timeout: float | None = None) -> int:
        import time

        deadline = time.monotonic() + (timeout if timeout is not None and timeout >= 0 else 1e9)
        left = int(self._producer.flush(timeout if timeout is not None else -1))
        if self.waiting:
            time.sleep(max(0.0, deadline - time.monotonic()))
        return left + self.waiting
