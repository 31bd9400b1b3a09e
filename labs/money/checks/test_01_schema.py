"""Stage schema: NUMERIC money, a non-negative customer balance, an append-only ledger whose
entries balance per currency at commit, and idempotency keys that are unique.

These checks write the tables directly with SQL, as a buggy code path or an admin tool would,
and prove that the database itself refuses what must never be stored."""

from __future__ import annotations

import uuid
from decimal import Decimal
from typing import Any

import pytest
from _support import READ, TABLES
from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, first_line, require_tables, rows, scalar, sqlstate
from dojo.checks.database import columns

pytestmark = pytest.mark.stage("schema")

MONEY_COLUMNS = (("account", "balance"), ("posting", "amount"))


def _account(conn: Any, currency: str = "USD", kind: str = "CUSTOMER") -> int:
    return int(conn.execute(text(
        "INSERT INTO account (kind, currency) VALUES (:k, :c) RETURNING id"),
        {"k": kind, "c": currency}).scalar_one())


def _accounts(engine: Engine, *currencies: str) -> list[int]:
    with engine.begin() as conn:
        return [_account(conn, c) for c in currencies]


def _attempt(engine: Engine, statements: list[tuple[str, dict[str, Any]]]) -> BaseException | None:
    """Run the statements in one transaction and commit; the error, if anything refused."""
    try:
        with engine.begin() as conn:
            for sql, params in statements:
                conn.execute(text(sql), params)
    except Exception as exc:
        return exc
    return None


def _entry(entry_id: str) -> tuple[str, dict[str, Any]]:
    return ("INSERT INTO ledger_entry (id, kind) VALUES (:id, 'TRANSFER')", {"id": entry_id})


def _posting(entry_id: str, account_id: int, amount: str, currency: str
             ) -> tuple[str, dict[str, Any]]:
    return ("INSERT INTO posting (entry_id, account_id, amount, currency) "
            "VALUES (:e, :a, CAST(:m AS numeric), :c)",
            {"e": entry_id, "a": account_id, "m": amount, "c": currency})


