"""Given (you do not need to change it): the relay under a steady load, at batch size 1 and
at batch size 100, side by side.

    python bench.py                                   # from your workspace, services up
    python bench.py --rate 800 --seconds 5 --batch-sizes 1,10,100 --send-delay-ms 20

It places orders at a steady rate with orders.place_order while one relay thread loops over
relay.relay_once, then reports throughput, publish age p50/p95 (from your
metrics.publish_age_seconds) and how many SQL statements the relay ran per event. It runs in
a scratch database and topic of its own, dropped afterwards.
"""

from __future__ import annotations

import argparse
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import metrics
import orders
import relay
from sqlalchemy import Engine, event, text


@dataclass(frozen=True)
class BenchResult:
    """One batch size's run."""

    batch_size: int
    placed: int
    published: int
    seconds: float  # from the first order placed until the outbox was drained (or gave up)
    throughput: float  # events published per second over `seconds`
    p50_seconds: float | None
    p95_seconds: float | None
    sql_per_event: float  # statements the relay thread ran, per event published
    pending_left: int


def run_benchmark(engine: Engine, producer: Any, topic: str, *,
                  batch_sizes: Sequence[int] = (1, 100), rate_per_second: float = 500.0,
                  seconds: float = 3.0, drain_seconds: float = 10.0,
                  poll_interval: float = 0.05) -> list[BenchResult]:
    """Run the steady load once per batch size on `engine`'s outbox (emptied before each)."""
    return [_run_one(engine, producer, topic, size, rate_per_second, seconds, drain_seconds,
                     poll_interval) for size in batch_sizes]


def _run_one(engine: Engine, producer: Any, topic: str, batch_size: int, rate: float,
             seconds: float, drain_seconds: float, poll_interval: float) -> BenchResult:
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM outbox_event"))
        conn.execute(text("DELETE FROM orders"))
    relay_thread_statements = [0]
    relay_ident: list[int | None] = [None]

    def count(*_: Any) -> None:
        if threading.get_ident() == relay_ident[0]:
            relay_thread_statements[0] += 1

    load_done = threading.Event()
    placed = [0]
    customers = [uuid.uuid4() for _ in range(20)]

    def load() -> None:
        start = time.monotonic()
        total = int(rate * seconds)
        for i in range(total):
            wait = start + i / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            orders.place_order(engine, customers[i % len(customers)], 100 + i % 900)
            placed[0] += 1
        load_done.set()

    def run_relay() -> None:
        relay_ident[0] = threading.get_ident()
        give_up = None
        while True:
            published = relay.relay_once(engine, producer, topic, batch_size=batch_size,
                                         lease_seconds=30.0)
            if load_done.is_set():
                give_up = give_up or time.monotonic() + drain_seconds
                if (published == 0 and metrics.pending_count(engine) == 0) or \
                        time.monotonic() > give_up:
                    return
            if published == 0:
                time.sleep(poll_interval)

    event.listen(engine, "after_cursor_execute", count)
    try:
        started = time.monotonic()
        threads = [threading.Thread(target=load, daemon=True),
                   threading.Thread(target=run_relay, daemon=True)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.monotonic() - started
    finally:
        event.remove(engine, "after_cursor_execute", count)

    with engine.connect() as conn:
        published = conn.execute(text(
            "SELECT count(*) FROM outbox_event WHERE published_at IS NOT NULL")).scalar_one()
    window = elapsed + 60
    return BenchResult(
        batch_size=batch_size, placed=placed[0], published=published, seconds=elapsed,
        throughput=published / elapsed if elapsed else 0.0,
        p50_seconds=metrics.publish_age_seconds(engine, 0.5, window_seconds=window),
        p95_seconds=metrics.publish_age_seconds(engine, 0.95, window_seconds=window),
        sql_per_event=relay_thread_statements[0] / published if published else float("nan"),
        pending_left=metrics.pending_count(engine),
    )


def format_results(results: Sequence[BenchResult]) -> str:
    """The runs side by side, one column per batch size."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f}"

    rows = [
        ("events placed", [f"{r.placed}" for r in results]),
        ("events published", [f"{r.published}" for r in results]),
        ("throughput (events/s)", [f"{r.throughput:.0f}" for r in results]),
        ("publish age p50 (ms)", [ms(r.p50_seconds) for r in results]),
        ("publish age p95 (ms)", [ms(r.p95_seconds) for r in results]),
        ("relay SQL statements/event", [f"{r.sql_per_event:.2f}" for r in results]),
        ("still pending at the end", [f"{r.pending_left}" for r in results]),
    ]
    header = ["", *[f"batch {r.batch_size}" for r in results]]
    width = max(len(label) for label, _ in rows) + 2
    lines = [header[0].ljust(width) + "".join(h.rjust(12) for h in header[1:])]
    lines += [label.ljust(width) + "".join(v.rjust(12) for v in values)
              for label, values in rows]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=500.0, help="orders placed per second")
    parser.add_argument("--seconds", type=float, default=3.0, help="how long the load runs")
    parser.add_argument("--batch-sizes", default="1,100", help="comma-separated, e.g. 1,100")
    parser.add_argument("--send-delay-ms", type=float, default=0.0,
                        help="simulate a slower broker: each acknowledgement arrives this late")
    args = parser.parse_args(argv)

    from confluent_kafka import Producer

    from dojo.runner.database import create_database, drop_database
    from dojo.runner.faults import SlowProducer
    from dojo.runner.kafka import KafkaEnv
    from dojo.services.manager import resolve

    services = resolve(start=True)
    database = create_database(services, hint="bench")
    kafka = KafkaEnv(services)
    try:
        with database.engine.begin() as conn:
            conn.exec_driver_sql(Path(__file__).with_name("schema.sql").read_text())
        topic = kafka.topic(3, hint="bench")
        producer: Any = Producer(relay.producer_config(kafka.producer_config()))
        if args.send_delay_ms:
            producer = SlowProducer(producer, args.send_delay_ms / 1000)
        sizes = [int(size) for size in args.batch_sizes.split(",")]
        print(f"{args.rate:.0f} orders/s for {args.seconds:.0f} s, batch sizes {sizes} …",
              flush=True)
        results = run_benchmark(database.engine, producer, topic, batch_sizes=sizes,
                                rate_per_second=args.rate, seconds=args.seconds)
        print(format_results(results))
    finally:
        kafka.close()
        drop_database(services, database)


if __name__ == "__main__":
    main()
