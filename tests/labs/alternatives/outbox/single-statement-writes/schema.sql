-- Alternative schema: uniqueness of an aggregate's versions is a UNIQUE index (which is how
-- PostgreSQL enforces a UNIQUE constraint anyway) rather than a named table constraint; the
-- relay's partial index covers (created_at, id); processed_event has one extra, nullable column.

-- Given: the order service's business table.
CREATE TABLE orders (
    id          uuid        PRIMARY KEY,
    customer_id uuid        NOT NULL,
    total_cents bigint      NOT NULL CHECK (total_cents >= 0),
    version     bigint      NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE outbox_event (
    id                uuid PRIMARY KEY,
    aggregate_type    text NOT NULL,
    aggregate_id      uuid NOT NULL,
    event_type        text NOT NULL,
    aggregate_version bigint NOT NULL,
    payload           jsonb NOT NULL,
    headers           jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at      timestamptz,
    lease_until       timestamptz,
    attempt_count     integer NOT NULL DEFAULT 0,
    last_error        text,
    next_attempt_at   timestamptz
);

CREATE UNIQUE INDEX outbox_event_aggregate_version_uniq
    ON outbox_event (aggregate_type, aggregate_id, aggregate_version);

CREATE INDEX outbox_event_claimable ON outbox_event (created_at, id)
    WHERE published_at IS NULL;

CREATE TABLE processed_event (
    event_id     uuid PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now(),
    event_type   text
);

-- Given: the consumer's read model, updated by consumer.apply_effect.
CREATE TABLE customer_stats (
    customer_id   uuid    PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0,
    total_cents   bigint  NOT NULL DEFAULT 0
);
