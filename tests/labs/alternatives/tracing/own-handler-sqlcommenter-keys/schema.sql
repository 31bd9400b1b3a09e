-- Given: the order service's tables. Nothing to write here.

CREATE TABLE orders (
    id          uuid PRIMARY KEY,
    customer_id uuid NOT NULL,
    sku         text NOT NULL,
    quantity    integer NOT NULL CHECK (quantity > 0),
    total_cents bigint NOT NULL CHECK (total_cents >= 0),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- Written by the consumer, one row per order it ships.
CREATE TABLE shipments (
    order_id   uuid PRIMARY KEY,
    sku        text NOT NULL,
    quantity   integer NOT NULL CHECK (quantity > 0),
    shipped_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
