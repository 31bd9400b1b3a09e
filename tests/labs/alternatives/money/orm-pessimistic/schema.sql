-- The money service for the ORM implementation (models.py mirrors these tables).
-- numeric(19,2): 17 integer digits, two decimals, exact.

CREATE TABLE account (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind           text          NOT NULL DEFAULT 'CUSTOMER',
    currency       char(3)       NOT NULL,
    balance        numeric(19,2) NOT NULL DEFAULT 0,
    version        bigint        NOT NULL DEFAULT 0,   -- SQLAlchemy's version_id_col
    customer_id    bigint,
    system_purpose text,                               -- 'clearing' on SYSTEM accounts
    opened_at      timestamptz   NOT NULL DEFAULT now(),
    CHECK (kind IN ('CUSTOMER', 'SYSTEM')),
    CONSTRAINT customer_balance_never_negative CHECK (kind = 'SYSTEM' OR balance >= 0)
);
CREATE UNIQUE INDEX account_system_per_currency ON account (system_purpose, currency)
    WHERE kind = 'SYSTEM';

CREATE TABLE ledger_entry (
    id          uuid PRIMARY KEY,
    kind        text NOT NULL,
    description text,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE posting (
    id         bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entry_id   uuid          NOT NULL REFERENCES ledger_entry (id),
    account_id bigint        NOT NULL REFERENCES account (id),
    amount     numeric(19,2) NOT NULL,
    currency   char(3)       NOT NULL
);
CREATE INDEX posting_account ON posting (account_id, id);
CREATE INDEX posting_entry ON posting (entry_id);

CREATE FUNCTION forbid_ledger_rewrite() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger is append-only (% on %)', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER posting_no_rewrite BEFORE UPDATE OR DELETE ON posting
    FOR EACH ROW EXECUTE FUNCTION forbid_ledger_rewrite();
CREATE TRIGGER ledger_entry_no_rewrite BEFORE UPDATE OR DELETE ON ledger_entry
    FOR EACH ROW EXECUTE FUNCTION forbid_ledger_rewrite();
CREATE TRIGGER posting_no_truncate BEFORE TRUNCATE ON posting
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_ledger_rewrite();
CREATE TRIGGER ledger_entry_no_truncate BEFORE TRUNCATE ON ledger_entry
    FOR EACH STATEMENT EXECUTE FUNCTION forbid_ledger_rewrite();

CREATE FUNCTION check_entry_sums() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    off record;
BEGIN
    FOR off IN SELECT currency, sum(amount) AS total FROM posting
                WHERE entry_id = NEW.entry_id GROUP BY currency LOOP
        IF off.total <> 0 THEN
            RAISE EXCEPTION 'entry %: % postings sum to %, not 0', NEW.entry_id, off.currency, off.total
                USING ERRCODE = 'check_violation';
        END IF;
    END LOOP;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER posting_sum_zero AFTER INSERT ON posting
    INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION check_entry_sums();

CREATE TABLE idempotency_key (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    key          text  NOT NULL UNIQUE,
    request_hash text  NOT NULL,
    response     jsonb,
    created_at   timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE quote (
    id            uuid PRIMARY KEY,
    sell_currency char(3)       NOT NULL,
    buy_currency  char(3)       NOT NULL,
    rate          numeric(18,8) NOT NULL,
    expires_at    timestamptz   NOT NULL,
    consumed_by   uuid                      -- the exchange that used it
);

CREATE TABLE exchange (
    id              uuid PRIMARY KEY,
    quote_id        uuid          NOT NULL REFERENCES quote (id),
    from_account_id bigint        NOT NULL,
    to_account_id   bigint        NOT NULL,
    sell_currency   char(3)       NOT NULL,
    buy_currency    char(3)       NOT NULL,
    rate            numeric(18,8) NOT NULL,
    sell_amount     numeric(19,2) NOT NULL,
    buy_amount      numeric(19,2) NOT NULL,
    status          text          NOT NULL DEFAULT 'PENDING',
    failure         text,
    order_ref       text,
    created_at      timestamptz   NOT NULL,
    lease_until     timestamptz,              -- a reconciler is asking the provider
    CHECK (status IN ('PENDING', 'COMPLETED', 'FAILED'))
);
CREATE INDEX exchange_pending ON exchange (created_at) WHERE status = 'PENDING';
