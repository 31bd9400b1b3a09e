"""Stage backoff: a row that keeps failing waits base × 2^(n − 1) seconds after its n-th failure
(capped, jitter within ±25 %), gives up its lease, and the rows behind it keep flowing."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    db_now,
    insert_event,
    outbox_rows,
    require_table,
)
from sqlalchemy import text

from dojo.checks import CheckFailure, call, first_line, raised, table

pytestmark = pytest.mark.stage("backoff")
SEE = READ["backoff"]

ROW_COLUMNS = ("id", "published_at", "attempt_count", "retry_in", "lease_left", "last_error")
BASE, MAXIMUM = 1.5, 45.5  # not round: a formula that only looks right shows
HOUR = 3600.0  # how long ago fast_forward makes a backing-off row due
JITTER = 0.25  # the README allows ±25 %
FOURTH = 4  # the attempt the extra rows fail: 12 s, long beside a pass's duration
# The producer refuses records over 100 kB; the poison row's payload is 200 kB, so sending
# it fails every time, for real, inside librdkafka (MSG_SIZE_TOO_LARGE).
SMALL_MESSAGES = {"message.max.bytes": 100_000}
# attempt_count after the claim of the failing attempt: around 2^31 and 2^63 (where an int or
# a bigint shift wraps), far past any float exponent
CAPPED_ATTEMPTS = (7, 32, 33, 41, 64, 65, 1100)
# A base so small that base × 2^(n − 1) reaches the maximum only past n = 55: an exponent
# capped low (at 10, 32, 50 …) stops the delay below the maximum. The 58th and 61st failures
# must still wait the maximum.
TINY_BASE = 2.7e-15
TINY_ATTEMPTS = (58, 61)
HISTORY = ("attempt", "delay", "expected", "lease_left", "last_error")


def poison(engine: Any, attempt_count: int = 0, created_ago: float = 60.0) -> str:
    return insert_event(engine, payload={"blob": "x" * 200_000}, created_ago=created_ago,
                        attempt_count=attempt_count)


def relay_pass(relay: Any, engine: Any, producer: Any, topic: str, batch_size: int = 10,
               base: float = BASE) -> int:
    return call(relay.relay_once, engine, producer, topic, batch_size=batch_size,
                lease_seconds=30, ack_timeout_seconds=10, backoff_base_seconds=base,
                backoff_max_seconds=MAXIMUM)


def row(engine: Any, event_id: str) -> dict[str, Any]:
    [found] = outbox_rows(engine, "id = CAST(:id AS uuid)", id=event_id)
    return found


def fast_forward(engine: Any, event_id: str) -> None:
    """Pretend the backoff has elapsed long ago (the relays were down for an hour): move
    next_attempt_at an hour into the past."""
    with engine.begin() as conn:
        conn.execute(text(
            "UPDATE outbox_event SET next_attempt_at = clock_timestamp() - interval '1 hour' "
            "WHERE id = CAST(:id AS uuid)"), {"id": event_id})


def expected_delay(attempt: int) -> float:
    return min(MAXIMUM, BASE * 2.0 ** min(attempt - 1, 60))


def delay_bounds(engine: Any, event_id: str, started: datetime, ended: datetime
                 ) -> tuple[float | None, float | None]:
    """The delay the relay chose, bracketed by the pass's start and end on the database clock:
    next_attempt_at − end ≤ delay ≤ next_attempt_at − start."""
    with engine.connect() as conn:
        found = conn.execute(text(
            "SELECT extract(epoch FROM next_attempt_at - CAST(:e AS timestamptz))::float8, "
            "extract(epoch FROM next_attempt_at - CAST(:s AS timestamptz))::float8 "
            "FROM outbox_event WHERE id = CAST(:id AS uuid)"),
            {"s": started, "e": ended, "id": event_id}).one()
    return found[0], found[1]


def failed_pass(relay: Any, engine: Any, producer: Any, topic: str, event_id: str,
                attempt: int, history: list[dict[str, Any]], batch_size: int = 10,
                base: float = BASE) -> tuple[float | None, float | None]:
    """One relay pass in which `event_id` fails (for the `attempt`-th time): checks what the
    row must say afterwards, and returns the bracket of the delay the relay chose."""
    started = db_now(engine)
    error = raised(relay_pass, relay, engine, producer, topic, batch_size, base)
    ended = db_now(engine)
    now = row(engine, event_id)
    low, high = delay_bounds(engine, event_id, started, ended)
    history.append({"attempt": now["attempt_count"],
                    "delay": "none" if low is None else f"{low:.2f}–{high:.2f} s",
                    "expected": f"{expected_delay(attempt):.2f} s ±25%",
                    "lease_left": now["lease_left"], "last_error": now["last_error"]})
    if error is not None:
        raise CheckFailure(
            f"relay_once raised while a row failed for the {ordinal(attempt)} time: one row's "
            "failure must never stop the relay (the batch's marks roll back with it, and the "
            "next pass claims the same rows).",
            expected="relay_once records the failure and returns",
            actual=first_line(error)[:200],
            evidence=table(history, HISTORY), lesson=SEE)
    if now["published_at"] is not None:
        raise CheckFailure(
            "The row whose payload is too large to send was marked published.",
            expected="published_at NULL (it was never acknowledged)",
            actual=f"published_at {now['published_at']} — did producer_config change "
                   "message.max.bytes? Keep the base settings.",
            lesson=MISTAKES)
    if attempt > 1 and now["attempt_count"] == attempt and high is not None and \
            high < -HOUR / 2:
        raise CheckFailure(
            f"After failed attempt {attempt}, next_attempt_at is about an hour in the past: the "
            "delay was added to the row's previous next_attempt_at (the check had made that due "
            "an hour ago, as after an outage), not to the time of this failure. The row is due "
            "again at once and is retried on every poll, with no backoff at all.",
            expected=f"next_attempt_at = the failure's time + {expected_delay(attempt):.2f} s "
                     "(±25%)",
            actual=f"next attempt in {high:.0f} s",
            evidence=table(history, HISTORY), lesson=SEE,
            fix="next_attempt_at = clock_timestamp() + make_interval(secs => :delay): from now, "
                "never from the old schedule")
    if not (now["attempt_count"] == attempt and now["last_error"] and
            high is not None and high > 0):
        raise CheckFailure(
            f"After failed attempt {attempt}, the row must say when to try again: "
            "next_attempt_at in the future (and the claim must skip it until then), with "
            "the error in last_error. Without next_attempt_at the relay retries it on every "
            "poll, hammering the broker with a record that cannot succeed.",
            expected=f"attempt_count {attempt}, last_error set, next_attempt_at in the future",
            actual=f"attempt_count {now['attempt_count']}, last_error "
                   f"{(now['last_error'] or '')[:60]!r}, next attempt in "
                   f"{'none' if high is None else f'{high:.2f} s'}",
            evidence=table(history, HISTORY), lesson=SEE)
    if now["lease_left"] is not None and now["lease_left"] > 0:
        raise CheckFailure(
            f"After failed attempt {attempt} the row kept its lease ({now['lease_left']:.0f} s "
            "left). No relay claims a leased row, so it waits for the lease (30 s here), not "
            "for its backoff: the failure must hand the row back.",
            expected="lease_until NULL once the failure is recorded, next_attempt_at set",
            actual=f"lease_until still {now['lease_left']:.1f} s ahead",
            evidence=table(history, HISTORY), lesson=SEE,
            fix="set lease_until = NULL in the UPDATE that records the failure")
    return low, high


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def within(bounds: tuple[float | None, float | None], want: float) -> bool:
    low, high = bounds
    return (low is not None and high is not None
            and high >= want * (1 - JITTER) and low <= want * (1 + JITTER))


Delay = tuple[int, tuple[float | None, float | None]]  # (attempt, bracket of the delay)


def judge_delays(delays: list[Delay], history: list[dict[str, Any]]) -> None:
    """Fail when a measured delay is outside base × 2^(n − 1) ±25% (n: its attempt)."""
    off = [i for i, (n, bounds) in enumerate(delays) if not within(bounds, expected_delay(n))]
    schedule = ", ".join(f"{expected_delay(n):g}" for n in range(1, 6))
    if off:
        shifted = all(within(bounds, expected_delay(n + 1)) for n, bounds in delays)
        below = [i for i in off if (high := delays[i][1][1]) is not None
                 and high < expected_delay(delays[i][0]) * (1 - JITTER)]
        side = "below" if len(below) == len(off) else "outside"
        fixed = all(within(bounds, expected_delay(1)) for _, bounds in delays)
        raise CheckFailure(
            "The delay must grow exponentially: after its n-th failure a row waits "
            f"backoff_base_seconds × 2^(n − 1) (base {BASE} s here: {schedule} s), jitter "
            "within ±25%. "
            + ("The delays here are one doubling ahead: base × 2^n — the exponent counted from "
               "1, not 0." if shifted else
               "Every failure here waits about the base: the delay never grows, so a broken "
               "dependency is hit at the same rate for ever." if fixed else
               f"{len(off)} of the {len(delays)} delays fall {side} that range (the table shows "
               "which)."),
            expected=", ".join(f"{expected_delay(n):.2f} s ±25%" for n in range(1, 6)),
            # the schedule's delays (attempts 1-5); the extra same-attempt rows are in the table
            actual="delays " + ", ".join("none" if lo is None else f"{lo:.2f}–{hi:.2f} s"
                                         for _, (lo, hi) in delays[:5]),
            evidence=table(history, HISTORY), lesson=SEE,
            fix="delay = min(max, base * 2 ** (attempt_count - 1)), with attempt_count as the "
                "claim counted it" if shifted else None)


def test_failing_row_backs_off_exponentially(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="backoff")
    producer = relay_producer(**SMALL_MESSAGES)
    bad = poison(outbox)
    history: list[dict[str, Any]] = []
    delays = [(1, failed_pass(relay, outbox, producer, topic, bad, 1, history))]
    for _ in range(2):  # polls right away: the poison row is not due yet
        insert_event(outbox)
        relay_pass(relay, outbox, producer, topic)
        if row(outbox, bad)["attempt_count"] != 1:
            judge_delays(delays, history)  # a first delay far too short made it due already
            raise CheckFailure(
                "The failed row was claimed again before its next_attempt_at: the claim must "
                "skip rows whose backoff has not elapsed.",
                expected="attempt_count stays 1 while next_attempt_at is in the future",
                actual=f"attempt_count {row(outbox, bad)['attempt_count']}",
                evidence=table(outbox_rows(outbox), ROW_COLUMNS), lesson=SEE)
    for attempt in range(2, 6):
        fast_forward(outbox, bad)
        delays.append((attempt, failed_pass(relay, outbox, producer, topic, bad, attempt,
                                            history)))
    delays += same_attempt_delays(relay, outbox, producer, topic, history)
    judge_delays(delays, history)


def same_attempt_delays(relay: Any, engine: Any, producer: Any, topic: str,
                        history: list[dict[str, Any]], rows: int = 6) -> list[Delay]:
    """Six rows failing their 4th attempt in one pass: six delays of 12 s each ±25%. A delay is
    only known within the pass's duration, which a loaded machine stretches to seconds; with
    one sample per attempt a random delay (full jitter) could land in range by chance, with
    six more at 12 s it cannot (each has about a one-in-four chance)."""
    bad = [poison(engine, attempt_count=FOURTH - 1, created_ago=50.0 - i) for i in range(rows)]
    started = db_now(engine)
    raised(relay_pass, relay, engine, producer, topic, rows)
    ended = db_now(engine)
    found: list[Delay] = []
    for event_id in bad:
        low, high = delay_bounds(engine, event_id, started, ended)
        history.append({"attempt": row(engine, event_id)["attempt_count"],
                        "delay": "none" if low is None else f"{low:.2f}–{high:.2f} s",
                        "expected": f"{expected_delay(FOURTH):.2f} s ±25%",
                        "lease_left": None, "last_error": None})
        found.append((FOURTH, (low, high)))
    return found


def test_backoff_is_capped(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="cap")
    producer = relay_producer(**SMALL_MESSAGES)
    history: list[dict[str, Any]] = []
    wrong = []
    for attempt in CAPPED_ATTEMPTS:  # rows that have failed for days; one pass each
        bad = poison(outbox, attempt_count=attempt - 1, created_ago=60.0 + attempt)
        bounds = failed_pass(relay, outbox, producer, topic, bad, attempt, history,
                             batch_size=1)
        if not within(bounds, MAXIMUM):
            wrong.append(attempt)
    stalled = []
    for attempt in TINY_ATTEMPTS:
        bad = poison(outbox, attempt_count=attempt - 1, created_ago=30.0 + attempt)
        bounds = failed_pass(relay, outbox, producer, topic, bad, attempt, history,
                             batch_size=1, base=TINY_BASE)
        if not within(bounds, MAXIMUM):
            stalled.append(attempt)
    if stalled and not wrong:
        raise CheckFailure(
            f"With backoff_base_seconds={TINY_BASE:g}, base × 2^(n − 1) passes the maximum "
            f"({MAXIMUM} s) at the 55th failure, so rows failing for the "
            f"{' and '.join(ordinal(n) for n in TINY_ATTEMPTS)} time must wait {MAXIMUM} s; "
            f"they waited less (attempt(s) {', '.join(map(str, stalled))}). The delay stopped "
            "growing below the maximum: the exponent was capped at a value that binds before "
            "backoff_max_seconds does. The maximum is the cap; the exponent's cap only keeps "
            "the arithmetic from overflowing and must never bind first.",
            expected=f"next attempt in {MAXIMUM} s ±25% for attempts "
                     f"{', '.join(map(str, TINY_ATTEMPTS))} (base {TINY_BASE:g} s)",
            actual=f"less for attempt(s) {', '.join(map(str, stalled))}",
            evidence=table(history, HISTORY), lesson=SEE,
            fix="cap the exponent where it cannot bind first: min(attempt_count − 1, 60) "
                "(2^60 × any sensible base is past any maximum), then min(max, …)")
    if wrong:
        raise CheckFailure(
            "After many failures the delay must stop growing at backoff_max_seconds "
            f"({MAXIMUM} s here), whatever the attempt count: 2^(n − 1) overflows an int "
            "at n = 32, a bigint shift wraps at n = 64 and a float exponent at n = 1025.",
            expected=f"next attempt in {MAXIMUM} s ±25% for attempts "
                     f"{', '.join(map(str, CAPPED_ATTEMPTS))}",
            actual=f"another delay for attempt(s) {', '.join(map(str, wrong))}",
            evidence=table(history, HISTORY), lesson=SEE)


def test_failing_row_does_not_block_the_others(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="hol")
    producer = relay_producer(**SMALL_MESSAGES)
    for batch_size, passes in ((3, 2), (1, 5)):
        with outbox.begin() as conn:
            conn.execute(text("DELETE FROM outbox_event"))
        bad = poison(outbox)
        good = [insert_event(outbox, created_ago=30.0 - i) for i in range(4)]
        for _ in range(passes):
            relay_pass(relay, outbox, producer, topic, batch_size=batch_size)
        rows = outbox_rows(outbox)
        poison_error = row(outbox, bad)["last_error"]
        stuck = [r for r in rows if r["id"] in good and r["published_at"] is None]
        if not stuck:
            continue
        blamed = [r for r in stuck if poison_error and r["last_error"] == poison_error]
        raise CheckFailure(
            f"With batch_size={batch_size} and the poison row oldest, {passes} passes must "
            "publish the 4 good rows behind it. "
            + (f"{len(blamed)} good row(s) claimed in the poison row's batch were recorded as "
               "failed with its error: one refused record failed the rest of the batch, which "
               "now backs off with it — at any batch size above 1 a single bad row blocks the "
               "outbox." if blamed else
               "A relay that claims the poison row on every poll (no backoff) never gets past "
               "it: head-of-line blocking."),
            expected=f"{passes} passes: the poison row fails, the 4 good rows are published",
            actual=f"{len(stuck)} of 4 good rows still unpublished; the poison row was tried "
                   f"{row(outbox, bad)['attempt_count']} time(s)",
            evidence=table(rows, ROW_COLUMNS), lesson=SEE,
            fix="catch the error of each produce() on its own and keep sending the rest of the "
                "batch; only the refused event fails" if blamed else None)


# Every statement that writes outbox_event is held this long before it runs: a time the
# relay read from its own clock (Python's) before the statement is then this much older
# than the database's clock_timestamp() when the statement runs.
CLOCK_HOLD = 0.2
CLOCK_BASE = 0.01  # a small base: the backoff (± jitter) is short beside the hold
CLOCK_SLACK = 0.05


def times(engine: Any, event_id: str) -> dict[str, Any]:
    """The row's times as datetimes (aware, comparable with the database's clock)."""
    with engine.connect() as conn:
        return dict(conn.execute(text(
            "SELECT lease_until, published_at, next_attempt_at FROM outbox_event "
            "WHERE id = CAST(:id AS uuid)"), {"id": event_id}).mappings().one())


class DatabaseClockWatch:
    """Holds each UPDATE of outbox_event for CLOCK_HOLD seconds, then reads the database's
    clock: the time the statement is about to run, by the clock the README fixes."""

    def __init__(self, engine: Any, hold: bool = True) -> None:
        self.engine, self.hold = engine, hold
        self.after_hold: list[datetime] = []

    def __enter__(self) -> DatabaseClockWatch:
        from sqlalchemy import event
        event.listen(self.engine, "before_cursor_execute", self._hold)
        return self

    def __exit__(self, *exc: Any) -> None:
        from sqlalchemy import event
        event.remove(self.engine, "before_cursor_execute", self._hold)

    def _hold(self, conn: Any, cursor: Any, statement: str, *rest: Any) -> None:
        import re
        import time
        if self.hold and re.search(r"\bupdate\s+(only\s+)?(public\.)?\"?outbox_event\b", statement,
                     re.IGNORECASE):
            time.sleep(CLOCK_HOLD)
            self.after_hold.append(db_now(self.engine))

    def first(self) -> datetime | None:
        return self.after_hold[0] if self.after_hold else None


def test_relay_times_come_from_the_database_clock(outbox, learner, kafka, relay_producer):
    require_table(outbox, "outbox_event", "backoff")
    relay = learner.module("relay")
    topic = kafka.topic(1, hint="clock")
    producer = relay_producer(**SMALL_MESSAGES)
    good, bad = insert_event(outbox), poison(outbox)
    findings = []
    for event_id, what in ((good, "published"), (bad, "failed")):
        with outbox.begin() as conn:  # one row claimable at a time
            conn.execute(text("UPDATE outbox_event SET next_attempt_at = clock_timestamp() + "
                              "interval '1 hour' WHERE id <> CAST(:id AS uuid) AND "
                              "published_at IS NULL"), {"id": event_id})
            conn.execute(text("UPDATE outbox_event SET next_attempt_at = NULL "
                              "WHERE id = CAST(:id AS uuid)"), {"id": event_id})
        with DatabaseClockWatch(outbox, hold=what == "published") as claim_watch:
            events = call(relay.claim_batch, outbox, batch_size=10, lease_seconds=30)
        leased = times(outbox, event_id)
        with DatabaseClockWatch(outbox) as publish_watch:
            call(relay.publish_claimed, outbox, producer, topic, events or [],
                 ack_timeout_seconds=10, backoff_base_seconds=CLOCK_BASE,
                 backoff_max_seconds=MAXIMUM)
        done = times(outbox, event_id)
        claimed_at, written_at = claim_watch.first(), publish_watch.first()
        if claimed_at is not None and leased["lease_until"] is not None:
            starts = leased["lease_until"] - timedelta(seconds=30)
            findings.append({"row": what, "column": "lease_until − 30 s", "value": starts,
                             "statement ran at": claimed_at,
                             "ok": starts >= claimed_at - timedelta(seconds=CLOCK_SLACK)})
        column = "published_at" if what == "published" else "next_attempt_at"
        if written_at is not None and done[column] is not None:
            findings.append({"row": what, "column": column, "value": done[column],
                             "statement ran at": written_at,
                             "ok": done[column] >= written_at - timedelta(seconds=CLOCK_SLACK)})
    wrong = [f for f in findings if not f["ok"]]
    if wrong:
        raise CheckFailure(
            f"Each UPDATE of outbox_event was held {CLOCK_HOLD:g} s before it ran, and "
            + ", ".join(sorted({w["column"].split(" ")[0] for w in wrong}))
            + " came out older than the database's clock when the statement ran: the time "
            "was read from this process's clock before the statement, not from "
            "clock_timestamp() in it. Relays on several hosts then disagree by their clocks' "
            "skew (a lease ends early, a backoff is cut short, a publish age goes negative), "
            "and the checks' fast-forwarding of those columns no longer means what it says.",
            expected="lease_until − lease_seconds, published_at and next_attempt_at at or after "
                     "the database's clock_timestamp() when their statement ran",
            actual="; ".join(f"{w['row']} row: {w['column']} "
                             f"{(w['statement ran at'] - w['value']).total_seconds():.2f} s "
                             "before its statement ran" for w in wrong),
            evidence=table(findings, ("row", "column", "value", "statement ran at", "ok")),
            lesson=SEE,
            fix="compute them in SQL: clock_timestamp() + make_interval(secs => :seconds), "
                "SET published_at = clock_timestamp()")
