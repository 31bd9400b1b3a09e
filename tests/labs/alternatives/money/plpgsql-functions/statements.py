"""Account statements in two queries whatever the number of accounts: the accounts, then
their postings ranked per account with a window function."""

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


def statements(engine: Engine, account_ids: Sequence[int], *, recent: int = 5
               ) -> dict[int, AccountStatement]:
    """For each account id: its currency, balance and its `recent` latest postings (newest
    first, by posting id). Unknown ids are left out."""
    ids = list({int(i) for i in account_ids})
    if not ids:
        return {}
    with engine.connect() as conn:
        result = {row.id: AccountStatement(row.id, row.currency, row.balance, [])
                  for row in conn.execute(text(
                      "SELECT id, currency, balance FROM account WHERE id = ANY(:ids)"),
                      {"ids": ids})}
        if recent > 0 and result:
            for row in conn.execute(text("""
                    SELECT account_id, id, entry_id, amount, kind FROM (
                        SELECT p.account_id, p.id, p.entry_id, p.amount, e.kind,
                               row_number() OVER (PARTITION BY p.account_id ORDER BY p.id DESC) AS n
                          FROM posting p JOIN ledger_entry e ON e.id = p.entry_id
                         WHERE p.account_id = ANY(:ids)) ranked
                     WHERE n <= :recent
                     ORDER BY account_id, id DESC"""), {"ids": list(result), "recent": recent}):
                result[row.account_id].recent.append(
                    PostingLine(row.id, str(row.entry_id), row.kind, row.amount))
    return result
