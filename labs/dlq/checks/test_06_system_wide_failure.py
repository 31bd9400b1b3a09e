"""Stage system-wide-failure: when the gateway is down for everyone, the consumer opens its
circuit and pauses (nothing dead-lettered, nothing hammered, still polling), lag grows, and
when ping() answers again it resumes and the lag drains."""

from __future__ import annotations

from typing import Any

import pytest
from _support import (
    READ,
    CommitAudit,
    SteppedWallClock,
    applied_ids,
    dlt_table,
    require_done,
    timeline,
)
from _tools import ScriptedDownstream, healthy

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("system-wide-failure")
SEE = READ["system-wide-failure"]
OUTAGE = 12.0  # clock seconds (the checks' clock makes them cost little real time)
OPEN = 2.0
POLL_INTERVAL_MS = 10_000
# The probing check opens the circuit for longer than max.poll.interval.ms (as a 30 s breaker
# against a 20 s poll interval would): only naps shorter than the open period keep polling.
LONG_OPEN = 11.0
# While the circuit is open the wall clock (clock.now()) steps back (an NTP correction) this
# long after the ping that opened it: the open period is a duration, on clock.monotonic().
STEP_AFTER = 3.71
WALL_STEP = -3607.3


class LaterSteppedClock(SteppedWallClock):
    """A SteppedWallClock whose wall time steps by `seconds` once monotonic() reaches a
    moment set with step_at() (in the middle of a nap, not at a call the check sees)."""

    def __init__(self) -> None:
        super().__init__()
        self.step: tuple[float, float] | None = None  # (monotonic moment, seconds)
        self.stepped_at: float | None = None

    def step_at(self, moment: float, seconds: float) -> None:
        self.step = (moment, seconds)

    def _due(self) -> None:
        if self.step is not None and self.monotonic() >= self.step[0]:
            self.stepped_at, seconds = self.step[0], self.step[1]
            self.step = None
            self.step_wall(seconds)

    def now(self) -> float:
        self._due()
        return super().now()

    def __call__(self) -> Any:
        self._due()
        return super().__call__()


class Outage:
    """The gateway goes down for everyone at its `after`-th authorize() and comes back
    OUTAGE clock seconds later; when it goes down, the check produces a second wave. Its
    recovery is flaky: the first authorize() after the outage times out once."""

    def __init__(self, clock, after, on_start):
        self.clock, self.after, self.on_start = clock, after, on_start
        self.calls = 0
        self.started = None
        self.flaked: str | None = None  # the event whose first call after recovery timed out

    def flaky(self, event_id):
        if self.started is None or self.down() or self.flaked is not None:
            return None
        self.flaked = event_id or "?"
        return "timeout"

    def down(self):
        return self.started is not None and self.clock.monotonic() < self.started + OUTAGE

    @property
    def ended(self):
        return None if self.started is None else self.started + OUTAGE

    def on_call(self, call):
        if self.started is None and call.what == "authorize":
            self.calls += 1
            if self.calls >= self.after:
                self.started = self.clock.monotonic()
                self.on_start()


def outage_run(lab, engine, clock, *, open_seconds=OPEN, down_as="unavailable",
               also_on_call=None, stop_when=None):
    topics = lab.topics()
    settings = lab.settings(topics, open_seconds=open_seconds,
                            max_poll_interval_ms=POLL_INTERVAL_MS)
    inputs = lab.produce(topics.source, [healthy(f"acc-{n % 5}", 100 + n) for n in range(12)])
    wave = [healthy(f"acc-{n % 5}", 500 + n) for n in range(12)]

    def second_wave():
        inputs.extend(lab.produce(topics.source, wave))

    outage = Outage(clock, 5, second_wave)

    def on_call(call):
        outage.on_call(call)
        if also_on_call is not None:
            also_on_call(call)

    downstream = ScriptedDownstream(lab.payments, clock, down_while=outage.down,
                                    on_call=on_call, override=outage.flaky,
                                    down_as=down_as)
    audit = CommitAudit(lab, engine, topics, clock)
    lags = []

    def watch(committed):
        ends = lab.ends[topics.source]
        lags.append((clock.monotonic(), sum(max(0, e - max(committed.get(p, -1), 0))
                                            for p, e in ends.items())))

    run = lab.run(engine, topics, settings, downstream, clock, watch=watch, timeout=25,
                  producer=audit.producer, before_commit=audit,
                  **({"stop_when": stop_when} if stop_when is not None else {}))
    return topics, settings, inputs, downstream, outage, run, lags, audit


