"""Account statements through the ORM: accounts, their postings and each posting's entry
as mapped objects."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import Engine, ForeignKey, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship


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


class Base(DeclarativeBase):
    pass


class Entry(Base):
    __tablename__ = "ledger_entry"
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    kind: Mapped[str]


class Posting(Base):
    __tablename__ = "posting"
    id: Mapped[int] = mapped_column(primary_key=True)
    entry_id: Mapped[uuid.UUID] = mapped_column(ForeignKey("ledger_entry.id"))
    account_id: Mapped[int] = mapped_column(ForeignKey("account.id"))
    amount: Mapped[Decimal]
    entry: Mapped[Entry] = relationship()


class Account(Base):
    __tablename__ = "account"
    id: Mapped[int] = mapped_column(primary_key=True)
    currency: Mapped[str]
    balance: Mapped[Decimal]
    # lazy="select" (the default): loaded on first access, one query per account
    postings: Mapped[list[Posting]] = relationship(order_by=Posting.id.desc())


def statements(engine: Engine, account_ids: Sequence[int], *, recent: int = 5
               ) -> dict[int, AccountStatement]:
    """For each account id: its currency, balance and its `recent` latest postings (newest
    first, by posting id). Unknown ids are left out."""
    out: dict[int, AccountStatement] = {}
    with Session(engine) as session:
        for account in session.scalars(select(Account).where(Account.id.in_(account_ids))):
            lines = [PostingLine(p.id, str(p.entry_id), p.entry.kind, p.amount)
                     for p in account.postings[:recent]]
            out[account.id] = AccountStatement(account.id, account.currency.strip(),
                                               account.balance, lines)
    return out
