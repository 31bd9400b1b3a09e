"""What only the money checks need: their lesson sections, the tables the README fixes, the
ledger read from the outside, the exchange stages' kit, and the provider's record compared
with the exchanges. Failures, tables, statement records and lock views come from the kit,
`dojo.checks`.

Nothing here reads the learner's internals: only the tables and functions the README fixes.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import ROUND_DOWN, ROUND_HALF_DOWN, ROUND_HALF_EVEN, ROUND_HALF_UP, ROUND_UP, Decimal
from types import ModuleType
from typing import Any

from sqlalchemy import Engine, text

from dojo.checks import CheckFailure, call, first_line, fmt, rows, scalar, table
from dojo.checks.observers import (
    SESSION_COLUMNS,
    ensure_pgrowlocks,
    open_transactions,
    row_locks,
    sessions,
)

# Lesson sections the messages send the learner to.
READ = {
    "numbers": "money-service#money-as-numbers-numeric-and-bigdecimal",
    "schema": "money-service#the-schema-accounts-an-append-only-ledger-postings-that-sum-to-zero",
    "race": "money-service#the-race-read-then-write-versus-one-conditional-update",
    "check": "money-service#check-balance--0-the-last-line-of-defence",
    "idempotency": "money-service#idempotency-keys-a-unique-constraint-and-a-stored-response",
    "transfer": "money-service#two-accounts-select--for-update-in-a-fixed-order",
    "exchange": "money-service#exchange-a-quote-a-pending-record-the-provider-call-outside-the-"
                "transaction",
    "reconcile": "money-service#a-timeout-means-i-dont-know-the-reconciliation-job",
    "breaker": "circuit-breaker#the-state-machine",
    "slow": "circuit-breaker#what-counts-as-a-failure-and-what-counts-as-slow",
    "half-open": "circuit-breaker#half-open-probing-safely",
    "locking": "locking#optimistic-locking-detect-the-conflict-at-write-time",
    "lost-update": "locking#the-problem-both-solve-the-lost-update",
    "deadlock": "locking#lock-order-and-how-deadlocks-happen",
    "check-then-act": "idempotent-consumer#why-check-then-act-is-a-race",
    "n-plus-one": "n-plus-one#the-same-problem-without-an-orm",
    "count-queries": "n-plus-one#detecting-it-count-the-statements",
}

# The tables and columns the README fixes (the checks read and write only these).
TABLES = {
    "account": ("id", "kind", "currency", "balance"),
    "ledger_entry": ("id", "kind"),
    "posting": ("id", "entry_id", "account_id", "amount", "currency"),
    "idempotency_key": ("key", "request_hash", "response"),
}
LATER_TABLES = {"exchange": ("id", "status"), "quote": ("id",)}


def see(keys: str) -> tuple[str, ...]:
    """The lesson sections for space-separated READ keys ("race lost-update")."""
    return tuple(READ.get(key, key) for key in keys.split())


# -- the ledger, read from the outside --------------------------------------------------------

def balance_of(engine: Engine, account_id: int) -> Decimal:
    return Decimal(scalar(engine, "SELECT balance FROM account WHERE id = :id", id=account_id))


def posted_sum(engine: Engine, account_id: int) -> Decimal:
    return Decimal(scalar(engine, "SELECT coalesce(sum(amount), 0) FROM posting "
                                  "WHERE account_id = :id", id=account_id))


def postings_of(engine: Engine, account_id: int) -> list[dict[str, Any]]:
    return rows(engine, "SELECT p.id, p.entry_id, e.kind, p.amount, p.currency FROM posting p "
                        "JOIN ledger_entry e ON e.id = p.entry_id WHERE p.account_id = :id "
                        "ORDER BY p.id", id=account_id)


def ledger_problems(engine: Engine, account_ids: Sequence[int] | None = None) -> list[str]:
    """What is wrong with the ledger: customer balances that differ from their postings,
    entries whose postings do not sum to zero per currency, postings in another currency than
    their account's, negative customer balances."""
    problems = []
    filter_ids = "AND a.id = ANY(:ids)" if account_ids is not None else ""
    params = {"ids": list(account_ids)} if account_ids is not None else {}
    for r in rows(engine, f"""
            SELECT a.id, a.balance, coalesce(sum(p.amount), 0) AS postings
              FROM account a LEFT JOIN posting p ON p.account_id = a.id
             WHERE a.kind = 'CUSTOMER' {filter_ids}
             GROUP BY a.id, a.balance HAVING a.balance <> coalesce(sum(p.amount), 0)
             ORDER BY a.id""", **params):
        problems.append(f"account {r['id']}: balance {fmt(r['balance'])} but its postings "
                        f"sum to {fmt(r['postings'])}")
    for r in rows(engine, """
            SELECT entry_id, currency, sum(amount) AS imbalance, count(*) AS legs
              FROM posting GROUP BY entry_id, currency HAVING sum(amount) <> 0
             ORDER BY entry_id LIMIT 5"""):
        problems.append(f"entry {r['entry_id']}: its {r['currency']} postings "
                        f"({r['legs']}) sum to {fmt(r['imbalance'])}, not 0")
    for r in rows(engine, """
            SELECT p.id, p.entry_id, p.currency, a.id AS account_id, a.kind,
                   a.currency AS account_currency
              FROM posting p JOIN account a ON a.id = p.account_id
             WHERE p.currency <> a.currency ORDER BY p.id LIMIT 5"""):
        problems.append(f"posting {r['id']} of entry {r['entry_id']}: {r['currency']} on "
                        f"account {r['account_id']}, a {r['account_currency']} "
                        f"{r['kind']} account (a posting is in its account's currency)")
    for r in rows(engine, "SELECT id, balance FROM account WHERE kind = 'CUSTOMER' "
                          "AND balance < 0 ORDER BY id"):
        problems.append(f"account {r['id']}: negative balance {fmt(r['balance'])}")
    return problems


