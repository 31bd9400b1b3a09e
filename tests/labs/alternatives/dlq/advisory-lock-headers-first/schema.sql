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
    account      text        NOT NULL,
    signed_cents bigint      NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Yours (stage order-per-key): keys whose messages wait in the dead-letter topic.
--   waiting           how many of the key's messages are in the DLT, not yet replayed
--   head_fingerprint  sha256 of the value that must come back first (NULL: the next replayed
--                     message of the key is the head)
--   last_offsets      per source partition, the offset that last changed the row, so that
--                     a redelivery after a crash does not count the same message twice
--                     ({"0": 17, "2": 30}: a replayed copy goes to its key's partition,
--                     which need not be where the original was read)
CREATE TABLE parked_keys (
    key              bytea       PRIMARY KEY,
    waiting          integer     NOT NULL CHECK (waiting >= 0),
    head_fingerprint text,
    last_offsets     jsonb       NOT NULL,
    parked_at        timestamptz NOT NULL DEFAULT clock_timestamp()
);
