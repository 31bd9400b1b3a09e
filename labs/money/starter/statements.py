"""Account statements: many accounts with their latest postings, in a bounded number of
queries however many accounts are asked for.

Core SQL or the ORM (sqlalchemy.orm) are both fine; the checks count the statements sent
through the engine they pass in."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from decimal import Decimal

from sqlalchemy import Engine


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
    raise NotImplementedError(
        "load the accounts and the latest `recent` postings of all of them (with their "
        "entry's kind) in a fixed number of queries, not one query per account")
