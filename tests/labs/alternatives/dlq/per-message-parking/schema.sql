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

CREATE TABLE processed_events (
    event_id     uuid        PRIMARY KEY,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- One row per source record of a parked key that went to the DLT (not per key): the key is
-- parked while it has an unreleased row; its head is the unreleased row with the lowest seq.
-- A row is identified by the source position of the record that put it there, so that a
-- redelivery adds nothing; a replayed copy that was booked releases the head and records
-- its own position, in the booking's transaction.
CREATE TABLE dead_lettered_messages (
    src_partition      integer NOT NULL,
    src_offset         bigint  NOT NULL,
    record_key         bytea   NOT NULL,
    value_sha256       text    NOT NULL,
    seq                bigserial,
    parked_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    released_partition integer,
    released_offset    bigint,
    PRIMARY KEY (src_partition, src_offset)
);
CREATE INDEX dead_lettered_messages_waiting
    ON dead_lettered_messages (record_key, seq) WHERE released_offset IS NULL;
CREATE INDEX dead_lettered_messages_released
    ON dead_lettered_messages (released_partition, released_offset);
