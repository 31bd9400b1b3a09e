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

-- The outbox (design: text aggregate id, unique *index* instead of a constraint).
CREATE TABLE outbox_event (
    id                uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      text        NOT NULL,
    event_type        text        NOT NULL,
    aggregate_version bigint      NOT NULL,
    payload           jsonb       NOT NULL,
    headers           jsonb       NOT NULL DEFAULT '{}',
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at      timestamptz NULL,
    lease_until       timestamptz NULL,
    attempt_count     integer     NOT NULL DEFAULT 0,
    last_error        text        NULL,
    next_attempt_at   timestamptz NULL,
    PRIMARY KEY (id)
);
CREATE UNIQUE INDEX outbox_event_aggregate_version_key
    ON outbox_event (aggregate_id, aggregate_version, aggregate_type);
CREATE INDEX outbox_event_pending ON outbox_event (created_at) WHERE published_at IS NULL;

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
