"""The fault tools do exactly what checks rely on: die at the named point, slow what they say,
start workers together, and report how a child ended."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer, TopicPartition
from sqlalchemy import text

from dojo.checks.faults import (
    InjectedFault,
    SlowProducer,
    duplicate_and_reorder,
    fail_sql,
    run_concurrently,
    run_in_subprocess,
    slow_sql,
    unreachable_bootstrap,
)
from tests.harness import _targets

TARGETS = str(Path(_targets.__file__))


# -- run_in_subprocess ------------------------------------------------------------------------

def test_a_child_returns_its_value_and_output():
    result = run_in_subprocess(f"{TARGETS}:add", 2, 3)
    assert result.returned and result.value == 5
    assert "adding 2 3" in result.stdout
    assert not result.killed and result.signal is None


def test_a_child_that_raises_reports_the_traceback():
    result = run_in_subprocess(f"{TARGETS}:fail", "boom")
    assert not result.returned
    assert result.exit_code == 1
    assert "ValueError: boom" in (result.error or "")
    assert "ValueError: boom" in result.describe()


def test_a_child_that_hangs_is_stopped_at_the_timeout():
    started = time.monotonic()
    result = run_in_subprocess(f"{TARGETS}:sleep_forever", timeout=1.0)
    assert result.timed_out and not result.killed
    assert time.monotonic() - started < 5
    assert "still running" in result.describe()


def test_a_child_gets_the_path_and_environment_it_was_given(tmp_path):
    result = run_in_subprocess("tests.harness._targets:pid_and_env", "DOJO_PROBE",
                               path=[tmp_path], env={"DOJO_PROBE": "yes"})
    assert result.value["env"] == "yes"
    assert result.value["path0"] == str(tmp_path)


# -- kill_after / kill_before -----------------------------------------------------------------

def test_kill_after_dies_right_after_the_nth_call_returned(tmp_path):
    log = tmp_path / "log"
    result = run_in_subprocess(f"{TARGETS}:step_three_times", str(log), "after", 2)
    assert result.killed, result.describe()
    assert log.read_text().splitlines() == ["step 1", "next line after step 1", "step 2"]
    assert "after Counter.step() (call 2) returned" in result.stderr


def test_kill_before_dies_before_the_nth_call_runs(tmp_path):
    log = tmp_path / "log"
    result = run_in_subprocess(f"{TARGETS}:step_three_times", str(log), "before", 2)
    assert result.killed, result.describe()
    assert log.read_text().splitlines() == ["step 1", "next line after step 1"]


@pytest.mark.parametrize("with_callback", [True, False])
def test_kill_after_ack_dies_once_the_broker_acknowledged(kafka, tmp_path, with_callback):
    topic = kafka.topic(1, hint="killack")
    log = tmp_path / "log"
    log.touch()
    result = run_in_subprocess(f"{TARGETS}:produce_three", kafka.bootstrap, topic, str(log),
                               with_callback)
    assert result.killed, result.describe()
    lines = log.read_text().splitlines()
    # The caller's callback saw the first ack; its next line ("flushed 0") never ran.
    assert lines == ([json.dumps({"err": None, "offset": 0})] if with_callback else [])
    consumer = kafka.consumer()
    consumer.assign([TopicPartition(topic, 0, 0)])
    msg = None
    deadline = time.monotonic() + 10
    while msg is None and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
    assert msg is not None and msg.value() == b"r0", "the acknowledged record is in the topic"


# -- SlowProducer -----------------------------------------------------------------------------

def test_slow_producer_holds_acknowledgements_back_for_the_delay(kafka):
    topic = kafka.topic(1, hint="slow")
    slow = SlowProducer(Producer(kafka.producer_config()), delay=0.6)
    acks: list[float] = []
    started = time.monotonic()
    slow.produce(topic, value=b"x", on_delivery=lambda err, msg: acks.append(time.monotonic()))
    assert slow.first_send.is_set()
    assert len(slow) == 1
    assert slow.poll(0.1) == 0 and not acks, "no report before the delay"
    assert slow.flush(10) == 0
    assert acks and acks[0] - started >= 0.6
    assert len(slow) == 0


def test_slow_producer_flush_blocks_without_a_callback(kafka):
    topic = kafka.topic(1, hint="slow2")
    slow = SlowProducer(Producer(kafka.producer_config()), delay=0.4)
    started = time.monotonic()
    slow.produce(topic, value=b"x")
    assert slow.flush(10) == 0
    assert time.monotonic() - started >= 0.4


def test_slow_producer_poll_returns_the_report_once_due(kafka):
    topic = kafka.topic(1, hint="slow3")
    slow = SlowProducer(Producer(kafka.producer_config()), delay=0.3)
    seen = []
    slow.produce(topic, b"x", on_delivery=lambda err, msg: seen.append(err))
    served = 0
    deadline = time.monotonic() + 5
    while not served and time.monotonic() < deadline:
        served = slow.poll(1.0)
    assert served == 1 and seen == [None]


# -- unreachable_bootstrap --------------------------------------------------------------------

def test_unreachable_bootstrap_refuses_connections():
    host, port = unreachable_bootstrap().split(":")
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((host, int(port)), timeout=2)


def test_a_producer_pointed_at_nothing_times_out_every_record():
    producer = Producer({"bootstrap.servers": unreachable_bootstrap(),
                         "message.timeout.ms": 500})
    errors = []
    producer.produce("dojo.nowhere", b"x", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(5)
    assert errors and errors[0] is not None


# -- run_concurrently -------------------------------------------------------------------------

def test_workers_start_together_and_report_values_and_errors():
    def work(i: int) -> float:
        if i == 2:
            raise KeyError("two")
        return time.monotonic()

    outcomes = run_concurrently(work, 4)
    assert [o.index for o in outcomes] == [0, 1, 2, 3]
    assert isinstance(outcomes[2].error, KeyError)
    starts = [o.value for o in outcomes if o.ok]
    assert max(starts) - min(starts) < 0.05, "the barrier released them together"


def test_a_stuck_worker_is_reported_as_a_timeout():
    release = threading.Event()
    outcomes = run_concurrently(lambda i: release.wait(5) if i == 0 else i, 2, timeout=0.5)
    release.set()
    assert isinstance(outcomes[0].error, TimeoutError)
    assert outcomes[1].value == 1


def test_workers_can_be_processes():
    outcomes = run_concurrently(_targets.square, 3, processes=True, timeout=30)
    assert [o.value for o in outcomes] == [0, 1, 4]


# -- slow_sql / fail_sql ----------------------------------------------------------------------

def test_slow_sql_delays_only_matching_statements(database):
    engine = database.engine
    with slow_sql(engine, 0.2, match=r"pg_sleep|FROM\s+generate_series") as slowed:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        assert slowed == [], "a statement that does not match is not slowed"
        started = time.monotonic()
        with engine.connect() as conn:
            conn.execute(text("SELECT count(*) FROM generate_series(1, 3)"))
        slow = time.monotonic() - started
    # which statements were slowed is read from the fault's record, not timed: an upper bound
    # on the fast one failed on a machine at load 18 (0.154 s for SELECT 1)
    assert slowed == ["SELECT count(*) FROM generate_series(1, 3)"]
    assert slow >= 0.2


def test_fail_sql_raises_at_the_matching_statement_and_the_transaction_rolls_back(database):
    engine = database.engine
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE a (x int); CREATE TABLE b (x int)"))
    with fail_sql(engine, r"INSERT INTO b") as failed, pytest.raises(InjectedFault):
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO a VALUES (1)"))
            conn.execute(text("INSERT INTO b VALUES (1)"))
    assert len(failed) == 1
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM a")).scalar() == 0
    with engine.begin() as conn:  # only `times` statements fail; the listener is gone after
        conn.execute(text("INSERT INTO b VALUES (2)"))


# -- duplicate_and_reorder --------------------------------------------------------------------

def test_every_item_appears_copies_times_deterministically():
    items = list(range(10))
    once = duplicate_and_reorder(items, copies=3, seed=7)
    assert sorted(once) == sorted(items * 3)
    assert once == duplicate_and_reorder(items, copies=3, seed=7)
    assert once != sorted(once)


def test_reordering_can_keep_the_order_inside_a_key():
    items = [(k, v) for k in "abc" for v in range(5)]
    out = duplicate_and_reorder(items, copies=2, seed=3, key=lambda item: item[0])
    for k in "abc":
        lane = [v for key, v in out if key == k]
        assert lane == sorted(lane)
    assert [k for k, _ in out] != sorted(k for k, _ in out), "keys interleave"


def test_the_process_result_names_the_signal(tmp_path):
    log = tmp_path / "log"
    result = run_in_subprocess(f"{TARGETS}:step_three_times", str(log), "after", 1)
    assert result.signal == signal.SIGKILL
    assert "SIGKILL" in result.describe()
