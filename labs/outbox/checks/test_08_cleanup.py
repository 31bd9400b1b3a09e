"""Stage cleanup: published rows older than the retention window go, in small batches, each in
its own transaction; an unpublished row is never deleted, however old."""

from __future__ import annotations

import re
from typing import Any

import pytest
from _support import (
    MISTAKES,
    READ,
    SESSION_ZONES,
    insert_event,
    insert_many,
    local_offset_hours,
    outbox_rows,
    require_table,
    session_zone,
)

from dojo.checks import CheckFailure, call, table
from dojo.checks.observers import record_sql

pytestmark = pytest.mark.stage("cleanup")
SEE = READ["cleanup"]

DAY = 86400.0
WEEK = 7 * DAY
HOUR = 3600.0
# Not a whole number of hours: a retention rounded to hours (or days) is off by minutes.
RETENTION = 6.5 * DAY + 37 * 60 + 13
RETENTION_TEXT = "6.5 days 37 min 13 s"
# hours after (+) or before (−) the retention boundary the edge rows were published
EDGE_HOURS = (-8, -6.5, -5, -4, -3, -2, -1, -0.25, 0.25, 1, 2, 3, 4, 5, 6.5, 8)
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
    # Rows published within hours of the retention boundary, on both sides: a cutoff computed
    # on another clock (a naive local time, a wrong zone) is hours off.
    edge = {insert_event(outbox, created_ago=RETENTION + 9 * HOUR - h * HOUR,
                         published_ago=RETENTION - h * HOUR): h for h in EDGE_HOURS}
    deleted = call(cleanup.delete_published, outbox, retention_seconds=RETENTION, batch_size=100)
    left = outbox_rows(outbox)
    left_ids = {r["id"] for r in left}
    unpublished_gone = [i for i in stuck if i not in left_ids]
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
    late_gone = [i for i in late if i not in left_ids]
    if late_gone:
        raise CheckFailure(
            "Cleanup deleted rows published an hour ago because they were created 10 days ago. "
            "Retention counts from published_at, not created_at: an event that waited out an "
            "outage has just reached the consumers, and its replay and audit window starts now.",
            expected="the 3 rows created 10 days ago and published 1 hour ago are still there "
                     f"(retention {RETENTION_TEXT})",
            actual=f"{len(late_gone)} of them deleted (did the filter compare created_at?)",
            evidence="deleted ids (created 10 days ago, published 1 hour ago):\n" +
                     "\n".join(late_gone), lesson=SEE)
    wrong_edge = {i: h for i, h in edge.items() if (i in left_ids) != (h > 0)}
    if wrong_edge:
        kept_old = sorted(-h for i, h in wrong_edge.items() if h < 0)
        gone_new = sorted(h for i, h in wrong_edge.items() if h > 0)
        gone = [h for i, h in edge.items() if i not in left_ids]
        kept = [h for i, h in edge.items() if i in left_ids]
        low, high = max(gone, default=None), min(kept, default=None)
        shift = local_offset_hours() - SESSION_ZONES[session_zone()]
        zone_shift = (low is None or low < shift) and (high is None or shift < high)
        rounded = not zone_shift and all(abs(h) < 1 for h in wrong_edge.values())
        raise CheckFailure(
            f"Cleanup's cutoff is {'minutes' if rounded else 'hours'} off (retention "
            f"{RETENTION_TEXT}): "
            + (f"rows published {RETENTION_TEXT} + {', '.join(f'{h:g}' for h in kept_old)} h "
               "ago were kept" if kept_old else "")
            + ("; " if kept_old and gone_new else "")
            + (f"rows published {RETENTION_TEXT} − {', '.join(f'{h:g}' for h in gone_new)} h "
               "ago were deleted" if gone_new else "")
            + ". The cutoff is clock_timestamp() − retention_seconds, on the database's clock."
            + (" Only rows within an hour of the boundary are wrong: the retention was rounded "
               "to a coarser unit (whole hours?), and retention_seconds is not a whole number "
               "of hours." if rounded else "")
            + (f" The check's database runs in {session_zone()} while this process runs at UTC"
               f"{local_offset_hours():+g}; a cutoff from a naive datetime.now() is local wall "
               "time that PostgreSQL reads in the session's zone: off by exactly that."
               if zone_shift else ""),
            expected=f"rows published more than {RETENTION_TEXT} ago deleted, newer ones "
                     "kept, however close to the boundary",
            actual=f"{len(wrong_edge)} row(s) near the boundary on the wrong side",
            evidence=table([{"published": f"{RETENTION_TEXT} {-h:+g} h ago",
                             "kept": i in left_ids, "should be kept": h > 0}
                            for i, h in sorted(edge.items(), key=lambda e: e[1])],
                           ("published", "kept", "should be kept"), limit=20),
            lesson=SEE,
            fix="compute the cutoff in SQL: published_at < clock_timestamp() - "
                "make_interval(secs => :retention_seconds)" if zone_shift or rounded else None)
    recent = [r for r in left if r["published_at"] is not None]
    kept_edge = sum(1 for h in EDGE_HOURS if h > 0)
    gone_edge = len(EDGE_HOURS) - kept_edge
    if not (deleted == 250 + gone_edge and len(left) == 28 + kept_edge
            and len(recent) == 23 + kept_edge):
        old_left = outbox_rows(outbox, "published_at < clock_timestamp() - "
                                       "make_interval(secs => :r)", r=RETENTION)
        raise CheckFailure(
            f"Rows published more than retention_seconds ago ({RETENTION_TEXT} here) must be "
            "deleted; "
            "rows published since stay for replay and audit.",
            expected=f"delete_published returns {250 + gone_edge}; {28 + kept_edge} rows left",
            actual=f"returned {deleted!r}; {len(left)} rows left, {len(recent)} of them published",
            evidence=table(old_left or left, ROW_COLUMNS), lesson=SEE)


