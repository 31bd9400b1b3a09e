"""The dead-letter topic: its name, its partitions, and the record written to it.

The record is the one Spring Kafka's DeadLetterPublishingRecoverer writes, so a Java tool
reads it unchanged: the original key and value bytes, the original headers, and the
`kafka_dlt-*` headers (numbers as big-endian binary, text as UTF-8), plus `x-dlt-*` headers
(UTF-8 text) for what Spring leaves to a headers function.

This version leaves the optional stack-trace header out (a payment's stack locals and
messages can leak account data), grows an existing DLT that is too small instead of
refusing it, and waits for its own delivery report with producer.poll() rather than flush().
"""

from __future__ import annotations

import hashlib
import struct
import time
from dataclasses import dataclass
from typing import Any

# Spring Kafka's KafkaHeaders.DLT_* names.
ORIGINAL_TOPIC = "kafka_dlt-original-topic"  # UTF-8
ORIGINAL_PARTITION = "kafka_dlt-original-partition"  # 4-byte big-endian int
ORIGINAL_OFFSET = "kafka_dlt-original-offset"  # 8-byte big-endian long
ORIGINAL_TIMESTAMP = "kafka_dlt-original-timestamp"  # 8-byte big-endian long, epoch ms
ORIGINAL_TIMESTAMP_TYPE = "kafka_dlt-original-timestamp-type"  # "CreateTime" | "LogAppendTime"
ORIGINAL_CONSUMER_GROUP = "kafka_dlt-original-consumer-group"  # UTF-8
EXCEPTION_FQCN = "kafka_dlt-exception-fqcn"  # UTF-8, module.ClassName
EXCEPTION_CAUSE_FQCN = "kafka_dlt-exception-cause-fqcn"  # UTF-8, the root cause's class
EXCEPTION_MESSAGE = "kafka_dlt-exception-message"  # UTF-8
EXCEPTION_STACKTRACE = "kafka_dlt-exception-stacktrace"  # UTF-8 (optional)
# This lab's own, UTF-8 text.
ATTEMPTS = "x-dlt-attempts"  # decimal
FIRST_FAILURE_AT = "x-dlt-first-failure-at"  # ISO-8601 UTC, e.g. 2025-01-16T11:33:00.752Z
LAST_FAILURE_AT = "x-dlt-last-failure-at"
SERVICE = "x-dlt-service"
REPLAY_COUNT = "x-replay-count"  # decimal; set by replay.py, kept by the consumer
FAILURE_HEADER_PREFIXES = ("kafka_dlt-", "x-dlt-")

MESSAGE_LIMIT = 1000  # characters


@dataclass(frozen=True)
class DeadLetterTopics:
    dead_letter: str
    parking_lot: str


@dataclass(frozen=True)
class Failure:
    """Why a record is dead-lettered, and how hard the consumer tried."""

    error: BaseException
    attempts: int
    first_failure_at: float  # clock.now() of the first failed attempt
    last_failure_at: float


class DeadLetterWriteFailed(Exception):
    """The broker did not acknowledge the dead-letter record: do not commit the original."""


DLT_SUFFIX = "-dlt"  # Spring Kafka 3.3
PARKING_LOT_SUFFIX = "-parking-lot"


def topic_names(source_topic: str) -> DeadLetterTopics:
    return DeadLetterTopics(source_topic + DLT_SUFFIX, source_topic + PARKING_LOT_SUFFIX)


def _partition_count(admin: Any, topic: str) -> int | None:
    found = admin.list_topics(timeout=10).topics.get(topic)
    if found is None or found.error is not None:
        return None
    return len(found.partitions)


