"""Stage request: follow one failing request by its trace id to the deepest cause."""

from __future__ import annotations

import json
from typing import Any

import pytest
from _history import BACKGROUND_CHAIN, deepest, failure_chains, root_of
from _support import PROVE, REQUEST, field_of, run_kind

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("request")


def _trace_lines(sources: Any, trace: str) -> list[dict[str, Any]]:
    found = []
    for path in sources.log_paths:
        for raw in path.read_text(encoding="utf-8").splitlines():
            if trace in raw:
                found.append(json.loads(raw))
    return sorted(found, key=lambda line: line["ts"])


def _evidence(scenario: Any, lines: list[dict[str, Any]]) -> str:
    rows = []
    for line in lines:
        chain, error = [], line.get("error")
        while error:
            chain.append(error["type"])
            error = error.get("cause")
        rows.append((line["service"], line["level"], line["span_id"],
                     line["parent_span_id"] or "-", " <- ".join(chain) or line["message"]))
    return (scenario.describe() + "\nthe request's log lines:\n"
            + table(rows, ("service", "level", "span", "parent", "error chain")))


def _failing(shop: Any, endpoint: str) -> str:
    for user in ("u-417", "u-583"):
        status, trace = shop.request(endpoint, user)
    assert status >= 500, f"the broken shop answered {status} to {endpoint}"
    return trace


def _judge(learner: Any, shop: Any, scenario: Any, sources: Any, headline: str) -> None:
    assert scenario.kind is not None
    trace = _failing(shop, scenario.endpoint)
    lines = _trace_lines(sources, trace)
    service, kind, _ = root_of(scenario.kind)
    message = next(deepest(line["error"])["message"] for line in lines
                   if line["service"] == service and line.get("error"))
    found = call(learner.module("triage").root_cause, sources, trace)
    got = ((field_of(found, "service"), field_of(found, "exception"),
            field_of(found, "message")) if found is not None else None)
    if got == (service, kind, message):
        return
    fix = None
    if got is None and any(line.get("error") for line in lines):
        answered = sorted({line["service"] for line in lines if line["level"] != "ERROR"
                           and line["parent_span_id"]})
        fix = ("The request has ERROR lines, so it has a root cause. "
               + (f"The lines of calls that went well ({', '.join(answered)}: INFO) are "
                  "children too, but no failure: the deepest ERROR line is one whose span_id "
                  "is no other ERROR line's parent_span_id." if answered else ""))
    if got is not None:
        outer = {line["error"]["type"] for line in lines if line.get("error")}
        caller_last = deepest(failure_chains(scenario.kind)[0][1])["type"]
        background = deepest(BACKGROUND_CHAIN[0][1])["type"]
        if got[1] in outer:
            fix = ("That is the outermost exception of the logged error. Follow error.cause "
                   "to its end: the last cause is where the failure started.")
        elif got[1] == caller_last and service != got[0]:
            fix = (f"That is the last cause in {got[0]}'s line, which only says its call "
                   f"failed. The service it called logged the same trace id deeper (its "
                   "parent_span_id is the caller's span_id): read that line's chain; the "
                   "order of the lines in time does not tell who called whom.")
        elif got[1] == background:
            fix = ("That error belongs to another request: keep only the lines whose "
                   "trace_id is the one you were given.")
    raise CheckFailure(
        headline,
        expected=f"service {service}, exception {kind}: {message}",
        actual=(f"service {got[0]}, exception {got[1]}: {got[2]}" if got else "None"),
        evidence=_evidence(scenario, lines),
        lesson=REQUEST,
        fix=fix,
    )


def test_root_cause_of_this_runs_incident(learner, shop, seed):
    the_shop, scenario, sources = shop(run_kind(seed))
    _judge(learner, the_shop, scenario, sources,
           "root_cause() did not name the deepest cause of the failing request.")


@pytest.mark.parametrize("kind", ["refund-deploy", "provider-timeout"])
def test_the_deepest_cause_is_in_the_service_that_was_called(learner, shop, kind):
    # refund-deploy: the callee's line is the later one (its host's clock runs ahead);
    # provider-timeout: the earlier one. Neither order in time finds the deepest span.
    the_shop, scenario, sources = shop(kind)
    _judge(learner, the_shop, scenario, sources,
           "root_cause() stopped before the deepest cause of a request that crossed two "
           "services.")


def test_only_this_requests_lines_count(learner, shop):
    the_shop, scenario, sources = shop("pricing-flag")
    _judge(learner, the_shop, scenario, sources,
           "root_cause() did not follow the request it was given.")


def test_a_request_that_succeeded_has_no_root_cause(learner, shop):
    the_shop, scenario, sources = shop(None)
    status, trace = the_shop.request("POST /orders")
    assert status == 200, f"the healthy shop answered {status}"
    assert the_shop.wait_notified(trace, sources.extra["paths"]["notifier"]), \
        "the notifier never logged the order event"
    found = call(learner.module("triage").root_cause, sources, trace)
    if found is None:
        return
    raise CheckFailure(
        "root_cause() blamed an exception for a request that succeeded.",
        expected="None (no ERROR line carries this trace id)",
        actual=f"service {field_of(found, 'service')}, exception "
               f"{field_of(found, 'exception')}",
        evidence=_evidence(scenario, _trace_lines(sources, trace)),
        lesson=REQUEST,
    )


def test_the_root_cause_carries_its_evidence(learner, shop):
    the_shop, scenario, sources = shop("provider-timeout")
    trace = _failing(the_shop, "POST /orders")
    found = call(learner.module("triage").root_cause, sources, trace)
    evidence = field_of(found, "evidence") if found is not None else None
    _, kind, _ = root_of("provider-timeout")
    if (isinstance(evidence, list) and evidence and all(isinstance(e, str) for e in evidence)
            and any(kind in e for e in evidence)):
        return
    raise CheckFailure(
        "root_cause() returned a finding without the evidence that supports it.",
        expected=f"evidence: a non-empty list of str, one naming the exception {kind}",
        actual=f"evidence {evidence!r}"[:200],
        evidence=_evidence(scenario, _trace_lines(sources, trace)),
        lesson=PROVE,
    )
