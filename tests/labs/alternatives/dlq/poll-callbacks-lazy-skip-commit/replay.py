"""Replay: dead-lettered records back to their original topic, once, at a limited rate, with
a cap that parks repeat offenders in the parking lot, and without overtaking within a key.

A replay job is its group id and its filters. The group's committed offsets say how far the
job got, so running it again sends nothing twice.
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


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


class ReplayWriteFailed(Exception):
    """The broker did not acknowledge a re-published record; its DLT offset stays uncommitted."""


def _header(msg: Any, name: str) -> bytes | None:
    values = [v for k, v in (msg.headers() or []) if k == name]
    return values[-1] if values else None


def _text(msg: Any, name: str) -> str | None:
    value = _header(msg, name)
    return None if value is None else value.decode("utf-8", "replace")


def replay_count(msg: Any) -> int:
    value = _text(msg, REPLAY_COUNT)
    try:
        return int(value) if value is not None else 0
    except ValueError:
        return 0


def exception_type(msg: Any) -> str | None:
    value = _text(msg, EXCEPTION_FQCN)
    return None if value is None else value.rsplit(".", 1)[-1]


def business_headers(msg: Any) -> list[tuple[str, bytes]]:
    """Everything but the failure context of the last trip and the old replay count."""
    return [(k, v) for k, v in (msg.headers() or [])
            if not k.startswith(FAILURE_HEADER_PREFIXES) and k != REPLAY_COUNT]


def _send(producer: Any, topic: str, msg: Any, headers: list[tuple[str, bytes]],
          partition: int | None, ack_timeout: float, may_retry: Any) -> None:
    """Write and wait for the delivery report by serving the producer's callbacks with poll(),
    at most `ack_timeout` of real time in all. A write the broker refused (a report with an
    error) is written again once, in place, while `may_retry()` says there is time; a write
    with no report in time is not (its copy may still be queued)."""
    kwargs: dict[str, Any] = {"partition": partition} if partition is not None else {}
    for attempt in (1, 2):
        reports: list[Any] = []
        try:
            producer.produce(topic, value=msg.value(), key=msg.key(), headers=headers,
                             on_delivery=lambda err, _record, r=reports: r.append(err), **kwargs)
        except (KafkaException, BufferError) as exc:
            raise ReplayWriteFailed(f"produce to {topic} failed: {exc}") from exc
        give_up = time.monotonic() + ack_timeout
        while not reports:
            left = give_up - time.monotonic()
            if left <= 0:
                break
            producer.poll(left)
        if reports and reports[0] is None:
            return
        if not reports or attempt == 2 or not may_retry():
            raise ReplayWriteFailed(f"{topic} did not acknowledge: {reports or 'timed out'}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    """Replay the DLT records that `group_id` has not handled yet, up to the DLT's end as it
    was when the replay started.

    Design: the delivery report is awaited with producer.poll() (no flush), a refused write is
    retried once in place, a partition is done when the consumer's position reaches the end
    read at the start, and a skipped record's offset is committed lazily: by the next commit of
    its partition, or in one commit when the run ends.

    Raises:
        ReplayWriteFailed: a write was not acknowledged (nothing after it is committed).
    """
    consumer = Consumer({**consumer_config, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    replayed = parked = skipped = 0
    try:
        meta = consumer.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        parts = [TopicPartition(dead_letter_topic, p) for p in sorted(meta.partitions)]
        committed = {tp.partition: tp.offset for tp in consumer.committed(parts, timeout=10)}
        ends: dict[int, int] = {}
        starts: dict[int, int] = {}
        for tp in parts:
            low, high = consumer.get_watermark_offsets(tp, timeout=10)
            start = committed.get(tp.partition, OFFSET_INVALID)
            start = low if start < 0 else max(start, low)
            if start < high:
                starts[tp.partition], ends[tp.partition] = start, high
        if not ends:
            return ReplayReport(0, 0, 0)
        assigned = [TopicPartition(dead_letter_topic, p, o) for p, o in sorted(starts.items())]
        consumer.assign(assigned)
        open_parts = set(ends)
        parked_keys: set[bytes] = set()
        skipped_keys: set[bytes] = set()
        lazy: dict[int, int] = {}  # partition -> offset after its last skipped record, uncommitted
        interval = 1.0 / rate_per_second
        last_send: float | None = None
        deadline = time.monotonic() + timeout_seconds

        def done(p: int) -> bool:
            pos = consumer.position([TopicPartition(dead_letter_topic, p)])[0].offset
            return pos >= ends[p]

        def may_retry() -> bool:
            return time.monotonic() < deadline

        while open_parts:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            msg = consumer.poll(min(0.5, left))
            if msg is not None and msg.error():
                if msg.error().code() != KafkaError._PARTITION_EOF:
                    raise KafkaException(msg.error())
                msg = None
            if msg is None:
                open_parts = {p for p in open_parts if not done(p)}
                continue
            p = msg.partition()
            if p not in open_parts or msg.offset() >= ends[p]:
                continue  # written after the run started: the next run's
            if time.monotonic() >= deadline:
                break
            key = msg.key()
            if key is not None and key in parked_keys:
                action = "park"
            elif key is not None and key in skipped_keys:
                action = "skip"
            else:
                stamp_ms = msg.timestamp()[1]
                in_window = (failed_after is None or stamp_ms / 1000 >= failed_after) and \
                    (failed_before is None or stamp_ms / 1000 < failed_before)
                wanted_type = exception_types is None or exception_type(msg) in exception_types
                if not (in_window and wanted_type):
                    action = "skip"
                elif _text(msg, ORIGINAL_TOPIC) is None or replay_count(msg) >= max_replays:
                    action = "park"
                else:
                    action = "replay"
                if key is not None and action == "skip":
                    skipped_keys.add(key)
                elif key is not None and action == "park":
                    parked_keys.add(key)
            if action == "skip":
                skipped += 1
                lazy[p] = msg.offset() + 1
            else:
                if action == "replay":
                    if last_send is not None:
                        gap = clock.monotonic() - last_send
                        if gap < interval:
                            clock.sleep(interval - gap)
                        if time.monotonic() >= deadline:
                            break
                    last_send = clock.monotonic()
                    raw = _header(msg, ORIGINAL_PARTITION)
                    target = None if key is not None or raw is None or len(raw) != 4 \
                        else int.from_bytes(raw, "big", signed=True)
                    headers = business_headers(msg) + [
                        (REPLAY_COUNT, str(replay_count(msg) + 1).encode())]
                    _send(producer, _text(msg, ORIGINAL_TOPIC) or "", msg, headers, target,
                          ack_timeout_seconds, may_retry)
                    replayed += 1
                else:
                    _send(producer, parking_lot_topic, msg, list(msg.headers() or []), None,
                          ack_timeout_seconds, may_retry)
                    parked += 1
                lazy.pop(p, None)  # this commit covers the partition's skipped records too
                consumer.commit(offsets=[TopicPartition(dead_letter_topic, p, msg.offset() + 1)],
                                asynchronous=False)
            if msg.offset() + 1 >= ends[p]:
                open_parts.discard(p)
        if lazy:  # every one of them is its partition's last handled record: no going back
            consumer.commit(offsets=[TopicPartition(dead_letter_topic, p, o)
                                     for p, o in sorted(lazy.items())], asynchronous=False)
        return ReplayReport(replayed, parked, skipped)
    finally:
        consumer.close()
