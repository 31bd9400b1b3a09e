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

-- One row per event whose effect is in the ledger, written in the effect's transaction.
-- The primary key is the idempotency guard; the other columns are for people.
CREATE TABLE processed_events (
    event_id   uuid        NOT NULL,
    account    text        NOT NULL,
    kind       text        NOT NULL CHECK (kind IN ('deposit', 'withdrawal')),
    booked_at  timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT processed_events_pkey PRIMARY KEY (event_id)
);

-- Accounts (record keys) whose messages wait in the dead-letter topic.
CREATE TABLE held_accounts (
    record_key     bytea       NOT NULL PRIMARY KEY,
    pending        integer     NOT NULL CHECK (pending >= 0),  -- messages of it in the DLT
    head_sha256    bytea,                                      -- NULL: next replayed is head
    guard_partition integer    NOT NULL,                       -- source position of the
    guard_offset   bigint      NOT NULL,                       --   last change (redeliveries)
    held_since     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now()
);
