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


# One round trip. The LATERAL subquery takes each account's latest postings through the
# (account_id, id) index, so the cost follows the rows returned, not the ledger's size.
STATEMENTS = text("""
    SELECT a.id AS account_id, a.currency, a.balance,
           p.id AS posting_id, p.entry_id, p.amount, e.kind
      FROM account a
      LEFT JOIN LATERAL (
            SELECT id, entry_id, amount FROM posting
             WHERE account_id = a.id
             ORDER BY id DESC
             LIMIT :recent) p ON true
      LEFT JOIN ledger_entry e ON e.id = p.entry_id
     WHERE a.id = ANY(:ids)
     ORDER BY a.id, p.id DESC
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
        for row in conn.execute(STATEMENTS, {"ids": ids, "recent": recent}):
            statement = out.get(row.account_id)
            if statement is None:
                statement = out[row.account_id] = AccountStatement(
                    row.account_id, row.currency, Decimal(row.balance), [])
            if row.posting_id is not None:
                statement.recent.append(PostingLine(row.posting_id, str(row.entry_id),
                                                    row.kind, Decimal(row.amount)))
    return out
