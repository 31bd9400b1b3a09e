-- Alternative schema: same contract, different shapes. The aggregate id is stored as text (the
-- README allows uuid or text), there are three extra columns (each with a default), and the
-- relay's partial index is a composite one.

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
    id                  uuid        PRIMARY KEY,
    aggregate_type      text        NOT NULL,
    aggregate_id        text        NOT NULL,
    event_type          text        NOT NULL,
    aggregate_version   bigint      NOT NULL CHECK (aggregate_version >= 1),
    payload             jsonb       NOT NULL,
    headers             jsonb       NOT NULL DEFAULT '{}'::jsonb,
    created_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    published_at        timestamptz,
    lease_until         timestamptz,
    attempt_count       integer     NOT NULL DEFAULT 0,
    last_error          text,
    next_attempt_at     timestamptz,
    -- extras: where the broker put the record, and the envelope's schema version
    published_partition integer     DEFAULT NULL,
    published_offset    bigint      DEFAULT NULL,
    envelope_version    smallint    NOT NULL DEFAULT 1,
    CONSTRAINT outbox_event_aggregate_version_key
        UNIQUE (aggregate_type, aggregate_id, aggregate_version)
);

-- The relay's working set: unpublished rows only, in claim order (id breaks created_at ties).
CREATE INDEX outbox_event_pending_idx ON outbox_event (created_at, id)
    WHERE published_at IS NULL;

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
