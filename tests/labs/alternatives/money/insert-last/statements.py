"""Account statements in two queries, in one REPEATABLE READ snapshot: the accounts, then
every asked account's latest postings, ranked with a window function."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import Engine, text


@dataclass(frozen=True)
class PostingLine:
    posting_id: int
    entry_id: str
    kind: str  # the ledger entry's kind: DEPOSIT, WITHDRAWAL, TRANSFER, ...
    amount: Decimal


@dataclass(frozen=True)
class AccountStatement:
    account_id: int
    currency: str
    balance: Decimal
    recent: list[PostingLine] = field(default_factory=list)  # newest first


ACCOUNTS = text("SELECT id, currency, balance FROM account WHERE id = ANY(:ids)")
LATEST = text("""
    SELECT r.account_id, r.id, r.entry_id, r.amount, e.kind
      FROM (SELECT p.account_id, p.id, p.entry_id, p.amount,
                   row_number() OVER (PARTITION BY p.account_id ORDER BY p.id DESC) AS n
              FROM posting p
             WHERE p.account_id = ANY(:ids)) r
      JOIN ledger_entry e ON e.id = r.entry_id
     WHERE r.n <= :recent
     ORDER BY r.account_id, r.id DESC
""")


def statements(engine: Engine, account_ids: Sequence[int], *, recent: int = 5
               ) -> dict[int, AccountStatement]:
    ids = list({int(i) for i in account_ids})
    if not ids:
        return {}
    with engine.connect().execution_options(isolation_level="REPEATABLE READ") as conn:
        with conn.begin():
            accounts = conn.execute(ACCOUNTS, {"ids": ids}).all()
            lines = conn.execute(LATEST, {"ids": ids, "recent": recent}).all()
    out = {a.id: AccountStatement(a.id, a.currency, Decimal(a.balance), []) for a in accounts}
    for line in lines:
        if line.account_id in out:
            out[line.account_id].recent.append(
                PostingLine(line.id, str(line.entry_id), line.kind, Decimal(line.amount)))
    return out
