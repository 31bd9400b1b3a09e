"""Stage change: correlate the onset with the change log, or say nothing changed."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from _history import Scenario
from _support import CHANGE, PROVE, field_of, hm, observability, run_kind

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("change")


def _changes(scenario: Scenario) -> str:
    rows = [(c["id"], c["at"], c["kind"], c["service"], c["description"])
            for c in scenario.changes]   # as the change log listed them
    return (f"{scenario.describe()}\nfirst bad minute {hm(scenario.since)}\n"
            + table(rows, ("id", "at", "kind", "service", "description")))


def _suspect_id(finding: Any) -> str | None:
    suspect = field_of(finding, "suspect")
    if suspect is None:
        return None
    if isinstance(suspect, dict):
        return str(suspect.get("id"))
    return str(getattr(suspect, "id", suspect))


def _describe(scenario: Scenario, change_id: str | None) -> str:
    if change_id is None:
        return "no change in the window"
    for change in scenario.changes:
        if change["id"] == change_id:
            return f"the {change['kind']} of {change['service']} at {change['at']}"
    return f"{change_id!r}, which is not in the change log"


def _ask(learner: Any, scenario: Scenario, sources: Any) -> Any:
    return call(learner.module("triage").what_changed, sources, scenario.since)


def _later_deploy(scenario: Scenario, change_id: str | None) -> bool:
    assert scenario.since is not None
    return any(c["id"] == change_id and c["kind"] == "deploy" and c["at"] > hm(
        scenario.since).replace(" ", "T") for c in scenario.changes)


def _judge(scenario: Scenario, found: Any, headline: str, fix: str | None = None) -> None:
    got = _suspect_id(found) if found is not None else "<no finding>"
    if got == scenario.suspect_id:
        return
    if fix is None and got != "<no finding>" and _later_deploy(scenario, got):
        fix = ("That deploy came after the first bad minute, so it cannot have started the "
               "incident: only a change before the onset (up to the end of its minute) is a "
               "suspect, however recent the others are.")
    raise CheckFailure(
        headline,
        expected=_describe(scenario, scenario.suspect_id),
        actual=_describe(scenario, got) if got != "<no finding>" else "None",
        evidence=_changes(scenario),
        lesson=CHANGE,
        fix=fix,
    )


def test_the_suspect_of_this_runs_incident(learner, window, seed):
    scenario, _, sources = window(run_kind(seed))
    _judge(scenario, _ask(learner, scenario, sources),
           "what_changed() did not name the change in the 15 minutes before the onset.")


def test_a_deploy_after_the_onset_is_not_the_suspect(learner, window):
    scenario, _, sources = window("refund-deploy")
    _judge(scenario, _ask(learner, scenario, sources),
           "what_changed() named the wrong change for an incident that followed a deploy.")


def test_no_change_in_the_window_is_an_answer(learner, window):
    scenario, _, sources = window("provider-timeout")
    _judge(scenario, _ask(learner, scenario, sources),
           "what_changed() named a suspect although nothing changed in the window.")


@pytest.mark.parametrize("kind", ["pricing-flag", "stock-lock"])
def test_a_flag_or_config_change_is_a_suspect_too(learner, window, kind):
    scenario, _, sources = window(kind)
    found = _ask(learner, scenario, sources)
    fix = None
    if found is not None and _suspect_id(found) is None:
        fix = ("A feature flag or a configuration change starts incidents as often as a "
               "deploy: every change in the log is a candidate.")
    _judge(scenario, found,
           "what_changed() missed a change that was not a deploy.", fix)


def test_the_change_finding_carries_its_evidence(learner, window):
    scenario, _, sources = window("refund-deploy")
    found = _ask(learner, scenario, sources)
    evidence = field_of(found, "evidence") if found is not None else None
    assert scenario.suspect_id is not None
    if (isinstance(evidence, list) and evidence and all(isinstance(e, str) for e in evidence)
            and any(scenario.suspect_id in e for e in evidence)):
        return
    raise CheckFailure(
        "what_changed() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the suspect change's id",
        actual=f"evidence {evidence!r}"[:200],
        evidence=_changes(scenario),
        lesson=PROVE,
    )


def _window(scenario: Scenario) -> list[dict[str, Any]]:
    """The changes of the README's window, oldest first."""
    assert scenario.since is not None
    low = hm(scenario.since - timedelta(minutes=15)).replace(" ", "T")
    high = hm(scenario.since + timedelta(minutes=1)).replace(" ", "T")
    return sorted((c for c in scenario.changes if low <= c["at"][:16] < high),
                  key=lambda c: c["at"])


