"""What the crash checks run in a child process (kept light: no pytest, no check helpers)."""

from __future__ import annotations

from typing import Any


def relay_child(db_url: str, base_config: dict[str, Any], topic: str, fault: str,
                lease_seconds: float) -> dict[str, Any]:
    """Run one relay_once in this (child) process with a kill proxy around its producer."""
    import relay  # the learner's, first on sys.path
    from confluent_kafka import Producer
    from sqlalchemy import create_engine

    from dojo.checks.faults import kill_after_ack, kill_before

    engine = create_engine(db_url)
    producer = Producer(relay.producer_config(dict(base_config)))
    if fault == "after-ack":
        wrapped = kill_after_ack(producer, acks=1)
    elif fault == "before-send":
        wrapped = kill_before(producer, "produce", calls=1)
    else:
        raise ValueError(fault)
    published = relay.relay_once(engine, wrapped, topic, batch_size=10,
                                 lease_seconds=lease_seconds, ack_timeout_seconds=10.0)
    return {"published": published}
