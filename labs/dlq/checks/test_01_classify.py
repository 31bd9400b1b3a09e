"""Stage classify: permanent failures go to the DLT at once; transient ones are retried in
place with bounded exponential backoff and jitter, inside the poll interval, then
dead-lettered."""

from __future__ import annotations

import math
import tempfile
from dataclasses import asdict
from pathlib import Path

import pytest
from _support import (
    READ,
    BackoffWait,
    SteppedWallClock,
    applied_ids,
    backoff_table,
    dlt_table,
    dlt_writes_of,
    first_delivery,
    match_dlt,
    nominal_backoffs,
    require_done,
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

from dojo.checks import CheckFailure, NotWritten, table
from dojo.checks.faults import run_in_subprocess
from dojo.checks.observers import read_jsonl

pytestmark = pytest.mark.stage("classify")
SEE = READ["classify"]
# edge records: a wrong rule goes unseen only while the draws stay below the nominal wait;
# each edge record shows it with a chance of about 0.45 (a little less when the real time the
# attempt itself took eats the 0.03 s margin), so 20 miss it well under once in 10,000
EDGE_ROUNDS = 20


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
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
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
    # 5 attempts: retries wait 4.3, 9.89, then the cap 15.7 twice (each ± 25 %). Long waits
    # cost no real time and keep the check's own timing noise far below the jitter.
    settings = lab.settings(topics, attempts=5, initial=4.3, multiplier=2.3, cap=15.7,
                            jitter=0.25)
    flaky = [healthy(f"acc-{n}", 137 * n + 11, label="transient") for n in range(1, 6)]
    items = [flaky[0], healthy("acc-9"), flaky[1], flaky[2], healthy("acc-8"), flaky[3],
             flaky[4]]
    inputs = lab.produce(topics.source, items)
    script = ["timeout", "unavailable", "timeout", "unavailable"]  # the fifth attempt works
    downstream = ScriptedDownstream(lab.payments, clock, {f.event_id: script for f in flaky})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"])

    applied = applied_ids(ledger_db)
    calls = {f.event_id: len(downstream.authorizations(f.event_id)) for f in flaky}
    unbooked = [f for f in flaky if len(applied.get(f.event_id or "", [])) != 1]
    if unbooked or not all(n == 5 for n in calls.values()):
        raise CheckFailure(
            "Each of these events failed transiently four times (timeout, 503, timeout, 503) "
            "and would succeed on the fifth attempt. max_attempts is 5: retry in place until "
            "then.",
            expected="5 authorize() calls each, then booked once, nothing dead-lettered",
            actual=f"authorize() calls per event: {sorted(calls.values())}; "
                   f"{len(unbooked)} of {len(flaky)} not booked exactly once",
            evidence=timeline(run, downstream, inputs, limit=20), lesson=READ["retry"])

    waits = backoff_table(settings, downstream, flaky)
    bad = [w for w in waits if not w.inside]
    evidence = table([w.row() for w in waits], BackoffWait.COLUMNS, limit=20)
    if bad:
        raise CheckFailure(
            "Retry n waits min(max_backoff, initial × multiplier^(n−1)) × a jitter factor in "
            "[1 − jitter, 1 + jitter]: 4.30, 9.89, 15.70, 15.70 s here, each ± 25 %. Waits are "
            "measured between authorize() calls on the clock you are given (clock.sleep, not "
            "time.sleep).",
            expected="every wait inside its range",
            actual=f"{len(bad)} of {len(waits)} waits outside; first: retry {bad[0].retry} "
                   f"of {bad[0].account} waited {bad[0].waited:.2f} s",
            evidence=evidence, lesson=READ["retry"])
    factors = [w.factor for w in waits]
    if max(factors) - min(factors) < 0.03:
        raise CheckFailure(
            "Every retry waited exactly the nominal backoff: no jitter. After an outage, every "
            "consumer instance would then retry in the same instant and hit the recovering "
            "gateway together.",
            expected="waits spread across [1 − jitter, 1 + jitter] × nominal",
            actual=f"wait / nominal ranged only {min(factors):.3f}–{max(factors):.3f}",
            evidence=evidence, lesson=READ["retry"])
    spreads = {f.account: _spread([w.factor for w in waits if w.account == f.account])
               for f in flaky}
    if all(spread < 0.05 for spread in spreads.values()):
        raise CheckFailure(
            "Within each record, every retry waited the same multiple of its nominal backoff: "
            "one jitter factor was drawn per record and reused. The README's rule draws a new "
            "factor for every retry; with one per record, two consumers that drew close "
            "factors stay in step for the whole retry window.",
            expected="each retry's wait / nominal drawn anew (they differ within a record)",
            actual="wait / nominal per record: " + "; ".join(
                f"{account} {min(w.factor for w in waits if w.account == account):.3f}–"
                f"{max(w.factor for w in waits if w.account == account):.3f}"
                for account in spreads),
            evidence=evidence, lesson=READ["retry"],
            fix="draw random.uniform(1 - jitter, 1 + jitter) inside the retry loop, once per "
                "wait")
    capped = [w for w in waits if w.capped]
    if capped and _spread([w.waited for w in capped]) < 0.2:
        raise CheckFailure(
            "Every wait at the cap was exactly max_backoff (15.70 s): the cap was applied "
            "after the jitter, min(max_backoff, nominal × factor), so the jitter vanishes "
            "once the exponential passes the cap, and every instance waits the same from then "
            "on. The README's order: cap the nominal wait, then jitter it, "
            "min(max_backoff, nominal) × factor.",
            expected=f"waits at the cap spread over {15.7 * 0.75:.2f}–{15.7 * 1.25:.2f} s",
            actual=f"{len(capped)} waits at the cap, "
                   f"{min(w.waited for w in capped):.3f}–{max(w.waited for w in capped):.3f} s",
            evidence=evidence, lesson=READ["retry"])

    # A second life of the consumer (a restart, another instance of the group) retries one
    # more such payment: its jitter draws must be its own, not the first life's again.
    again = healthy("acc-71", 4_711, label="transient")
    more = lab.produce(topics.source, [again])
    downstream = ScriptedDownstream(lab.payments, clock, {again.event_id: script})
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, more, downstream, read=READ["retry"])
    later = [w.factor for w in backoff_table(settings, downstream, [again])]
    for f in flaky:
        earlier = [w.factor for w in waits if w.account == f.account]
        if len(earlier) == len(later) == 4 and \
                all(abs(a - b) < 0.01 for a, b in zip(earlier, later, strict=True)):
            raise CheckFailure(
                "A second life of the consumer (the same group, run again) waited the very "
                "factors the first life drew for one of its payments: its random generator "
                "starts from a value every life shares (the group id, a constant). Every "
                "restart and every instance of the group then retries in step, which is what "
                "jitter is there to prevent. Draw from a generator the system initialises "
                "(random.uniform, or random.Random() created without an argument).",
                expected="the second life's wait / nominal factors differ from the first's",
                actual="wait / nominal, first life: " + ", ".join(f"{x:.3f}" for x in earlier)
                       + "; second life: " + ", ".join(f"{x:.3f}" for x in later),
                lesson=READ["retry"])


