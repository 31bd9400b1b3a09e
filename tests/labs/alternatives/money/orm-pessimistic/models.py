"""ORM models of schema.sql. Account uses SQLAlchemy's version_id_col: every flush of an
Account bumps `version` and adds `WHERE version = <the version it loaded>`, raising
StaleDataError when another transaction changed the row first (optimistic locking)."""

from __future__ import annotations

import uuid
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import CHAR, BigInteger, ForeignKey, Identity, Numeric, Text
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class Account(Base):
    __tablename__ = "account"
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    currency: Mapped[str] = mapped_column(CHAR(3))
    balance: Mapped[Decimal] = mapped_column(Numeric(19, 2), default=Decimal("0"))
    version: Mapped[int] = mapped_column(BigInteger)
    customer_id: Mapped[int | None] = mapped_column(BigInteger)
    system_purpose: Mapped[str | None] = mapped_column(Text)
    __mapper_args__ = {"version_id_col": version}


class LedgerEntry(Base):
    __tablename__ = "ledger_entry"
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True, default=uuid.uuid4)
    kind: Mapped[str] = mapped_column(Text)
    description: Mapped[str | None] = mapped_column(Text)


class Posting(Base):
    __tablename__ = "posting"
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    entry_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), ForeignKey("ledger_entry.id"))
    account_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("account.id"))
    amount: Mapped[Decimal] = mapped_column(Numeric(19, 2))
    currency: Mapped[str] = mapped_column(CHAR(3))


class IdempotencyKey(Base):
    __tablename__ = "idempotency_key"
    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    key: Mapped[str] = mapped_column(Text, unique=True)
    request_hash: Mapped[str] = mapped_column(Text)
    response: Mapped[Any | None] = mapped_column(JSONB)


class QuoteRow(Base):
    __tablename__ = "quote"
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    sell_currency: Mapped[str] = mapped_column(CHAR(3))
    buy_currency: Mapped[str] = mapped_column(CHAR(3))
    rate: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    expires_at: Mapped[datetime] = mapped_column(TIMESTAMP(timezone=True))
    consumed_by: Mapped[uuid.UUID | None] = mapped_column(UUID(as_uuid=True))


class ExchangeRow(Base):
    __tablename__ = "exchange"
    id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), primary_key=True)
    quote_id: Mapped[uuid.UUID] = mapped_column(UUID(as_uuid=True), ForeignKey("quote.id"))
    from_account_id: Mapped[int] = mapped_column(BigInteger)
    to_account_id: Mapped[int] = mapped_column(BigInteger)
    sell_currency: Mapped[str] = mapped_column(CHAR(3))
    buy_currency: Mapped[str] = mapped_column(CHAR(3))
    rate: Mapped[Decimal] = mapped_column(Numeric(18, 8))
    sell_amount: Mapped[Decimal] = mapped_column(Numeric(19, 2))
    buy_amount: Mapped[Decimal] = mapped_column(Numeric(19, 2))
    status: Mapped[str] = mapped_column(Text, default="PENDING")
    failure: Mapped[str | None] = mapped_column(Text)
    order_ref: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TIMESTAMP(timezone=True))
    lease_until: Mapped[datetime | None] = mapped_column(TIMESTAMP(timezone=True))