def test_outage_is_not_dead_lettered(lab, ledger_db, clock):
    # This outage shows as timeouts (a load balancer that accepts and hangs), the probing
    # check's as 503s: ping() decides, not the class of the last failure.
    topics, settings, inputs, downstream, outage, run, lags, _ = outage_run(
        lab, ledger_db, clock, down_as="timeout")
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    flaked = next((i for i in inputs if i.item.event_id == outage.flaked), None)
    writes = run.producer.to(topics.dead_letter)
    before = [p for p in writes if outage.ended is None or p.at < outage.ended]
    after = [p for p in writes if outage.ended is not None and p.at >= outage.ended]
    if flaked is not None and not before and after and after[0].value == flaked.item.value:
        calls = [c for c in downstream.authorizations(flaked.item.event_id)
                 if c.at >= outage.ended]
        raise CheckFailure(
            "After the outage a ping() answered and the consumer resumed, but the held "
            "record's first attempt timed out (a gateway that has just come back is often "
            "flaky), and the record went straight to the DLT. When a ping answers, the held "
            "record starts again from attempt 1 with the whole retry policy: a healthy "
            "payment is not dead-lettered because of one timeout.",
            expected="the held record retried with backoff and booked; nothing in the DLT",
            actual=f"{len(calls)} attempt(s) after recovery, then dead-lettered"
                   + (f" ({len(after) - 1} more DLT write(s) followed it)" if len(after) > 1
                      else ""),
            evidence=f"the held record: {flaked.describe()}\n"
                     "gateway calls for it after the outage (clock):\n" + table(
                [(f"t+{c.at - outage.ended:5.2f}s", c.what, c.outcome) for c in calls],
                ("when", "call", "outcome")) + "\nwhat happened:\n"
                     + timeline(run, downstream, inputs, limit=10), lesson=SEE)
    if dlt:
        raise CheckFailure(
            "The gateway was down for everyone for 12 s: every authorize() timed out and "
            "ping() failed too (whatever the last failure was, a 503 or a timeout, a failing "
            "ping() is what says the gateway is down for everyone). "
            "That is not a problem of any one message: dead-lettering them fills the DLT with "
            "healthy payments and forces a bulk replay. Open the circuit and pause instead; the "
            "topic is the buffer.",
            expected="nothing in the DLT",
            actual=f"{len(dlt)} records dead-lettered during the outage",
            evidence="DLT:\n" + dlt_table(dlt, inputs) + "\nwhat happened:\n" +
                     timeline(run, downstream, inputs, limit=12), lesson=SEE)
    require_done(run, inputs, downstream, read=SEE, why=(
        "After the outage ping() answers again: the consumer should resume and work through "
        "the backlog."))
    booked = applied_ids(ledger_db)
    wrong = [i for i in inputs if len(booked.get(i.item.event_id, [])) != 1]
    during = [lag for at, lag in lags if outage.started and outage.started <= at < outage.ended]
    if wrong or not (during and max(during) >= 12 and lags[-1][1] == 0):
        raise CheckFailure(
            "While the circuit is open the lag grows (12 more payments arrived during the "
            "outage); after recovery it drains to zero and every payment is booked once.",
            expected="lag ≥ 12 during the outage, 0 at the end; every event booked once",
            actual=f"max lag during the outage {max(during) if during else 'not seen'}, at the end "
                   f"{lags[-1][1] if lags else '?'}; {len(wrong)} events not booked exactly once",
            evidence=timeline(run, downstream, inputs, limit=10), lesson=SEE)


