"""Stage cleanup: published rows older than the retention window go, in small batches, each in
its own transaction; an unpublished row is never deleted, however old."""

from __future__ import annotations

import re
from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    insert_event,
    insert_many,
    outbox_rows,
    require_table,
)

from dojo.checks import CheckFailure, call, table
from dojo.checks.observers import record_sql

pytestmark = pytest.mark.stage("cleanup")
SEE = READ["cleanup"]

DAY = 86400.0
WEEK = 7 * DAY
ROW_COLUMNS = ("id", "created_at", "published_at", "attempt_count", "last_error")


def test_deletes_only_old_published_rows(outbox, learner):
    require_table(outbox, "outbox_event", "cleanup")
    cleanup = learner.module("cleanup")
    insert_many(outbox, 250, published=True, created_ago=9 * DAY, published_ago=8 * DAY)
    insert_many(outbox, 20, published=True, created_ago=2 * DAY, published_ago=1 * DAY)
    stuck = [insert_event(outbox, created_ago=30 * DAY, attempt_count=n) for n in (0, 0, 3, 7, 9)]
    # Created 10 days ago, published an hour ago: they waited out an outage. Retention counts
    # from the publish, so they stay for the whole window like any other published row.
    late = [insert_event(outbox, created_ago=10 * DAY, published_ago=3600, attempt_count=n)
            for n in (4, 6, 8)]
    deleted = call(cleanup.delete_published, outbox, retention_seconds=WEEK, batch_size=100)
    left = outbox_rows(outbox)
    unpublished_gone = [i for i in stuck if i not in {r["id"] for r in left}]
    if unpublished_gone:
        raise CheckFailure(
            "Cleanup deleted unpublished rows. Those events were never sent (a broker outage, a "
            "poison row backing off): deleting them loses them for good. Only rows with "
            "published_at older than the retention window may go — never filter on created_at "
            "alone.",
            expected="the 5 unpublished rows from 30 days ago are all still there",
            actual=f"{len(unpublished_gone)} unpublished row(s) deleted",
            evidence="deleted unpublished ids:\n" + "\n".join(unpublished_gone),
            lesson=MISTAKES)
    late_gone = [i for i in late if i not in {r["id"] for r in left}]
    if late_gone:
        raise CheckFailure(
            "Cleanup deleted rows published an hour ago because they were created 10 days ago. "
            "Retention counts from published_at, not created_at: an event that waited out an "
            "outage has just reached the consumers, and its replay and audit window starts now.",
            expected="the 3 rows created 10 days ago and published 1 hour ago are still there "
                     "(retention 7 days)",
            actual=f"{len(late_gone)} of them deleted (did the filter compare created_at?)",
            evidence="deleted ids (created 10 days ago, published 1 hour ago):\n" +
                     "\n".join(late_gone), lesson=SEE)
    old_left = outbox_rows(outbox, "published_at < clock_timestamp() - interval '7 days'")
    recent = [r for r in left if r["published_at"] is not None]
    if not (deleted == 250 and len(left) == 28 and len(recent) == 23):
        raise CheckFailure(
            "Rows published more than retention_seconds ago (7 days here) must be deleted; rows "
            "published in the last day stay for replay and audit.",
            expected="delete_published returns 250; 28 rows left (20 published yesterday, 3 an "
                     "hour ago, 5 unpublished)",
            actual=f"returned {deleted!r}; {len(left)} rows left, {len(recent)} of them published",
            evidence=table(old_left or left, ROW_COLUMNS), lesson=SEE)


def test_deletes_in_bounded_batches(outbox, learner):
    require_table(outbox, "outbox_event", "cleanup")
    cleanup = learner.module("cleanup")
    insert_many(outbox, 350, published=True, created_ago=9 * DAY, published_ago=8 * DAY)
    with record_sql(outbox, xid=True) as log:
        deleted = call(cleanup.delete_published, outbox, retention_seconds=WEEK, batch_size=100)
    deletes = [s for s in log if re.search(r"\bdelete\s+from\s+(public\.)?\"?outbox_event\b",
                                           s.sql, re.IGNORECASE) and s.rowcount > 0]
    rows: list[dict[str, Any]] = [
        {"statement": i + 1, "rows deleted": s.rowcount, "transaction": s.xid}
        for i, s in enumerate(deletes)]
    too_big = [r for r in rows if r["rows deleted"] > 100]
    same_tx = len({r["transaction"] for r in rows}) < len(rows)
    if not (deleted == 350 and len(deletes) >= 4 and not too_big and not same_tx):
        raise CheckFailure(
            "Cleanup must delete in bounded batches, each its own short transaction: one huge "
            "DELETE (or a loop inside one transaction) holds its locks until the end, writes a "
            "burst of WAL the replicas must replay, and leaves a long transaction that stops "
            "vacuum everywhere.",
            expected="350 deleted by ≥ 4 DELETE statements of ≤ 100 rows, each in its own "
                     "transaction",
            actual=f"returned {deleted!r}; {len(deletes)} DELETE statement(s)"
                   + (f", {len(too_big)} over 100 rows" if too_big else "")
                   + (", sharing one transaction" if same_tx else ""),
            evidence=table(rows, ("statement", "rows deleted", "transaction")),
            lesson=SEE)