def assert_ledger_agrees(engine: Engine, what: str, account_ids: Sequence[int] | None = None,
                         read: str = "schema") -> None:
    """Fail when ledger_problems finds anything. No fix line: a balance that differs from its
    postings can come from a lost update as well as from postings written apart."""
    problems = ledger_problems(engine, account_ids)
    if problems:
        raise CheckFailure(
            f"{what}: the balances and the ledger disagree.",
            expected="every customer balance equals the sum of its postings, every entry's "
                     "postings sum to zero per currency, each in its account's currency",
            actual=f"{len(problems)} problem(s)", evidence="\n".join(problems[:10]),
            lesson=see(read))


def ledger_table(engine: Engine, account_id: int, limit: int = 12) -> str:
    return table(postings_of(engine, account_id), ("id", "kind", "amount", "currency",
                                                   "entry_id"), limit)


# -- clocks -----------------------------------------------------------------------------------

# Where the stopped clock starts: years away from the database's now() and time.time(), and
# not on a whole second, so code that mixes them up, or rounds, is seen at once.
STOPPED_AT = datetime(2031, 5, 17, 9, 30, 12, 345678, tzinfo=UTC)


class StoppedClock:
    """`clock()` for the exchange stages: it reads STOPPED_AT until the check moves it with
    `advance(seconds)`, so an age or an expiry can be put exactly on its boundary."""

    def __init__(self, start: datetime = STOPPED_AT) -> None:
        self._now = start
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += timedelta(seconds=seconds)


# -- the exchange stages' kit ----------------------------------------------------------------

@dataclass
class ClientKit:
    """The learner's provider client and breaker, the provider the check runs, a clock: all
    a check of the client alone needs (no database)."""

    fx_client: ModuleType
    breaker: ModuleType
    provider: Any  # _provider.FxProvider
    clock: Any  # StoppedClock, or InstantClock where real durations matter

    def client(self, timeout: float = 1.0, breaker: Any = None) -> Any:
        """The learner's FxClient pointed at the check's provider."""
        return call(self.fx_client.FxClient, self.provider.url, timeout=timeout,
                    breaker=breaker)