def test_the_window_runs_to_the_end_of_the_onset_minute(learner, window):
    # the flag flipped a few seconds into the first bad minute; two older changes are in the
    # window too, and another flag flipped exactly one minute after the onset
    scenario, _, sources = window("pricing-flag")
    found = _ask(learner, scenario, sources)
    got = _suspect_id(found) if found is not None else None
    assert scenario.since is not None
    edge = hm(scenario.since + timedelta(minutes=1)).replace(" ", "T") + ":00.000Z"
    older = [c["id"] for c in _window(scenario)[:-1]]
    fix = None
    if got is not None and got == older[-1]:
        fix = ("That is the latest change before the onset minute began. The window runs to "
               "the end of the first bad minute (since + 1 minute, excluded): a flag flipped "
               "at :20 of that minute can have made the whole minute bad.")
    elif any(c["id"] == got and c["at"] == edge for c in scenario.changes):
        fix = ("That change was made exactly one minute after the onset: the window is "
               "since - 15 min <= at < since + 1 min, its end excluded.")
    _judge(scenario, found, "what_changed() cut the window at the wrong end.", fix)


def test_the_change_log_is_in_no_particular_order(learner, window):
    # stock-lock: the change log lists the suspect before an older change of the window
    scenario, _, sources = window("stock-lock")
    found = _ask(learner, scenario, sources)
    got = _suspect_id(found) if found is not None else None
    inside = _window(scenario)
    fix = None
    listed = [c["id"] for c in scenario.changes if c in inside]
    if got is not None and got != scenario.suspect_id and got in listed:
        which = "last" if got == listed[-1] else "first" if got == listed[0] else "one"
        fix = (f"That is the {which} of the window's changes as the log listed them, not the "
               "latest: the README promises no order. Compare the changes' `at`.")
    _judge(scenario, found, "what_changed() did not name the latest change of the window.",
           fix)


