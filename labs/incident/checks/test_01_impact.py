"""Stage impact: which endpoint, since when, how bad against the baseline, for how many."""

from __future__ import annotations

import math
import random
from datetime import datetime
from typing import Any

import pytest
from _history import (
    BASELINE_MINUTES,
    ENDPOINTS,
    MIN_REQUESTS,
    Recorded,
    Scenario,
    p95,
    quiet_baseline_minute,
)
from _support import (
    IMPACT,
    LOCAL_TZ,
    PROVE,
    baseline_durations,
    expected_impact,
    field_of,
    first_error_minute,
    hm,
    iso_minute,
    local_hm,
    local_minute_fix,
    machine_time_zone,
    observability,
    run_kind,
)

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("impact")

RATE_TOLERANCE = 0.005
P95_TOLERANCE = 0.15


def _summary(scenario: Scenario, rows: list[dict[str, Any]], endpoint: str) -> str:
    """The endpoint's minutes from the metrics, as the learner could have read them."""
    shown = [(r["minute"][11:16], r["requests"], r["errors"],
              sorted(r["durations_ms"])[-3:]) for r in rows if r["endpoint"] == endpoint]
    return (scenario.describe() + "\n"
            + table(shown, ("minute", "requests", "errors", "slowest 3 ms"), limit=40))


def _impact(learner: Any, sources: Any) -> Any:
    return call(learner.module("triage").impact, sources)


def _diff(found: Any, want: Any) -> list[tuple[str, str, str]]:
    wrong = []
    for name in ("endpoint", "requests", "failed", "users"):
        if field_of(found, name) != getattr(want, name):
            wrong.append((name, repr(getattr(want, name)), repr(field_of(found, name))))
    if hm(field_of(found, "since")) != hm(want.since):
        wrong.append(("since", hm(want.since), hm(field_of(found, "since"))))
    for name in ("error_rate", "baseline_error_rate"):
        got = field_of(found, name)
        if not isinstance(got, int | float) or abs(got - getattr(want, name)) > RATE_TOLERANCE:
            wrong.append((name, f"{getattr(want, name):.4f}", repr(got)))
    for name in ("p95_ms", "baseline_p95_ms"):
        got, target = field_of(found, name), getattr(want, name)
        if not isinstance(got, int | float) or abs(got - target) > P95_TOLERANCE * target:
            wrong.append((name, f"{target}", repr(got)))
    return wrong


def test_impact_of_this_runs_incident(learner, window, seed):
    scenario, recorded, sources = window(run_kind(seed))
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    if found is None:
        raise CheckFailure(
            f"impact() saw no incident, but {want.endpoint} has been failing since "
            f"{hm(want.since)}.",
            expected=f"an Impact for {want.endpoint} since {hm(want.since)}",
            actual="None",
            evidence=_summary(scenario, recorded.minutes, want.endpoint),
            lesson=IMPACT,
        )
    wrong = _diff(found, want)
    if wrong:
        raise CheckFailure(
            "impact() described the incident wrongly: "
            + ", ".join(name for name, _, _ in wrong) + ".",
            expected="; ".join(f"{name} {w}" for name, w, _ in wrong),
            actual="; ".join(f"{name} {g}" for name, _, g in wrong),
            evidence=_summary(scenario, recorded.minutes, want.endpoint),
            lesson=IMPACT,
        )