@dataclass
class ExchangeKit(ClientKit):
    """ClientKit, with the learner's accounts and exchange modules on a database, and the
    sell amount of every exchange the check started (the README fixes no column for it, so
    the check remembers what it asked for)."""

    accounts: ModuleType = field(default=None)  # type: ignore[assignment]
    exchange: ModuleType = field(default=None)  # type: ignore[assignment]
    engine: Engine = field(default=None)  # type: ignore[assignment]
    sold: dict[str, Decimal] = field(default_factory=dict)

    def quote(self, fx: Any, sell: str = "USD", buy: str = "EUR", ttl: float = 30.0) -> Any:
        return call(self.exchange.create_quote, self.engine, fx, self.clock,
                    sell_currency=sell, buy_currency=buy, ttl_seconds=ttl)

    def start(self, fx: Any, quote: Any, source: int, target: int, amount: Decimal | str,
              key: str) -> Any:
        """exchange(...) as a learner's caller would call it (a stub's NotImplementedError
        becomes NotWritten); the result's exchange id is remembered with its amount."""
        return self.remember(call(self.exchange.exchange, self.engine, fx, self.clock,
                                  idempotency_key=key, quote_id=quote.id,
                                  from_account_id=source, to_account_id=target,
                                  sell_amount=Decimal(amount)), Decimal(amount))

    def remember(self, result: Any, amount: Decimal) -> Any:
        exchange_id = getattr(result, "exchange_id", None)
        if exchange_id is not None:
            self.sold[str(exchange_id)] = amount
        return result

    def sold_amount(self, exchange_id: str) -> Decimal | None:
        """What the exchange sold: as the check asked, or as the provider received it."""
        if exchange_id in self.sold:
            return self.sold[exchange_id]
        for request in self.provider.order_requests():
            if request.key == exchange_id and request.body:
                return Decimal(str(request.body.get("sell_amount")))
        return None


def held_during_call(engine: Engine, tables: Sequence[str]) -> dict[str, Any]:
    """What the code under test holds right now (call it while the provider or a rule is
    stalled): sessions idle in transaction or holding locks on `tables`, row locks on
    account (pgrowlocks, where it exists) and pooled connections checked out."""
    have_rowlocks = ensure_pgrowlocks(engine)
    found = sessions(engine, tables)
    return {"sessions": found, "holding": open_transactions(found),
            "row_locks": row_locks(engine, "account") if have_rowlocks else [],
            "checked_out": engine.pool.checkedout()}  # type: ignore[attr-defined]


def assert_nothing_held(held: dict[str, Any], during: str, read: str, note: str = "") -> None:
    """Fail when `held` (from held_during_call) shows a transaction, a row lock or a pooled
    connection kept through `during` ("the provider's answer to get_rate", say)."""
    if held["holding"] or held["row_locks"]:
        raise CheckFailure(
            f"While {during} was outstanding, your code held a database transaction open.",
            expected="no session idle in transaction and no lock of yours during the call "
                     "(pg_stat_activity, pg_locks, pgrowlocks)",
            actual=f"{len(held['holding'])} session(s) in a transaction; row locks on account: "
                   + (", ".join(f"{r['row_id']} ({r['modes']})" for r in held["row_locks"])
                      or "none"),
            evidence="pg_stat_activity + pg_locks, taken during the call:\n"
                     + table(held["holding"] or held["sessions"], SESSION_COLUMNS)
                     + (f"\n{note}" if note else ""),
            fix="finish the transaction (leave the `with engine.begin()` block) before the "
                "call, and open a new one for what comes after it",
            lesson=see(read))
    if held["checked_out"]:
        raise CheckFailure(
            f"While {during} was outstanding, your code kept a pooled connection checked out.",
            expected="engine.pool.checkedout() == 0 during the call",
            actual=f"{held['checked_out']} connection(s) checked out",
            evidence="a connection held through a remote call is one the pool cannot lend to "
                     "the payments arriving meanwhile; under load the pool runs dry",
            fix="leave the `with engine.connect()` / `engine.begin()` block before calling",
            lesson=see(read))


