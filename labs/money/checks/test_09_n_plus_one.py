"""Stage n-plus-one: statements() returns each account's latest postings in a bounded number
of queries, the same for 10 accounts as for 100. The check counts every statement sent
through the engine it passes in (SQLAlchemy cursor events), ORM or Core alike."""

from __future__ import annotations

from decimal import Decimal
from types import ModuleType
from typing import Any

import pytest
from _support import READ
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, fmt, rows, table
from dojo.checks.observers import count_queries, query_summary

pytestmark = pytest.mark.stage("n-plus-one")

MAX_QUERIES = 3
# Never the default of `recent` (5), and not one value throughout: a LIMIT written into the
# query instead of bound to the parameter returns the wrong number of postings
RECENT = 3
MORE_RECENT = 7


def _ring(engine: Engine, ids: list[int], rounds: int) -> None:
    """`rounds` transfers around a ring of accounts, written as the ledger would have them:
    each round, every account sends a different amount to the next. Balances are set to the
    sum of the postings (all accounts were funded first, so none goes negative)."""
    with engine.begin() as conn:
        for r in range(rounds):
            conn.execute(text("""
                WITH legs AS (
                    SELECT gen_random_uuid() AS entry, a.id AS src,
                           coalesce(lead(a.id) OVER (ORDER BY a.id), min(a.id) OVER ()) AS dst,
                           ((a.n * 7 + :r * 3) % 17 + 1)::numeric / 4 AS amount
                      FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
                              FROM account WHERE id = ANY(:ids)) a),
                entries AS (
                    INSERT INTO ledger_entry (id, kind)
                    SELECT entry, 'TRANSFER' FROM legs RETURNING id)
                INSERT INTO posting (entry_id, account_id, amount, currency)
                SELECT entry, src, -amount, 'USD' FROM legs
                UNION ALL
                SELECT entry, dst, amount, 'USD' FROM legs"""), {"ids": ids, "r": r})
        conn.execute(text("""
            UPDATE account a SET balance = s.total
              FROM (SELECT account_id, sum(amount) AS total FROM posting
                     WHERE account_id = ANY(:ids) GROUP BY account_id) s
             WHERE a.id = s.account_id"""), {"ids": ids})


def _interleaved(engine: Engine, src: int, dst: int, between: int) -> None:
    """Transfers src -> dst whose transactions overlap: the first begins, `between` others
    begin later and commit one by one, and only then does the first write its postings. Its
    postings have the highest ids and the oldest BEGIN (now()) of them all, so with
    recent=`between` it is among each account's latest by posting id and not among the latest
    by any timestamp taken at BEGIN: the cut falls inside the overlap."""
    first = engine.connect()
    total = Decimal("0.03") + Decimal("0.07") * between
    try:
        first.execute(text("SELECT now()"))  # its transaction (and its now()) begins here
        for _ in range(between):
            with engine.connect() as later:
                later.execute(text("SELECT now()"))
                _transfer_rows(later, src, dst, "0.07")
                later.commit()
        _transfer_rows(first, src, dst, "0.03")
        first.commit()
    finally:
        first.close()
    with engine.begin() as conn:  # the balances follow (the transactions wrote both rows)
        conn.execute(text("UPDATE account SET balance = balance + CASE WHEN id = :src "
                          "THEN -CAST(:t AS numeric) ELSE CAST(:t AS numeric) END "
                          "WHERE id IN (:src, :dst)"), {"src": src, "dst": dst, "t": total})


def _transfer_rows(conn: Any, src: int, dst: int, amount: str) -> None:
    entry = conn.execute(text("INSERT INTO ledger_entry (id, kind) "
                              "VALUES (gen_random_uuid(), 'TRANSFER') RETURNING id")).scalar_one()
    conn.execute(text("""
        INSERT INTO posting (entry_id, account_id, amount, currency)
        VALUES (:e, :src, -CAST(:m AS numeric), 'USD'),
               (:e, :dst, CAST(:m AS numeric), 'USD')"""),
                 {"e": entry, "src": src, "dst": dst, "m": amount})


def _expected(engine: Engine, ids: list[int], recent: int = RECENT
              ) -> dict[int, dict[str, Any]]:
    """The check's own answer: balance, currency and the latest postings of each account."""
    out = {r["id"]: {"currency": r["currency"].strip(), "balance": r["balance"], "recent": []}
           for r in rows(engine, "SELECT id, currency, balance FROM account "
                                 "WHERE id = ANY(:ids)", ids=ids)}
    for r in rows(engine, """
            SELECT account_id, id, entry_id::text AS entry_id, amount, kind FROM (
              SELECT p.*, e.kind, row_number() OVER (PARTITION BY p.account_id
                                                     ORDER BY p.id DESC) AS n
                FROM posting p JOIN ledger_entry e ON e.id = p.entry_id
               WHERE p.account_id = ANY(:ids)) x
             WHERE n <= :recent ORDER BY account_id, id DESC""", ids=ids, recent=recent):
        out[r["account_id"]]["recent"].append((r["id"], r["entry_id"], r["kind"], r["amount"]))
    return out


