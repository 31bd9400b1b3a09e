"""Functions the fault-tool tests run in child processes (importable by file path)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from dojo.checks.faults import kill_after, kill_after_ack, kill_before


def add(a: int, b: int) -> int:
    print("adding", a, b)
    return a + b


def fail(message: str) -> None:
    raise ValueError(message)


def sleep_forever() -> None:
    time.sleep(3600)


class Counter:
    def __init__(self, log: str) -> None:
        self.log = Path(log)

    def step(self, n: int) -> int:
        with self.log.open("a") as fh:
            fh.write(f"step {n}\n")
        return n


def step_three_times(log: str, when: str, calls: int) -> str:
    """Call .step() three times through a kill proxy; log what ran."""
    wrap = kill_after if when == "after" else kill_before
    counter = wrap(Counter(log), "step", calls=calls)
    for n in (1, 2, 3):
        counter.step(n)
        with Path(log).open("a") as fh:
            fh.write(f"next line after step {n}\n")
    return "survived"


def produce_three(bootstrap: str, topic: str, log: str, with_callback: bool) -> str:
    """Produce three records through kill_after_ack; log each acknowledgement we saw."""
    from confluent_kafka import Producer

    producer = kill_after_ack(Producer({"bootstrap.servers": bootstrap, "linger.ms": 0}), acks=1)

    def on_delivery(err: Any, msg: Any) -> None:
        with Path(log).open("a") as fh:
            fh.write(json.dumps({"err": str(err) if err else None,
                                 "offset": msg.offset()}) + "\n")

    for i in range(3):
        kwargs = {"on_delivery": on_delivery} if with_callback else {}
        producer.produce(topic, value=f"r{i}".encode(), **kwargs)
        producer.flush(10)
        with Path(log).open("a") as fh:
            fh.write(f"flushed {i}\n")
    return "survived"


def pid_and_env(name: str) -> dict[str, Any]:
    return {"pid": os.getpid(), "env": os.environ.get(name), "path0": sys.path[0]}


def square(i: int) -> int:
    return i * i


def started_at(i: int) -> float:
    return time.time()
