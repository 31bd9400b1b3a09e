"""Stage classify: permanent failures go to the DLT at once; transient ones are retried in
place with bounded exponential backoff and jitter, inside the poll interval, then
dead-lettered."""

from __future__ import annotations

import pytest
from _support import (
    READ,
    applied_ids,
    dlt_table,
    dlt_writes_of,
    first_delivery,
    match_dlt,
    nominal_backoffs,
    require_done,
    retries_of,
    timeline,
)
from _tools import (
    ScriptedDownstream,
    business_rule,
    healthy,
    invalid,
    undecodable,
    with_label,
)

from dojo.checks import CheckFailure, table

pytestmark = pytest.mark.stage("classify")
SEE = READ["classify"]


def described(inputs) -> str:
    return ", ".join(i.describe() for i in inputs) or "none"


def test_permanent_failures_go_to_the_dead_letter_topic_at_once(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    declined = with_label(healthy("poison-d1", 700), "declined")
    over_limit = with_label(healthy("poison-o1", 20_000_000), "business-rule")
    items = [healthy("acc-1"), undecodable("poison-u1"), healthy("acc-2"),
             invalid("poison-i1"), healthy("acc-3"), business_rule("poison-b1"),
             declined, healthy("acc-4"), over_limit, healthy("acc-5")]
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock, {declined.event_id: ["declined"] * 9})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=SEE)

    poison = [i for i in inputs if i.label != "healthy"]
    dlt = lab.read(topics.dead_letter, topics.partitions, expect=len(poison))
    found = match_dlt(inputs, dlt)
    missing = [i for n, i in enumerate(inputs) if i.label != "healthy" and n not in found]
    wrongly = [i for n, i in enumerate(inputs) if i.label == "healthy" and n in found]
    applied = applied_ids(ledger_db)
    not_applied = [i for i in inputs if i.label == "healthy" and i.item.event_id not in applied]
    if missing or wrongly or not_applied:
        raise CheckFailure(
            "Every input that can never be processed (undecodable bytes, a schema error, a "
            "business-rule violation, a payment the gateway declined) must be in the DLT; every "
            "healthy one booked, and none of those dead-lettered. A permanent failure that is "
            "committed without a DLT record is LOST.",
            expected=f"{len(poison)} records in {topics.dead_letter}; "
                     f"{len(inputs) - len(poison)} healthy events in ledger_entries",
            actual=f"missing from the DLT: {described(missing)}; "
                   f"healthy but dead-lettered: {described(wrongly)}; "
                   f"healthy, not booked: {described(not_applied)}",
            evidence="DLT:\n" + dlt_table(dlt, inputs) + "\nwhat happened:\n" +
                     timeline(run, downstream, inputs), lesson=SEE)

    calls = downstream.authorizations(declined.event_id)
    if len(calls) != 1:
        raise CheckFailure(
            "The gateway declined a payment for good (PaymentDeclined, a PermanentError). "
            "Asking again cannot change the answer; it only holds up the partition.",
            expected="authorize() called once for it, then the DLT",
            actual=f"authorize() called {len(calls)} times",
            evidence=timeline(run, downstream, inputs), lesson=SEE)

    slow = []
    for i in poison:
        seen = first_delivery(run, i)
        writes = dlt_writes_of(run, topics.dead_letter, i)
        if seen is not None and writes and writes[0].at - seen > 0.25:
            slow.append((i.describe(), f"{writes[0].at - seen:.2f} s"))
    if slow:
        raise CheckFailure(
            "A permanent failure goes to the DLT at once: no backoff, no retry. These waited "
            "between being polled and being written to the DLT (clock time):",
            expected="under 0.25 s each (the first backoff is "
                     f"{settings.retry.initial_backoff_seconds} s)",
            actual=f"{len(slow)} waited", evidence=table(slow, ("input", "waited")), lesson=SEE)