def _differences(got: dict[Any, Any], expected: dict[int, dict[str, Any]]) -> list[str]:
    problems = []
    extra = sorted(set(got) - set(expected))
    if extra:
        problems.append(f"unexpected account ids {extra[:5]}")
    for account_id, want in expected.items():
        statement = got.get(account_id)
        if statement is None:
            problems.append(f"account {account_id}: missing")
            continue
        lines = [(p.posting_id, str(p.entry_id), p.kind, p.amount) for p in statement.recent]
        if statement.balance != want["balance"] or statement.currency != want["currency"]:
            problems.append(f"account {account_id}: {statement.currency} "
                            f"{fmt(statement.balance)}, expected {want['currency']} "
                            f"{fmt(want['balance'])}")
        if lines != want["recent"]:
            problems.append(f"account {account_id}: postings (id, kind, amount) "
                            f"{[(i, k, fmt(a)) for i, _, k, a in lines]}, expected "
                            f"{[(i, k, fmt(a)) for i, _, k, a in want['recent']]}")
    return problems


def _accounts(accounts: ModuleType, engine: Engine, count: int) -> list[int]:
    ids = []
    for _ in range(count):
        account_id = call(accounts.open_account, engine, currency="USD")
        call(accounts.deposit, engine, account_id, Decimal("100.00"))
        ids.append(int(account_id))
    return ids


def test_statement_shows_the_latest_postings(learner: Any, accounts: ModuleType,
                                             bank: Engine) -> None:
    statements = learner.module("statements")
    quiet, busy, other = _accounts(accounts, bank, 3)
    call(accounts.withdraw, bank, quiet, Decimal("0.50"))
    empty = call(accounts.open_account, bank, currency="EUR")
    # after the quiet account's two postings, the busy one gets 24 more: a limit shared by all
    # the accounts asked for (5 x 4 = 20 rows) would be spent on the busy one alone
    for n in range(12):
        call(accounts.deposit, bank, busy, Decimal(f"{n + 1}.{n * 13 % 100:02d}"))
        call(accounts.transfer, bank, busy, other, Decimal(f"0.{n + 11}"))
    asked = [busy, quiet, empty, 987654321]
    got = call(statements.statements, bank, asked, recent=RECENT)
    expected = _expected(bank, [busy, quiet, empty])
    problems = _differences(got, expected)
    if problems:
        raise CheckFailure(
            "statements() must return each account's balance and its latest postings, newest "
            "first.",
            expected=f"for accounts {busy} (25 postings), {quiet} (2, older than all of "
                     f"{busy}'s) and {empty} (none), with recent={RECENT}: the latest {RECENT} "
                     "postings of each, by posting id, descending; the unknown id 987654321 "
                     "left out",
            actual="; ".join(problems[:4]),
            evidence=table([{"account": a, "id": i, "kind": k, "amount": m}
                         for a, want in expected.items() for i, _, k, m in want["recent"]],
                        ("account", "id", "kind", "amount")),
            fix="the latest N postings of EACH account: a window (row_number() OVER (PARTITION "
                "BY account_id ORDER BY id DESC) <= :recent) or LEFT JOIN LATERAL (... LIMIT "
                ":recent), not one LIMIT shared by all the accounts"
            if _starved(got, expected, quiet) else
            f"return `recent` postings per account: bind LIMIT :recent to the parameter "
            f"(recent={RECENT} here), not a number written into the query"
            if _miscounted(got, expected, busy) else None,
            lesson=READ["n-plus-one"])
    # "latest" is by posting id, whatever order the transactions began or committed in
    _interleaved(bank, busy, other, MORE_RECENT)
    got = call(statements.statements, bank, [busy, other], recent=MORE_RECENT)
    expected = _expected(bank, [busy, other], MORE_RECENT)
    problems = _differences(got, expected)
    if problems:
        raise CheckFailure(
            "statements() must choose and order each account's latest postings by posting "
            "id, newest first.",
            expected=f"for the busy account and the one it pays, after {MORE_RECENT + 1} "
                     "overlapping transfers between them (the transaction that began first "
                     f"wrote its postings last, after the other {MORE_RECENT} committed, so "
                     "they have the highest ids and the oldest BEGIN): the latest "
                     f"{MORE_RECENT} postings by posting id, descending (recent={MORE_RECENT}): "
                     "the late writer's 0.03 among them",
            actual="; ".join(problems[:2]),
            evidence=table([{"account": a, "id": i, "kind": k, "amount": m}
                            for a, want in expected.items() for i, _, k, m in want["recent"]],
                           ("account", "id", "kind", "amount")),
            fix="choose and order by posting.id DESC (in the window or the LATERAL and in the "
                "outer query), not by a timestamp: now() is the time a transaction began, not "
                "the order its rows were written" if _late_writer_misplaced(got, expected)
            else None, lesson=READ["n-plus-one"])