def test_open_circuit_pauses_and_probes_gently(lab, ledger_db):
    clock = LaterSteppedClock()

    probed_after_step = []

    def step_when_opened(call):  # the first failed ping opens the circuit (or reopens it)
        if call.what != "ping":
            return
        if clock.stepped_at is not None:
            probed_after_step.append(call.at)
        elif call.outcome == "down" and clock.step is None:
            clock.step_at(call.at + STEP_AFTER, WALL_STEP)

    def no_probe_long_after_the_step():  # the run cannot pass any more: end it early
        return clock.stepped_at is not None and not probed_after_step and \
            clock.monotonic() > clock.stepped_at + 3 * LONG_OPEN

    topics, settings, inputs, downstream, outage, run, _, audit = outage_run(
        lab, ledger_db, clock, open_seconds=LONG_OPEN, also_on_call=step_when_opened,
        stop_when=no_probe_long_after_the_step)
    pings = [c.at for c in downstream.calls if c.what == "ping"]
    if clock.stepped_at is not None:
        opened = max(p for p in pings if p < clock.stepped_at)
        probe = next((p for p in pings if p > clock.stepped_at), None)
        if probe is None or probe - opened > LONG_OPEN + 1.0:
            waited = (probe if probe is not None else clock.monotonic()) - opened
            raise CheckFailure(
                "The circuit opened after a failed ping(); "
                f"{STEP_AFTER:.2f} s later the wall clock (clock.now()) stepped back "
                f"{-WALL_STEP:.1f} s (an NTP correction), and the next probe "
                + (f"came {waited:.1f} s after the circuit opened" if probe is not None else
                   f"had not come {waited:.1f} s after the circuit opened, when the run "
                   "ended") + f". open_seconds is {LONG_OPEN:.0f} s: a duration, measured "
                "with clock.monotonic(), which never jumps; clock.now() is for timestamps.",
                expected=f"a ping about {LONG_OPEN:.0f} s after the one that opened the "
                         "circuit",
                actual="pings at (clock time since the outage began): " + ", ".join(
                    f"t+{p - outage.started:.1f}s" for p in pings[:8]),
                lesson=SEE)
    require_done(run, inputs, downstream, read=SEE)
    start, end = outage.started, outage.ended
    during = [c for c in downstream.calls if start <= c.at < end]
    held = {c.event_id for c in during if c.what == "authorize"}
    budget = settings.retry.max_attempts + int(OUTAGE / LONG_OPEN) + 3
    # every gap between two polls that overlaps the outage, whole (a nap that began in the
    # outage and ended after it counts in full)
    polls = run.consumer.polls
    gaps = [b - a for a, b in zip(polls, polls[1:], strict=False) if b > start and a < end]
    pauses = [p for p in run.consumer.pauses if start <= p[0] <= end]
    resumes = [r for r in run.consumer.resumes if r[0] >= end]
    after = [c for c in downstream.calls if c.at >= end and c.what == "authorize"
             and c.outcome == "ok"]
    recovered = (after[0].at - end) if after else float("inf")
    problems = []
    if len(held) > 1:
        problems.append(f"{len(held)} different events were sent to the gateway during the "
                        "outage: the consumer went on taking records instead of holding one")
    if len(during) > budget:
        problems.append(f"{len(during)} gateway calls in {OUTAGE:.0f} s: a probe every "
                        f"{LONG_OPEN:.0f} s allows about {budget}")
    if not pauses or not resumes:
        problems.append("consumer.pause(assignment) while the circuit is open and "
                        "consumer.resume(assignment) after recovery were "
                        f"{'not called' if not pauses else 'paused but never resumed'}")
    paused = sorted({p for _, parts in pauses for p in parts})
    if pauses and len(paused) < topics.partitions:
        problems.append(f"consumer.pause() covered only {', '.join(f'p{p}' for p in paused)} "
                        f"of the {topics.partitions} assigned partitions: the others go on "
                        "fetching records for a gateway that is down for everyone (pause the "
                        "whole assignment, consumer.pause(consumer.assignment()))")
    if gaps and max(gaps) > POLL_INTERVAL_MS / 1000:
        problems.append(f"poll() was not called for {max(gaps):.1f} s: over "
                        f"max.poll.interval.ms ({POLL_INTERVAL_MS} ms) the broker evicts the "
                        "consumer (keep polling while paused, in naps shorter than the open "
                        f"period: it is {LONG_OPEN:.0f} s here, longer than the poll interval)")
    if recovered > LONG_OPEN + 1.0:
        problems.append(f"the first payment after recovery went through {recovered:.1f} s "
                        f"after the gateway came back (probe every {LONG_OPEN:.0f} s)")
    if audit.violations:
        problems.append("a commit covered a record that was neither booked nor "
                        "dead-lettered (see the commits below): the record held while the "
                        "circuit is open stays uncommitted until it is booked (a crash during "
                        "the outage would lose it)")
    calls = [(f"t+{c.at - start:5.1f}s", c.what, c.outcome) for c in during]
    if problems:
        raise CheckFailure(
            "While the gateway is down the circuit is open: hold the record in hand, pause the "
            "assignment, keep calling poll() (it returns nothing while paused) and ping() once "
            "every open_seconds; when a ping answers, resume and retry the held record.",
            expected="one held record, few calls, paused and resumed, polls within the interval, "
                     f"recovery within {LONG_OPEN + 1.0:.0f} s",
            actual="\n    - " + "\n    - ".join(problems),
            evidence="gateway calls during the outage (clock time since it began):\n" +
                     table(calls, ("when", "call", "outcome"), limit=12)
                     + ("\ncommits ahead of the ledger and the DLT:\n" + audit.table()
                        if audit.violations else ""), lesson=SEE)


