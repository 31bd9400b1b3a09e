"""One life of the learner's consumer in a child process, killed with SIGKILL at a chosen
point: right after the effect's transaction committed, right after a DLT acknowledgement,
right after an offset commit, inside a gateway call, or on a timer.

Run by the nothing-lost check through dojo.checks.faults.run_in_subprocess, with the learner
directory first on sys.path. Every poll, acknowledgement and commit is appended to a log file
(one write per line), so the history survives the kill.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from _tools import ScriptedDownstream

from dojo.checks import InstantClock
from dojo.checks.observers import CommitProbe, ConsumerTap, ProducerTap, die, jsonl_log


def consumer_life(spec: dict[str, Any]) -> dict[str, Any]:
    import consumer as consumer_module  # the learner's, first on sys.path
    import payments
    from confluent_kafka import Consumer, Producer, TopicPartition
    from sqlalchemy import create_engine, event

    log = jsonl_log(spec["log"])
    log({"ev": "start", "kill": spec["kill"]})
    clock = InstantClock()
    raw = spec["settings"]
    settings = payments.Settings(
        service=raw["service"], group_id=raw["group_id"], source_topic=raw["source_topic"],
        dead_letter_topic=raw["dead_letter_topic"],
        retry=payments.RetryPolicy(**raw["retry"]),
        breaker=payments.BreakerPolicy(**raw["breaker"]),
        max_poll_interval_ms=raw["max_poll_interval_ms"],
        dead_letter_timeout_seconds=raw["dead_letter_timeout_seconds"])
    mode, n = spec["kill"]["mode"], int(spec["kill"].get("n", 1))

    engine = create_engine(spec["db_url"])
    if mode == "after-effect":
        seen = {"effects": 0}

        @event.listens_for(engine, "after_cursor_execute")
        def mark(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
            if "ledger_entries" in statement.lower() and "insert" in statement.lower():
                conn.info["dojo_effect"] = True

        @event.listens_for(engine.pool, "checkin")
        def after_commit(dbapi_conn: Any, record: Any) -> None:
            if record is not None and record.info.pop("dojo_effect", False):
                seen["effects"] += 1
                if seen["effects"] >= n:
                    die(f"right after the transaction of effect #{seen['effects']} committed "
                        "(before the offset commit)", log)

    calls = {"n": 0}

    def on_call(call: Any) -> None:
        log({"ev": call.what, "event": call.event_id, "outcome": call.outcome})
        if mode == "in-gateway" and call.what == "authorize":
            calls["n"] += 1
            if calls["n"] >= n:
                die(f"inside gateway call #{calls['n']} (authorize), before it answered", log)

    downstream = ScriptedDownstream(payments, clock, spec["scripts"], on_call=on_call)
    base = dict(spec["consumer_base"])
    source = Consumer(consumer_module.consumer_config(base, settings))
    source.assign([TopicPartition(settings.source_topic, p)
                   for p in range(spec["partitions"])])
    ctap = ConsumerTap(source, clock, log=log,
                       kill_after_commit=n if mode == "after-commit" else None)
    producer = Producer(consumer_module.producer_config(dict(spec["producer_base"])))
    ptap = ProducerTap(producer, clock, log=log,
                       kill_after_ack=n if mode == "after-ack" else None)
    if mode == "timer":
        timer = threading.Timer(float(spec["kill"]["seconds"]), die,
                                args=(f"on a timer, {spec['kill']['seconds']:.2f} s into the "
                                      "run", log))
        timer.daemon = True
        timer.start()

    probe = CommitProbe(base, settings.group_id, settings.source_topic, spec["partitions"])
    ends = {int(p): e for p, e in spec["ends"].items()}
    deadline = time.monotonic() + float(spec["timeout"])

    def should_stop() -> bool:
        committed = probe.read()
        return all(committed.get(p, -1) >= e for p, e in ends.items()) or \
            time.monotonic() > deadline

    consumer_module.run(ctap, ptap, engine, downstream, settings, clock=clock,
                        should_stop=should_stop)
    log({"ev": "returned"})
    return {"returned": True}