def test_the_onset_is_the_first_minute_of_the_bad_run(learner, window):
    scenario, recorded, sources = window("refund-deploy")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    got = hm(field_of(found, "since")) if found is not None else "None"
    if got == hm(want.since):
        return
    fix = None
    if got.replace(" ", "T") == first_error_minute(recorded, want.endpoint):
        fix = ("That is the minute of the endpoint's first ERROR log line, a background "
               "failure long before the incident; take the first minute of the run of bad "
               "minutes that lasts to now.")
    elif scenario.blip is not None and got == hm(scenario.minute(scenario.blip)):
        fix = ("That minute was a burst that recovered by itself; the incident is the run of "
               "bad minutes that lasts to the end of the window.")
    raise CheckFailure(
        "impact().since is not the first bad minute of the incident.",
        expected=f"since {hm(want.since)} (the first of the bad minutes that last to now)",
        actual=f"since {got}",
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def test_a_quiet_minute_ends_the_run(learner, window):
    # provider-timeout: a bad minute, then a minute with a handful of requests (most of them
    # failing), then the incident to the end of the window
    scenario, recorded, sources = window("provider-timeout")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    got = hm(field_of(found, "since")) if found is not None else "None"
    if got == hm(want.since):
        return
    assert scenario.onset is not None
    rows = [r for r in recorded.minutes if r["endpoint"] == want.endpoint]
    quiet = rows[scenario.onset - 1]
    fix = None
    if got == hm(scenario.minute(scenario.onset - 2)):
        fix = (f"The minute before the onset had {quiet['requests']} requests "
               f"({quiet['errors']} failed): under 10 requests a minute is not bad, whatever "
               "its error rate, so it ends the run of bad minutes. It is neither skipped as "
               "unknown nor judged by its rate alone; the incident begins after it.")
    raise CheckFailure(
        "impact().since is not the first bad minute after a quiet minute.",
        expected=f"since {hm(want.since)} (the minute at {hm(scenario.minute(scenario.onset - 1))}"
                 f" had {quiet['requests']} requests: not bad, so the run starts after it)",
        actual=f"since {got}",
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def test_latency_is_the_95th_percentile(learner, window):
    scenario, recorded, sources = window("provider-timeout")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    if found is None:
        raise CheckFailure(
            "impact() saw no incident in a window where a slow dependency fails requests.",
            expected=f"an Impact for {want.endpoint}", actual="None",
            evidence=_summary(scenario, recorded.minutes, want.endpoint), lesson=IMPACT)
    wrong = [w for w in _diff(found, want) if w[0] in ("p95_ms", "baseline_p95_ms")]
    if not wrong:
        return
    got = field_of(found, "p95_ms")
    mean = isinstance(got, int | float) and abs(got - want.mean_ms) <= 0.02 * want.mean_ms
    fix = ("That is the mean of the durations: the slowest 5 % that users feel disappear "
           "in an average. Sort the durations and take the ceil(0.95 n)-th.") if mean else None
    base = sorted(baseline_durations(scenario, recorded))
    rank = math.ceil(0.95 * len(base))
    got_base = field_of(found, "baseline_p95_ms")
    nearest = (f"of the {len(base)} sorted baseline durations the p95 is the ceil(0.95 x "
               f"{len(base)}) = {rank}-th (1-based), sorted(d)[{rank - 1}]")
    if fix is None and rank < len(base) and got_base == base[rank] != base[rank - 1]:
        fix = f"That is the next rank: {nearest}, not sorted(d)[{rank}]."
    elif fix is None and rank >= 2 and got_base == base[rank - 2] != base[rank - 1]:
        fix = f"That is the rank before: {nearest}, not sorted(d)[{rank - 2}]."
    elif (fix is None and rank >= 2 and rank < len(base) and isinstance(got_base, int | float)
          and base[rank - 2] < got_base < base[rank] and got_base != base[rank - 1]):
        fix = (f"That lies between two ranks: an interpolated percentile (statistics.quantiles, "
               f"numpy.percentile). The README's p95 is a rank: {nearest}.")
    raise CheckFailure(
        "impact() reported a latency that is not the 95th percentile.",
        expected="; ".join(f"{name} {w} (nearest rank, within 15 %)" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def test_a_healthy_window_raises_no_alarm(learner, window):
    scenario, recorded, sources = window(None)
    found = _impact(learner, sources)
    if found is None:
        return
    endpoint = field_of(found, "endpoint")
    last = [r for r in recorded.minutes if r["endpoint"] == endpoint][-1:]
    fix = None
    since = field_of(found, "since")
    run = [r for r in recorded.minutes if r["endpoint"] == endpoint and isinstance(since, datetime)
           and datetime.fromisoformat(r["minute"].replace("Z", "+00:00")) >= since]
    # the floor explains the alarm only when every minute it calls bad had a stray error under
    # 5 % (an alarm raised by latency has minutes without one)
    stray = bool(run) and all(0 < r["errors"] / max(r["requests"], 1) < 0.05 for r in run)
    if last and stray and last[0]["errors"] and last[0]["errors"] / last[0]["requests"] < 0.05:
        fix = (f"Its last minute had {last[0]['errors']} failure in {last[0]['requests']} "
               "requests: more than 3 x a tiny baseline, but under the 5 % floor. A minute "
               "is bad from max(0.05, 3 x baseline error rate) on; without the floor one "
               "stray error wakes someone up.")
    raise CheckFailure(
        "impact() raised an alarm on a healthy system.",
        expected="None (every endpoint is within its baseline at the end of the window)",
        actual=f"an Impact for {endpoint} since {hm(field_of(found, 'since'))}",
        evidence=_summary(scenario, recorded.minutes,
                          endpoint if endpoint in ENDPOINTS else "POST /orders"),
        lesson=IMPACT,
        fix=fix,
    )


def test_several_failing_endpoints_report_the_one_with_most_failures(learner, window):
    # GET /orders fails since a flag flipped; POST /orders, on a trickle of traffic, fails
    # at a higher rate and from earlier on, but fewer of its requests failed
    scenario, recorded, sources = window("pricing-flag")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    got = field_of(found, "endpoint") if found is not None else None
    if got == want.endpoint and not _diff(found, want):
        return
    fix = None
    if got == "POST /orders":
        fix = ("POST /orders is in an incident too, with a higher error rate and an earlier "
               "onset, but GET /orders lost more requests: report the endpoint with the most "
               "failed requests since its onset.")
    if got != want.endpoint:
        wrong = [("endpoint", repr(want.endpoint), repr(got))]
    else:
        wrong = _diff(found, want)
    raise CheckFailure(
        "impact() did not report the endpoint that failed the most requests.",
        expected="; ".join(f"{name} {w}" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=_summary(scenario, recorded.minutes, "POST /orders")
        + f"\n{want.endpoint} since {hm(want.since)}: {want.failed} of {want.requests} "
        "requests failed",
        lesson=IMPACT,
        fix=fix,
    )


def test_the_error_rate_counts_every_request_since_the_onset(learner, window):
    # stock-lock: requests pile up behind the lock, every other minute few get through
    scenario, recorded, sources = window("stock-lock")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    wrong = (_diff(found, want) if found is not None
             else [("endpoint", want.endpoint, "None")])
    if not wrong:
        return
    after = [r for r in recorded.minutes
             if r["endpoint"] == want.endpoint and r["minute"] >= iso_minute(want.since)]
    mean = sum(r["errors"] / r["requests"] for r in after) / len(after)
    got = field_of(found, "error_rate")
    fix = None
    if isinstance(got, int | float) and abs(got - mean) <= RATE_TOLERANCE:
        fix = (f"That is the mean of the minutes' error rates ({mean:.4f}); a minute with 12 "
               "requests weighs as much as one with 40. The rate since the onset is every "
               f"failure over every request: {want.failed} / {want.requests}.")
    raise CheckFailure(
        "impact() described an incident with uneven traffic wrongly: "
        + ", ".join(name for name, _, _ in wrong) + ".",
        expected="; ".join(f"{name} {w}" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def test_the_finding_carries_its_evidence(learner, window, seed):
    scenario, recorded, sources = window(run_kind(seed))
    want = expected_impact(scenario, recorded)
    with machine_time_zone(LOCAL_TZ):      # an onset written in local time is not UTC
        found = _impact(learner, sources)
    evidence = field_of(found, "evidence") if found is not None else None
    minute = want.since.strftime("%H:%M")
    if (isinstance(evidence, list) and evidence and all(isinstance(e, str) for e in evidence)
            and any(minute in e for e in evidence)):
        return
    raise CheckFailure(
        "impact() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the first bad minute as HH:MM "
                 "(UTC; the machine's time zone is UTC+05:45)",
        actual=f"evidence {evidence!r}"[:200],
        evidence=scenario.describe(),
        lesson=PROVE,
        fix=local_minute_fix(minute, local_hm(want.since), evidence),
    )


def test_a_minute_of_exactly_ten_requests_can_be_bad(learner, window):
    # stock-lock: the first bad minute has exactly 10 requests, a third or more of them failed
    scenario, recorded, sources = window("stock-lock")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    got = hm(field_of(found, "since")) if found is not None else "None"
    if got == hm(want.since):
        return
    assert scenario.onset is not None
    first = [r for r in recorded.minutes if r["endpoint"] == want.endpoint][scenario.onset]
    assert first["requests"] == MIN_REQUESTS
    fix = None
    if got == hm(scenario.minute(scenario.onset + 1)):
        fix = (f"The minute {hm(want.since)} had exactly {MIN_REQUESTS} requests "
               f"({first['errors']} failed). A minute is bad from 10 requests on (at least "
               "10, not more than 10): only one with fewer than 10 is never bad.")
    raise CheckFailure(
        "impact().since is not the first bad minute when that minute had exactly 10 "
        "requests.",
        expected=f"since {hm(want.since)} ({first['requests']} requests, {first['errors']} "
                 "failed: a bad minute)",
        actual=f"since {got}",
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def test_the_baseline_counts_its_quiet_minutes(learner, window):
    # stock-lock: one minute of the baseline had a handful of requests, half of them failed
    scenario, recorded, sources = window("stock-lock")
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    wrong = ([w for w in _diff(found, want) if w[0] in ("baseline_error_rate",
                                                         "baseline_p95_ms")]
             if found is not None else [("endpoint", want.endpoint, "None")])
    if not wrong:
        return
    quiet = quiet_baseline_minute(scenario)
    assert quiet is not None
    rows = [r for r in recorded.minutes if r["endpoint"] == want.endpoint][:10]
    loud = [r for i, r in enumerate(rows) if i != quiet]
    without = sum(r["errors"] for r in loud) / sum(r["requests"] for r in loud)
    got = field_of(found, "baseline_error_rate")
    fix = None
    if isinstance(got, int | float) and abs(got - without) <= RATE_TOLERANCE / 2:
        fix = (f"That is the baseline without the minute {rows[quiet]['minute'][11:16]} "
               f"({rows[quiet]['requests']} requests, {rows[quiet]['errors']} failed). The "
               "baseline is every row of the first 10 minutes, however few requests a row "
               "has: the 10-request rule decides which minutes are bad, not which count.")
    raise CheckFailure(
        "impact() measured the baseline wrongly when one of its minutes was quiet.",
        expected="; ".join(f"{name} {w}" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )


def _relabelled(recorded: Recorded, names: dict[str, str], reverse: bool) -> Recorded:
    """The metrics with the endpoints renamed as `names` says, each minute's rows listed in
    reverse order when `reverse`."""
    rows = [{**r, "endpoint": names.get(r["endpoint"], r["endpoint"])}
            for r in recorded.minutes]
    if reverse:
        by_minute: dict[str, list[dict[str, Any]]] = {}
        for row in rows:
            by_minute.setdefault(row["minute"], []).append(row)
        rows = [r for minute in by_minute.values() for r in reversed(minute)]
    return Recorded(rows, recorded.lines)


def test_the_evidence_names_the_reported_endpoints_onset(learner, window):
    # pricing-flag: GET /orders (the most failures) and POST /orders (from two minutes earlier)
    # are both in an incident. Asked twice: as recorded, then with the two endpoints' names
    # swapped and each minute's rows listed in reverse, so that in one of the asks the other
    # endpoint comes after the reported one in any order a loop may take them.
    scenario, recorded, _ = window("pricing-flag")
    want = expected_impact(scenario, recorded)
    assert scenario.onset is not None
    other = hm(scenario.minute(scenario.onset - 2))[11:]
    minute = want.since.strftime("%H:%M")
    swap = {"GET /orders": "POST /orders", "POST /orders": "GET /orders"}
    for names, reverse in (({}, False), (swap, True)):
        served = _relabelled(recorded, names, reverse)
        with observability(scenario, served, []) as sources:
            found = _impact(learner, sources)
        endpoint = names.get(want.endpoint, want.endpoint)
        evidence = field_of(found, "evidence") if found is not None else None
        if (field_of(found, "endpoint") == endpoint and isinstance(evidence, list)
                and any(isinstance(e, str) and minute in e for e in evidence)):
            continue
        named_other = isinstance(evidence, list) and any(
            isinstance(e, str) and other in e for e in evidence)
        fix = None
        if field_of(found, "endpoint") == endpoint and named_other:
            fix = (f"{other} is the onset of the other endpoint in an incident, "
                   f"{names.get('POST /orders', 'POST /orders')}. Write the evidence from the "
                   "reported endpoint's own onset row, not from a variable a loop over the "
                   "endpoints left behind.")
        raise CheckFailure(
            "impact()'s evidence does not name the onset of the endpoint it reports.",
            expected=f"endpoint {endpoint!r}, evidence naming its first bad minute {minute}",
            actual=f"endpoint {field_of(found, 'endpoint')!r}, evidence {evidence!r}"[:300]
            if found is not None else "None",
            evidence=_summary(scenario, served.minutes, endpoint)
            + f"\nthe other endpoint in an incident since {other}",
            lesson=PROVE,
            fix=fix,
        )


# -- the p95's rank and its pool: a window whose durations are drawn for it -------------------
WHOLE_RANK_PER_MINUTE = 20      # baseline requests per minute: 0.95 n is a whole number
SLOW_EVERY_THIRD = 3            # since the onset, every third minute is slow


def _latency_window(scenario: Scenario, recorded: Recorded) -> Recorded:
    """refund-deploy's window (its incident fails requests fast: errors, not latency) with the
    incident endpoint's durations drawn again. The baseline: 20 requests a minute, 200 in all,
    so 0.95 n = 190 is whole; the 190th smallest duration (the nearest rank) takes 131-149 ms,
    the 10 above it 1183-1247 ms, every one below it at most 79 ms: the 191st (a 0-based
    int(0.95 n), or round()) is 8 times the p95. Since the onset, one minute in three is slow
    (every duration 1012-1088 ms), the others fast (18-79 ms): the p95 of every duration since
    the onset is a slow one, the mean of the minutes' p95s less than half of it. The minutes
    before the onset keep their durations (at most 342 ms: under 3 x the baseline p95)."""
    assert scenario.onset is not None
    rng = random.Random(f"{scenario.seed}/whole-rank")
    base_total = BASELINE_MINUTES * WHOLE_RANK_PER_MINUTE
    rank = math.ceil(0.95 * base_total)
    pool = ([round(rng.uniform(18, 79), 1) for _ in range(rank - 1)]
            + [round(rng.uniform(131, 149), 1)]
            + [round(rng.uniform(1183, 1247), 1) for _ in range(base_total - rank)])
    rng.shuffle(pool)
    rows, index = [], 0
    for row in recorded.minutes:
        if row["endpoint"] != scenario.endpoint:
            rows.append(row)
            continue
        at = index
        index += 1
        if at < BASELINE_MINUTES:
            n = WHOLE_RANK_PER_MINUTE
            errors = min(row["errors"], n)
            rows.append({**row, "requests": n, "errors": errors,
                         "failed_users": row["failed_users"][:errors],
                         "durations_ms": pool[at * n:(at + 1) * n]})
        elif at >= scenario.onset:
            slow = (at - scenario.onset) % SLOW_EVERY_THIRD == 1
            low, high = (1012, 1088) if slow else (18, 79)
            rows.append({**row, "durations_ms": [round(rng.uniform(low, high), 1)
                                                 for _ in range(row["requests"])]})
        else:
            rows.append(row)
    return Recorded(rows, recorded.lines)


def _latency_impact(learner: Any, window: Any) -> tuple[Scenario, Recorded, Any, Any]:
    scenario, recorded, sources = window("refund-deploy")
    served = _latency_window(scenario, recorded)
    want = expected_impact(scenario, served)
    with observability(scenario, served, sources.log_paths) as reshaped:
        found = _impact(learner, reshaped)
    return scenario, served, want, found


def test_the_p95_when_0_95_n_is_a_whole_rank(learner, window):
    # the baseline has 200 durations: the nearest rank is the 190th, and the 191st is 8 x it
    scenario, served, want, found = _latency_impact(learner, window)
    got = field_of(found, "baseline_p95_ms") if found is not None else None
    target = want.baseline_p95_ms
    if isinstance(got, int | float) and abs(got - target) <= P95_TOLERANCE * target:
        return
    base = sorted(baseline_durations(scenario, served))
    rank = math.ceil(0.95 * len(base))
    fix = None
    if got == base[rank]:
        fix = (f"0.95 x {len(base)} = {rank} is a whole number: the nearest rank is the "
               f"{rank}th smallest, sorted(d)[{rank - 1}]. int(0.95 n) or round(0.95 n) as a "
               f"0-based index is the same as ceil(0.95 n) - 1 only when 0.95 n is not whole; "
               f"here it takes the {rank + 1}st. Use sorted(d)[ceil(0.95 n) - 1].")
    raise CheckFailure(
        "impact() reported a baseline p95 that is not the nearest rank.",
        expected=f"baseline_p95_ms {target} (of {len(base)} durations, the ceil(0.95 x "
                 f"{len(base)}) = {rank}th smallest; within 15 %)",
        actual="None" if found is None else f"baseline_p95_ms {got!r}",
        evidence=_summary(scenario, served.minutes, want.endpoint)
        + f"\nthe baseline's {len(base)} sorted durations, ranks {rank - 2} to {rank + 1}: "
        + ", ".join(str(d) for d in base[rank - 3:rank + 1]),
        lesson=IMPACT,
        fix=fix,
    )


def test_the_p95_since_the_onset_is_of_every_duration(learner, window):
    # one minute in three of the incident is slow: the p95 of all its durations is a slow one
    scenario, served, want, found = _latency_impact(learner, window)
    got = field_of(found, "p95_ms") if found is not None else None
    target = want.p95_ms
    if isinstance(got, int | float) and abs(got - target) <= P95_TOLERANCE * target:
        return
    after = [r for r in served.minutes
             if r["endpoint"] == want.endpoint and r["minute"] >= iso_minute(want.since)]
    mean = sum(p95(r["durations_ms"]) for r in after) / len(after)
    fix = None
    if isinstance(got, int | float) and abs(got - mean) <= 0.02 * mean:
        fix = (f"That is the mean of the minutes' p95s ({mean:.1f} ms): a slow minute and a "
               "fast one do not average into a percentile. The p95 since the onset is the "
               "nearest rank of every duration from since to the end, pooled.")
    raise CheckFailure(
        "impact() reported a p95 since the onset that is not the p95 of its durations.",
        expected=f"p95_ms {target} (the nearest rank of all {want.requests} durations since "
                 f"{hm(want.since)}; within 15 %)",
        actual="None" if found is None else f"p95_ms {got!r}",
        evidence=_summary(scenario, served.minutes, want.endpoint),
        lesson=IMPACT,
        fix=fix,
    )
