"""Stage schema: the outbox table, its keys, and the partial index the relay's claim uses."""

from __future__ import annotations

from typing import Any

import pytest
from _support import (
    DOCUMENTED_CLAIM,
    READ,
    explain_uses_partial_index,
    fill_with_published_rows,
    indexes,
    insert_event,
    require_table,
)
from sqlalchemy import Engine, text
from sqlalchemy.exc import DBAPIError, IntegrityError

from dojo.checks import CheckFailure, first_line, indent, raised, table

pytestmark = pytest.mark.stage("schema")
SEE = READ["schema"]
PAUSE = 0.25  # seconds between two inserts of one transaction

TEXT = ("text", "character varying")
TIMESTAMPTZ = ("timestamp with time zone",)

# column → (accepted types, NOT NULL?, needs a default?)  None: either is fine
EXPECTED: dict[str, tuple[tuple[str, ...], bool | None, bool]] = {
    "id": (("uuid",), True, False),
    "aggregate_type": (TEXT, True, False),
    "aggregate_id": (("uuid", *TEXT), True, False),
    "event_type": (TEXT, True, False),
    # orders.version is a bigint: the event's version is the order's, so the same width.
    "aggregate_version": (("bigint",), True, False),
    "payload": (("jsonb",), True, False),
    "headers": (("jsonb",), None, False),
    "created_at": (TIMESTAMPTZ, True, True),
    "published_at": (TIMESTAMPTZ, False, False),
    "lease_until": (TIMESTAMPTZ, False, False),
    # integer (the README's) or wider; a smallint overflows at 32,767 attempts and the claim
    # of that row then fails for every relay.
    "attempt_count": (("integer", "bigint"), True, True),
    "last_error": (TEXT, False, False),
    "next_attempt_at": (TIMESTAMPTZ, False, False),
}