def test_deletes_in_bounded_batches(outbox, learner):
    require_table(outbox, "outbox_event", "cleanup")
    cleanup = learner.module("cleanup")
    insert_many(outbox, 333, published=True, created_ago=9 * DAY, published_ago=8 * DAY)
    with record_sql(outbox, xid=True) as log:
        deleted = call(cleanup.delete_published, outbox, retention_seconds=WEEK, batch_size=70)
    deletes = [s for s in log if re.search(r"\bdelete\s+from\s+(public\.)?\"?outbox_event\b",
                                           s.sql, re.IGNORECASE) and s.rowcount > 0]
    rows: list[dict[str, Any]] = [
        {"statement": i + 1, "rows deleted": s.rowcount, "transaction": s.xid}
        for i, s in enumerate(deletes)]
    too_big = [r for r in rows if r["rows deleted"] > 70]
    same_tx = len({r["transaction"] for r in rows}) < len(rows)
    if not (deleted == 333 and len(deletes) >= 5 and not too_big and not same_tx):
        raise CheckFailure(
            "Cleanup must delete in bounded batches, each its own short transaction: one huge "
            "DELETE (or a loop inside one transaction) holds its locks until the end, writes a "
            "burst of WAL the replicas must replay, and leaves a long transaction that stops "
            "vacuum everywhere.",
            expected="333 deleted by ≥ 5 DELETE statements of ≤ 70 rows, each in its own "
                     "transaction",
            actual=f"returned {deleted!r}; {len(deletes)} DELETE statement(s)"
                   + (f", {len(too_big)} over 70 rows" if too_big else "")
                   + (", sharing one transaction" if same_tx else ""),
            evidence=table(rows, ("statement", "rows deleted", "transaction")),
            lesson=SEE)
    # "until a batch comes back short": 333 rows at 70 a batch end with a batch of 53, and
    # nothing runs after it (a loop until a batch deletes nothing never ends while a busy
    # outbox keeps publishing rows past the retention boundary).
    every = [s for s in log if re.search(r"\bdelete\s+from\s+(public\.)?\"?outbox_event\b",
                                         s.sql, re.IGNORECASE)]
    first_short = next((i for i, s in enumerate(every) if s.rowcount < 70), None)
    if first_short is not None and len(every) > first_short + 1:
        raise CheckFailure(
            "Cleanup went on deleting after a batch came back short. A short batch means "
            "nothing older than the cutoff was left when it ran: stop there. Looping until a "
            "batch deletes nothing costs one more statement every time, and on a busy outbox, "
            "where rows keep crossing the retention boundary, it may never stop.",
            expected="DELETE statements of 70, 70, 70, 70 and 53 rows, then none",
            actual="row counts " + ", ".join(str(s.rowcount) for s in every),
            evidence=table([{"statement": i + 1, "rows deleted": s.rowcount}
                            for i, s in enumerate(every)], ("statement", "rows deleted")),
            lesson=SEE, fix="leave the loop as soon as a batch deletes fewer than batch_size "
                            "rows")
