"""Kafka helpers for the outbox checks: read a topic completely, deliver records, and watch a
consumer's offset commits against the database."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _support import table
from sqlalchemy import Engine, text

# -- Kafka ------------------------------------------------------------------------------------

FENCE = "dojo-fence"


@dataclass(frozen=True)
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)

    def header(self, name: str) -> str | None:
        values = [v for k, v in self.headers if k == name]
        return values[-1].decode(errors="replace") if values and values[-1] is not None \
            else None


def read_topic(kafka: Any, topic: str, partitions: int, timeout: float = 15.0) -> list[Record]:
    """Everything in `topic` now. A fence record is appended to each partition and read back,
    so the read is complete without trusting the broker's high watermark."""
    from confluent_kafka import TopicPartition

    fence_id = uuid.uuid4().hex.encode()
    fencer = kafka.producer(**{"linger.ms": 0})
    for partition in range(partitions):
        fencer.produce(topic, value=b"", partition=partition, headers=[(FENCE, fence_id)])
    if fencer.flush(10):
        raise RuntimeError("the check could not write its fence records to Kafka")
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    records: list[Record] = []
    fenced: set[int] = set()
    deadline = time.monotonic() + timeout
    try:
        while len(fenced) < partitions and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None or msg.error():
                continue
            headers = list(msg.headers() or [])
            fence = [v for k, v in headers if k == FENCE]
            if fence:
                if fence[0] == fence_id:
                    fenced.add(msg.partition())
                continue
            records.append(Record(msg.partition(), msg.offset(), msg.key(), msg.value(),
                                  headers))
    finally:
        consumer.close()
    if len(fenced) < partitions:
        raise RuntimeError(f"the check's fence records did not come back within {timeout} s")
    return records


def records_table(records: Sequence[Record], limit: int = 12) -> str:
    return table([{"partition": r.partition, "offset": r.offset,
                   "key": r.key.decode(errors="replace") if r.key is not None else None,
                   "event-id": r.header("event-id"), "event-type": r.header("event-type")}
                  for r in records], ("partition", "offset", "key", "event-id", "event-type"),
                 limit)


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
    assert len(out) == len(events), f"the check read back {len(out)} of {len(events)} records"
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
        return self._consumer.commit(*args, **kwargs)