def test_a_stop_while_the_circuit_is_open_dead_letters_nothing(lab, ledger_db, clock):
    """A rolling deploy during an outage stops the consumer while it holds a record."""
    topics = lab.topics()
    settings = lab.settings(topics, open_seconds=OPEN, max_poll_interval_ms=POLL_INTERVAL_MS)
    inputs = lab.produce(topics.source, [healthy("acc-7", 317), healthy("acc-8", 523),
                                         healthy("acc-9", 641)])
    downstream = ScriptedDownstream(lab.payments, clock, down_while=lambda: True)
    audit = CommitAudit(lab, ledger_db, topics, clock)

    def probed_twice():  # the circuit is open: one probe after the ping that opened it
        return sum(c.what == "ping" for c in downstream.calls) >= 2

    run = lab.run(ledger_db, topics, settings, downstream, clock, timeout=6,
                  producer=audit.producer, before_commit=audit, stop_when=probed_twice)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    if dlt or audit.violations:
        raise CheckFailure(
            "The consumer was stopped (a deploy, a scale-down) while the gateway was down for "
            "everyone and it held a record with its circuit open. That record is unfinished: "
            "it stays uncommitted and out of the DLT, and the next consumer life takes it up "
            "again. Dead-lettering it on the way out sends a healthy payment to the DLT.",
            expected="nothing in the DLT, nothing committed",
            actual=f"{len(dlt)} record(s) in the DLT, "
                   f"{len(audit.violations)} commit(s) of unbooked records",
            evidence=("DLT:\n" + dlt_table(dlt, inputs) + "\n" if dlt else "")
                     + ("commits ahead of the ledger:\n" + audit.table() + "\n"
                        if audit.violations else "")
                     + "what happened:\n" + timeline(run, downstream, inputs, limit=12),
            lesson=SEE)


def test_a_window_cut_short_by_the_poll_interval_still_asks_ping(lab, ledger_db, clock):
    """The gateway is down for everyone, and every call hangs 20 s before it times out:
    with a 60 s poll interval the retry window (30 s) is over after two of the four
    attempts. Dead-lettering then is the same mistake as after the fourth: ping() decides."""
    topics = lab.topics()
    settings = lab.settings(topics, attempts=4, open_seconds=9.7, max_poll_interval_ms=60_000)
    inputs = lab.produce(topics.source, [healthy("acc-4", 1_913), healthy("acc-6", 2_207)])
    outage: dict[str, float | None] = {"started": None}
    hang = 20.0

    def down():
        start = outage["started"]
        if start is None:
            start = outage["started"] = clock.monotonic()
        return clock.monotonic() < start + 47.0

    def on_call(call):
        if call.what == "authorize" and call.outcome == "down":
            clock.advance(hang)  # the call hangs, then times out

    downstream = ScriptedDownstream(lab.payments, clock, down_while=down, on_call=on_call,
                                    down_as="timeout")
    run = lab.run(ledger_db, topics, settings, downstream, clock, timeout=15)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    if dlt:
        first = [c for c in downstream.calls if c.at < (outage["started"] or 0) + 47.0]
        pinged = any(c.what == "ping" for c in first)
        raise CheckFailure(
            "The gateway was down for everyone, and every authorize() hung 20 s before it "
            "timed out: with a 60 s poll interval the retry window (half of it) was over "
            "after two attempts of max_attempts 4, and the record went to the DLT"
            + ("" if pinged else " without a ping()") + ". A window cut short by the poll "
            "interval ends the retries like max_attempts does, and the same question comes "
            "before the DLT: does ping() answer? It did not: open the circuit and hold the "
            "record.",
            expected="nothing in the DLT; the record held until the gateway answers, then "
                     "booked",
            actual=f"{len(dlt)} record(s) dead-lettered; "
                   + ("ping() was asked" if pinged else "ping() was never asked"),
            evidence="DLT:\n" + dlt_table(dlt, inputs) + "\ngateway calls (clock time since "
                     "the outage began):\n" + table(
                         [(f"t+{max(0.0, c.at - (outage['started'] or 0)):5.1f}s", c.what,
                           c.outcome) for c in first], ("when", "call", "outcome"), limit=10),
            lesson=SEE)
    require_done(run, inputs, downstream, read=SEE, why=(
        "After the outage ping() answers: the consumer should resume and book both."))