CHECKS_DIR = Path(__file__).resolve().parent


def _life_gaps(lab, spec, item, number, result, script):
    """The waits (clock s, and the real seconds in them) between one life's authorize()
    calls for `item`, or a failure when the life did not retry it."""
    outcome = (result.value or [{}])[number] if result.value and \
        len(result.value) > number else {}
    if outcome.get("stub"):
        raise NotWritten(*outcome["stub"])
    calls = [(e["at"], e["skipped"]) for e in read_jsonl(spec["log"])
             if e.get("ev") == "authorize" and e.get("event") == item.event_id]
    # a wait between two calls: clock seconds, and the real seconds in them (what
    # clock.sleep did not skip: the process's own time, longer on a loaded machine)
    gaps = [(b[0] - a[0], (b[0] - a[0]) - (b[1] - a[1]))
            for a, b in zip(calls, calls[1:], strict=False)]
    if len(gaps) != len(script):
        raise CheckFailure(
            f"In a process of its own ({spec['name']}), the consumer did not retry a "
            "payment that failed four times and would succeed on the fifth attempt.",
            expected="5 authorize() calls, four waits between them",
            actual=f"{len(calls)} authorize() calls",
            evidence=((outcome.get("error") or result.error or result.stderr or "")
                      .strip()[-1500:] or "the life ended without an error"),
            lesson=READ["retry"])
    return gaps


def _same_draws(one, other):
    """The same factors at every retry, up to what real time added to either wait."""
    return all(abs(a[0] - b[0]) <= a[1] + b[1] + 0.002
               for a, b in zip(one, other, strict=True))


