"""Replay: dead-lettered records back to their original topic, once, at a limited rate, with
a cap that parks repeat offenders in the parking lot, and without overtaking within a key.

This variant reads the DLT with consume() batches, waits for each write's delivery callback
with producer.poll() (not flush()), and paces by sleeping a full interval after each
re-publish's acknowledgement.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from deadletter import (
    EXCEPTION_FQCN,
    FAILURE_HEADER_PREFIXES,
    ORIGINAL_PARTITION,
    ORIGINAL_TOPIC,
    REPLAY_COUNT,
)
from payments import SYSTEM_CLOCK, Clock

_BATCH = 100
_MAX_WAIT = 1.0  # longest consume() wait, so the deadline is looked at every second


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


class ReplayWriteFailed(Exception):
    """A write was not acknowledged; its DLT offset stays uncommitted."""


def _last(msg: Any, name: str) -> bytes | None:
    found = None
    for k, v in msg.headers() or []:
        if k == name:
            found = v
    return found


def _origin(msg: Any) -> str | None:
    raw = _last(msg, ORIGINAL_TOPIC)
    return None if raw is None else raw.decode("utf-8", "replace")


def _count(msg: Any) -> int:
    raw = _last(msg, REPLAY_COUNT)
    if raw is None:
        return 0
    try:
        return int(raw.decode("ascii").strip())
    except (UnicodeDecodeError, ValueError):
        return 0


def _class_name(msg: Any) -> str | None:
    raw = _last(msg, EXCEPTION_FQCN)
    if raw is None:
        return None
    return raw.decode("utf-8", "replace").rpartition(".")[2]


def _in_filters(msg: Any, types: Collection[str] | None, after: float | None,
                before: float | None) -> bool:
    if types is not None and _class_name(msg) not in set(types):
        return False
    stamp = msg.timestamp()[1] / 1000  # Kafka gives ms; the window is in epoch seconds
    if after is not None and stamp < after:
        return False
    if before is not None and stamp >= before:
        return False
    return True


class _Writer:
    """One write at a time; a write counts once its delivery callback reported no error."""

    def __init__(self, producer: Any, ack_timeout: float) -> None:
        self._producer = producer
        self._ack_timeout = ack_timeout

    def write(self, topic: str, msg: Any, headers: list[tuple[str, bytes]],
              partition: int | None) -> None:
        reports: list[Any] = []

        def on_delivery(err: Any, _record: Any) -> None:
            reports.append(err)

        extra: dict[str, Any] = {} if partition is None else {"partition": partition}
        try:
            self._producer.produce(topic, key=msg.key(), value=msg.value(), headers=headers,
                                   on_delivery=on_delivery, **extra)
        except (KafkaException, BufferError) as exc:
            raise ReplayWriteFailed(f"produce to {topic}: {exc}") from exc
        give_up = time.monotonic() + self._ack_timeout
        while not reports:
            left = give_up - time.monotonic()
            if left <= 0:
                break
            self._producer.poll(left)  # serves delivery callbacks, waits at most `left`
        if not reports:
            raise ReplayWriteFailed(f"{topic}: no delivery report in {self._ack_timeout} s")
        if reports[0] is not None:
            raise ReplayWriteFailed(f"{topic}: {reports[0]}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    """Replay what `group_id` has not handled yet, up to the DLT's end as it was at the start.

    Raises:
        ReplayWriteFailed: a write was not acknowledged (nothing after it is committed).
    """
    deadline = time.monotonic() + timeout_seconds
    consumer = Consumer({**consumer_config, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    writer = _Writer(producer, ack_timeout_seconds)
    interval = 1.0 / rate_per_second
    counts = {"replay": 0, "park": 0, "skip": 0}
    try:
        topic = consumer.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        tps = [TopicPartition(dead_letter_topic, p) for p in sorted(topic.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(tps, timeout=10)}
        # Last offset of each partition as the run starts (no transactions: end - 1 is a record).
        last: dict[int, int] = {}
        begin: dict[int, int] = {}
        for tp in tps:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            done = committed.get(tp.partition, OFFSET_INVALID)
            start = low if done < 0 else max(done, low)
            if start < high:
                begin[tp.partition] = start
                last[tp.partition] = high - 1
        if not last:
            return ReplayReport(0, 0, 0)
        consumer.assign([TopicPartition(dead_letter_topic, p, o) for p, o in begin.items()])
        held: dict[bytes, str] = {}
        acked_at: float | None = None  # clock reading when the previous re-publish was acked
        while last:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            batch = consumer.consume(num_messages=_BATCH, timeout=min(_MAX_WAIT, left))
            for msg in batch:
                if time.monotonic() >= deadline:
                    break  # the rest of the batch stays uncommitted for the next run
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                p = msg.partition()
                if p not in last or msg.offset() > last[p]:
                    continue  # arrived after the run started: the next run's
                action = _choose(msg, held, max_replays, exception_types, failed_after,
                                 failed_before)
                if action == "replay":
                    if acked_at is not None:
                        wait = acked_at + interval - clock.monotonic()
                        if wait > 0:
                            clock.sleep(wait)
                    headers = [(k, v) for k, v in msg.headers() or []
                               if not k.startswith(FAILURE_HEADER_PREFIXES) and k != REPLAY_COUNT]
                    headers.append((REPLAY_COUNT, str(_count(msg) + 1).encode("ascii")))
                    target = None
                    if msg.key() is None:
                        raw = _last(msg, ORIGINAL_PARTITION)
                        if raw is not None and len(raw) == 4:
                            target = int.from_bytes(raw, "big", signed=True)
                    writer.write(_origin(msg), msg, headers, target)  # type: ignore[arg-type]
                    acked_at = clock.monotonic()
                elif action == "park":
                    writer.write(parking_lot_topic, msg, list(msg.headers() or []), None)
                counts[action] += 1
                consumer.commit(message=msg, asynchronous=False)
                if msg.offset() >= last[p]:
                    del last[p]
        return ReplayReport(counts["replay"], counts["park"], counts["skip"])
    finally:
        consumer.close()


def _choose(msg: Any, held: dict[bytes, str], max_replays: int,
            types: Collection[str] | None, after: float | None, before: float | None) -> str:
    key = msg.key()
    if key is not None and key in held:
        return held[key]  # a key's later records follow the one that stayed behind
    if not _in_filters(msg, types, after, before):
        action = "skip"
    elif _origin(msg) is None or _count(msg) >= max_replays:
        action = "park"
    else:
        return "replay"
    if key is not None:
        held[key] = action
    return action