def create_topics(admin: Any, source_topic: str, *, replication_factor: int = 1
                  ) -> DeadLetterTopics:
    """Make sure the DLT and the parking lot exist with at least as many partitions as the
    source (a dead-letter record keeps its partition number): create what is missing, grow
    what is too small."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewPartitions, NewTopic

    names = topic_names(source_topic)
    wanted = _partition_count(admin, source_topic)
    if wanted is None:
        raise ValueError(f"no such source topic: {source_topic}")
    to_create, to_grow = [], []
    for topic in (names.dead_letter, names.parking_lot):
        have = _partition_count(admin, topic)
        if have is None:
            to_create.append(NewTopic(topic, num_partitions=wanted,
                                      replication_factor=replication_factor))
        elif have < wanted:
            to_grow.append(NewPartitions(topic, wanted))
    futures = []
    if to_create:
        futures += list(admin.create_topics(to_create, operation_timeout=15).values())
    if to_grow:
        futures += list(admin.create_partitions(to_grow, operation_timeout=15).values())
    raced = []
    for future in futures:
        try:
            future.result(timeout=20)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ValueError(f"cannot prepare the topics of {source_topic}: {exc}") from exc
            raced.append(exc)
    if raced:
        # created since the metadata above (or the metadata lagged): grow it if it is small
        for topic in (names.dead_letter, names.parking_lot):
            have = _settled_partition_count(admin, topic)
            if have < wanted:
                admin.create_partitions([NewPartitions(topic, wanted)],
                                        operation_timeout=15)[topic].result(timeout=20)
    return names


def _settled_partition_count(admin: Any, topic: str) -> int:
    """A topic the broker says exists may be missing from a metadata answer for a moment."""
    import time

    for _ in range(50):
        have = _partition_count(admin, topic)
        if have is not None:
            return have
        time.sleep(0.2)
    raise ValueError(f"{topic} exists, says the broker, but its metadata never shows it")


def _class_name(error: BaseException) -> str:
    cls = error.__class__
    return cls.__module__ + "." + cls.__qualname__


def _deepest(error: BaseException, depth: int = 0) -> BaseException:
    """Follow __cause__ (explicit) or else __context__ (implicit) to the end of the chain."""
    nxt = error.__cause__ if error.__cause__ is not None else error.__context__
    if nxt is None or nxt is error or depth > 50:
        return error
    return _deepest(nxt, depth + 1)


def _iso(epoch: float) -> str:
    whole = int(epoch)
    millis = int(round((epoch - whole) * 1000))
    if millis == 1000:
        whole, millis = whole + 1, 0
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole)) + f".{millis:03d}Z"


def sha256_of(value: bytes | None) -> bytes:
    return hashlib.sha256(value or b"").digest()


_TS_TYPE_NAMES = ("NoTimestampType", "CreateTime", "LogAppendTime")


def _failure_headers(msg: Any, failure: Failure, group_id: str, service: str
                     ) -> list[tuple[str, bytes]]:
    ts_type, ts_ms = msg.timestamp()
    err = failure.error
    text = str(err)
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT - 1] + "…"
    return [
        (ORIGINAL_TOPIC, msg.topic().encode("utf-8")),
        (ORIGINAL_PARTITION, struct.pack(">i", msg.partition())),
        (ORIGINAL_OFFSET, struct.pack(">q", msg.offset())),
        (ORIGINAL_TIMESTAMP, struct.pack(">q", ts_ms)),
        (ORIGINAL_TIMESTAMP_TYPE, _TS_TYPE_NAMES[ts_type if 0 <= ts_type <= 2 else 0].encode()),
        (ORIGINAL_CONSUMER_GROUP, group_id.encode("utf-8")),
        (EXCEPTION_FQCN, _class_name(err).encode("utf-8")),
        (EXCEPTION_CAUSE_FQCN, _class_name(_deepest(err)).encode("utf-8")),
        (EXCEPTION_MESSAGE, text.encode("utf-8")),
        (ATTEMPTS, b"%d" % failure.attempts),
        (FIRST_FAILURE_AT, _iso(failure.first_failure_at).encode("ascii")),
        (LAST_FAILURE_AT, _iso(failure.last_failure_at).encode("ascii")),
        (SERVICE, service.encode("utf-8")),
    ]


def publish_dead_letter(producer: Any, msg: Any, failure: Failure, *, topic: str,
                        group_id: str, service: str, timeout_seconds: float) -> None:
    """Write `msg` to partition msg.partition() of `topic`, byte for byte, and return only
    once the broker acknowledged it.

    Raises:
        DeadLetterWriteFailed: the write failed or was not acknowledged in time.
    """
    from confluent_kafka import KafkaException

    kept = [(k, v) for k, v in (msg.headers() or []) if not k.startswith(FAILURE_HEADER_PREFIXES)]
    report: dict[str, Any] = {}

    def delivered(err: Any, _record: Any) -> None:
        report["error"] = err

    try:
        producer.produce(topic, msg.value(), msg.key(), partition=msg.partition(),
                         headers=kept + _failure_headers(msg, failure, group_id, service),
                         callback=delivered)
    except (KafkaException, BufferError, ValueError) as exc:
        raise DeadLetterWriteFailed(f"could not hand the record to the producer: {exc}") from exc
    give_up_at = time.monotonic() + timeout_seconds
    while "error" not in report:
        left = give_up_at - time.monotonic()
        if left <= 0:
            raise DeadLetterWriteFailed(f"no acknowledgement from {topic} in {timeout_seconds} s")
        producer.poll(min(left, 0.1))
    if report["error"] is not None:
        raise DeadLetterWriteFailed(f"{topic} refused the record: {report['error']}")
