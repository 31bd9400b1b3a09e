"""Stage change: correlate the onset with the change log, or say nothing changed."""

from __future__ import annotations

from typing import Any

import pytest
from _history import Scenario
from _support import CHANGE, PROVE, field_of, hm, run_kind

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("change")


def _changes(scenario: Scenario) -> str:
    rows = [(c["id"], c["at"], c["kind"], c["service"], c["description"])
            for c in scenario.changes]
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