# -- races ------------------------------------------------------------------------------------

def first_of(problems: Sequence[str], noun: str = "anomaly") -> str:
    """How many `problems` and the first of them, for an `actual:` line whose shape does not
    change with how many a race happened to produce (`all_of` gives the rest as evidence)."""
    return f"{len(problems)} {noun}(s); the first: {problems[0]}" if problems else "none"


def all_of(problems: Sequence[str], limit: int = 12) -> str:
    """The problems, one a line, for the evidence."""
    shown = [f"- {p}" for p in problems[:limit]]
    if len(problems) > limit:
        shown.append(f"- ... and {len(problems) - limit} more")
    return "\n".join(shown)


def failures(outcomes: Sequence[Any], allowed: tuple[type[BaseException], ...] = ()
             ) -> list[Any]:
    """Outcomes that raised something other than `allowed` (refusals the API documents)."""
    return [o for o in outcomes if o.error is not None and not isinstance(o.error, allowed)]


def describe_errors(outcomes: Sequence[Any], limit: int = 4) -> str:
    lines = [f"worker {o.index}: {first_line(o.error)}" for o in outcomes[:limit]]
    if len(outcomes) > limit:
        lines.append(f"… and {len(outcomes) - limit} more")
    return "\n".join(lines)


def keyed_requests(url: str, account_id: int, other_id: int) -> list[str]:
    """In a process of its own (another hash seed): a keyed deposit of 12.37 to account_id and
    a keyed transfer of 3.21 from it to other_id, through the learner's accounts module.
    Returns their entry ids."""
    import accounts  # the learner's: its directory is first on the child's sys.path
    from sqlalchemy import create_engine

    engine = create_engine(url, pool_size=2, max_overflow=0)
    try:
        deposited = accounts.deposit(engine, account_id, Decimal("12.37"),
                                     idempotency_key="proc-dep")
        moved = accounts.transfer(engine, account_id, other_id, Decimal("3.21"),
                                  idempotency_key="proc-tr")
        return [str(deposited.entry_id), str(moved.entry_id)]
    finally:
        engine.dispose()


