"""The dead-letter topic: its name, its partitions, and the record written to it.

The record is the one Spring Kafka's DeadLetterPublishingRecoverer writes, so a Java tool
reads it unchanged: the original key and value bytes, the original headers, and the
`kafka_dlt-*` headers (numbers as big-endian binary, text as UTF-8), plus `x-dlt-*` headers
(UTF-8 text) for what Spring leaves to a headers function.
"""

from __future__ import annotations

import hashlib
from decimal import ROUND_FLOOR, Decimal
import struct
import time
import traceback
from dataclasses import dataclass
from datetime import UTC, datetime
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

MAX_MESSAGE_CHARS = 1000  # exception messages can carry payload data: keep them short
MAX_STACKTRACE_CHARS = 4000

_TIMESTAMP_TYPES = {1: "CreateTime", 2: "LogAppendTime"}


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


def topic_names(source_topic: str) -> DeadLetterTopics:
    """The dead-letter and parking-lot topics of `source_topic`, named by one explicit scheme
    (Spring Kafka 3.3's `-dlt` suffix; never guessed from a framework default)."""
    return DeadLetterTopics(dead_letter=f"{source_topic}-dlt",
                            parking_lot=f"{source_topic}-parking-lot")


def create_topics(admin: Any, source_topic: str, *, replication_factor: int = 1
                  ) -> DeadLetterTopics:
    """Create the DLT and the parking lot with as many partitions as the source topic (a
    dead-letter record keeps its partition number). Topics that exist already are kept if
    they have enough partitions.

    Raises:
        ValueError: the source topic does not exist, or an existing DLT is too small.
    """
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    names = topic_names(source_topic)
    meta = admin.list_topics(timeout=10).topics
    source = meta.get(source_topic)
    if source is None or source.error is not None:
        raise ValueError(f"source topic {source_topic} does not exist")
    wanted = len(source.partitions)
    missing = []
    for name in (names.dead_letter, names.parking_lot):
        existing = meta.get(name)
        if existing is not None and existing.error is None:
            if len(existing.partitions) < wanted:
                raise ValueError(f"{name} has {len(existing.partitions)} partitions, fewer "
                                 f"than the {wanted} of {source_topic}")
            continue
        missing.append(NewTopic(name, num_partitions=wanted,
                                replication_factor=replication_factor))
    if missing:
        for name, future in admin.create_topics(missing, operation_timeout=15).items():
            try:
                future.result(timeout=20)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                    raise
                # created by someone else since the metadata above: too small is still wrong
                have = _partition_count(admin, name)
                if have < wanted:
                    raise ValueError(f"{name} has {have} partitions, fewer than the "
                                     f"{wanted} of {source_topic}") from exc
    return names


def _partition_count(admin: Any, topic: str, wait_seconds: float = 10.0) -> int:
    """The partitions of a topic the broker says exists; a metadata answer may miss a topic
    created a moment ago, so ask again until it shows (at most `wait_seconds`)."""
    deadline = time.monotonic() + wait_seconds
    while True:
        found = admin.list_topics(topic=topic, timeout=10).topics.get(topic)
        if found is not None and found.error is None and found.partitions:
            return len(found.partitions)
        if time.monotonic() > deadline:
            raise ValueError(f"{topic} exists, says the broker, but its metadata never shows "
                             "its partitions")
        time.sleep(0.2)


def fqcn(error: BaseException) -> str:
    return type(error).__module__ + "." + type(error).__qualname__


def root_cause(error: BaseException) -> BaseException:
    chain = [error]
    while True:
        nxt = chain[-1].__cause__ if chain[-1].__cause__ is not None else chain[-1].__context__
        if nxt is None or any(nxt is e for e in chain):
            return chain[-1]
        chain.append(nxt)


def iso_utc(epoch_seconds: float) -> str:
    # floor to the millisecond with integer arithmetic, then format
    ms_total = int((Decimal(repr(epoch_seconds)) * 1000).to_integral_value(rounding=ROUND_FLOOR))
    seconds, ms = divmod(ms_total, 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{ms:03d}Z"


def fingerprint(value: bytes | None) -> str:
    return hashlib.blake2b(value or b"", digest_size=32).hexdigest()


def _message(error: BaseException) -> bytes:
    text_ = str(error).encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text_) > MAX_MESSAGE_CHARS:
        text_ = text_[:MAX_MESSAGE_CHARS - 1] + "\u2026"
    return text_.encode("utf-8")


def dead_letter_headers(msg: Any, failure: Failure, *, group_id: str, service: str
                        ) -> list[tuple[str, bytes]]:
    """Failure headers first, then the original ones (the checks read by name)."""
    ts_type, ts = msg.timestamp()
    error = failure.error
    failure_headers = [
        (ORIGINAL_TOPIC, msg.topic().encode("utf-8")),
        (ORIGINAL_PARTITION, msg.partition().to_bytes(4, "big", signed=True)),
        (ORIGINAL_OFFSET, msg.offset().to_bytes(8, "big", signed=True)),
        (ORIGINAL_TIMESTAMP, int(ts).to_bytes(8, "big", signed=True)),
        (ORIGINAL_TIMESTAMP_TYPE, b"LogAppendTime" if ts_type == 2 else b"CreateTime"),
        (ORIGINAL_CONSUMER_GROUP, group_id.encode("utf-8")),
        (EXCEPTION_FQCN, fqcn(error).encode("utf-8")),
        (EXCEPTION_CAUSE_FQCN, fqcn(root_cause(error)).encode("utf-8")),
        (EXCEPTION_MESSAGE, _message(error)),
        (ATTEMPTS, str(failure.attempts).encode("ascii")),
        (FIRST_FAILURE_AT, iso_utc(failure.first_failure_at).encode("ascii")),
        (LAST_FAILURE_AT, iso_utc(failure.last_failure_at).encode("ascii")),
        (SERVICE, service.encode("utf-8")),
    ]
    kept = [(k, v) for k, v in (msg.headers() or [])
            if not (k.startswith("kafka_dlt-") or k.startswith("x-dlt-"))]
    return failure_headers + kept


def publish_dead_letter(producer: Any, msg: Any, failure: Failure, *, topic: str,
                        group_id: str, service: str, timeout_seconds: float) -> None:
    """Produce, then serve delivery reports with poll() until ours arrives or time is up."""
    from confluent_kafka import KafkaException

    report: dict[str, Any] = {}

    def delivered(err: Any, _record: Any) -> None:
        report["err"] = err

    try:
        producer.produce(topic, msg.value(), msg.key(), partition=msg.partition(),
                         headers=dead_letter_headers(msg, failure, group_id=group_id,
                                                     service=service),
                         on_delivery=delivered)
    except (KafkaException, BufferError) as exc:
        raise DeadLetterWriteFailed(str(exc)) from exc
    deadline = time.monotonic() + timeout_seconds
    while "err" not in report:
        left = deadline - time.monotonic()
        if left <= 0:
            producer.flush(0)
            break
        producer.poll(min(left, 0.1))
    if "err" not in report:
        raise DeadLetterWriteFailed(f"no acknowledgement from {topic} in {timeout_seconds} s")
    if report["err"] is not None:
        raise DeadLetterWriteFailed(f"{topic} refused the record: {report['err']}")


def header_text(text: str, limit: int) -> bytes:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:limit].encode("utf-8")
