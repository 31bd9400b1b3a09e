-- Given: the ledger that payments.apply_payment writes. Keep these two tables as they are.
CREATE TABLE ledger_entries (
    id           bigserial   PRIMARY KEY,
    event_id     uuid        NOT NULL,
    account      text        NOT NULL,
    amount_cents bigint      NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE balances (
    account       text   PRIMARY KEY,
    balance_cents bigint NOT NULL
);

CREATE TABLE processed_events (
    event_id uuid PRIMARY KEY
);

-- parked keys, the key as lowercase hex of its bytes (bijective, NUL-safe)
CREATE TABLE parked_keys (
    key_hex  text    PRIMARY KEY,
    waiting  integer NOT NULL CHECK (waiting >= 0),
    head_sha text
);

-- per source partition, the last offset that changed a parked key (redeliveries count once)
CREATE TABLE parked_key_offsets (
    key_hex      text    NOT NULL REFERENCES parked_keys (key_hex) ON DELETE CASCADE,
    src_partition integer NOT NULL,
    last_offset  bigint  NOT NULL,
    PRIMARY KEY (key_hex, src_partition)
);
