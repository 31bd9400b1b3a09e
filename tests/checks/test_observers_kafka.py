"""The Kafka observers against a real broker: complete topic reads (fenced, or settling on an
input topic), a group's committed offsets, taps around the learner's clients, headers."""

from __future__ import annotations

import struct
import time

from confluent_kafka import TopicPartition

from dojo.checks import InstantClock
from dojo.checks.observers import (
    FENCE_HEADER,
    CommitProbe,
    ConsumerTap,
    ProducerTap,
    committed_offsets,
    headers_table,
    java_int,
    offsets_text,
    partition_count,
    read_topic,
    show_bytes,
    show_header,
)


def _produce(kafka, topic: str, count: int, partition: int = 0, batch: bool = False) -> None:
    producer = kafka.producer(**{"linger.ms": 50 if batch else 0})
    for n in range(count):
        producer.produce(topic, key=f"k{n}".encode(), value=f"v{n}".encode(),
                         partition=partition, headers=[("n", str(n).encode())])
        if not batch:
            producer.flush(10)
    assert producer.flush(10) == 0


def test_a_fenced_read_returns_every_record_even_after_a_batch(kafka) -> None:
    topic = kafka.topic(2, hint="fenced")
    _produce(kafka, topic, 25, partition=1, batch=True)  # one multi-record batch
    records = read_topic(kafka, topic)
    assert [r.value for r in records] == [f"v{n}".encode() for n in range(25)]
    assert all(r.partition == 1 and FENCE_HEADER not in r.names() for r in records)
    assert records[3].text("n") == "3" and records[3].key_text == "k3"
    assert records[3].at == f"p1@{records[3].offset}"
    assert partition_count(kafka, topic) == 2


def test_an_unfenced_read_stops_after_the_expected_records_and_writes_nothing(kafka) -> None:
    topic = kafka.topic(1, hint="unfenced")
    _produce(kafka, topic, 4)
    records = read_topic(kafka, topic, 1, fence=False, expect=4, timeout=10)
    assert [r.offset for r in records] == [0, 1, 2, 3]
    again = read_topic(kafka, topic, 1, fence=False, timeout=10)
    assert len(again) == 4, "an unfenced read adds no record to the topic"
    later = read_topic(kafka, topic, 1, fence=False, start={0: 2}, expect=2, timeout=10)
    assert [r.offset for r in later] == [2, 3]


def test_committed_offsets_and_the_probe_see_a_groups_commits(kafka) -> None:
    topic = kafka.topic(2, hint="offsets")
    group = kafka.group_id("offsets")
    assert committed_offsets(kafka, group, topic, 2) == {0: -1, 1: -1}
    probe = CommitProbe(kafka.consumer_config(), group, topic, 2, every=0.02)
    try:
        consumer = kafka.consumer(group)
        consumer.commit(offsets=[TopicPartition(topic, 1, 7)], asynchronous=False)
        assert committed_offsets(kafka.consumer_config(), group, topic, 2) == {0: -1, 1: 7}
        assert probe.read(force=True) == {0: -1, 1: 7}
    finally:
        probe.close()
    assert offsets_text({1: 7, 0: -1}) == "{p0: none, p1: 7}"


def test_taps_record_what_the_code_did_with_its_clients(kafka) -> None:
    topic = kafka.topic(1, hint="taps")
    out = kafka.topic(1, hint="taps-out")
    _produce(kafka, topic, 3)
    clock = InstantClock()
    audited: list[dict[int, int]] = []
    raw = kafka.consumer(kafka.group_id("taps"))
    raw.assign([TopicPartition(topic, 0, 0)])
    consumer = ConsumerTap(raw, clock, before_commit=audited.append)
    producer = ProducerTap(kafka.producer(**{"linger.ms": 0}), clock, hold_acks=0.3)
    acked: list[int] = []
    deadline = time.monotonic() + 15
    while len(consumer.delivered) < 3 and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and not msg.error():
            producer.produce(out, value=msg.value(),
                             on_delivery=lambda err, m: acked.append(m.offset()))
    sent = time.monotonic()
    assert producer.flush(10) == 0
    assert time.monotonic() - sent >= 0.25, "acknowledgements were held back"
    consumer.commit(asynchronous=False)
    assert [d.offset for d in consumer.delivered] == [0, 1, 2]
    assert audited == [{0: 3}] and consumer.commits[0].upto == {0: 3}
    assert [p.value for p in producer.to(out)] == [b"v0", b"v1", b"v2"]
    assert all(p.acked_at is not None and p.error is None for p in producer.produced)
    assert sorted(acked) == [0, 1, 2], "the caller's own callbacks still ran"


def test_headers_show_java_numbers_text_and_what_is_missing() -> None:
    offset = struct.pack(">q", 42)
    assert java_int(offset, 8) == 42 and java_int(b"\x00", 4) is None
    assert show_header("kafka_dlt-original-offset", offset).startswith("42  (bytes 00 00")
    assert "not a 4-byte" in show_header("kafka_dlt-original-partition", b"7")
    assert show_header("note", b"two\nlines") == "two⏎lines"
    assert show_header("note", None) == "(null)"
    assert show_bytes(b"\xff" * 40, width=12).endswith("…")
    table = headers_table([("a", b"1"), ("kafka_dlt-original-partition", struct.pack(">i", 3))],
                          names=("kafka_dlt-original-partition", "b"))
    assert "3  (bytes 00 00 00 03)" in table and "MISSING" in table
