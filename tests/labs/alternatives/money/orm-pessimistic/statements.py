"""Account statements with the ORM: the accounts, then their latest postings ranked with a
window function; two statements whatever the number of accounts."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from models import Account, LedgerEntry, Posting
from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session


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
    wanted = sorted({int(i) for i in account_ids})
    if not wanted:
        return {}
    with Session(engine) as session:
        out = {a.id: AccountStatement(a.id, a.currency, a.balance, [])
               for a in session.scalars(select(Account).where(Account.id.in_(wanted)))}
        if not out or recent <= 0:
            return out
        ranked = (select(Posting.account_id, Posting.id, Posting.entry_id, Posting.amount,
                         LedgerEntry.kind,
                         func.row_number().over(partition_by=Posting.account_id,
                                                order_by=Posting.id.desc()).label("rank"))
                  .join(LedgerEntry, LedgerEntry.id == Posting.entry_id)
                  .where(Posting.account_id.in_(list(out)))
                  .subquery())
        for line in session.execute(select(ranked).where(ranked.c.rank <= recent)
                                    .order_by(ranked.c.account_id, ranked.c.id.desc())):
            out[line.account_id].recent.append(
                PostingLine(line.id, str(line.entry_id), line.kind, line.amount))
    return out