def columns(engine: Engine) -> dict[str, dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT a.attname AS name, format_type(a.atttypid, a.atttypmod) AS type,
                   a.attnotnull AS not_null, pg_get_expr(d.adbin, d.adrelid) AS "default"
            FROM pg_attribute a
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE a.attrelid = 'outbox_event'::regclass AND a.attnum > 0
              AND NOT a.attisdropped""")).mappings().all()
    return {row["name"]: dict(row) for row in rows}


def index_table(found: list[dict[str, Any]]) -> str:
    return table(found, ("definition",), width=110) if found else "(outbox_event has no indexes)"


def test_outbox_table_has_every_column(outbox):
    require_table(outbox, "outbox_event", "schema")
    found = columns(outbox)
    problems = []
    for name, (types, not_null, needs_default) in EXPECTED.items():
        col = found.get(name)
        want = " or ".join(types)
        if not_null is True:
            want += ", NOT NULL"
        elif not_null is False:
            want += ", nullable"
        if needs_default:
            want += ", with a DEFAULT"
        if col is None:
            problems.append({"column": name, "expected": want, "found": "missing"})
            continue
        base_type = col["type"].split("(")[0]
        wrong = (base_type not in types
                 or (not_null is not None and col["not_null"] != not_null)
                 or (needs_default and not col["default"]))
        if wrong:
            problems.append({"column": name, "expected": want,
                             "found": col["type"] + (", NOT NULL" if col["not_null"] else
                                                     ", nullable") +
                             (f", DEFAULT {col['default']}" if col["default"] else "")})
    hint = ""
    if any(p["column"].endswith(("_at", "_until")) and "without time zone" in p["found"]
           for p in problems):
        hint = ("\n  timestamp without time zone stores wall-clock time with no zone: two "
                "relays on servers in different zones would disagree about when a lease ends.")
    too_narrow = {"attempt_count": ("smallint",), "aggregate_version": ("smallint", "integer")}
    narrow = [p["column"] for p in problems
              if p["found"].startswith(too_narrow.get(p["column"], ("-",)))]
    if narrow:
        why = {"aggregate_version": "aggregate_version copies orders.version, a bigint",
               "attempt_count": "a smallint attempt_count overflows at 32,767 attempts, and "
                                "then the claim of that row fails for every relay"}
        hint += ("\n  " + " and ".join(narrow) + (" are" if len(narrow) > 1 else " is")
                 + " narrower than the README's type: "
                 + "; ".join(why[c] for c in narrow) + ".")
    if problems:
        raise CheckFailure(
            "outbox_event does not have the columns the relay, the consumer and the metrics need."
            + hint,
            expected="the 13 columns of the README's table, with those types and NULL rules",
            actual="; ".join(f"{p['column']} {p['found']}" for p in problems[:3])
            + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""),
            evidence=table(problems, ("column", "expected", "found"), limit=20),
            lesson=SEE)
    require_documented_defaults(outbox, found)


# The README's defaults, read back from a row that names only the columns without one (the
# order service writes its events that way, and the checks insert rows so).
DEFAULTS = {"headers": {}, "attempt_count": 0}
FIXES = {"headers": "headers jsonb NOT NULL DEFAULT '{}'::jsonb",
         "attempt_count": "attempt_count integer NOT NULL DEFAULT 0"}


def require_documented_defaults(engine: Engine, found: dict[str, dict[str, Any]]) -> None:
    insert = text(
        "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
        "aggregate_version, payload) VALUES (gen_random_uuid(), 'order', gen_random_uuid(), "
        "'order.placed.v1', 1, '{}'::jsonb) RETURNING headers, attempt_count")
    with engine.connect() as conn:
        with conn.begin() as tx:
            refused = None
            try:
                got = dict(conn.execute(insert).mappings().one())
            except DBAPIError as exc:
                refused, got = exc, {}
            tx.rollback()
    wrong = [{"column": name, "expected default": repr(want),
              "a row without it gets": "(refused)" if refused else repr(got.get(name)),
              "DEFAULT": found[name]["default"] or "(none)"}
             for name, want in DEFAULTS.items() if refused or got.get(name) != want]
    if wrong:
        raise CheckFailure(
            "An event inserted without headers and attempt_count must get the README's "
            "defaults: headers '{}' (an object of strings, empty: a relay reads its keys), "
            "attempt_count 0 (the claim counts each attempt, so the first claim makes it 1).",
            expected="headers {} and attempt_count 0 on a row that names neither",
            actual=f"the INSERT was refused: {first_line(refused)}" if refused else
                   ", ".join(f"{w['column']} {w['a row without it gets']}" for w in wrong),
            evidence=table(wrong, ("column", "expected default", "a row without it gets",
                                   "DEFAULT")),
            lesson=SEE,
            fix=", ".join(FIXES[w["column"]] for w in wrong) if not refused else None)


def test_outbox_keys(outbox):
    require_table(outbox, "outbox_event", "schema")
    found = indexes(outbox)
    primary = [ix for ix in found if ix["is_primary"]]
    if not (primary and primary[0]["columns"] == ["id"]):
        raise CheckFailure(
            "The event id must be the primary key: consumers deduplicate on it.",
            expected="PRIMARY KEY (id)",
            actual=f"primary key on {primary[0]['columns']}" if primary else "no primary key",
            evidence=index_table(found), lesson=SEE)
    aggregate = "5b1f8e36-9a55-4d1c-8c1e-0d6a4f3b2a10"
    insert_event(outbox, aggregate_id=aggregate, version=1)
    duplicate = raised(insert_event, outbox, aggregate_id=aggregate, version=1)
    if not isinstance(duplicate, IntegrityError):
        raise CheckFailure(
            "Two events of one aggregate must never share a version: without a unique key, two "
            "concurrent updates can both write version 2 and the consumer cannot order them.",
            expected="a second ('order', same aggregate_id, version 1) row is refused "
                     "(unique violation)",
            actual="it was inserted" if duplicate is None else first_line(duplicate),
            evidence=index_table(found), lesson=SEE)
    # Another aggregate type may use the same id and version: the key is all three columns.
    other_type = raised(insert_event, outbox, aggregate_id=aggregate, version=1,
                        aggregate_type="customer")
    if other_type is not None:
        raise CheckFailure(
            "An event of another aggregate type with the same aggregate_id and version was "
            "refused. The unique key is (aggregate_type, aggregate_id, aggregate_version): two "
            "kinds of aggregate number their versions independently, and nothing makes their ids "
            "distinct across types (a customer and an order may share an id).",
            expected="('customer', same aggregate_id, version 1) is inserted next to the "
                     "('order', …) row",
            actual=f"refused: {first_line(other_type)}",
            evidence=index_table(found), lesson=SEE)
    wanted = {"aggregate_type", "aggregate_id", "aggregate_version"}
    # Version 2 is published; a second version 2 arrives later (a change that read a stale
    # version): a published version is still taken.
    insert_event(outbox, aggregate_id=aggregate, version=2, published_ago=5)
    again = raised(insert_event, outbox, aggregate_id=aggregate, version=2)
    if not isinstance(again, IntegrityError):
        partial = [ix for ix in found if ix["is_unique"] and ix["predicate"]
                   and set(ix["columns"]) == wanted]
        raise CheckFailure(
            "Version 2 of an aggregate was published, then a second version 2 of it was "
            "accepted. A version stays taken once published: consumers have seen it, and "
            "two events with one version cannot be ordered."
            + (f" The unique index is partial ({partial[0]['predicate']}): it only compares "
               "rows that are still pending." if partial else ""),
            expected="the second ('order', same aggregate_id, version 2) row is refused",
            actual="it was inserted" if again is None else first_line(again),
            evidence=index_table(found), lesson=SEE,
            fix="a full constraint, CONSTRAINT … UNIQUE (aggregate_type, aggregate_id, "
                "aggregate_version), with no WHERE" if partial else None)
    unique = [ix for ix in found if ix["is_unique"] and not ix["predicate"]
              and set(ix["columns"]) == wanted]
    if not unique:
        raise CheckFailure(
            "The unique key on the aggregate's versions must be a constraint or unique index on "
            "exactly those three columns.",
            expected="UNIQUE (aggregate_type, aggregate_id, aggregate_version)",
            actual="no unique constraint or index on exactly those three columns",
            evidence=index_table(found), lesson=SEE)


def test_created_at_is_the_time_of_the_insert(outbox):
    require_table(outbox, "outbox_event", "schema")
    insert = text(
        "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, "
        "aggregate_version, payload) VALUES (gen_random_uuid(), 'order', gen_random_uuid(), "
        "'order.placed.v1', 1, '{}'::jsonb) RETURNING created_at, now() AS started")
    with outbox.begin() as conn:
        first = conn.execute(insert).one()
        conn.execute(text("SELECT pg_sleep(:s)"), {"s": PAUSE})
        second = conn.execute(insert).one()
    gap = (second.created_at - first.created_at).total_seconds()
    if gap < PAUSE * 0.8:
        at_start = first.created_at == first.started and second.created_at == second.started
        raise CheckFailure(
            "Two events written in one transaction, 0.25 s apart, got "
            + ("the same created_at: the transaction's start time (now())." if at_start else
               "created_at values that do not show the time between them.")
            + " created_at must be when the row was written: a relay orders by it, and the "
            "publish age (published_at − created_at) would count the whole business transaction "
            "as time spent in the outbox.",
            expected=f"created_at {PAUSE} s apart (DEFAULT clock_timestamp())",
            actual=f"{gap:.3f} s apart" + ("; both equal now(), the transaction's start"
                                           if at_start else ""),
            evidence=table([{"row": 1, "created_at": first.created_at,
                             "transaction start": first.started},
                            {"row": 2, "created_at": second.created_at,
                             "transaction start": second.started}],
                           ("row", "created_at", "transaction start")),
            lesson=SEE,
            fix=("DEFAULT clock_timestamp() — now() and CURRENT_TIMESTAMP are the transaction's "
                 "start, the same for every row it writes") if at_start else None)
    require_created_at_per_row(outbox)


# One INSERT … SELECT writing two rows, the second produced only after a pause: a default
# evaluated per statement (statement_timestamp(), or now() in a statement of its own) gives
# both rows the statement's start, as it does to an event inserted by a statement that first
# waited for the order's row lock (a data-modifying WITH).
ONE_STATEMENT_TWO_ROWS = text(
    "INSERT INTO outbox_event (id, aggregate_type, aggregate_id, event_type, aggregate_version, "
    "payload) SELECT gen_random_uuid(), 'order', gen_random_uuid(), 'order.placed.v1', n, "
    "'{}'::jsonb FROM generate_series(1, 2) AS n WHERE n = 1 OR pg_sleep(:s) IS NOT NULL "
    "RETURNING aggregate_version AS row, created_at, statement_timestamp() AS statement_start")


def require_created_at_per_row(outbox: Engine) -> None:
    with outbox.begin() as conn:
        found = sorted(conn.execute(ONE_STATEMENT_TWO_ROWS, {"s": PAUSE}).all())
    gap = (found[1].created_at - found[0].created_at).total_seconds()
    if gap < PAUSE * 0.8:
        at_statement = all(row.created_at == row.statement_start for row in found)
        raise CheckFailure(
            "One INSERT wrote two events, the second 0.25 s after the first, and their "
            "created_at " + ("are both the statement's start (statement_timestamp())."
                             if at_statement else "do not show the time between them.")
            + " created_at must be when the row itself was written: an event inserted by a "
            "statement that first waited (for the order's row lock, in a data-modifying WITH) "
            "would carry the time before the wait, and no longer follow its version.",
            expected=f"created_at {PAUSE} s apart (DEFAULT clock_timestamp(), read per row)",
            actual=f"{gap:.3f} s apart" + ("; both equal statement_timestamp()"
                                           if at_statement else ""),
            evidence=table([row._asdict() for row in found],
                           ("row", "created_at", "statement_start")),
            lesson=SEE,
            fix=("DEFAULT clock_timestamp(): statement_timestamp() is the start of the statement, "
                 "the same for every row it writes") if at_statement else None)


def test_partial_index_on_unpublished_rows(outbox):
    require_table(outbox, "outbox_event", "schema")
    found = indexes(outbox)
    partial = [ix for ix in found if ix["predicate"] and
               "published_at IS NULL" in ix["predicate"]]
    if not partial:
        raise CheckFailure(
            "The relay looks for unpublished rows many times a second. Published rows pile up "
            "(millions, until cleanup), so its index should hold only the unpublished ones.",
            expected="an index on outbox_event with WHERE published_at IS NULL, e.g. "
                     "CREATE INDEX … ON outbox_event (created_at) WHERE published_at IS NULL",
            actual="no partial index with that predicate",
            evidence=index_table(found), lesson=SEE)


def test_claim_query_uses_the_partial_index(outbox):
    require_table(outbox, "outbox_event", "schema")
    fill_with_published_rows(outbox)
    ok, partial, plan = explain_uses_partial_index(outbox, DOCUMENTED_CLAIM)
    if not ok:
        raise CheckFailure(
            "With 20,000 published rows and 30 unpublished ones, the README's claim query should "
            "read the small partial index, not scan the table.",
            expected=f"an Index Scan using a partial index ({', '.join(partial) or 'none found'})",
            actual="the plan below",
            evidence="EXPLAIN" + DOCUMENTED_CLAIM.rstrip() + "\n\n" + indent(plan, 2),
            lesson=SEE)
