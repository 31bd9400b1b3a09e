"""Stage impact: which endpoint, since when, how bad against the baseline, for how many."""

from __future__ import annotations

from typing import Any

import pytest
from _history import ENDPOINTS, Scenario
from _support import IMPACT, PROVE, expected_impact, field_of, first_error_minute, hm, run_kind

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
    raise CheckFailure(
        "impact() reported a latency that is not the 95th percentile.",
        expected="; ".join(f"{name} {w} (nearest rank, within 15 %)" for name, w, _ in wrong),
        actual="; ".join(f"{name} {g}" for name, _, g in wrong),
        evidence=_summary(scenario, recorded.minutes, want.endpoint),
        lesson=IMPACT,
        fix=("That is the mean of the durations: the slowest 5 % that users feel disappear "
             "in an average. Sort the durations and take the ceil(0.95 n)-th.") if mean else None,
    )


def test_a_healthy_window_raises_no_alarm(learner, window):
    scenario, recorded, sources = window(None)
    found = _impact(learner, sources)
    if found is None:
        return
    endpoint = field_of(found, "endpoint")
    raise CheckFailure(
        "impact() raised an alarm on a healthy system.",
        expected="None (every endpoint is within its baseline at the end of the window)",
        actual=f"an Impact for {endpoint} since {hm(field_of(found, 'since'))}",
        evidence=_summary(scenario, recorded.minutes,
                          endpoint if endpoint in ENDPOINTS else "POST /orders"),
        lesson=IMPACT,
    )


def test_the_finding_carries_its_evidence(learner, window, seed):
    scenario, recorded, sources = window(run_kind(seed))
    want = expected_impact(scenario, recorded)
    found = _impact(learner, sources)
    evidence = field_of(found, "evidence") if found is not None else None
    minute = want.since.strftime("%H:%M")
    if (isinstance(evidence, list) and evidence and all(isinstance(e, str) for e in evidence)
            and any(minute in e for e in evidence)):
        return
    raise CheckFailure(
        "impact() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the first bad minute as HH:MM",
        actual=f"evidence {evidence!r}"[:200],
        evidence=scenario.describe(),
        lesson=PROVE,
    )