def test_each_process_draws_its_own_jitter(lab, ledger_database):
    """Lives of the consumer retry one payment each: one in a Python process of its own, then
    two workers forked from another process that had imported the learner's modules afresh
    (a restart or an instance on another machine; a pre-fork server, a multiprocessing
    pool). Their jitter factors must differ. A generator created at import
    with a fixed seed gives every process the same sequence; one created at import without
    a seed is copied, state and all, into every forked worker (random's own module-level
    functions are reseeded in a forked child; a random.Random() of yours is not)."""
    topics = lab.topics()
    settings = lab.settings(topics, attempts=5, initial=4.3, multiplier=2.3, cap=15.7,
                            jitter=0.25)
    script = ["timeout", "unavailable", "timeout", "unavailable"]  # the fifth attempt works
    lives = []

    def spec_for(tmp, name, item, group):
        return {"db_url": ledger_database.url,
                "consumer_base": lab.kafka.consumer_config(group),
                "producer_base": lab.kafka.producer_config(),
                "partitions": topics.partitions,
                "settings": {**asdict(settings), "group_id": group},
                "scripts": {item.event_id: script}, "ends": dict(lab.ends[topics.source]),
                "kill": {"mode": "none"}, "log": str(Path(tmp) / f"{name}.jsonl"),
                "timeout": 20.0, "life_seconds": 40.0, "name": name}

    with tempfile.TemporaryDirectory(prefix="dojo-dlq-jitter-") as tmp:
        item = healthy("acc-81", 4_701, label="transient")
        lab.produce(topics.source, [item])
        spec = spec_for(tmp, "life 1", item, settings.group_id)
        # a fresh interpreter: nothing of this process reaches the next one
        result = run_in_subprocess(f"{CHECKS_DIR / '_crash.py'}:consumer_lives", [spec],
                                   path=[lab.learner.dir, CHECKS_DIR], timeout=90)
        lives.append(_life_gaps(lab, spec, item, 0, result, script))
        # Another interpreter, which imports consumer.py afresh and forks two workers from
        # itself after the import: each a group of its own over the whole topic, each
        # retrying the same new payment (the earlier one goes through at once: booked).
        item = healthy("acc-83", 4_703, label="transient")
        lab.produce(topics.source, [item])
        forked = [spec_for(tmp, f"forked worker {n}", item, lab.kafka.group_id(f"worker{n}"))
                  for n in (1, 2)]
        result = run_in_subprocess(f"{CHECKS_DIR / '_crash.py'}:consumer_lives", forked,
                                   path=[lab.learner.dir, CHECKS_DIR], timeout=120)
        workers = [_life_gaps(lab, spec, item, n, result, script)
                   for n, spec in enumerate(forked)]
    lives.append(workers[0])  # a second process, which imported the modules afresh
    nominal = nominal_backoffs(settings, len(script))

    def factors(life):
        return ", ".join(f"{gap / n:.3f}" for (gap, _), n in zip(life, nominal, strict=True))

    told = ("\neach life retried one payment (timeout, 503, timeout, 503, then ok); nominal "
            "waits " + ", ".join(f"{n:.2f}" for n in nominal) + " s")
    if _same_draws(lives[0], lives[1]):
        raise CheckFailure(
            "Two processes running your consumer, one after the other, each importing "
            "consumer.py afresh, waited the same jitter factors retry by retry: the "
            "generator starts from the same value in every process. Every restart and every "
            "instance of the group then retries in step, which is what jitter is there to "
            "prevent.",
            expected="the second process's wait / nominal factors differ from the first's",
            actual=f"the same factor at each of the {len(nominal)} retries in both processes",
            evidence="wait / nominal, first process: " + factors(lives[0])
                     + "\nwait / nominal, second process: " + factors(lives[1])
                     + "\neach process imported consumer.py afresh." + told,
            fix="create the generator without a seed (random.Random(), or use random.uniform "
                "directly): a seed written in the code, or one every process derives alike "
                "(the group id), is the same in every process",
            lesson=READ["retry"])
    if _same_draws(workers[0], workers[1]):
        raise CheckFailure(
            "Two workers forked from one process after it had imported consumer.py (as a "
            "pre-fork server or a multiprocessing pool starts them) waited the same jitter "
            "factors retry by retry: they drew from one generator, copied into each worker "
            "with its state by fork(). The README asks for a generator no other consumer "
            "life shares: every worker of the group then retries in step, which is what "
            "jitter is there to prevent.",
            expected="the second worker's wait / nominal factors differ from the first's",
            actual=f"the same factor at each of the {len(nominal)} retries in both workers",
            evidence="wait / nominal, first worker: " + factors(workers[0])
                     + "\nwait / nominal, second worker: " + factors(workers[1]) + told,
            fix="create the generator for each consumer life, inside run() "
                "(random.Random() there), or draw with random.uniform, which Python reseeds "
                "in every forked child; a random.Random() made at import is shared by every "
                "worker forked after the import",
            lesson=READ["retry"])