def test_money_columns_are_numeric(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    wrong = []
    for table_name, column in MONEY_COLUMNS:
        data_type = columns(bank, table_name)[column]
        if data_type != "numeric":
            wrong.append(f"{table_name}.{column} is {data_type}")
    if wrong:
        raise CheckFailure(
            "Money must be stored as exact decimals.",
            expected="account.balance and posting.amount of type numeric (numeric(20,4), say)",
            actual="; ".join(wrong),
            evidence="double precision and real are binary fractions: 0.1 + 0.2 = "
                     "0.30000000000000004, and at 14 digits a cent no longer exists; the money "
                     "type knows no currency and depends on lc_monetary",
            fix="balance numeric(20,4) NOT NULL DEFAULT 0, amount numeric(20,4) NOT NULL",
            lesson=READ["numbers"])
    [account_id] = _accounts(bank, "USD")
    try:
        with bank.begin() as conn:
            conn.execute(text("UPDATE account SET balance = CAST('98765432109876.53' AS numeric) "
                              "WHERE id = :id"), {"id": account_id})
            stored = conn.execute(text("SELECT balance::text FROM account WHERE id = :id"),
                                  {"id": account_id}).scalar_one()
    except Exception as exc:
        stored = f"refused: {first_line(exc)}"
    if stored.rstrip("0").rstrip(".") != "98765432109876.53":
        raise CheckFailure(
            "A balance of 98765432109876.53 did not survive the round trip.",
            expected="98765432109876.53 exactly", actual=f"{stored}",
            fix="numeric with at least 2 decimals and 14 integer digits, e.g. numeric(20,4)",
            lesson=READ["numbers"])
    # the same amount as a posting: a balanced entry of +x on a customer account and -x on a
    # SYSTEM one (which may go negative), so neither the zero-sum rule nor the CHECK objects
    with bank.begin() as conn:
        system_id = _account(conn, "USD", kind="SYSTEM")
    entry = str(uuid.uuid4())
    big = "98765432109876.53"
    refused = _attempt(bank, [_entry(entry), _posting(entry, account_id, big, "USD"),
                              _posting(entry, system_id, f"-{big}", "USD")])
    posted = [] if refused is not None else [str(r["amount"]) for r in rows(
        bank, "SELECT amount::text AS amount FROM posting WHERE entry_id = :e "
              "ORDER BY posting.amount DESC", e=entry)]
    if [p.rstrip("0").rstrip(".") for p in posted] != [big, f"-{big}"]:
        raise CheckFailure(
            f"A posting of {big} did not survive the round trip.",
            expected=f"an entry of +{big} and -{big} USD commits, and posting.amount reads "
                     "back exactly those amounts",
            actual=f"refused: {first_line(refused)}" if refused is not None
            else f"read back {posted}",
            evidence="a posting carries every amount a balance can hold: a column narrower "
                     "than the balance (numeric(12,2) tops out at 9,999,999,999.99) refuses "
                     "the deposit that a balance column accepts",
            fix="posting.amount as wide as account.balance: numeric(20,4), say",
            lesson=READ["numbers"])


def test_customer_balance_cannot_go_negative(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    [account_id] = _accounts(bank, "USD")
    error = _attempt(bank, [("UPDATE account SET balance = -0.01 WHERE id = :id",
                             {"id": account_id})])
    insert_error = _attempt(bank, [("INSERT INTO account (kind, currency, balance) "
                                    "VALUES ('CUSTOMER', 'USD', -5)", {})])
    accepted = [sql for sql, exc in (
        (f"UPDATE account SET balance = -0.01 WHERE id = {account_id}", error),
        ("INSERT INTO account (kind, currency, balance) VALUES ('CUSTOMER', 'USD', -5)",
         insert_error)) if exc is None]
    if accepted:
        raise CheckFailure(
            "The database accepted a negative balance on a customer account.",
            expected="CHECK constraint violation (SQLSTATE 23514) for a customer balance < 0",
            actual="committed: " + "; ".join(accepted),
            evidence="the conditional UPDATE is the mechanism, the CHECK is the safety net: the "
                     "next code path someone writes without WHERE balance >= :amount (an admin "
                     "tool, a fee job, a hot-fix) is stopped by the database, not by review",
            fix="CONSTRAINT customer_balance_not_negative CHECK (kind = 'SYSTEM' OR balance >= 0)",
            lesson=READ["check"])
    for exc in (error, insert_error):
        if sqlstate(exc) != "23514":
            raise CheckFailure(
                "A negative customer balance was refused, but not by a CHECK constraint.",
                expected="SQLSTATE 23514 (check_violation), from CHECK (... balance >= 0)",
                actual=f"SQLSTATE {sqlstate(exc)}: {first_line(exc)}",
                fix="declare the rule as a CHECK constraint on account", lesson=READ["check"])


def test_system_accounts_may_go_negative(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    opened = _attempt(bank, [("INSERT INTO account (kind, currency) VALUES ('SYSTEM', 'USD')",
                              {})])
    if opened is not None:
        raise CheckFailure(
            "A SYSTEM account could not be opened with only kind and currency.",
            expected="INSERT INTO account (kind, currency) VALUES ('SYSTEM', 'USD') commits",
            actual=f"SQLSTATE {sqlstate(opened)}: {first_line(opened)}",
            evidence="the checks insert rows with only the columns the README lists, as an "
                     "admin tool would; a column of your own that is NOT NULL without a default "
                     "(or a CHECK that demands it) refuses them",
            fix="give every column you add a default, or let it be NULL",
            lesson=READ["schema"])
    with bank.begin() as conn:
        system_id = conn.execute(text("SELECT max(id) FROM account WHERE kind = 'SYSTEM'")
                                 ).scalar_one()
    refused = _attempt(bank, [("UPDATE account SET balance = -1234.56 WHERE id = :id",
                               {"id": system_id})])
    if refused is not None:
        raise CheckFailure(
            "A SYSTEM account was not allowed to go negative.",
            expected=f"UPDATE account SET balance = -1234.56 WHERE id = {system_id} (a SYSTEM "
                     "account) commits",
            actual=f"SQLSTATE {sqlstate(refused)}: {first_line(refused)}",
            evidence="a clearing account is the other side of every deposit: it goes negative "
                     "as customers deposit. Only customer balances must stay >= 0",
            fix="CHECK (kind = 'SYSTEM' OR balance >= 0)" if sqlstate(refused) == "23514"
            else None, lesson=READ["check"])


def test_ledger_is_append_only(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    a, b = _accounts(bank, "USD", "USD")
    entry, lonely = str(uuid.uuid4()), str(uuid.uuid4())
    setup = _attempt(bank, [_entry(entry), _posting(entry, a, "10.00", "USD"),
                            _posting(entry, b, "-10.00", "USD"), _entry(lonely)])
    if setup is not None:
        raise CheckFailure(
            "A balanced entry (+10.00 and -10.00 USD) could not be written.",
            expected="INSERT INTO ledger_entry (id, kind) and two INSERT INTO posting "
                     "(entry_id, account_id, amount, currency) commit",
            actual=first_line(setup), fix="give any extra column a default", lesson=READ["schema"])
    # the +10.00 posting, by its id: the edits below must not lose it when one moves it
    posting_id = scalar(bank, "SELECT min(id) FROM posting WHERE account_id = :a", a=a)
    # every column, not only the amount: moving a posting to another account or entry
    # rewrites history as surely as changing its amount
    attempts: dict[str, tuple[str, dict[str, Any]]] = {
        "UPDATE posting SET amount = 20.00": ("UPDATE posting SET amount = 20.00 "
                                              "WHERE entry_id = :e AND amount > 0", {"e": entry}),
        "UPDATE posting SET account_id = <the other account>": (
            "UPDATE posting SET account_id = :b WHERE entry_id = :e AND amount > 0",
            {"e": entry, "b": b}),
        "UPDATE posting SET entry_id = <another entry>": (
            "UPDATE posting SET entry_id = :other WHERE entry_id = :e AND amount > 0",
            {"e": entry, "other": lonely}),
        "DELETE FROM posting": ("DELETE FROM posting WHERE entry_id = :e", {"e": entry}),
        "UPDATE ledger_entry SET kind = 'FIXED'": ("UPDATE ledger_entry SET kind = 'FIXED' "
                                                   "WHERE id = :e", {"e": entry}),
    }
    accepted = [label for label, statement in attempts.items() if _attempt(bank, [statement])
                is None]
    # and every other column, the schema's own included (a reversal's link, a created_at): a
    # trigger BEFORE UPDATE OF <the README's columns> lets those be rewritten
    accepted += [label for label, (sql, params) in _other_column_edits(bank, entry, lonely)
                 if _edited(bank, sql, {**params, "p": posting_id})]
    # an entry without postings: a plain foreign key cannot be what refuses its deletion
    if _attempt(bank, [("DELETE FROM ledger_entry WHERE id = :e", {"e": lonely})]) is None:
        accepted.append("DELETE FROM ledger_entry")
    if accepted:
        raise CheckFailure(
            "The ledger can be rewritten: history must be append-only.",
            expected="every UPDATE and DELETE on posting and ledger_entry refused by the database",
            actual="these committed: " + "; ".join(accepted),
            evidence="a balance is explained by its postings; once a posting can be edited, no "
                     "audit or reconciliation can explain a balance. Mistakes are corrected with "
                     "a new REVERSAL entry",
            fix="a BEFORE UPDATE OR DELETE trigger on posting and ledger_entry that raises, "
                "whatever column changes (not UPDATE OF a list of columns), and BEFORE "
                "TRUNCATE, for each statement",
            lesson=READ["schema"])


# The columns test_ledger_is_append_only edits by name; the others are found in the catalog.
EDITED_BY_NAME = {"posting": {"amount", "account_id", "entry_id"}, "ledger_entry": {"kind"}}


def _edited(engine: Engine, sql: str, params: dict[str, Any]) -> bool:
    """True when the UPDATE committed and changed a row."""
    try:
        with engine.begin() as conn:
            return conn.execute(text(sql), params).rowcount > 0
    except Exception:
        return False


def _other_column_edits(engine: Engine, entry: str, other_entry: str
                        ) -> list[tuple[str, tuple[str, dict[str, Any]]]]:
    """An UPDATE per remaining column of posting and ledger_entry that gives the entry (or the
    posting :p) another value of the column's type: a changed value, so a trigger that
    refuses only real changes refuses it too."""
    edits = []
    for table_name, where in (("posting", "id = :p"),
                              ("ledger_entry", "id = :e")):
        for r in rows(engine, """
                SELECT column_name, data_type FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = :t
                   AND is_identity = 'NO' AND is_generated = 'NEVER'
                 ORDER BY ordinal_position""", t=table_name):
            name, data_type = r["column_name"], r["data_type"]
            if name in EDITED_BY_NAME[table_name]:
                continue
            column = f'"{name}"'
            if data_type.startswith(("timestamp", "date")):
                value = f"coalesce({column}, now()) - interval '1 day'"
            elif data_type in ("smallint", "integer", "bigint", "numeric", "real",
                               "double precision"):
                value = f"coalesce({column}, 0) + 1"
            elif data_type in ("text", "character varying", "character"):
                value = f"CASE WHEN {column} IS DISTINCT FROM 'X' THEN 'X' ELSE 'Y' END"
            elif data_type == "uuid":  # another entry's id: a reversal detached or re-pointed
                value = f"CASE WHEN {column} IS DISTINCT FROM :other THEN :other ELSE :e END"
            elif data_type == "boolean":
                value = f"NOT coalesce({column}, false)"
            elif data_type in ("json", "jsonb"):
                value = "'{\"edited\": true}'"
            else:
                continue
            edits.append((f"UPDATE {table_name} SET {name} = <another value>",
                          (f"UPDATE {table_name} SET {column} = {value} WHERE {where}",
                           {"e": entry, "other": other_entry})))
    return edits


def test_entries_must_balance_per_currency(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    usd1, usd2, eur1, eur2 = _accounts(bank, "USD", "USD", "EUR", "EUR")
    cases = []
    e1 = str(uuid.uuid4())
    cases.append(("one posting of +10.00 USD and nothing else",
                  [_entry(e1), _posting(e1, usd1, "10.00", "USD")], False))
    e2 = str(uuid.uuid4())
    cases.append(("+10.00 USD and -10.00 EUR (zero in total, not per currency)",
                  [_entry(e2), _posting(e2, usd1, "10.00", "USD"),
                   _posting(e2, eur1, "-10.00", "EUR")], False))
    e3 = str(uuid.uuid4())
    cases.append(("+100.00/-100.00 USD and +92.00/-92.00 EUR, one posting per statement",
                  [_entry(e3), _posting(e3, usd1, "-100.00", "USD"),
                   _posting(e3, usd2, "100.00", "USD"), _posting(e3, eur1, "-92.00", "EUR"),
                   _posting(e3, eur2, "92.00", "EUR")], True))
    wrong = []
    for label, statements, should_commit in cases:
        error = _attempt(bank, statements)
        if should_commit and error is not None:
            wrong.append(f"balanced entry {label}: refused with {first_line(error)}")
        if not should_commit and error is None:
            wrong.append(f"unbalanced entry {label}: committed")
    # an imbalance below a cent is an imbalance: a sum rounded to cents (or compared with a
    # tolerance) lets it commit. A column narrower than 4 decimals may round the amounts as
    # they are stored; what counts is whether the stored postings sum to zero
    for imbalance in ("0.0001", "0.0049"):
        e4 = str(uuid.uuid4())
        debit = Decimal("-37.4213")
        credit = -debit + Decimal(imbalance)
        error = _attempt(bank, [_entry(e4), _posting(e4, usd1, str(credit), "USD"),
                                _posting(e4, usd2, str(debit), "USD")])
        stored = scalar(bank, "SELECT coalesce(sum(amount), 0) FROM posting WHERE entry_id = :e",
                        e=e4)
        if error is None and stored != 0:
            wrong.append(f"unbalanced entry +{credit}/{debit} USD (off by {imbalance}): "
                         f"committed, its postings sum to {stored}")
    # the entry above committed balanced; a later transaction that adds one posting to it (a
    # "fee leg" added by another code path) unbalances it just the same
    if not any(label.startswith("balanced entry") for label in wrong):
        late = _attempt(bank, [_posting(e3, usd1, "5.00", "USD")])
        if late is None:
            wrong.append("a +5.00 USD posting added in a later transaction to the balanced "
                         "entry above: committed")
    if wrong:
        raise CheckFailure(
            "Ledger entries must balance, and the database must enforce it at commit.",
            expected="an entry whose postings do not sum to zero per currency fails to COMMIT; a "
                     "balanced one commits even though its postings arrive one INSERT at a time",
            actual="; ".join(wrong),
            evidence="a CHECK constraint sees one row, so it cannot sum an entry; an immediate "
                     "trigger sees the first posting alone and refuses every entry; a trigger on "
                     "ledger_entry never sees a posting added to an entry that already exists",
            fix="compare each currency's sum with zero exactly: no round(), no tolerance"
            if all("(off by " in w for w in wrong) else
            "CREATE CONSTRAINT TRIGGER ... AFTER INSERT ON posting DEFERRABLE INITIALLY "
            "DEFERRED FOR EACH ROW: it runs at COMMIT and sums the entry's postings per "
            "currency, raising if any sum is not zero",
            lesson=READ["schema"])


def test_idempotency_keys_are_unique(bank: Engine) -> None:
    require_tables(bank, TABLES, "schema")
    response_type = columns(bank, "idempotency_key")["response"]
    statement = ("INSERT INTO idempotency_key (key, request_hash) VALUES (:k, 'abc')",
                 {"k": "retry-me"})
    first = _attempt(bank, [statement])
    if first is not None:
        raise CheckFailure(
            "An idempotency key could not be stored.",
            expected="INSERT INTO idempotency_key (key, request_hash) commits",
            actual=first_line(first), fix="give the other columns defaults or NULL",
            lesson=READ["idempotency"])
    second = _attempt(bank, [statement])
    # the key alone is unique: the same key for another request (a unique index on key and
    # request_hash, say) is the reuse that must be refused, not stored next to the first
    other_request = False
    if sqlstate(second) == "23505":
        another = _attempt(bank, [(
            "INSERT INTO idempotency_key (key, request_hash, response) "
            "VALUES (:k, 'f3a9c1', '{\"amount\": \"12.37\"}')", {"k": "retry-me"})])
        if sqlstate(another) != "23505":
            other_request, second = True, another
    if sqlstate(second) != "23505":
        raise CheckFailure(
            "The same idempotency key could be stored twice"
            + (", for another request." if other_request else "."),
            expected="a second INSERT of key 'retry-me', with the same request_hash or another, "
                     "refused with SQLSTATE 23505 (unique_violation)",
            actual=("the same key with request_hash 'f3a9c1' (the first row has 'abc'): "
                    if other_request else "the same key and request_hash: ")
                   + ("it committed" if second is None else first_line(second)),
            evidence="the unique index is what makes two racing retries wait for each other; "
                     "without it both see 'no such key' and both move the money. Unique over "
                     "(key, request_hash), two different requests racing on one key both "
                     "insert, and both move money",
            fix="the key alone unique: key text PRIMARY KEY, not PRIMARY KEY (key, request_hash)"
            if other_request else "key text PRIMARY KEY (or UNIQUE)",
            lesson=READ["idempotency"])
    if response_type not in ("jsonb", "json"):
        raise CheckFailure(
            "The stored response should be structured.",
            expected="idempotency_key.response of type jsonb", actual=response_type,
            fix="response jsonb: the receipt the first request answered, replayed on a retry",
            lesson=READ["idempotency"])
