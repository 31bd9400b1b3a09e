"""What every lab relies on from a Kafka broker, run on whichever backend is up.

CI runs this module on Tansu (make test) and again on Apache Kafka (.ci/run).
"""

from __future__ import annotations

from confluent_kafka import TopicPartition

from dojo.checks.partitioning import murmur2, partition_for
from tests.kafka.conftest import consume, produce_all


def test_murmur2_matches_the_java_clients_reference_values():
    # Values from Apache Kafka's UtilsTest.testMurmur2.
    assert murmur2(b"21") == -973932308
    assert murmur2(b"foobar") == -790332482
    assert murmur2(b"a-little-bit-long-string") == -985981536
    assert murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8") == -58897971


def test_a_record_keeps_its_key_value_and_headers(kafka):
    topic = kafka.topic(1, hint="roundtrip")
    produce_all(kafka.producer(), topic, [(b"order-7", b'{"total": 12}')],
                headers=[("event_id", b"e-1"), ("event_type", b"OrderPlaced.v1")])
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(topic, 0, 0)])
    [msg] = consume(consumer, 1)
    assert (msg.key(), msg.value()) == (b"order-7", b'{"total": 12}')
    assert dict(msg.headers()) == {"event_id": b"e-1", "event_type": b"OrderPlaced.v1"}


def test_keys_land_on_the_partition_a_java_producer_would_choose(kafka):
    topic = kafka.topic(6, hint="murmur2")
    keys = [f"account-{i}".encode() for i in range(60)]
    reports = produce_all(kafka.producer(), topic, [(k, b"v") for k in keys])
    wrong = [(m.key(), m.partition(), partition_for(m.key(), 6)) for m in reports
             if m.partition() != partition_for(m.key(), 6)]
    assert not wrong, f"key → (actual, expected) partition mismatches: {wrong[:5]}"
    assert len({m.partition() for m in reports}) > 1, "60 keys all in one partition?"


def test_the_same_key_always_goes_to_the_same_partition(kafka):
    topic = kafka.topic(4, hint="stable")
    reports = produce_all(kafka.producer(), topic, [(b"order-42", str(i).encode())
                                                     for i in range(20)])
    assert {m.partition() for m in reports} == {partition_for(b"order-42", 4)}
    assert [m.offset() for m in reports] == sorted(m.offset() for m in reports)


def test_a_new_consumer_resumes_from_the_offset_committed_inside_a_batch(kafka):
    topic = kafka.topic(1, hint="resume")
    # One producer batch of ten records (linger lets them travel together).
    produce_all(kafka.producer(**{"linger.ms": 50}), topic,
                [(None, f"r{i}".encode()) for i in range(10)])
    group = kafka.group_id("resume")
    first = kafka.consumer(group)
    first.subscribe([topic])
    got = consume(first, 4)
    assert [m.value() for m in got] == [b"r0", b"r1", b"r2", b"r3"]
    # Commit "next to read = 4": the middle of the batch the broker stored.
    first.commit(offsets=[TopicPartition(topic, 0, got[-1].offset() + 1)], asynchronous=False)
    first.close()

    second = kafka.consumer(group)
    second.subscribe([topic])
    rest = consume(second, 6)
    assert [m.value() for m in rest] == [f"r{i}".encode() for i in range(4, 10)], \
        "a new consumer in the same group must resume exactly at the committed offset"
    second.close()


def test_the_idempotent_producer_writes_each_record_once_in_order(kafka):
    topic = kafka.topic(2, hint="idem")
    producer = kafka.producer(**{"enable.idempotence": True,
                                 "max.in.flight.requests.per.connection": 5})
    items = [(f"k{i % 4}".encode(), str(i).encode()) for i in range(400)]
    produce_all(producer, topic, items)
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(topic, p, 0) for p in range(2)])
    records = consume(consumer, 400)
    assert len(records) == 400
    for key in {k for k, _ in items}:
        sent = [int(v) for k, v in items if k == key]
        seen = [int(m.value()) for m in records if m.key() == key]
        assert seen == sent, f"key {key!r}: duplicates or reordering ({len(seen)} seen)"


def test_lag_is_the_high_watermark_minus_the_committed_offset(kafka):
    topic = kafka.topic(1, hint="lag")
    producer = kafka.producer()
    for _ in range(12):  # one record per batch: see the high-watermark gap test for why
        produce_all(producer, topic, [(None, b"x")])
    group = kafka.group_id("lag")
    consumer = kafka.consumer(group)
    consumer.subscribe([topic])
    got = consume(consumer, 5)
    consumer.commit(offsets=[TopicPartition(topic, 0, got[-1].offset() + 1)], asynchronous=False)
    [committed] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    consumer.close()
    high = kafka.high_watermarks(topic)[0]
    assert high == 12
    assert high - committed.offset == 7