def _spread(values):
    return max(values) - min(values) if values else 0.0


def test_unexpected_errors_from_the_gateway_are_retried(lab, ledger_db, clock):
    topics = lab.topics()
    settings = lab.settings(topics)
    buggy = [healthy(f"acc-{n}", 211 * n + 3, label="transient") for n in range(1, 6)]
    # a KeyError, a TypeError, and ValueErrors of a garbled response (JSON, UTF-8, a number)
    scripts = {buggy[0].event_id: ["bug", "timeout"], buggy[1].event_id: ["bug2"],
               buggy[2].event_id: ["bug", "bug2", "unavailable"],
               buggy[3].event_id: ["garbled", "bad-utf8"], buggy[4].event_id: ["bad-value"]}
    items = [buggy[0], healthy("acc-7"), buggy[1], buggy[2], buggy[3], healthy("acc-8"),
             buggy[4]]
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock, scripts)
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"])
    applied = applied_ids(ledger_db)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    rows, wrong = [], []
    for b in buggy:
        n = next(k for k, i in enumerate(inputs) if i.item is b)
        script = scripts[b.event_id]
        calls = len(downstream.authorizations(b.event_id))
        booked = len(applied.get(b.event_id or "", []))
        rows.append((inputs[n].describe(), " → ".join(script + ["ok"]), calls,
                     "yes" if n in found else "no", booked))
        if n in found or booked != 1 or calls != len(script) + 1:
            wrong.append(inputs[n])
    if wrong:
        dead = [r for r in dlt if r.text("kafka_dlt-exception-fqcn")]
        kinds = sorted({(r.text("kafka_dlt-exception-fqcn") or "").rsplit(".", 1)[-1]
                        for r in dead})
        raise CheckFailure(
            "authorize() raised an exception that is neither a TransientError nor a "
            "PermanentError (a KeyError, a TypeError: a bug in the gateway's client; a "
            "ValueError, a JSONDecodeError, a UnicodeDecodeError: a garbled response). It says "
            "nothing final about the payment, so it is treated as transient: retried in place "
            "with the backoff, and booked when an attempt works.",
            expected="each booked once after its failures, nothing dead-lettered",
            actual=f"{len(wrong)} of {len(buggy)} went wrong"
                   + (f"; dead-lettered as {', '.join(kinds)}" if kinds else ""),
            evidence=table(rows, ("input", "gateway answers", "authorize() calls",
                                  "in DLT", "ledger rows")) + "\nwhat happened:\n"
                     + timeline(run, downstream, inputs, limit=14),
            lesson=READ["classify"])


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

    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
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
    # 10 attempts capped at 8 s would take 1.3 + 2.6 + 5.2 + 8 × 6 s of backoff, and the
    # gateway takes 2.7 s to time out each attempt; the broker evicts a consumer that does
    # not poll for max.poll.interval.ms (60 s here). No jitter: the schedule is exact.
    latency = 2.7
    settings = lab.settings(topics, attempts=10, initial=1.3, multiplier=2.0, cap=8.0,
                            jitter=0.0, max_poll_interval_ms=60_000)
    stuck = with_label(healthy("poison-t1", 300), "transient-exhausted")
    inputs = lab.produce(topics.source, [stuck, healthy("acc-1")])
    downstream = ScriptedDownstream(lab.payments, clock, {stuck.event_id: ["timeout"] * 20},
                                    latency=latency)
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["retry"])

    times = [c.at for c in downstream.authorizations(stuck.event_id)]
    budget = settings.max_poll_interval_ms / 1000 / 2
    writes = dlt_writes_of(run, topics.dead_letter, inputs[0])
    starts = [t - times[0] for t in times]
    spent = (writes[0].at - times[0]) if writes and times else None
    schedule = table([(n, f"t+{t:.1f}s", f"t+{t + latency:.1f}s",
                       "PAST THE HALF" if t > budget + 0.3 else "")
                      for n, t in enumerate(starts, start=1)],
                     ("attempt", "started", "gateway answered", ""), limit=12)
    late = [(n, t) for n, t in enumerate(starts, start=1) if t > budget + 0.3]
    slept = sum(s for at, s in clock.sleeps if times and times[0] <= at <= times[-1])
    following = nominal_backoffs(settings, len(times))[-1] if times else 0.0
    if late:
        n, t = late[0]
        # It stopped exactly where a window made of the waits alone would end.
        only_waits = len(times) < settings.retry.max_attempts and \
            slept <= budget + 0.3 < slept + following
        counted = (f"; its waits add up to {slept:.1f} s, under {budget:.0f} s, and it "
                   "stopped when the next wait would have crossed: the window counted the "
                   "waits and left out the attempts' own time" if only_waits else "")
        raise CheckFailure(
            "While a record is retried in place the consumer does not poll, so the whole retry "
            "window must stay well inside max.poll.interval.ms, or the broker evicts the "
            "consumer and rebalances. The lab's rule, on the clock from the start of the first "
            "attempt (the attempts' own time counts, here 2.7 s each): retry only when the "
            "next wait ends within half of max_poll_interval_ms.",
            expected=f"every attempt starts within {budget:.0f} s of the first (half of 60 s)",
            actual=f"attempt {n} started {t:.1f} s after the first" + counted,
            evidence=schedule, lesson=READ["retry"])
    if not (len(times) >= 2 and spent is not None and spent <= budget + latency + 0.5):
        raise CheckFailure(
            "After the last attempt that fits in the window fails, the record goes to the DLT "
            "at once, so the partition moves on (the gateway answers ping(): the failure "
            "belongs to this message).",
            expected=f"at least one retry, and the DLT write within {budget + latency:.1f} s "
                     "of the first attempt (half of 60 s, plus the last attempt's 2.7 s)",
            actual=f"{len(times)} attempts; "
                   + (f"dead-lettered after {spent:.1f} s" if spent is not None
                      else "never dead-lettered"),
            evidence=schedule, lesson=READ["retry"])
    ended = starts[-1] + latency
    if len(times) < settings.retry.max_attempts and ended + following <= budget - 0.5:
        raise CheckFailure(
            "The record was dead-lettered while another retry still fitted in the window: "
            "give up only when the next wait would take the record past half of "
            "max_poll_interval_ms.",
            expected=f"retries until the next wait would end past {budget:.0f} s",
            actual=f"gave up {ended:.1f} s after the first attempt began; retry "
                   f"{len(times)} would have waited {following:.1f} s and started at "
                   f"{ended + following:.1f} s",
            evidence=schedule, lesson=READ["retry"])


