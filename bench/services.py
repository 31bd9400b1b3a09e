"""Service benchmarks: cold starts and a new consumer group's first record, medians of N runs.

    python bench/services.py [--runs 3] [--skip-apache]

Each run uses a fresh private state dir, so "cold" means a new data dir and new processes
(Apache Kafka's jars are cached after the first resolution and reused, as in normal use).
Prints numbers against the targets; it does not assert them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable

TARGETS = {
    "postgres cold start": 2.0,  # together with Tansu, see the combined row
    "tansu cold start": 2.0,
    "postgres + tansu ready": 2.0,
    "apache kafka cold start": 15.0,
    "first record, new group (tansu)": None,
    "first record, new group (apache)": 1.0,
}


def _in_private_state(fn: Callable[[], float]) -> float:
    from dojo.services import manager

    with tempfile.TemporaryDirectory(prefix="dojo-bench-") as tmp:
        old = os.environ.get("DOJO_STATE_DIR")
        os.environ["DOJO_STATE_DIR"] = tmp
        try:
            return fn()
        finally:
            manager.down()
            if old is None:
                os.environ.pop("DOJO_STATE_DIR", None)
            else:
                os.environ["DOJO_STATE_DIR"] = old


def _timed(start: Callable[[], object]) -> float:
    began = time.perf_counter()
    start()
    return time.perf_counter() - began


def cold_postgres() -> float:
    from dojo.services import manager

    return _in_private_state(lambda: _timed(lambda: manager.up(kafka_wanted=False)))


def cold_kafka(backend: str) -> float:
    from dojo.services import manager

    return _in_private_state(
        lambda: _timed(lambda: manager.up(backend, postgres_wanted=False)))


def cold_both() -> float:
    from dojo.services import manager

    return _in_private_state(lambda: _timed(lambda: manager.up("tansu")))


def first_record(backend: str, groups: int) -> list[float]:
    """Seconds from subscribe() to the first record, for `groups` new groups on one broker."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from dojo.runner.kafka import KafkaEnv
    from dojo.services import manager

    samples: list[float] = []

    def measure() -> float:
        endpoints = manager.up(backend, postgres_wanted=False)
        env = KafkaEnv(endpoints)
        admin = AdminClient({"bootstrap.servers": endpoints.kafka_bootstrap})
        topic = f"dojo.bench.{uuid.uuid4().hex[:8]}"
        for fut in admin.create_topics([NewTopic(topic, 1, 1)]).values():
            fut.result(20)
        producer = Producer(env.producer_config())
        producer.produce(topic, value=b"hello")
        producer.flush(20)
        for _ in range(groups):
            consumer = Consumer(env.consumer_config(env.group_id("bench")))
            began = time.perf_counter()
            consumer.subscribe([topic])
            while True:
                msg = consumer.poll(0.05)
                if msg is not None and not msg.error():
                    samples.append(time.perf_counter() - began)
                    break
                if time.perf_counter() - began > 30:
                    samples.append(float("inf"))
                    break
            consumer.close()
        return 0.0

    _in_private_state(measure)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--skip-apache", action="store_true")
    args = parser.parse_args()

    rows: dict[str, list[float]] = {
        "postgres cold start": [cold_postgres() for _ in range(args.runs)],
        "tansu cold start": [cold_kafka("tansu") for _ in range(args.runs)],
        "postgres + tansu ready": [cold_both() for _ in range(args.runs)],
        "first record, new group (tansu)": first_record("tansu", args.runs),
    }
    if not args.skip_apache:
        rows["apache kafka cold start"] = [cold_kafka("apache") for _ in range(args.runs)]
        rows["first record, new group (apache)"] = first_record("apache", args.runs)

    print(f"{'measure':<36}{'median s':>10}{'min s':>9}{'max s':>9}{'target s':>10}{'ratio':>8}")
    for name, samples in rows.items():
        median = statistics.median(samples)
        target = TARGETS.get(name)
        ratio = f"{median / target:.2f}" if target else "-"
        target_text = f"{target:.1f}" if target else "-"
        print(f"{name:<36}{median:>10.3f}{min(samples):>9.3f}{max(samples):>9.3f}"
              f"{target_text:>10}{ratio:>8}")
    tansu = statistics.median(rows["first record, new group (tansu)"])
    if "first record, new group (apache)" in rows:
        apache = statistics.median(rows["first record, new group (apache)"])
        print(f"\nnew-group first record: tansu / apache = {tansu / apache:.1f}x")


if __name__ == "__main__":
    main()
