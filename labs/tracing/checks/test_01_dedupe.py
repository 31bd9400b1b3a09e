"""Stage dedupe: a redelivered event is kept once, by its id.

Written with the lab kit, `dojo.checks` (docs/lab-contract.md lists it): `call` runs the
learner's function (a stub fails as "not written yet"), `CheckFailure` says what was expected,
what happened and the evidence, `table` formats the evidence. Fixtures: `learner`, and
`database` / `kafka` once lab.yaml lists the services.
"""

import pytest

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("dedupe")


def test_a_redelivery_is_dropped_by_event_id(learner):
    module = learner.module("tracing")
    delivered = [("e1", "placed"), ("e2", "paid"), ("e1", "placed"), ("e3", "paid")]
    got = call(module.unique_events, list(delivered))
    wanted = [("e1", "placed"), ("e2", "paid"), ("e3", "paid")]
    if got != wanted:
        dropped = [event for event in wanted if event not in (got or [])]
        raise CheckFailure(
            "unique_events must drop a redelivered event by its id, and keep every other event"
            " in delivery order.",
            expected=f"{wanted}",
            actual=f"{got!r}"
                   + (f" (dropped {dropped}: another event with the same payload is still "
                      "another event)" if dropped else ""),
            evidence="delivered, in order:\n" + table(delivered, ("event_id", "payload")),
            # lesson="<lesson-id>#<section-slug>",  the section that explains the mistake
        )
