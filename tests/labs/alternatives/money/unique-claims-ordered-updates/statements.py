"""Account statements: many accounts with their latest postings, in a bounded number of
queries however many accounts are asked for (one here: a LATERAL join)."""

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


# Two round trips, whatever the number of accounts: the accounts, then every asked-for
# account's latest postings ranked per account with a window function.
ACCOUNTS = text("SELECT id, currency, balance FROM account WHERE id = ANY(:ids)")
POSTINGS = text("""
    SELECT r.account_id, r.id, r.entry_id, r.amount, e.kind
      FROM (SELECT p.account_id, p.id, p.entry_id, p.amount,
                   row_number() OVER (PARTITION BY p.account_id ORDER BY p.id DESC) AS rn
              FROM posting p WHERE p.account_id = ANY(:ids)) r
      JOIN ledger_entry e ON e.id = r.entry_id
     WHERE r.rn <= :recent
     ORDER BY r.account_id, r.id DESC
""")


def statements(engine: Engine, account_ids: Sequence[int], *, recent: int = 5
               ) -> dict[int, AccountStatement]:
    """For each account id: its currency, balance and its `recent` latest postings (newest
    first, by posting id). Unknown ids are left out."""
    ids = sorted({int(i) for i in account_ids})
    if not ids:
        return {}
    out: dict[int, AccountStatement] = {}
    with engine.connect() as conn:
        for row in conn.execute(ACCOUNTS, {"ids": ids}):
            out[row.id] = AccountStatement(row.id, row.currency, Decimal(row.balance), [])
        if out and recent > 0:
            for row in conn.execute(POSTINGS, {"ids": sorted(out), "recent": recent}):
                out[row.account_id].recent.append(
                    PostingLine(row.id, str(row.entry_id), row.kind, Decimal(row.amount)))
    return out
