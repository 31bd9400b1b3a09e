"""Stage request: follow one failing request by its trace id to the deepest cause."""

from __future__ import annotations

import json
import uuid
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
                line = json.loads(raw)
                if line.get("trace_id") == trace:    # not a line that only quotes it
                    found.append(line)
    return sorted(found, key=lambda line: line["ts"])


# another request's ERROR line that quotes the trace id: payments' retry job took the failed
# request up under a trace of its own, its span a child of the failed one (a span link)
QUOTING_ROOT = "builtins.LookupError"


def _quote_the_trace(shop: Any, sources: Any, trace: str) -> None:
    """Append to payments' log another request's ERROR line whose text quotes `trace` and
    whose parent span is the request's deepest ERROR span: taken into the request by a
    match on the raw text, it would be the deepest line."""
    errors = [line for line in _trace_lines(sources, trace) if line.get("error")]
    parents = {line["parent_span_id"] for line in errors}
    leaf = next(line for line in errors if line["span_id"] not in parents)
    quoting = {"ts": shop.logs.stamp("payments"), "level": "ERROR", "service": "payments",
               "trace_id": uuid.uuid4().hex, "span_id": uuid.uuid4().hex[:16],
               "parent_span_id": leaf["span_id"], "message": f"retry of request {trace} failed",
               "error": {"type": "payments.jobs.RetryFailed",
                         "message": f"retry of trace {trace} gave up",
                         "cause": {"type": QUOTING_ROOT, "message": f"no order for trace {trace}",
                                   "cause": None}}}
    with shop.logs.lock, sources.extra["paths"]["payments"].open("a", encoding="utf-8") as out:
        out.write(json.dumps(quoting) + "\n")


# a call the deepest span made that went well: payments published an event about the charge it
# was attempting, and the notifier queued a notice for it (an INFO line, a child of payments'
# span). The deepest ERROR line is still payments': a child that logged no error hides nothing.
INFO_CHILD = ("notifier", "charge attempt notice queued")


def _info_child_of_the_deepest(shop: Any, sources: Any, trace: str) -> None:
    """Append to the notifier's log an INFO line of the request whose parent_span_id is the
    request's deepest ERROR span: counted among the children, it leaves no ERROR line
    childless."""
    errors = [line for line in _trace_lines(sources, trace) if line.get("error")]
    parents = {line["parent_span_id"] for line in errors}
    leaf = next(line for line in errors if line["span_id"] not in parents)
    service, message = INFO_CHILD
    child = {"ts": shop.logs.stamp(service), "level": "INFO", "service": service,
             "trace_id": trace, "span_id": uuid.uuid4().hex[:16],
             "parent_span_id": leaf["span_id"], "message": message, "error": None}
    with shop.logs.lock, sources.extra["paths"][service].open("a", encoding="utf-8") as out:
        out.write(json.dumps(child) + "\n")


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


def _judge(learner: Any, shop: Any, scenario: Any, sources: Any, headline: str,
           quoted: bool = False, info_child: bool = False) -> None:
    assert scenario.kind is not None
    trace = _failing(shop, scenario.endpoint)
    if quoted:
        _quote_the_trace(shop, sources, trace)
    if info_child:
        _info_child_of_the_deepest(shop, sources, trace)
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
        if info_child and got[0] != service and got[1] != kind:
            fix = (f"The ERROR line of {service} has a child line, the {INFO_CHILD[0]}'s INFO line "
                   "of a call that went well. Lines of calls that went well do not count: the "
                   "deepest ERROR line is one whose span_id is no other ERROR line's "
                   "parent_span_id, so take the parents from the ERROR lines only.")
        elif got[1] in outer:
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
        elif quoted and got[1] == QUOTING_ROOT:
            fix = ("That error is another request's: its line has a trace_id of its own and "
                   "only quotes this one in its text. A line belongs to the request when its "
                   "trace_id field is the one given, not when the id occurs in the raw line.")
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


def test_a_call_that_went_well_below_the_deepest_error_does_not_count(learner, shop):
    # provider-timeout: orders-api's ERROR line, payments' below it, and below payments' an
    # INFO line of the notifier (a call payments made that went well)
    the_shop, scenario, sources = shop("provider-timeout")
    _judge(learner, the_shop, scenario, sources,
           "root_cause() did not name the deepest ERROR line's cause when a call that went "
           "well hangs below it.", info_child=True)


def test_only_this_requests_lines_count(learner, shop):
    # besides the background failures, another request's ERROR line quotes this trace id
    the_shop, scenario, sources = shop("pricing-flag")
    _judge(learner, the_shop, scenario, sources,
           "root_cause() did not follow the request it was given.", quoted=True)


def test_every_call_reads_the_logs_again(learner, shop):
    # two failing requests, root_cause() called after each in one process: the second
    # request's lines were written after the first call
    the_shop, scenario, sources = shop("refund-deploy")
    service, kind, message = root_of("refund-deploy")
    triage = learner.module("triage")
    for number in (1, 2):
        trace = _failing(the_shop, scenario.endpoint)
        found = call(triage.root_cause, sources, trace)
        got = ((field_of(found, "service"), field_of(found, "exception"),
                field_of(found, "message")) if found is not None else None)
        if got == (service, kind, message):
            continue
        fix = None
        if number == 2 and got is None:
            fix = ("Your first call found its request; this one was logged after it, in the "
                   "same files, and your second call found no ERROR line of it. The logs grow "
                   "while the shop runs: read them on every call, keep no index between calls.")
        raise CheckFailure(
            "root_cause() did not name the deepest cause of the "
            f"{'second' if number == 2 else 'first'} of two failing requests.",
            expected=f"service {service}, exception {kind}: {message}",
            actual=(f"service {got[0]}, exception {got[1]}: {got[2]}" if got else "None"),
            evidence=_evidence(scenario, _trace_lines(sources, trace)),
            lesson=REQUEST,
            fix=fix,
        )


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
