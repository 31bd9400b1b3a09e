"""The lives of the learner's consumer for the nothing-lost check, each in a process of its
own killed with SIGKILL at a chosen point: right after the effect's transaction committed,
right after a DLT acknowledgement, right after an offset commit, inside a gateway call, or on
a timer.

`consumer_lives` runs in one child process (dojo.checks.faults.run_in_subprocess, the learner
directory first on sys.path): it imports the learner's modules and the clients' libraries
once, creates no client itself, and forks one process per life, so each life starts in
milliseconds instead of paying Python's and the libraries' start-up again. Every poll,
acknowledgement and commit of a life is appended to its log file (one write per line), so
the history survives the kill.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import traceback
from pathlib import Path
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
        log({"ev": call.what, "event": call.event_id, "outcome": call.outcome, "at": call.at,
             "skipped": clock.skipped})
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
    log({"ev": "committed", "at_start": {str(p): o for p, o in probe.read(force=True).items()}})
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


def consumer_lives(specs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run one life per spec, one after the other, each in a forked process; return how
    each ended: {"duration", "signal", "exit_code", "timed_out", "error", "stub"}."""
    import confluent_kafka  # noqa: F401  the libraries and the learner's modules, once
    import consumer  # noqa: F401
    import payments  # noqa: F401
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql.psycopg  # noqa: F401

    ended = []
    for spec in specs:
        outcome_file = Path(spec["log"] + ".outcome")
        started = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the life
            code = 0
            try:
                consumer_life(spec)
            except NotImplementedError as exc:
                from dojo.checks.learner import not_written

                stub = not_written(exc)
                outcome_file.write_text(json.dumps({"error": traceback.format_exc(), "stub": [
                    stub.function, stub.todo, stub.where]}))
                code = 3
            except BaseException:
                outcome_file.write_text(json.dumps({"error": traceback.format_exc()}))
                code = 1
            os._exit(code)  # no atexit hooks: a crashed library may hang in them
        timed_out, status = False, 0
        deadline = started + float(spec["life_seconds"])
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                timed_out = True
                os.kill(pid, signal.SIGKILL)
                _, status = os.waitpid(pid, 0)
                break
            time.sleep(0.01)
        outcome = json.loads(outcome_file.read_text()) if outcome_file.exists() else {}
        ended.append({"duration": time.monotonic() - started,
                      "signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                      "exit_code": os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
                      "timed_out": timed_out, "error": outcome.get("error"),
                      "stub": outcome.get("stub")})
        if outcome.get("stub"):
            break  # every later life would stop at the same stub
    return ended
