"""Stage exchange: a quote with a time-to-live, the source debited and the exchange PENDING
before the provider is called, the call made outside any transaction, lock and pooled
connection, and "no answer" kept apart from "no".

The provider is a real HTTP server; the checks make it stall until released, fail, drop the
connection, or convert and then answer after the caller's timeout."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest
from _support import (
    READ,
    ExchangeKit,
    assert_ledger_agrees,
    balance_of,
    ledger_table,
)

from dojo.checks import CheckFailure, call, first_line, fmt, in_thread, raised, rows, table
from dojo.checks.observers import (
    SESSION_COLUMNS,
    ensure_pgrowlocks,
    open_transactions,
    row_locks,
    sessions,
)

pytestmark = pytest.mark.stage("exchange")

TIMEOUT = 0.4  # the client timeout the checks configure
LATE = 1.5  # how late the provider answers in fill-then-late


def _accounts(kit: ExchangeKit, usd: str = "500.00") -> tuple[int, int]:
    source = call(kit.accounts.open_account, kit.engine, currency="USD")
    call(kit.accounts.deposit, kit.engine, source, Decimal(usd))
    target = call(kit.accounts.open_account, kit.engine, currency="EUR")
    return int(source), int(target)


def _quote(kit: ExchangeKit, fx: Any, ttl: float = 30.0) -> Any:
    return call(kit.exchange.create_quote, kit.engine, fx, kit.clock, sell_currency="USD",
                buy_currency="EUR", ttl_seconds=ttl)


def _exchange(kit: ExchangeKit, fx: Any, quote: Any, source: int, target: int,
              amount: str = "100.00", key: str = "ex-1") -> Any:
    return call(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key=key,
                quote_id=quote.id, from_account_id=source, to_account_id=target,
                sell_amount=Decimal(amount))


def _exchange_rows(kit: ExchangeKit) -> list[dict[str, Any]]:
    return rows(kit.engine, "SELECT id::text AS id, status FROM exchange ORDER BY 1")


def _money(kit: ExchangeKit, source: int, target: int) -> str:
    return (f"source {fmt(balance_of(kit.engine, source))} USD, "
            f"target {fmt(balance_of(kit.engine, target))} EUR")


def test_expired_quote_is_refused(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx, ttl=30)
    if not (isinstance(quote.rate, Decimal) and quote.rate == Decimal("0.92")):
        raise CheckFailure(
            "create_quote must carry the provider's rate as a Decimal.",
            expected="Quote.rate == Decimal('0.92') (GET /v1/rates?sell=USD&buy=EUR)",
            actual=f"{type(quote.rate).__name__} {quote.rate!r}", evidence=kit.provider.history(),
            lesson=READ["exchange"])
    kit.clock.advance(31)
    error = raised(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key="late",
                   quote_id=quote.id, from_account_id=source, to_account_id=target,
                   sell_amount=Decimal("100.00"))
    if not isinstance(error, kit.exchange.QuoteExpired):
        raise CheckFailure(
            "An exchange on a quote 31 s after it was given, with a 30 s time-to-live, must be "
            "refused.",
            expected="exchange.QuoteExpired, nothing debited, no order sent",
            actual=first_line(error) + f"; {_money(kit, source, target)}",
            evidence="the quote's TTL bounds how long the company carries the risk of the rate "
                     "moving; compare expires_at with the clock you are given (clock()), not with "
                     "the database's now() or time.time(): the check moves that clock",
            lesson=READ["exchange"])
    if kit.provider.order_requests() or balance_of(kit.engine, source) != 500:
        raise CheckFailure("A refused exchange still acted.", expected="no order, source 500.00",
                           actual=_money(kit, source, target), evidence=kit.provider.history(),
                           lesson=READ["exchange"])
    fresh = _quote(kit, fx, ttl=30)
    kit.clock.advance(29)
    result = _exchange(kit, fx, fresh, source, target, key="in-time")
    if result.status != "COMPLETED":
        raise CheckFailure(
            "An exchange 29 s into a 30 s quote must go through.",
            expected="COMPLETED", actual=f"{result}", evidence=kit.provider.history(),
            lesson=READ["exchange"])
    reuse = raised(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key="again",
                   quote_id=fresh.id, from_account_id=source, to_account_id=target,
                   sell_amount=Decimal("100.00"))
    if not isinstance(reuse, kit.exchange.QuoteAlreadyUsed):
        raise CheckFailure(
            "A quote is good for one exchange.",
            expected="exchange.QuoteAlreadyUsed for a second exchange (another key) on it",
            actual=first_line(reuse), lesson=READ["exchange"])


def test_exchange_completes_when_the_provider_fills(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    result = _exchange(kit, fx, _quote(kit, fx), source, target)
    orders = kit.provider.order_requests()
    if result.status != "COMPLETED":
        raise CheckFailure(
            "The provider filled the order, so the exchange is COMPLETED.",
            expected="ExchangeResult.status 'COMPLETED'", actual=f"{result}",
            evidence=kit.provider.history(), lesson=READ["exchange"])
    if [o.key for o in orders] != [str(result.exchange_id)]:
        raise CheckFailure(
            "The provider's Idempotency-Key is the exchange id, and one order is sent.",
            expected=f"one POST /v1/orders with Idempotency-Key {result.exchange_id}",
            actual=", ".join(f"key={o.key}" for o in orders) or "no order",
            evidence=kit.provider.history(),
            fix="send str(exchange_id) as the key: reconciliation asks by it, and a resend with "
                "it cannot convert twice", lesson=READ["exchange"])
    got = (balance_of(kit.engine, source), balance_of(kit.engine, target))
    bought = kit.provider.orders[str(result.exchange_id)].bought_amount
    if got != (Decimal("400.00"), bought):
        raise CheckFailure(
            "100.00 USD at 0.92 leaves 400.00 USD and credits what the provider bought.",
            expected=f"source 400.00 USD, target {fmt(bought)} EUR",
            actual=_money(kit, source, target), evidence=ledger_table(kit.engine, target),
            lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after a completed exchange", read="exchange")


def test_provider_is_called_outside_any_transaction(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(timeout=10)
    quote = _quote(kit, fx)
    observe = kit.engine
    have_rowlocks = ensure_pgrowlocks(observe)
    kit.provider.script(place="stall")
    job = in_thread(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key="stall",
                    quote_id=quote.id, from_account_id=source, to_account_id=target,
                    sell_amount=Decimal("100.00"))
    try:
        if not kit.provider.wait_stalled(1, timeout=5):
            job.join(5)
            if isinstance(job.error, CheckFailure):
                raise job.error  # a stub: not written yet
            raise CheckFailure(
                "exchange() never called the provider.",
                expected="POST /v1/orders within 5 s",
                actual=first_line(job.error) if job.error else f"returned {job.value}",
                evidence=kit.provider.history(), lesson=READ["exchange"])
        time.sleep(0.2)  # let whatever the code does around the call settle
        others = sessions(observe, ("account", "exchange", "quote", "idempotency_key",
                                    "posting", "ledger_entry"))
        holding = open_transactions(others)
        locked_rows = row_locks(observe, "account") if have_rowlocks else []
        checked_out = kit.engine.pool.checkedout()  # type: ignore[attr-defined]
        started = time.monotonic()
        probe = in_thread(raised, kit.accounts.withdraw, kit.engine, source, Decimal("1.00"))
        probe.join(2.0)
        waited = time.monotonic() - started
        debited = balance_of(observe, source)
        pending = _exchange_rows(kit)
    finally:
        kit.provider.release()
        job.join(15)
    if holding or locked_rows:
        raise CheckFailure(
            "While the provider was stalled, your code held a database transaction and its "
            "locks.",
            expected="no transaction open and no row lock held during the provider call "
                     "(pg_locks and pgrowlocks show nothing of yours)",
            actual=f"{len(holding)} session(s) idle in transaction; row locks on account "
                   + (", ".join(f"{r['row_id']} ({r['modes']}, pid {r['pids']})"
                                for r in locked_rows) or "none"),
            evidence="pg_stat_activity + pg_locks, taken while the provider was stalled:\n"
                     + table(holding or others, SESSION_COLUMNS)
                     + (f"\na withdrawal of 1.00 from account {source} then waited "
                     f"{waited:.1f} s for that row lock" if probe.alive else ""),
            fix="the provider can take seconds; a row lock held meanwhile blocks every payment "
                "on the account and a pooled connection is gone for the duration. Commit tx 1 "
                "(debit, PENDING), make the call with no transaction open, then settle in tx 2",
            lesson=READ["exchange"])
    if checked_out != 0:
        raise CheckFailure(
            "While the provider was stalled, your code kept a pooled connection checked out.",
            expected="engine.pool.checkedout() == 0 during the call",
            actual=f"{checked_out} connection(s) checked out",
            fix="leave the `with engine.begin()` / `engine.connect()` block before calling",
            lesson=READ["exchange"])
    if probe.alive:
        raise CheckFailure(
            "A withdrawal on the source account waited while the provider was stalled.",
            expected="withdraw(source, 1.00) finishes at once",
            actual=f"still waiting after {waited:.1f} s", lesson=READ["exchange"])
    if not (debited == Decimal("399.00") and [r["status"] for r in pending] == ["PENDING"]):
        raise CheckFailure(
            "The debit and the PENDING exchange must be committed before the provider is "
            "called.",
            expected="during the call: source 399.00 (500.00 - 100.00 exchanged - 1.00 "
                     "probe) and one exchange row, PENDING",
            actual=f"source {fmt(debited)}; exchanges {pending}",
            evidence="the committed PENDING row is the durable record that an exchange started "
                     "(reconciliation finds it after a crash), and the debit stops the customer "
                     "spending the same money while the provider works",
            lesson=READ["exchange"])
    result = job.value
    if not (result is not None and result.status == "COMPLETED"):
        raise CheckFailure(
            "Once released, the provider filled the order.", expected="COMPLETED",
            actual=first_line(job.error) if job.error else f"{result}",
            evidence=kit.provider.history(), lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after the stalled exchange", read="exchange")


def test_timeout_leaves_the_exchange_pending(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(place="fill-then-late", delay=LATE)
    started = time.monotonic()
    result = _exchange(kit, fx, quote, source, target)
    took = time.monotonic() - started
    converted = kit.provider.converted()
    if not (took < TIMEOUT + 0.8):
        raise CheckFailure(
            f"exchange() waited {took:.1f} s for a provider that answers after {LATE} s, with a "
            f"{TIMEOUT} s timeout configured.",
            expected=f"FxClient(timeout={TIMEOUT}) gives up after about {TIMEOUT} s",
            actual=f"{took:.2f} s; {result}", evidence=kit.provider.history(),
            fix="urllib.request.urlopen(request, timeout=self.timeout): without a timeout one "
                "hung provider holds a thread for ever", lesson=READ["exchange"])
    source_now, target_now = balance_of(kit.engine, source), balance_of(kit.engine, target)
    if not (result.status == "PENDING" and source_now == Decimal("400.00") and target_now == 0):
        raise CheckFailure(
            "The provider converted the order but answered after the timeout: the outcome "
            "is unknown to the caller, so the exchange must stay PENDING.",
            expected="status PENDING, source still debited (400.00 USD), target not credited",
            actual=f"status {result.status}; {_money(kit, source, target)}",
            evidence="the provider's side:\n" + kit.provider.history()
                     + f"\nit converted: {', '.join(converted) or 'nothing'}"
                     + ("\nrefunding now pays the customer twice: the 100.00 USD back AND the "
                     f"{fmt(converted[str(result.exchange_id)].bought_amount)} EUR the "
                     "provider bought: double money"
                     if result.status == "FAILED" and str(result.exchange_id) in converted
                     else ""),
            fix="a timeout means 'I don't know', never 'it failed': leave the exchange "
                "PENDING and let reconcile() ask the provider",
            lesson=READ["reconcile"])
    assert_ledger_agrees(kit.engine, "after a timed-out exchange", read="exchange")


def test_server_error_or_reset_leaves_the_exchange_pending(kit: ExchangeKit) -> None:
    source, target = _accounts(kit, usd="300.00")
    fx = kit.client(TIMEOUT)
    for mode, key, meaning in (
            ("fill-then-fail", "ex-500", "converted, then answered 500"),
            ("drop", "ex-reset", "closed the connection without an answer")):
        quote = _quote(kit, fx)
        kit.provider.script(place=mode)
        result = _exchange(kit, fx, quote, source, target, key=key)
        if result.status != "PENDING":
            raise CheckFailure(
                f"The provider {meaning}: the caller cannot know whether it converted.",
                expected="status PENDING, the source still debited",
                actual=f"status {result.status}; {_money(kit, source, target)}",
                evidence=kit.provider.history(),
                fix="only FILLED (credit) and REJECTED (refund) are answers; a 5xx, a reset, a "
                    "timeout or an unreadable body leave the exchange PENDING",
                lesson=READ["reconcile"])
    if not (balance_of(kit.engine, source) == Decimal("100.00") and
            balance_of(kit.engine, target) == 0):
        raise CheckFailure(
            "Two PENDING exchanges of 100.00 from 300.00.",
            expected="source 100.00 USD, target 0.00 EUR",
            actual=_money(kit, source, target), evidence=ledger_table(kit.engine, source),
            lesson=READ["exchange"])


def test_rejected_exchange_is_refunded(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(place="reject")
    result = _exchange(kit, fx, quote, source, target)
    if not (result.status == "FAILED" and balance_of(kit.engine, source) == 500 and
            balance_of(kit.engine, target) == 0):
        raise CheckFailure(
            "The provider refused the order (422 REJECTED): nothing converted, so the "
            "customer gets the money back.",
            expected="status FAILED, source 500.00 USD again, target 0.00 EUR",
            actual=f"status {result.status}; {_money(kit, source, target)}",
            evidence=ledger_table(kit.engine, source),
            fix="tx 2: a REVERSAL entry that credits the source from the fx clearing "
                "account, and status FAILED; never delete the debit postings",
            lesson=READ["exchange"])
    kinds = [r["kind"] for r in rows(kit.engine, "SELECT DISTINCT e.kind FROM posting p JOIN "
                                     "ledger_entry e ON e.id = p.entry_id WHERE "
                                     "p.account_id = :a", a=source)]
    if not (len(kinds) >= 2):
        raise CheckFailure(
            "The refund is a new entry: the ledger keeps the debit and its reversal.",
            expected="the source's postings: the deposit, the exchange debit, the refund",
            actual=str(kinds), evidence=ledger_table(kit.engine, source), lesson=READ["schema"])
    assert_ledger_agrees(kit.engine, "after a rejected exchange", read="exchange")


def test_retried_exchange_moves_money_once(kit: ExchangeKit) -> None:
    from dojo.checks.faults import run_concurrently

    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    outcomes = run_concurrently(lambda _: kit.exchange.exchange(
        kit.engine, fx, kit.clock, idempotency_key="twice", quote_id=quote.id,
        from_account_id=source, to_account_id=target, sell_amount=Decimal("100.00")), 8,
        timeout=20)
    ids = {str(o.value.exchange_id) for o in outcomes if o.ok}
    broken = [o for o in outcomes if not o.ok]
    if not (len(ids) == 1 and not broken):
        raise CheckFailure(
            "8 retries of one exchange (same idempotency key) at once must be one exchange.",
            expected="every retry returns the same exchange_id; one debit; one provider order key",
            actual=f"{len(ids)} exchange ids; {len(broken)} retries raised"
                   + (f" ({first_line(broken[0].error)})" if broken else ""),
            evidence=kit.provider.history(), lesson=READ["idempotency"])
    keys = {o.key for o in kit.provider.order_requests()}
    if not (balance_of(kit.engine, source) == Decimal("400.00") and len(keys) == 1):
        raise CheckFailure(
            "Retries debited or ordered more than once.",
            expected="source 400.00 USD; orders with one key",
            actual=f"{_money(kit, source, target)}; {len(keys)} order keys",
            evidence=kit.provider.history(), lesson=READ["idempotency"])


QUOTE_RACERS = 8
# every plain SELECT that reads the quote answers late: "is it used?" is asked by all at once
SLOW_QUOTE_READ = 0.1
PLAIN_QUOTE_SELECT = r"(?s)^\s*select(?!.*\bfor\s+(no\s+key\s+)?update).*\bquote\b"


def test_one_quote_buys_one_exchange_when_requests_race(kit: ExchangeKit) -> None:
    from dojo.checks.faults import run_concurrently, slow_sql

    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)

    def spend(index: int) -> Any:
        return kit.exchange.exchange(
            kit.engine, fx, kit.clock, idempotency_key=f"spend-{index}", quote_id=quote.id,
            from_account_id=source, to_account_id=target, sell_amount=Decimal("50.00"))

    with slow_sql(kit.engine, SLOW_QUOTE_READ, match=PLAIN_QUOTE_SELECT):
        outcomes = run_concurrently(spend, QUOTE_RACERS, timeout=30)
    ok = [o for o in outcomes if o.ok]
    used = [o for o in outcomes if isinstance(o.error, kit.exchange.QuoteAlreadyUsed)]
    other = [o for o in outcomes if not o.ok and o not in used]
    keys = {o.key for o in kit.provider.order_requests()}
    debited = balance_of(kit.engine, source)
    if not (len(ok) == 1 and len(used) == QUOTE_RACERS - 1 and len(keys) == 1 and
            debited == Decimal("450.00")):
        raise CheckFailure(
            f"{QUOTE_RACERS} exchanges on one quote, each with its own idempotency key, "
            "arrived at the same moment: the quote bought more than one exchange.",
            expected=f"exactly 1 exchange goes through; {QUOTE_RACERS - 1} raise "
                     "exchange.QuoteAlreadyUsed; one order at the provider; source 450.00 USD",
            actual=f"{len(ok)} went through, {len(used)} QuoteAlreadyUsed, {len(other)} "
                   f"raised something else"
                   + (f" ({first_line(other[0].error)})" if other else "")
                   + f"; {len(keys)} order(s) at the provider; {_money(kit, source, target)}",
            evidence="exchanges recorded:\n" + table(_exchange_rows(kit), ("id", "status"))
                     + f"\n(every plain SELECT on quote answered "
                    f"{SLOW_QUOTE_READ * 1000:.0f} ms late, so each request read "
                    "'not used yet' before any of them marked it)",
            fix="reading used_at and then marking the quote is check-then-act. Claim it in "
                "one statement: UPDATE quote SET used_at = :now WHERE id = :id AND used_at IS "
                "NULL (zero rows: QuoteAlreadyUsed), or SELECT ... FOR UPDATE the quote row "
                "before checking, or a unique constraint on exchange.quote_id",
            lesson=(READ["exchange"], READ["check-then-act"]))
    assert_ledger_agrees(kit.engine, "after racing exchanges on one quote", read="exchange")