def process_hammer(impl_dir: str, url: str, account_id: int, seed: int, operations: int,
                   index: int) -> list[list[str]]:
    """One hammering process: `operations` deposits and withdrawals on one account through the
    learner's accounts module, each run in a process of its own. Returns [op, amount, result]
    with result "ok", "refused" (InsufficientFunds) or the error."""
    import random
    import sys

    from sqlalchemy import create_engine

    sys.path.insert(0, impl_dir)
    import accounts

    engine = create_engine(url, pool_size=4, max_overflow=0)
    rng = random.Random(seed * 1000 + index)
    out: list[list[str]] = []
    lock = threading.Lock()

    def worker(n: int) -> None:
        for _ in range(n):
            op = rng.choice(("deposit", "withdraw", "withdraw"))
            amount = Decimal(rng.choice(("1.10", "2.35", "3.05", "0.45")))
            try:
                getattr(accounts, op)(engine, account_id, amount)
                result = "ok"
            except accounts.InsufficientFunds:
                result = "refused"
            except Exception as exc:
                result = f"{type(exc).__name__}: {exc}"[:200]
            with lock:
                out.append([op, str(amount), result])

    threads = [threading.Thread(target=worker, args=(operations // 4,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    engine.dispose()
    return out


# -- exchanges against what the provider did -------------------------------------------------

def exchange_anomalies(kit: ExchangeKit, source: int, target: int, funded_with: Decimal
                       ) -> tuple[list[str], str]:
    """Compare every exchange (status) with what the provider recorded (converted or not) and
    the customer balances with both. Returns (named anomalies, a table of the evidence).

    Reads only exchange.id and exchange.status: the amounts are the check's own (what it
    asked each exchange to sell) and the provider's (what it bought)."""
    statuses = {r["id"]: r["status"] for r in rows(kit.engine, "SELECT id::text AS id, status "
                                                               "FROM exchange")}
    order = list(kit.sold) + sorted(set(statuses) - set(kit.sold))
    converted = kit.provider.converted()
    anomalies: list[str] = []
    evidence = []
    refunded_or_open = credited = Decimal(0)
    for exchange_id in order:
        status = statuses.get(exchange_id)
        if status is None:
            continue
        order_ = converted.get(exchange_id)
        provider_says = ("converted, bought " + fmt(order_.bought_amount)) if order_ else (
            "rejected" if exchange_id in kit.provider.orders else
            "voided (NOT_FOUND)" if exchange_id in kit.provider.voided else "never received")
        sold = kit.sold_amount(exchange_id)
        evidence.append({"exchange": exchange_id, "sold": fmt(sold) if sold is not None
                         else "?", "status": status, "provider": provider_says})
        if status == "FAILED" and order_:
            anomalies.append(f"double money: exchange {exchange_id} was refunded, but the "
                             f"provider converted it ({fmt(order_.bought_amount)} bought)")
        if status == "COMPLETED" and not order_:
            anomalies.append(f"money from nowhere: exchange {exchange_id} was credited, but "
                             "the provider never converted it")
        if status != "FAILED" and sold is not None:
            refunded_or_open += sold
        if status == "COMPLETED" and order_:
            credited += order_.bought_amount
    src, dst = balance_of(kit.engine, source), balance_of(kit.engine, target)
    owed = funded_with - refunded_or_open
    if src != owed:
        anomalies.append(f"source balance {fmt(src)}, expected {fmt(owed)} (funded "
                         f"{fmt(funded_with)}, minus the exchanges not refunded): "
                         f"{'refunded twice' if src > owed else 'debited twice'}")
    if dst != credited:
        anomalies.append(f"target balance {fmt(dst)}, expected {fmt(credited)} (what the "
                         f"provider bought for the COMPLETED exchanges): "
                         + ("credited more than the provider bought" if dst > credited
                            else "credited less than the provider bought"))
    return anomalies, table(evidence, ("exchange", "sold", "status", "provider"))


# -- a COMMIT that fails, from the database ----------------------------------------------------

INJECTED = "dojo: this COMMIT fails on purpose"
_COMMIT_FAULT = f"""
CREATE TABLE IF NOT EXISTS dojo_commit_fault (account_id bigint PRIMARY KEY);
CREATE OR REPLACE FUNCTION dojo_fail_commit() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF EXISTS (SELECT 1 FROM dojo_commit_fault WHERE account_id = NEW.account_id) THEN
        RAISE EXCEPTION USING MESSAGE = '{INJECTED}: a posting on account '
            || NEW.account_id || ' (the check injects this failure)';
    END IF;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS dojo_fail_commit ON posting;
CREATE CONSTRAINT TRIGGER dojo_fail_commit AFTER INSERT ON posting
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION dojo_fail_commit();
"""


def assert_result_amounts(kit: ExchangeKit, result: Any, quote: Any, sold: str,
                          what: str, *, retry: bool = False, read: str = "exchange") -> None:
    """The README's contract for ExchangeResult's amounts: sell_amount is what was sold;
    buy_amount, in the buy currency, is the provider's bought_amount once COMPLETED and the
    quote's estimate (sell_amount x the provider's rate the quote stored, rounded to the cent,
    a half cent either way) while PENDING or once FAILED. `retry`: `result` answered a retry
    with the key."""
    from _provider import RATES  # here: a check's child process imports this module alone

    amount = Decimal(sold)
    # the rate the provider quoted (the learner's quote may have lost digits storing it)
    rate = RATES.get((quote.sell_currency, quote.buy_currency), Decimal(quote.rate))
    exact = amount * rate
    estimates = {exact.quantize(CENT, rounding) for rounding in (ROUND_HALF_EVEN, ROUND_HALF_UP)}
    order = kit.provider.orders.get(str(result.exchange_id))
    if result.status == "COMPLETED":
        want = [order.bought_amount] if order is not None and order.bought_amount else []
        said = (f"{fmt(want[0])} {quote.buy_currency}, the bought_amount of the provider's "
                "FILLED answer" if want else "the provider's bought_amount")
    else:
        want = sorted(estimates)
        said = (f"{' or '.join(fmt(e) for e in want)} {quote.buy_currency}: the quote's "
                f"estimate, {fmt(amount)} x {rate} rounded to the cent")
    sell, buy = getattr(result, "sell_amount", None), getattr(result, "buy_amount", None)
    if (isinstance(sell, Decimal) and sell == amount and isinstance(buy, Decimal)
            and buy in want):
        return
    raise CheckFailure(
        f"{what}: exchange() returned {result.status}, with amounts that are not the README's.",
        expected=f"sell_amount {fmt(amount)} {quote.sell_currency}; buy_amount {said}",
        actual=f"sell_amount {sell!r}, buy_amount {buy!r}",
        evidence="ExchangeResult.buy_amount is in the quote's buy currency: once COMPLETED what "
                 "the provider bought (what the target was credited), before that the quote's "
                 "estimate",
        fix=_amounts_fix(result.status, buy, want, estimates, order, amount, rate, exact,
                         retry),
        lesson=READ[read])


CENT = Decimal("0.01")


def _amounts_fix(status: str, buy: Any, want: list[Decimal], estimates: set[Decimal],
                 order: Any, amount: Decimal, rate: Decimal, exact: Decimal,
                 retry: bool) -> str | None:
    """The fix line for assert_result_amounts, only when the amount it got identifies the
    mistake."""
    if not isinstance(buy, Decimal) or buy in want:
        return None
    if status == "COMPLETED":
        if buy not in estimates:
            return None
        if retry:
            return ("a retry returns the exchange as it stands: store the bought_amount in the "
                    "exchange's row when you settle it, and answer a retry from that row, not "
                    "the estimate stored when it was placed")
        return ("once the provider FILLED, answer its bought_amount (read the row you settled), "
                "not the quote's estimate")
    short = rate.quantize(CENT)
    if short != rate and buy in {(amount * short).quantize(CENT, rounding)
                                 for rounding in (ROUND_HALF_EVEN, ROUND_HALF_UP)}:
        return (f"the estimate used the rate cut to two decimals ({fmt(short)} for {rate}): "
                "store and use the provider's rate as it came (numeric with more decimals, "
                "such as numeric(20,8))")
    if order is not None and order.bought_amount and buy == order.bought_amount:
        return ("until the exchange is COMPLETED (the target credited), answer it as its row "
                "stands, with the quote's estimate: not the bought_amount of a FILLED answer you "
                "did not book")
    if buy == exact:
        return "round the estimate to the cent: quantize(Decimal('0.01'))"
    half = exact * 1000 % 10 == 5 and exact * 1000 % 1 == 0  # an exact half cent: 5.435
    plain = format(exact.normalize(), "f")
    if not half and buy == exact.quantize(CENT, ROUND_DOWN):
        return "round the estimate to the nearest cent (half-even or half-up), not down"
    if not half and buy == exact.quantize(CENT, ROUND_UP):
        return "round the estimate to the nearest cent (half-even or half-up), not up"
    if half and buy == exact.quantize(CENT, ROUND_HALF_DOWN):
        floated = Decimal(repr(round(float(amount) * float(rate), 2))) == buy
        return (f"an exact half cent ({plain}) rounds up or to the even cent "
                "(ROUND_HALF_UP or ROUND_HALF_EVEN), not down (ROUND_HALF_DOWN, ROUND_DOWN)"
                + (f"; and compute it in Decimal: in binary floating point {plain} is a "
                   f"hair under the half, so round(float, 2) gives {fmt(buy)} too"
                   if floated else ""))
    return None


class failing_commits:  # noqa: N801 - used as a context manager, like contextlib's
    """While active, the COMMIT of any transaction that wrote a posting on `account_id`
    fails (a deferred constraint trigger of the check's own, on the README's posting table).
    Whatever the code sends, SQL text or one function call, the database refuses the whole
    transaction at its last step, as a crash or a lost connection at COMMIT would."""

    def __init__(self, engine: Engine, account_id: int) -> None:
        self.engine = engine
        self.account_id = account_id

    def __enter__(self) -> failing_commits:
        with self.engine.begin() as conn:
            conn.exec_driver_sql(_COMMIT_FAULT)
            conn.execute(text("INSERT INTO dojo_commit_fault VALUES (:a) ON CONFLICT DO NOTHING"),
                         {"a": self.account_id})
        return self

    def __exit__(self, *exc: object) -> None:
        with self.engine.begin() as conn:
            conn.execute(text("DELETE FROM dojo_commit_fault WHERE account_id = :a"),
                         {"a": self.account_id})


def injected(error: BaseException | None) -> bool:
    """The error is (or wraps) the failure failing_commits injected."""
    seen: BaseException | None = error
    while seen is not None:
        if INJECTED in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def assert_quote_stays_used(kit: ExchangeKit, fx: Any, quote: Any, source: int, target: int,
                            what: str, read: str) -> None:
    """A second exchange (another key) on `quote`, whose exchange was refunded (`what`), is
    refused with QuoteAlreadyUsed, debits nothing and sends no order: a quote is used by the
    exchange that took it, whatever became of that exchange."""
    before, sent_before = balance_of(kit.engine, source), len(kit.provider.order_requests())
    try:
        again: Any = kit.exchange.exchange(
            kit.engine, fx, kit.clock, idempotency_key=f"again-{quote.id}", quote_id=quote.id,
            from_account_id=source, to_account_id=target, sell_amount=Decimal("41.37"))
    except Exception as exc:
        again = exc
    sent = len(kit.provider.order_requests()) - sent_before
    after = balance_of(kit.engine, source)
    if isinstance(again, kit.exchange.QuoteAlreadyUsed) and not sent and after == before:
        return
    went_through = not isinstance(again, BaseException)
    raise CheckFailure(
        f"Quote {quote.id}: {what}. A second exchange of 41.37 on the same quote, with "
        "another idempotency key, was not refused as QuoteAlreadyUsed.",
        expected="exchange.QuoteAlreadyUsed, nothing debited, no order sent: a quote is good "
                 "for one exchange, and a refunded (FAILED) exchange used it as much as a "
                 "completed one",
        actual=(f"it returned {again}" if went_through else first_line(again))
               + f"; {sent} order(s) sent; source {fmt(before)} before, {fmt(after)} after",
        evidence=kit.provider.history(),
        fix="a refund gives the money back, not the quote: keep the quote marked used (do not "
            "clear used_at, and do not count only COMPLETED exchanges as using it)"
        if went_through else None,
        lesson=read)


def keyed_deposit(url: str, account_id: int, amount: str, key: str) -> str:
    """In a process of its own: deposit(account_id, amount, idempotency_key=key) through the
    learner's accounts module (the check kills it while it waits). Returns the entry id."""
    import accounts  # the learner's: its directory is first on the child's sys.path
    from sqlalchemy import create_engine

    engine = create_engine(url, pool_size=2, max_overflow=0)
    return str(accounts.deposit(engine, account_id, Decimal(amount), idempotency_key=key)
               .entry_id)
