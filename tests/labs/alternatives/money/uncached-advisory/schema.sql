-- The money service's schema: accounts with a cached balance, an append-only double-entry
-- ledger that refuses unbalanced entries, idempotency keys with their stored responses,
-- rate quotes and exchanges. Runs on an empty database.

-- Accounts. Customer accounts never go below zero; SYSTEM accounts (deposit clearing,
-- fx clearing, interest) are the other side of every movement and may go negative.
CREATE TABLE account (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    customer_id bigint,
    kind        text          NOT NULL DEFAULT 'CUSTOMER' CHECK (kind IN ('CUSTOMER', 'SYSTEM')),
    -- SYSTEM accounts of the service: 'deposits', 'fx', 'interest'. NULL is allowed (a
    -- SYSTEM account opened by an admin tool with only kind and currency), and the unique
    -- index below treats NULLs as distinct.
    purpose     text,
    currency    char(3)       NOT NULL CHECK (currency ~ '^[A-Z]{3}$'),
    balance     numeric(18,2) NOT NULL DEFAULT 0,
    -- bumped by every statement that changes the balance: the optimistic lock of
    -- apply_interest compares it (stage lost-updates)
    version     bigint        NOT NULL DEFAULT 0,
    CONSTRAINT customer_balance_not_negative CHECK (kind = 'SYSTEM' OR balance >= 0),
    UNIQUE (id, currency)                        -- target of posting's (account, currency) key
);
CREATE UNIQUE INDEX one_system_account_per_purpose ON account (purpose, currency)
    WHERE kind = 'SYSTEM';

-- One business movement: a deposit, a withdrawal, a transfer, one leg of an exchange, a
-- reversal. Its postings sum to zero per currency.
CREATE TABLE ledger_entry (
    id          uuid        PRIMARY KEY,
    kind        text        NOT NULL,
    reverses    uuid        REFERENCES ledger_entry (id),
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE posting (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entry_id    uuid          NOT NULL REFERENCES ledger_entry (id),
    account_id  bigint        NOT NULL,
    amount      numeric(18,2) NOT NULL CHECK (amount <> 0),     -- signed: + in, - out
    currency    char(3)       NOT NULL,
    -- a posting is in its account's currency, always
    FOREIGN KEY (account_id, currency) REFERENCES account (id, currency)
);
-- statements read "the latest postings of an account" (stage n-plus-one)
CREATE INDEX posting_by_account ON posting (account_id, id);
CREATE INDEX posting_by_entry ON posting (entry_id);

-- Append-only, enforced: history is corrected with new (reversal) entries, never edited.
CREATE FUNCTION refuse_ledger_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only: % on % is refused; post a reversal entry',
        TG_OP, TG_TABLE_NAME USING ERRCODE = 'restrict_violation';
END
$$;
CREATE TRIGGER posting_append_only BEFORE UPDATE OR DELETE ON posting
    FOR EACH ROW EXECUTE FUNCTION refuse_ledger_change();
CREATE TRIGGER posting_no_truncate BEFORE TRUNCATE ON posting
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_ledger_change();
CREATE TRIGGER ledger_entry_append_only BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION refuse_ledger_change();
CREATE TRIGGER ledger_entry_no_truncate BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_ledger_change();

-- Zero-sum, enforced at COMMIT: a CHECK sees one row, so a deferred constraint trigger sums
-- the entry's postings once all of them are in.
CREATE FUNCTION refuse_unbalanced_entry() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    unbalanced record;
BEGIN
    SELECT currency, sum(amount) AS imbalance INTO unbalanced
      FROM posting WHERE entry_id = NEW.entry_id
     GROUP BY currency HAVING sum(amount) <> 0
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'ledger entry % does not balance: its % postings sum to %',
            NEW.entry_id, unbalanced.currency, unbalanced.imbalance
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER entry_postings_sum_to_zero AFTER INSERT ON posting
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION refuse_unbalanced_entry();

-- Idempotency: the key is claimed by INSERT ... ON CONFLICT DO NOTHING in the same
-- transaction as the money movement, and the response is stored with it.
CREATE TABLE idempotency_key (
    key          text        PRIMARY KEY,
    request_hash text        NOT NULL,          -- SHA-256 of the canonical request
    response     jsonb,                         -- what the first request answered
    created_at   timestamptz NOT NULL DEFAULT now()
);

-- Exchange (stages exchange and reconciliation).
CREATE TABLE quote (
    id            uuid          PRIMARY KEY,
    sell_currency char(3)       NOT NULL,
    buy_currency  char(3)       NOT NULL,
    rate          numeric(20,8) NOT NULL CHECK (rate > 0),
    created_at    timestamptz   NOT NULL,      -- from the service's clock, like expires_at
    expires_at    timestamptz   NOT NULL,
    used_at       timestamptz
);

CREATE TABLE exchange (
    id                uuid          PRIMARY KEY,   -- also the provider's Idempotency-Key
    quote_id          uuid          NOT NULL UNIQUE REFERENCES quote (id),
    from_account_id   bigint        NOT NULL REFERENCES account (id),
    to_account_id     bigint        NOT NULL REFERENCES account (id),
    sell_currency     char(3)       NOT NULL,
    sell_amount       numeric(18,2) NOT NULL CHECK (sell_amount > 0),
    buy_currency      char(3)       NOT NULL,
    buy_amount        numeric(18,2) NOT NULL CHECK (buy_amount > 0),  -- quoted; filled on completion
    status            text          NOT NULL DEFAULT 'PENDING'
                                    CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED')),
    debit_entry_id    uuid          NOT NULL REFERENCES ledger_entry (id),
    provider_order_id text,
    failure_reason    text,
    created_at        timestamptz   NOT NULL,      -- from the service's clock
    finished_at       timestamptz
);
-- the reconciliation job's claim: old PENDING exchanges, oldest first
CREATE INDEX exchange_pending ON exchange (created_at) WHERE status = 'PENDING';