def test_retry_budget_counts_the_wait_it_sleeps(lab, ledger_db):
    """Each record's first attempt takes L s, then fails; retry 1 would wait 6.1 s ± 5 %.
    Half of 45,980 ms is 22.99 s. Records whose retry ends inside the half whatever the
    draw must be retried; records whose retry cannot fit must not be; on the edge, a retry
    is fine only when the wait actually slept still ends inside the half. Judged on the
    clock's own numbers (L, and the sleep), so no real-time noise enters."""
    clock = SteppedWallClock()
    topics = lab.topics()
    settings = lab.settings(topics, attempts=10, initial=6.1, multiplier=1.5, cap=9.0,
                            jitter=0.05, max_poll_interval_ms=45_980)
    budget = settings.max_poll_interval_ms / 1000 / 2  # 22.99 s
    nominal = settings.retry.initial_backoff_seconds
    low, high = nominal * (1 - settings.retry.jitter), nominal * (1 + settings.retry.jitter)
    # fits: its retry ends by 22.705 s whatever the draw (0.285 s to spare for the real time
    # the attempt itself took), and past 22 s whatever the draw
    fits, edge, over = 16.3, budget - nominal - 0.03, budget - low + 0.06
    plan: list[tuple[str, float, float]] = []  # (label, latency, wall-clock step)
    plan += [("fits", fits, 0.0)] * 2 + [("fits, wall clock +1 h", fits, 3600.0)]
    plan += [("cannot fit, wall clock −1 h", over, -3600.0)]
    plan += [("edge", edge, 0.0)] * EDGE_ROUNDS
    items = [healthy(f"acc-b{n}", 4817 + 37 * n, label="transient") for n in range(len(plan))]
    how = {i.event_id: p for i, p in zip(items, plan, strict=True)}

    def latency_of(event_id, n):
        return how[event_id][1] if n == 0 and event_id in how else 0.0

    def on_call(call):
        step = how.get(call.event_id, ("", 0.0, 0.0))[2]
        if step and call.what == "authorize" and len(downstream.authorizations(
                call.event_id)) == 1:
            clock.step_wall(step)

    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock,
                                    {i.event_id: ["timeout"] for i in items},
                                    latency_of=latency_of, on_call=on_call)
    run = lab.run(ledger_db, topics, settings, downstream, clock, timeout=20)
    require_done(run, inputs, downstream, read=READ["retry"])

    rows: list[tuple[str, ...]] = []
    late: list[tuple[str, float, float]] = []
    early: list[tuple[str, float]] = []
    for item, inp in zip(items, inputs, strict=True):
        label, took, step = how[item.event_id]
        calls = downstream.authorizations(item.event_id)
        slept: float | None = (
            float(sum(s for at, s in clock.sleeps if calls[0].at <= at <= calls[1].at))
            if len(calls) >= 2 else None)
        ends = took + slept if slept is not None else None
        verdict = ""
        if ends is not None and slept is not None and ends > budget + 1e-6:
            verdict = "RETRIED PAST THE HALF"
            late.append((label, took, slept))
        elif ends is None and took + high <= budget:
            verdict = "GAVE UP THOUGH IT FITTED"
            early.append((label, took))
        rows.append((inp.describe(), label, f"{took:.2f} s",
                     "-" if slept is None else f"{slept:.3f} s",
                     "dead-lettered" if ends is None else f"t+{ends:.3f} s", verdict))
    evidence = table(rows, ("input", "case", "attempt 1 took", "then slept",
                            "attempt 2 began", ""), limit=24)
    if late:
        stepped = [x for x in late if x[0].startswith("cannot")]
        nominal_fit = [x for x in late if not x[0].startswith("cannot")
                       and x[1] + nominal <= budget < x[1] + x[2]]
        label, took, slept = late[0]
        fix = None
        if stepped and len(stepped) == len(late):
            fix = ("measure the retry window on clock.monotonic(): clock.now() is wall time, "
                   "which an NTP step moves back or forward")
        elif nominal_fit and len(nominal_fit) == len(late):
            fix = ("decide with the jittered wait you are about to sleep, not the nominal "
                   "min(max_backoff, initial × multiplier^(n−1))")
        raise CheckFailure(
            "A retry began past half of max_poll_interval_ms. The rule: retry only when the "
            "next wait, the one actually slept (jitter included), ends within half of "
            "max_poll_interval_ms, on clock.monotonic() from the start of the first attempt."
            + (" The wall clock (clock.now()) stepped back an hour during the first attempt "
               "of one record, as an NTP correction does; monotonic time did not."
               if stepped else ""),
            expected=f"attempt 1's {took:.2f} s plus the wait slept ≤ {budget:.2f} s "
                     f"(half of {settings.max_poll_interval_ms:,} ms)",
            actual=f"{len(late)} record(s) retried past it; first: {label}, attempt 1 took "
                   f"{took:.2f} s, then slept {slept:.3f} s (nominal {nominal:.2f} s): "
                   f"attempt 2 began at {took + slept:.3f} s",
            evidence=evidence, lesson=READ["retry"], fix=fix)
    if early:
        plain = [x for x in early if "wall" not in x[0]]
        label, took = (plain or early)[0]
        whole = bool(plain) and all(math.floor(budget) < t + low for _, t in plain)
        raise CheckFailure(
            "A record was dead-lettered after its first attempt although its retry fitted: "
            f"attempt 1 took {took:.2f} s, and retry 1's wait ({nominal:.2f} s ± "
            f"{settings.retry.jitter:.0%}, at most {high:.3f} s) ends by {took + high:.3f} s "
            f"whatever the draw, inside half of {settings.max_poll_interval_ms:,} ms "
            f"({budget:.2f} s)."
            + (" One record's wall clock (clock.now()) jumped an hour forward during its "
               "first attempt, as a VM resume does; monotonic time did not."
               if not plain else ""),
            expected="retried once, then booked",
            actual=f"{len(early)} record(s) dead-lettered after one attempt; first: {label}",
            evidence=evidence, lesson=READ["retry"],
            fix=("half of the poll interval keeps its fraction: max_poll_interval_ms / 2000 "
                 "seconds, not // 2000" if whole
                 else "measure the retry window on clock.monotonic(), not clock.now()"
                 if not plain else None))
