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

-- Idempotency marker: the payment's event id. Written by the same statement as the effect.
CREATE TABLE processed_events (
    id          uuid        PRIMARY KEY,
    recorded_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Parked accounts, keyed by the record key in hex.
CREATE TABLE parked_accounts (
    key_hex        text    PRIMARY KEY,
    in_dlt         integer NOT NULL DEFAULT 0 CHECK (in_dlt >= 0),
    head_digest    text,
    last_partition integer NOT NULL,
    last_offset    bigint  NOT NULL
);