def test_transient_failures_are_retried_with_backoff_and_jitter(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)  # 4 attempts: retries wait 0.4, 0.8, 1.6 s (± 20 %)
    flaky = [healthy(f"acc-{n}", 100 * n, label="transient") for n in range(1, 5)]
    items = [flaky[0], healthy("acc-9"), flaky[1], flaky[2], healthy("acc-8"), flaky[3]]
    inputs = lab.produce(topics.source, items)
    script = ["timeout", "unavailable", "timeout"]  # the fourth attempt succeeds
    downstream = ScriptedDownstream(lab.payments, clock, {f.event_id: script for f in flaky})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"])

    applied = applied_ids(ledger_db)
    calls = {f.event_id: len(downstream.authorizations(f.event_id)) for f in flaky}
    unbooked = [f for f in flaky if len(applied.get(f.event_id or "", [])) != 1]
    if unbooked or not all(n == 4 for n in calls.values()):
        raise CheckFailure(
            "Each of these events failed transiently three times (timeout, 503, timeout) and "
            "would succeed on the fourth attempt. max_attempts is 4: retry in place until then.",
            expected="4 authorize() calls each, then booked once, nothing dead-lettered",
            actual=f"authorize() calls per event: {sorted(calls.values())}; "
                   f"{len(unbooked)} of 4 not booked exactly once",
            evidence=timeline(run, downstream, inputs, limit=20), lesson=READ["retry"])

    nominal = nominal_backoffs(settings, 3)
    jitter = settings.retry.jitter
    rows, bad, factors = [], [], []
    for f in flaky:
        for n, (gap, d) in enumerate(zip(retries_of(downstream, f.event_id), nominal,
                                         strict=False), start=1):
            low, high = d * (1 - jitter) - 0.02, d * (1 + jitter) + 0.15
            factors.append(gap / d)
            ok = low <= gap <= high
            rows.append((f.account, n, f"{d:.2f}", f"{low:.2f}–{high:.2f}", f"{gap:.3f}",
                         "" if ok else "WRONG"))
            if not ok:
                bad.append(rows[-1])
    if bad:
        raise CheckFailure(
            "Retry n waits min(max_backoff, initial × multiplier^(n−1)) × a jitter factor in "
            "[1 − jitter, 1 + jitter]: 0.4, 0.8, 1.6 s here, each ± 20 %. Waits are measured "
            "between authorize() calls on the clock you are given (clock.sleep, not time.sleep).",
            expected="every wait inside its range",
            actual=f"{len(bad)} of {len(rows)} waits outside",
            evidence=table(rows, ("account", "retry", "nominal s", "allowed s", "waited s", "")),
            lesson=READ["retry"])
    if not (max(factors) - min(factors) > 0.03):
        raise CheckFailure(
            "Every retry waited exactly the nominal backoff: no jitter. After an outage, every "
            "consumer instance would then retry in the same instant and hit the recovering "
            "gateway together.",
            expected="waits spread across [1 − jitter, 1 + jitter] × nominal",
            actual=f"wait / nominal ranged only {min(factors):.3f}–{max(factors):.3f}",
            evidence=table(rows, ("account", "retry", "nominal s", "allowed s", "waited s", "")),
            lesson=READ["retry"])


def test_exhausted_transient_failures_are_dead_lettered(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    stuck = [with_label(healthy("poison-t1", 300), "transient-exhausted"),
             with_label(healthy("poison-t2", 400), "transient-exhausted")]
    items = [healthy("acc-1"), stuck[0], healthy("acc-2"), stuck[1], healthy("acc-3")]
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock, {
        stuck[0].event_id: ["timeout"] * 20, stuck[1].event_id: ["unavailable"] * 20})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"], why=(
        "Two events time out (or get a 503) on every attempt while ping() says the gateway is "
        "up: the failure belongs to these messages, so after max_attempts they go to the DLT. "
        "(Holding them as if the gateway were down would block the partition for ever.)"))

    dlt = lab.read(topics.dead_letter, topics.partitions, expect=2)
    found = match_dlt(inputs, dlt)
    calls = {s.account: len(downstream.authorizations(s.event_id)) for s in stuck}
    missing = [i for n, i in enumerate(inputs) if i.label != "healthy" and n not in found]
    if missing or not all(n == settings.retry.max_attempts for n in calls.values()):
        raise CheckFailure(
            "An event that keeps failing transiently gets max_attempts attempts in all, then goes "
            "to the DLT so the partition can move on.",
            expected=f"{settings.retry.max_attempts} authorize() calls each, then a DLT record",
            actual=f"authorize() calls: {calls}; missing from the DLT: "
                   f"{', '.join(i.describe() for i in missing) or 'none'}",
            evidence="DLT:\n" + dlt_table(dlt, inputs) + "\n"
                     + timeline(run, downstream, inputs, 20),
            lesson=READ["retry"])


def test_retry_window_stays_inside_max_poll_interval(lab, ledger_db, clock):
    topics = lab.topics()
    # 10 attempts capped at 8 s would take 1 + 2 + 4 + 8 × 6 = 55 s of backoff; the broker
    # evicts a consumer that does not poll for max.poll.interval.ms (60 s here).
    settings = lab.settings(topics, attempts=10, initial=1.0, multiplier=2.0, cap=8.0,
                            jitter=0.0, max_poll_interval_ms=60_000)
    stuck = with_label(healthy("poison-t1", 300), "transient-exhausted")
    inputs = lab.produce(topics.source, [stuck, healthy("acc-1")])
    downstream = ScriptedDownstream(lab.payments, clock, {stuck.event_id: ["unavailable"] * 20})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"])

    times = [c.at for c in downstream.authorizations(stuck.event_id)]
    window = times[-1] - times[0] if times else 0.0
    budget = settings.max_poll_interval_ms / 1000 / 2
    writes = dlt_writes_of(run, topics.dead_letter, inputs[0])
    spent = (writes[0].at - times[0]) if writes and times else window
    if not (len(times) >= 2 and spent <= budget + 0.5 and writes):
        raise CheckFailure(
            "While a record is retried in place the consumer does not poll, so the whole retry "
            "window must stay well inside max.poll.interval.ms, or the broker evicts the "
            "consumer and rebalances. The lab's rule: stop retrying (dead-letter) when the next "
            "backoff would take the record past half of max_poll_interval_ms.",
            expected=f"at least one retry, and the DLT write within {budget:.0f} s of the first "
                     "attempt (half of 60 s)",
            actual=f"{len(times)} attempts over {window:.1f} s; "
                   + (f"dead-lettered after {spent:.1f} s" if writes else "never dead-lettered"),
            evidence="attempts at t+: " + ", ".join(f"{t - times[0]:.1f}s" for t in times),
            lesson=READ["retry"])
