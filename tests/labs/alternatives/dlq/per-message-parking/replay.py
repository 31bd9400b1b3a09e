"""Replay as a small pipeline: plan (fixed end offsets), classify each record, act, commit
the record's offset explicitly once its write was acknowledged."""

from __future__ import annotations

import time
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from deadletter import EXCEPTION_FQCN, ORIGINAL_PARTITION, ORIGINAL_TOPIC, REPLAY_COUNT
from payments import SYSTEM_CLOCK, Clock


@dataclass(frozen=True)
class ReplayReport:
    replayed: int  # re-published to their original topic
    parked: int  # moved to the parking lot (cap reached, or behind a parked record of the key)
    skipped: int  # left alone: filtered out (or behind a filtered-out record of the key)


class ReplayWriteFailed(Exception):
    pass


def _get(msg: Any, name: str) -> bytes | None:
    found = None
    for k, v in msg.headers() or []:
        if k == name:
            found = v
    return found


def _is_failure_context(name: str) -> bool:
    return name.startswith("kafka_dlt-") or name.startswith("x-dlt-") or name == REPLAY_COUNT


def _deliver(producer: Any, timeout: float, **record: Any) -> None:
    errors: list[Any] = []
    try:
        producer.produce(on_delivery=lambda err, _m: errors.append(err), **record)
    except (KafkaException, BufferError) as exc:
        raise ReplayWriteFailed(str(exc)) from exc
    producer.flush(timeout)
    if errors != [None]:
        raise ReplayWriteFailed(f"{record['topic']}: {errors or 'not acknowledged'}")


def replay(consumer_config: dict[str, Any], producer: Any, *, dead_letter_topic: str,
           parking_lot_topic: str, group_id: str, max_replays: int = 3,
           rate_per_second: float = 50.0, exception_types: Collection[str] | None = None,
           failed_after: float | None = None, failed_before: float | None = None,
           clock: Clock = SYSTEM_CLOCK, ack_timeout_seconds: float = 10.0,
           timeout_seconds: float = 60.0) -> ReplayReport:
    dlt = Consumer({**consumer_config, "group.id": group_id, "enable.auto.commit": False})
    tally = {"replayed": 0, "parked": 0, "skipped": 0}
    stuck_keys: dict[bytes, str] = {}
    try:
        partitions = dlt.list_topics(dead_letter_topic, timeout=10).topics[dead_letter_topic]
        tps = [TopicPartition(dead_letter_topic, p) for p in sorted(partitions.partitions)]
        plan: dict[int, tuple[int, int]] = {}
        for tp in dlt.committed(tps, timeout=10):
            low, high = dlt.get_watermark_offsets(tp, timeout=10)
            first = low if tp.offset < 0 else max(tp.offset, low)
            if first < high:
                plan[tp.partition] = (first, high)
        if not plan:
            return ReplayReport(0, 0, 0)
        dlt.incremental_assign([TopicPartition(dead_letter_topic, p, first)
                                for p, (first, _) in plan.items()])
        last_sent: float | None = None  # clock reading of the previous send
        gap = 1.0 / rate_per_second
        stop_at = time.monotonic() + timeout_seconds
        open_parts = set(plan)
        while open_parts and time.monotonic() < stop_at:
            msg = dlt.poll(0.25)
            if msg is None:
                continue
            if msg.error():
                if msg.error().code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(msg.error())
            p = msg.partition()
            if p not in open_parts or msg.offset() >= plan[p][1]:
                continue
            what = _classify(msg, stuck_keys, max_replays, exception_types, failed_after,
                             failed_before)
            if what == "replayed":
                if last_sent is not None:
                    early = last_sent + gap - clock.monotonic()
                    if early > 0:
                        clock.sleep(early)  # never two sends closer than 1/rate
                last_sent = clock.monotonic()
                count = int((_get(msg, REPLAY_COUNT) or b"0").decode() or 0) + 1
                headers = [(k, v) for k, v in msg.headers() or [] if not _is_failure_context(k)]
                headers.append((REPLAY_COUNT, f"{count}".encode()))
                record: dict[str, Any] = {"topic": (_get(msg, ORIGINAL_TOPIC) or b"").decode(),
                                          "key": msg.key(), "value": msg.value(),
                                          "headers": headers}
                original_partition = _get(msg, ORIGINAL_PARTITION)
                if msg.key() is None and original_partition and len(original_partition) == 4:
                    record["partition"] = int.from_bytes(original_partition, "big", signed=True)
                _deliver(producer, ack_timeout_seconds, **record)
            elif what == "parked":
                _deliver(producer, ack_timeout_seconds, topic=parking_lot_topic, key=msg.key(),
                         value=msg.value(), headers=list(msg.headers() or []))
            tally[what] += 1
            dlt.commit(offsets=[TopicPartition(dead_letter_topic, p, msg.offset() + 1)],
                       asynchronous=False)
            if msg.offset() + 1 >= plan[p][1]:
                open_parts.discard(p)
        return ReplayReport(**tally)
    finally:
        dlt.close()


def _classify(msg: Any, stuck_keys: dict[bytes, str], max_replays: int,
              exception_types: Collection[str] | None, failed_after: float | None,
              failed_before: float | None) -> str:
    key = msg.key()
    if key is not None and key in stuck_keys:
        return stuck_keys[key]
    fqcn = (_get(msg, EXCEPTION_FQCN) or b"").decode("utf-8", "replace")
    ts = msg.timestamp()[1] / 1000
    if (exception_types is not None and fqcn.rpartition(".")[2] not in exception_types) or \
            (failed_after is not None and ts < failed_after) or \
            (failed_before is not None and ts >= failed_before):
        verdict = "skipped"
    else:
        raw = _get(msg, REPLAY_COUNT)
        try:
            count = int(raw.decode()) if raw else 0
        except ValueError:
            count = 0
        if _get(msg, ORIGINAL_TOPIC) is None or count >= max_replays:
            verdict = "parked"
        else:
            return "replayed"
    if key is not None:
        stuck_keys[key] = verdict
    return verdict