def _iso_ms(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _extra_change(scenario: Scenario, salt: str, at: datetime, kind: str, service: str,
                  description: str) -> dict[str, Any]:
    """A change of the check's own, with an id the scenario's log does not use."""
    rng = random.Random(f"{scenario.seed}/{scenario.kind}/{salt}")
    taken = {c["id"] for c in scenario.changes}
    ident = next(i for i in (f"chg-{rng.randint(1000, 9999)}" for _ in range(100))
                 if i not in taken)
    return {"id": ident, "at": _iso_ms(at), "kind": kind, "service": service,
            "description": description}


def _ask_with(learner: Any, scenario: Scenario, recorded: Any, changes: list[dict[str, Any]]
              ) -> Any:
    """what_changed() on the scenario with the change log `changes`, served as listed."""
    with observability(replace(scenario, changes=changes), recorded, []) as sources:
        return call(learner.module("triage").what_changed, sources, scenario.since)


def test_changes_in_one_minute_are_told_apart_to_the_millisecond(learner, window):
    # pricing-flag: the flag flipped a few seconds into the onset minute; a config change of
    # the same minute came a few seconds earlier, and another one earlier within the flag's
    # own second. Asked twice, the change log listing the flag first, then last: the latest
    # is the flag either way.
    scenario, recorded, _ = window("pricing-flag")
    assert scenario.since is not None and scenario.suspect_id is not None
    rng = random.Random(f"{scenario.seed}/same-minute")
    listed_suspect = next(c for c in scenario.changes if c["id"] == scenario.suspect_id)
    at = datetime.fromisoformat(listed_suspect["at"].replace("Z", "+00:00")).replace(
        microsecond=rng.randint(500, 999) * 1000)
    suspect = {**listed_suspect, "at": _iso_ms(at)}
    minute = _extra_change(scenario, "same-minute",
                           scenario.since + timedelta(seconds=rng.randint(0, 2),
                                                      milliseconds=rng.randint(0, 999)),
                           "config", "orders-api", "orders-api: price cache TTL 60 s -> 5 s")
    second = _extra_change(scenario, "same-second",
                           at - timedelta(milliseconds=rng.randint(1, 400)),
                           "config", "payments", "payments: charge retries 3 -> 1")
    assert minute["at"] < second["at"] < suspect["at"] and at - scenario.since >= timedelta(
        seconds=4)
    rest = [c for c in scenario.changes if c["id"] != suspect["id"]]
    for listed in ([suspect, second, minute, *rest], [*rest, minute, second, suspect]):
        found = _ask_with(learner, scenario, recorded, listed)
        got = _suspect_id(found) if found is not None else None
        if got == scenario.suspect_id:
            continue
        shown = replace(scenario, changes=listed)
        fix = None
        if got in (minute["id"], second["id"]):
            fix = (f"Three changes were made in the minute {hm(scenario.since)}: "
                   f"{minute['id']} at {minute['at'][17:23]} s, {second['id']} at "
                   f"{second['at'][17:23]} s and {suspect['id']} at {suspect['at'][17:23]} s. "
                   "Compare `at` to the millisecond (parse the whole timestamp), not to the "
                   "minute or the second: of changes close together the later one is the "
                   "latest.")
        raise CheckFailure(
            "what_changed() did not name the latest of several changes made in the same "
            "minute.",
            expected=_describe(shown, scenario.suspect_id),
            actual=_describe(shown, got) if found is not None else "None",
            evidence=_changes(shown),
            lesson=CHANGE,
            fix=fix,
        )


def test_a_change_on_the_windows_start_is_in_it(learner, window):
    # provider-timeout has no change in its window; this change log adds one made exactly at
    # since - 15 min (in the window: its start is included) and one exactly at since + 1 min
    # (outside: its end is excluded)
    scenario, recorded, _ = window("provider-timeout")
    assert scenario.since is not None
    start, end = scenario.since - timedelta(minutes=15), scenario.since + timedelta(minutes=1)
    first = _extra_change(scenario, "window-start", start, "config", "payments",
                          "payments: provider timeout 5 s -> 2 s")
    last = _extra_change(scenario, "window-end", end, "flag", "notifier",
                         "feature flag notifier.digest: off -> on (5 %)")
    listed = [*scenario.changes, first, last]
    random.Random(f"{scenario.seed}/edges").shuffle(listed)
    shown = replace(scenario, changes=listed, suspect_id=first["id"])
    found = _ask_with(learner, scenario, recorded, listed)
    got = _suspect_id(found) if found is not None else None
    if got == first["id"]:
        return
    fix = None
    if got is None and found is not None:
        fix = (f"{first['id']} was made at {first['at']}, exactly since - 15 min: the window "
               "includes its start (since - 15 min <= at), so that change is the suspect.")
    elif got == last["id"]:
        fix = (f"{last['id']} was made at {last['at']}, exactly since + 1 min: the window "
               "excludes its end (at < since + 1 min).")
    raise CheckFailure(
        "what_changed() got a change on the edge of the window wrong.",
        expected=_describe(shown, first["id"]) + " (on the window's start, which is included)",
        actual=_describe(shown, got) if found is not None else "None",
        evidence=_changes(shown),
        lesson=CHANGE,
        fix=fix,
    )


# offsets no host runs by accident, on both sides of UTC and not whole hours
_OFFSETS = (timezone(timedelta(hours=5, minutes=45)), timezone(-timedelta(hours=3, minutes=30)))


@pytest.mark.parametrize("kind", ["refund-deploy", "stock-lock"])
def test_since_in_another_time_zone_is_the_same_instant(learner, window, kind):
    # since is an aware datetime: the same instant written with a non-UTC offset must give
    # the same window (the change log is in UTC)
    scenario, _, sources = window(kind)
    assert scenario.since is not None
    offset = _OFFSETS[0 if kind == "refund-deploy" else 1]
    since = scenario.since.astimezone(offset)
    found = call(learner.module("triage").what_changed, sources, since)
    got = _suspect_id(found) if found is not None else None
    if got == scenario.suspect_id:
        return
    fix = None
    if found is not None and got is None:
        fix = (f"since was {since.isoformat()}, the same instant as "
               f"{scenario.since.isoformat()}: compare aware datetimes (parse `at` with its "
               "Z as UTC and keep since's offset), never their wall-clock fields.")
    raise CheckFailure(
        "what_changed() missed the suspect when since came in another time zone.",
        expected=_describe(scenario, scenario.suspect_id)
        + f" (since {since.isoformat()} = {hm(scenario.since)} UTC)",
        actual=_describe(scenario, got) if found is not None else "None",
        evidence=_changes(scenario),
        lesson=CHANGE,
        fix=fix,
    )


def test_every_call_reads_the_change_log_again(learner, window):
    # refund-deploy, asked twice in one process on the same change log URL: first before the
    # deploy that started it was logged (nothing in the window), then after
    scenario, _, sources = window("refund-deploy")
    assert scenario.suspect_id is not None
    routes = sources.extra["routes"]
    full = routes["/changes"]
    triage = learner.module("triage")
    earlier = [c for c in scenario.changes if c["id"] != scenario.suspect_id]
    routes["/changes"] = json.dumps({"changes": earlier}).encode()
    try:
        first = call(triage.what_changed, sources, scenario.since)
    finally:
        routes["/changes"] = full
    _judge(replace(scenario, changes=earlier, suspect_id=None), first,
           "what_changed() named a suspect although nothing changed in the window yet.")
    second = call(triage.what_changed, sources, scenario.since)
    got = _suspect_id(second) if second is not None else None
    if got == scenario.suspect_id:
        return
    fix = None
    if second is not None and got == _suspect_id(first):
        fix = (f"{scenario.suspect_id} was logged between your two calls, on the same change "
               "log URL; your second call answered as the first. The change log grows while "
               "an incident lasts: read it on every call, keep no copy between calls.")
    raise CheckFailure(
        "what_changed() did not see a change logged after its first call.",
        expected=_describe(scenario, scenario.suspect_id) + " (logged before the second call)",
        actual=_describe(scenario, got) if second is not None else "None",
        evidence=_changes(scenario),
        lesson=CHANGE,
        fix=fix,
    )
