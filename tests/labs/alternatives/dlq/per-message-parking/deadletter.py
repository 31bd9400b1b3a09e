"""The dead-letter topic: its name, its partitions, and the record written to it (the
record Spring Kafka's DeadLetterPublishingRecoverer writes, plus this lab's x-dlt-* text
headers). The stack-trace header is written with digits masked (card and account numbers
appear in messages and locals) and kept under 2 KB."""

from __future__ import annotations

import hashlib
import re
import struct
import traceback
from dataclasses import dataclass
from datetime import datetime, timezone
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
    return DeadLetterTopics(dead_letter="%s-dlt" % source_topic,
                            parking_lot="%s-parking-lot" % source_topic)


def create_topics(admin: Any, source_topic: str, *, replication_factor: int = 1
                  ) -> DeadLetterTopics:
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    names = topic_names(source_topic)
    topics = admin.list_topics(timeout=10).topics
    if source_topic not in topics or topics[source_topic].error is not None:
        raise ValueError(f"{source_topic}: no such topic")
    count = len(topics[source_topic].partitions)
    for name in (names.dead_letter, names.parking_lot):
        if name in topics and topics[name].error is None:
            if len(topics[name].partitions) < count:
                raise ValueError(f"{name} is smaller than {source_topic}")
            continue
        future = admin.create_topics([NewTopic(name, count, replication_factor)])[name]
        try:
            future.result(30)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
    return names


def fingerprint(value: bytes | None) -> str:
    return hashlib.sha256(b"" if value is None else value).hexdigest()


def _fqcn(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def _root(error: BaseException) -> BaseException:
    chain = [error]
    while True:
        nxt = chain[-1].__cause__ or chain[-1].__context__
        if nxt is None or any(nxt is seen for seen in chain):
            return chain[-1]
        chain.append(nxt)


def _utc(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(
        timespec="milliseconds").replace("+00:00", "Z")


_DIGITS = re.compile(r"\d{4,}")


def _masked_trace(error: BaseException) -> bytes:
    lines = traceback.format_exception_only(type(error), error)
    frames = traceback.format_tb(error.__traceback__)[-5:]
    trace = _DIGITS.sub(lambda m: "#" * len(m.group()), "".join(frames + lines))
    return trace.encode("utf-8")[-2000:].decode("utf-8", "ignore").encode("utf-8")


def _context(msg: Any, failure: Failure, group_id: str, service: str) -> list[tuple[str, bytes]]:
    kind, stamp = msg.timestamp()
    error = failure.error
    return [
        (ORIGINAL_TOPIC, msg.topic().encode()),
        (ORIGINAL_PARTITION, msg.partition().to_bytes(4, "big", signed=True)),
        (ORIGINAL_OFFSET, msg.offset().to_bytes(8, "big", signed=True)),
        (ORIGINAL_TIMESTAMP, struct.pack(">q", stamp)),
        (ORIGINAL_TIMESTAMP_TYPE, b"LogAppendTime" if kind == 2 else b"CreateTime"),
        (ORIGINAL_CONSUMER_GROUP, group_id.encode()),
        (EXCEPTION_FQCN, _fqcn(type(error)).encode()),
        (EXCEPTION_CAUSE_FQCN, _fqcn(type(_root(error))).encode()),
        (EXCEPTION_MESSAGE, str(error)[:1000].encode()),
        (EXCEPTION_STACKTRACE, _masked_trace(error)),
        (ATTEMPTS, str(failure.attempts).encode()),
        (FIRST_FAILURE_AT, _utc(failure.first_failure_at).encode()),
        (LAST_FAILURE_AT, _utc(failure.last_failure_at).encode()),
        (SERVICE, service.encode()),
    ]


def publish_dead_letter(producer: Any, msg: Any, failure: Failure, *, topic: str,
                        group_id: str, service: str, timeout_seconds: float) -> None:
    from confluent_kafka import KafkaException

    headers = [h for h in (msg.headers() or []) if not h[0].startswith(FAILURE_HEADER_PREFIXES)]
    headers.extend(_context(msg, failure, group_id, service))
    acked: dict[str, Any] = {}
    try:
        producer.produce(topic=topic, key=msg.key(), value=msg.value(),
                         partition=msg.partition(), headers=headers,
                         on_delivery=lambda err, rec: acked.setdefault("err", err))
    except (KafkaException, BufferError) as exc:
        raise DeadLetterWriteFailed(str(exc)) from exc
    producer.flush(timeout_seconds)
    if "err" not in acked:
        raise DeadLetterWriteFailed(f"{topic}: no acknowledgement in {timeout_seconds} s")
    if acked["err"] is not None:
        raise DeadLetterWriteFailed(f"{topic}: {acked['err']}")
