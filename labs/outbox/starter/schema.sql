-- The lab's schema. The checks run this file on a fresh, empty database before each check.
-- The order service and, to keep the lab small, the consumer's tables live in one database;
-- in production the consumer keeps processed_event and customer_stats in its own.

-- Given: the order service's business table. Ids are assigned by the application (no
-- DEFAULT), so the outbox row can carry the order id in the same transaction.
CREATE TABLE orders (
    id          uuid        PRIMARY KEY,
    customer_id uuid        NOT NULL,
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

-- TODO (stage schema): CREATE TABLE outbox_event (...) with the 13 columns the README lists:
--   id, aggregate_type, aggregate_id, event_type, aggregate_version, payload, headers,
--   created_at, published_at, lease_until, attempt_count, last_error, next_attempt_at
-- plus UNIQUE (aggregate_type, aggregate_id, aggregate_version)
-- and a partial index for the relay: CREATE INDEX … WHERE published_at IS NULL;

-- TODO (stage idempotent-consumer): CREATE TABLE processed_event (...): one row per event
-- the consumer has applied, keyed by the event id.

-- Given: the consumer's read model, updated by consumer.apply_effect.
CREATE TABLE customer_stats (
    customer_id   uuid    PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0,
    total_cents   bigint  NOT NULL DEFAULT 0
);
