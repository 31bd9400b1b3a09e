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

-- Yours (stage idempotent-effect): processed_events, one row per booked event id,
-- written in the same transaction as the effect.

-- Yours (stage order-per-key): a table of parked keys (how many of the key's messages wait
-- in the DLT, which one must come back first, and the source offset of the last change).
