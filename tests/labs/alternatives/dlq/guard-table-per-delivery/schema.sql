-- Given: the ledger that payments.apply_payment writes. Keep these two tables as they are.
CREATE TABLE ledger_entries (
    id           bigserial   PRIMARY KEY,          -- the order in which effects were applied
    event_id     uuid        NOT NULL,             -- deliberately not unique: duplicates show
    account      text        NOT NULL,
    amount_cents bigint      NOT NULL,             -- signed: a withdrawal is negative
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE balances (
    account       text   PRIMARY KEY,
    balance_cents bigint NOT NULL
);

-- Yours (stage idempotent-effect): one row per event whose effect is in the ledger,
-- written in the same transaction as the effect.
CREATE TABLE processed_events (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Yours (stage order-per-key): keys whose messages wait in the dead-letter topic.
--   waiting           how many of the key's messages are in the DLT, not yet replayed
--   head_fingerprint  sha256 of the value that must come back first (NULL: the next replayed
--                     message of the key is the head)
CREATE TABLE parked_keys (
    key              bytea       PRIMARY KEY,
    waiting          integer     NOT NULL CHECK (waiting >= 0),
    head_fingerprint text,
    parked_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per source record (topic, partition, offset) that changed parked_keys, written in
-- the same transaction as the change: a redelivery finds its row and changes nothing.
CREATE TABLE parked_key_changes (
    source_topic     text        NOT NULL,
    source_partition integer     NOT NULL,
    source_offset    bigint      NOT NULL,
    changed_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (source_topic, source_partition, source_offset)
);
