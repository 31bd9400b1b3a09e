-- Alternative schema: the relay records who holds a lease and where the broker put each
-- record. Every extra column has a default. The uniqueness rule lists the same three columns
-- in another order; the relay's index is partial and also INCLUDEs the columns it filters on.

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
    id                uuid        NOT NULL,
    aggregate_type    text        NOT NULL,
    aggregate_id      uuid        NOT NULL,
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
    lease_owner       text        NULL DEFAULT NULL,
    kafka_partition   integer     NULL DEFAULT NULL,
    kafka_offset      bigint      NULL DEFAULT NULL,
    CONSTRAINT outbox_event_pkey PRIMARY KEY (id),
    CONSTRAINT outbox_event_one_event_per_version
        UNIQUE (aggregate_id, aggregate_type, aggregate_version)
);

CREATE INDEX outbox_event_unpublished
    ON outbox_event USING btree (created_at) INCLUDE (lease_until, next_attempt_at)
    WHERE (published_at IS NULL);

CREATE TABLE processed_event (
    event_id     uuid        NOT NULL PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT now()
);

-- Given: the consumer's read model, updated by consumer.apply_effect.
CREATE TABLE customer_stats (
    customer_id   uuid    PRIMARY KEY,
    orders_placed integer NOT NULL DEFAULT 0,
    total_cents   bigint  NOT NULL DEFAULT 0
);
