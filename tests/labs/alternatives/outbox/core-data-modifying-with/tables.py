"""SQLAlchemy Core table definitions shared by the modules (design C: Core, not text())."""
from sqlalchemy import (BigInteger, Column, Integer, MetaData, Table, Text, func, literal_column)
from sqlalchemy.dialects.postgresql import JSONB, TIMESTAMP, UUID

metadata = MetaData()

orders = Table(
    "orders", metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("customer_id", UUID(as_uuid=True)),
    Column("total_cents", BigInteger),
    Column("version", BigInteger),
    Column("created_at", TIMESTAMP(timezone=True)),
    Column("updated_at", TIMESTAMP(timezone=True)),
)

outbox_event = Table(
    "outbox_event", metadata,
    Column("id", UUID(as_uuid=True), primary_key=True),
    Column("aggregate_type", Text),
    Column("aggregate_id", UUID(as_uuid=True)),
    Column("event_type", Text),
    Column("aggregate_version", BigInteger),
    Column("payload", JSONB),
    Column("headers", JSONB),
    Column("created_at", TIMESTAMP(timezone=True)),
    Column("published_at", TIMESTAMP(timezone=True)),
    Column("lease_until", TIMESTAMP(timezone=True)),
    Column("attempt_count", Integer),
    Column("last_error", Text),
    Column("next_attempt_at", TIMESTAMP(timezone=True)),
)

processed_event = Table(
    "processed_event", metadata,
    Column("event_id", UUID(as_uuid=True), primary_key=True),
    Column("processed_at", TIMESTAMP(timezone=True)),
)

now = func.clock_timestamp