def _late_writer_misplaced(got: dict[Any, Any], expected: dict[int, dict[str, Any]]) -> bool:
    """Some account's newest posting by id (the late writer's) is not first in its statement,
    while the statement holds as many lines as asked for."""
    for account_id, want in expected.items():
        statement = got.get(account_id)
        if statement is None or not want["recent"]:
            continue
        lines = [p.posting_id for p in statement.recent]
        if len(lines) == len(want["recent"]) and lines[0] != want["recent"][0][0]:
            return True
    return False


def _starved(got: dict[Any, Any], expected: dict[int, dict[str, Any]], quiet: int) -> bool:
    """The quiet account came back with fewer postings than it has, the busy one in full."""
    statement = got.get(quiet)
    return statement is not None and len(statement.recent) < len(expected[quiet]["recent"])


def _miscounted(got: dict[Any, Any], expected: dict[int, dict[str, Any]], busy: int) -> bool:
    """The busy account came back with its newest postings, but not as many as asked for."""
    statement = got.get(busy)
    if statement is None:
        return False
    lines = [(p.posting_id, str(p.entry_id), p.kind, p.amount) for p in statement.recent]
    want = expected[busy]["recent"]
    return len(lines) != len(want) and (lines[:len(want)] == want or want[:len(lines)] == lines)


def _funded_by_sql(engine: Engine, count: int) -> list[int]:
    """`count` customer accounts holding 100.00 each, written the way the README fixes the
    tables (a SYSTEM account on the other side of each DEPOSIT entry): quicker than 200
    calls of the API, and the statements read the same rows."""
    with engine.begin() as conn:
        system = conn.execute(text("INSERT INTO account (kind, currency) "
                                   "VALUES ('SYSTEM', 'USD') RETURNING id")).scalar_one()
        ids = [int(i) for i in conn.execute(text(
            "INSERT INTO account (kind, currency) SELECT 'CUSTOMER', 'USD' "
            "FROM generate_series(1, :n) RETURNING id"), {"n": count}).scalars()]
        conn.execute(text("""
            WITH legs AS (SELECT gen_random_uuid() AS entry, id FROM unnest(CAST(:ids AS bigint[]))
                                                               AS t(id)),
            entries AS (INSERT INTO ledger_entry (id, kind)
                        SELECT entry, 'DEPOSIT' FROM legs RETURNING id)
            INSERT INTO posting (entry_id, account_id, amount, currency)
            SELECT entry, id, 100.00, 'USD' FROM legs
            UNION ALL
            SELECT entry, :system, -100.00, 'USD' FROM legs"""), {"ids": ids, "system": system})
        conn.execute(text("UPDATE account SET balance = -100.00 * :n WHERE id = :system"),
                     {"n": count, "system": system})
    return sorted(ids)


def test_statements_use_a_bounded_number_of_queries(learner: Any, ledger_tables: Engine
                                                    ) -> None:
    bank = ledger_tables
    statements = learner.module("statements")
    ids = _funded_by_sql(bank, 100)
    _ring(bank, ids, rounds=4)
    counts = {}
    for size in (10, 100):
        chosen = ids[:size]
        with count_queries(bank) as queries:
            got = call(statements.statements, bank, chosen, recent=MORE_RECENT)
        counts[size] = list(queries)
        problems = _differences(got, _expected(bank, chosen, MORE_RECENT))
        if problems:
            raise CheckFailure(
                f"statements() for {size} accounts returned wrong statements.",
                expected=f"each account's balance and its latest {MORE_RECENT} postings "
                         f"(recent={MORE_RECENT}), newest first",
                actual="; ".join(problems[:3]), lesson=READ["n-plus-one"])
    small, large = len(counts[10]), len(counts[100])
    if not (large <= MAX_QUERIES and large <= small):
        raise CheckFailure(
            f"statements() for 100 accounts sent {large} queries ({small} for 10 accounts): the "
            "number of queries grows with the number of accounts, the N+1 query problem.",
            expected=f"at most {MAX_QUERIES} queries, the same for 10 accounts as for 100",
            actual=f"{large} queries for 100 accounts, {small} for 10",
            evidence="the statements it sent for 100 accounts, grouped:\n"
                     + query_summary(counts[100]),
            fix="one query for the accounts and then one (lazy load) per account for its "
                "postings is N+1. Load the postings of all the accounts at once: WHERE account_id "
                "= ANY(:ids) with a window (row_number() OVER (PARTITION BY account_id ORDER BY "
                "id DESC)) or LEFT JOIN LATERAL (... ORDER BY id DESC LIMIT :recent); with the "
                "ORM, selectinload instead of lazy loading",
            lesson=(READ["n-plus-one"], READ["count-queries"]))
