"""Account statements in ONE statement: each account row carries its latest postings as a
JSON array built by a correlated subquery (amounts travel as text, so they stay exact)."""

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


QUERY = text("""
    SELECT a.id, a.currency, a.balance,
           coalesce((SELECT json_agg(json_build_object(
                                'id', p.id, 'entry', p.entry_id, 'kind', e.kind,
                                'amount', p.amount::text) ORDER BY p.id DESC)
                       FROM (SELECT id, entry_id, amount FROM posting
                              WHERE account_id = a.id ORDER BY id DESC LIMIT :n) p
                       JOIN ledger_entry e ON e.id = p.entry_id), '[]'::json) AS recent
      FROM account a
     WHERE a.id = ANY(:ids)
""")


def statements(engine: Engine, account_ids: Sequence[int], *, recent: int = 5
               ) -> dict[int, AccountStatement]:
    """For each account id: its currency, balance and its `recent` latest postings (newest
    first, by posting id). Unknown ids are left out."""
    if not account_ids:
        return {}
    with engine.connect() as conn:
        rows = conn.execute(QUERY, {"ids": [int(i) for i in account_ids], "n": max(recent, 0)})
        return {row.id: AccountStatement(
                    row.id, row.currency, row.balance,
                    [PostingLine(int(p["id"]), str(p["entry"]), p["kind"], Decimal(p["amount"]))
                     for p in row.recent])
                for row in rows}
