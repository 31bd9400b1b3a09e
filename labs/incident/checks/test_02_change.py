"""Stage change: correlate the onset with the change log, or say nothing changed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from _history import Scenario
from _support import CHANGE, PROVE, field_of, hm, run_kind

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
