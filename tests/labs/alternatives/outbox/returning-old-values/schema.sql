-- The order service and, to keep the lab small, the consumer's tables in one database.
-- In production the consumer (another service) keeps processed_event and customer_stats in
-- its own database; nothing here relies on them sharing one.

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

-- The outbox: one row per domain event, written in the business transaction.
CREATE TABLE outbox_event (
    id                uuid        PRIMARY KEY,                 -- the event id, set by the app
    aggregate_type    text        NOT NULL,                    -- 'order'
    aggregate_id      uuid        NOT NULL,                    -- becomes the Kafka key
    event_type        text        NOT NULL,                    -- versioned: order.placed.v1
    aggregate_version bigint      NOT NULL,                    -- 1, 2, 3 … per aggregate
    payload           jsonb       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at      timestamptz,                             -- NULL until the broker acked
    lease_until       timestamptz,                             -- a relay owns the row until
    attempt_count     integer     NOT NULL DEFAULT 0,
    last_error        text,
    next_attempt_at   timestamptz,                             -- backoff after a failure
    CONSTRAINT uq_outbox_aggregate_version
        UNIQUE (aggregate_type, aggregate_id, aggregate_version)
);

-- Only unpublished rows are in this index: the relay's claim stays fast with millions of
-- published rows in the table.
CREATE INDEX ix_outbox_unpublished ON outbox_event (created_at) WHERE published_at IS NULL;

-- Consumer side: one row per event already applied.
CREATE TABLE processed_event (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Given: the consumer's read model, updated by consumer.apply_effect.
CREATE TABLE customer_stats (
    customer_id   uuid    PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0,
    total_cents   bigint  NOT NULL DEFAULT 0
);
