"""Stage exchange: a quote with a time-to-live, the source debited and the exchange PENDING
before the provider is called, the call made outside any transaction, lock and pooled
connection, and "no answer" kept apart from "no".

The provider is a real HTTP server; the checks make it stall until released, fail, drop the
connection, or convert and then answer after the caller's timeout."""

from __future__ import annotations

import http.client
import time
from decimal import Decimal
from typing import Any

import pytest
from _support import (
    READ,
    ClientKit,
    ExchangeKit,
    assert_ledger_agrees,
    assert_nothing_held,
    assert_quote_stays_used,
    assert_result_amounts,
    balance_of,
    exchange_anomalies,
    failing_commits,
    held_during_call,
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


QUOTE_TTL = 30.0  # the time-to-live of a quote the checks take, unless they say otherwise


def _quote(kit: ExchangeKit, fx: Any, ttl: float = QUOTE_TTL) -> Any:
    return kit.quote(fx, ttl=ttl)


def _exchange(kit: ExchangeKit, fx: Any, quote: Any, source: int, target: int,
              amount: str = "100.00", key: str = "ex-1") -> Any:
    return kit.start(fx, quote, source, target, amount, key)


def _refusal(kit: ExchangeKit, fx: Any, quote: Any, source: int, target: int,
             amount: str | float, key: str) -> BaseException | None:
    """What exchange(...) raised (None: it returned). A str amount is sent as a Decimal, a
    float as it is (a JSON number a caller did not convert)."""
    return raised(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key=key,
                  quote_id=quote.id, from_account_id=source, to_account_id=target,
                  sell_amount=Decimal(amount) if isinstance(amount, str) else amount)


def _refusal_or_result(kit: ExchangeKit, fx: Any, quote: Any, source: int, target: int,
                       amount: str, key: str) -> Any:
    """What exchange(...) returned, or what it raised."""
    try:
        return call(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key=key,
                    quote_id=quote.id, from_account_id=source, to_account_id=target,
                    sell_amount=Decimal(amount))
    except CheckFailure:
        raise  # a stub: not written yet
    except Exception as exc:
        return exc


def _exchange_rows(kit: ExchangeKit) -> list[dict[str, Any]]:
    return rows(kit.engine, "SELECT id::text AS id, status FROM exchange ORDER BY 1")


def _money(kit: ExchangeKit, source: int, target: int) -> str:
    return (f"source {fmt(balance_of(kit.engine, source))} USD, "
            f"target {fmt(balance_of(kit.engine, target))} EUR")


def test_expired_quote_is_refused(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    # fractional TTLs: an expiry that is rounded to whole seconds errs on one side or the other
    quote = _quote(kit, fx, ttl=29.6)
    if not (isinstance(quote.rate, Decimal) and quote.rate == Decimal("0.92")):
        raise CheckFailure(
            "create_quote must carry the provider's rate as a Decimal.",
            expected="Quote.rate == Decimal('0.92') (GET /v1/rates?sell=USD&buy=EUR)",
            actual=f"{type(quote.rate).__name__} {quote.rate!r}", evidence=kit.provider.history(),
            lesson=READ["exchange"])
    kit.clock.advance(29.6)
    error = raised(kit.exchange.exchange, kit.engine, fx, kit.clock, idempotency_key="late",
                   quote_id=quote.id, from_account_id=source, to_account_id=target,
                   sell_amount=Decimal("100.00"))
    if not isinstance(error, kit.exchange.QuoteExpired):
        raise CheckFailure(
            "An exchange on a quote 29.6 s after it was given, with a 29.6 s time-to-live, must "
            "be refused: at expires_at the quote has expired.",
            expected="exchange.QuoteExpired, nothing debited, no order sent",
            actual=first_line(error) + f"; {_money(kit, source, target)}",
            evidence="the quote's TTL bounds how long the company carries the risk of the rate "
                     "moving; compare expires_at with the clock you are given (clock()), not with "
                     "the database's now() or time.time(): the check's clock stands still "
                     f"until it moves it, and reads {kit.clock():%Y-%m-%d %H:%M:%S.%f} now",
            lesson=READ["exchange"])
    if kit.provider.order_requests() or balance_of(kit.engine, source) != 500:
        raise CheckFailure("A refused exchange still acted.", expected="no order, source 500.00",
                           actual=_money(kit, source, target), evidence=kit.provider.history(),
                           lesson=READ["exchange"])
    fresh = _quote(kit, fx, ttl=2.4)
    kit.clock.advance(2.3)
    result = _exchange(kit, fx, fresh, source, target, key="in-time")
    if result.status != "COMPLETED":
        raise CheckFailure(
            "An exchange 2.3 s into a quote with a 2.4 s time-to-live must go through.",
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


FILL_RATE = Decimal("0.9137")  # the provider fills at its own price, not the quote's 0.92


def test_exchange_completes_when_the_provider_fills(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(fill_rate=FILL_RATE)
    result = _exchange(kit, fx, quote, source, target, amount="123.45")
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
    quoted = (Decimal("123.45") * quote.rate).quantize(Decimal("0.01"))
    if got != (Decimal("376.55"), bought):
        raise CheckFailure(
            f"123.45 USD sold: the provider filled at {FILL_RATE} (not the quote's "
            f"{quote.rate}) and bought {fmt(bought)} EUR; the target gets what it bought.",
            expected=f"source 376.55 USD, target {fmt(bought)} EUR (the bought_amount of the "
                     "provider's FILLED answer)",
            actual=_money(kit, source, target),
            evidence=ledger_table(kit.engine, target),
            fix="credit the bought_amount of the FILLED answer, not sell_amount x the quote's "
                "rate: the provider decides what it bought"
            if got[1] == quoted else None, lesson=READ["exchange"])
    assert_result_amounts(kit, result, quote, "123.45", "123.45 USD sold, filled at "
                          f"{FILL_RATE}")
    kit.provider.script(fill_rate=None)
    pounds = call(kit.accounts.open_account, kit.engine, currency="GBP")
    call(kit.accounts.deposit, kit.engine, pounds, Decimal("80.05"))
    dollars = call(kit.accounts.open_account, kit.engine, currency="USD")
    sterling = kit.quote(fx, sell="GBP", buy="USD")
    second = kit.start(fx, sterling, pounds, dollars, "33.33", "gbp-usd")
    bought = kit.provider.orders.get(str(second.exchange_id))
    want = (Decimal("46.72"), bought.bought_amount if bought else None)
    got = (balance_of(kit.engine, pounds), balance_of(kit.engine, dollars))
    if second.status != "COMPLETED" or got != want:
        raise CheckFailure(
            "An exchange of 33.33 GBP into USD (rate 1.27) did not settle in those currencies.",
            expected=f"COMPLETED; GBP account 46.72, USD account "
                     f"{fmt(want[1]) if want[1] is not None else '(what the provider bought)'}",
            actual=f"{second}; GBP account {fmt(got[0])}, USD account {fmt(got[1])}",
            evidence=kit.provider.history(), lesson=READ["exchange"])
    assert_result_amounts(kit, second, sterling, "33.33", "33.33 GBP sold into USD")
    assert_ledger_agrees(kit.engine, "after completed exchanges", read="exchange")


def test_bad_exchanges_are_refused_before_anything_moves(kit: ExchangeKit) -> None:
    source, target = _accounts(kit, usd="150.00")
    lira = call(kit.accounts.open_account, kit.engine, currency="TRY")
    euros = call(kit.accounts.open_account, kit.engine, currency="EUR")
    call(kit.accounts.deposit, kit.engine, euros, Decimal("50.00"))
    fx = kit.client(TIMEOUT)
    attempts: list[tuple[str, int, int, str | float, Any]] = [
        ("the target account is in TRY, the quote buys EUR", source, lira, "10.00",
         kit.accounts.CurrencyMismatch),
        ("the source account is in EUR, the quote sells USD", euros, target, "10.00",
         kit.accounts.CurrencyMismatch),
        ("150.01 is sold from 150.00", source, target, "150.01", kit.accounts.InsufficientFunds),
        ("the amount is 10.005", source, target, "10.005", ValueError),
        ("the amount is 0", source, target, "0", ValueError),
        ("the amount is -10.00", source, target, "-10.00", ValueError),
        # a JSON number a caller passed on as it came: 10.25 is exact in binary, so only a type
        # check refuses it
        ("the amount is the float 10.25", source, target, 10.25, TypeError | ValueError),
        ("the target account does not exist", source, 987654321, "10.00",
         kit.accounts.AccountNotFound),
    ]
    accounts = {"USD": source, "EUR": target, "TRY": lira, "EUR (2)": euros}
    before = {name: balance_of(kit.engine, a) for name, a in accounts.items()}
    for n, (label, src, dst, amount, wanted) in enumerate(attempts):
        quote = _quote(kit, fx)
        error = _refusal(kit, fx, quote, src, dst, amount, key=f"bad-{n}")
        sent = kit.provider.order_requests()
        after = {name: balance_of(kit.engine, a) for name, a in accounts.items()}
        if not isinstance(error, wanted) or sent or after != before:
            raise CheckFailure(
                f"An exchange where {label} must be refused before anything moves.",
                expected=f"{_names(wanted)}; no order sent; every balance as before",
                actual=(first_line(error) if error else "it returned")
                       + f"; {len(sent)} order(s) sent; balances "
                       + ", ".join(f"{name} {fmt(after[name])}" for name in accounts),
                evidence=kit.provider.history(), lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after refused exchanges", read="exchange")


def _names(wanted: Any) -> str:
    """An exception class, or a union of them, as the README names them."""
    classes = getattr(wanted, "__args__", None) or (wanted,)
    return " or ".join(c.__name__ if c.__module__ == "builtins" else
                       f"{c.__module__}.{c.__name__}" for c in classes)


def test_quote_is_created_outside_any_transaction(kit: ExchangeKit) -> None:
    fx = kit.client(timeout=10)
    kit.provider.script(rates="stall")
    job = in_thread(kit.exchange.create_quote, kit.engine, fx, kit.clock,
                    sell_currency="USD", buy_currency="EUR", ttl_seconds=30)
    try:
        if not kit.provider.wait_stalled(1, timeout=5):
            job.join(5)
            if isinstance(job.error, CheckFailure):
                raise job.error  # a stub: not written yet
            raise CheckFailure(
                "create_quote() never asked the provider for a rate.",
                expected="GET /v1/rates within 5 s",
                actual=first_line(job.error) if job.error else f"returned {job.value}",
                evidence=kit.provider.history(), lesson=READ["exchange"])
        time.sleep(0.2)  # let whatever the code does around the call settle
        held = held_during_call(kit.engine, ("quote", "account", "exchange"))
    finally:
        kit.provider.release()
        job.join(15)
    assert_nothing_held(held, "create_quote's GET /v1/rates", "exchange")
    if job.error is not None or job.value is None:
        raise CheckFailure("Once released, the provider answered the rate.",
                           expected="create_quote returns the Quote",
                           actual=first_line(job.error) if job.error else "nothing",
                           evidence=kit.provider.history(), lesson=READ["exchange"])


def test_a_conflict_answer_is_not_a_rejection(client_kit: ClientKit) -> None:
    kit = client_kit
    fx = kit.client(TIMEOUT)
    key = "b0a3f1de-7c55-4e0c-9d47-2f6a51c1e8aa"
    first = call(fx.place_order, key, sell_currency="USD", buy_currency="EUR",
                 sell_amount=Decimal("40.00"), rate=Decimal("0.92"))
    if getattr(first, "status", None) != "FILLED":
        raise CheckFailure(
            "Setting up: the provider filled an order.", expected="OrderResult FILLED",
            actual=f"{first}", evidence=kit.provider.history(), lesson=READ["exchange"])
    try:
        other = fx.place_order(key, sell_currency="USD", buy_currency="EUR",
                               sell_amount=Decimal("41.00"), rate=Decimal("0.92"))
        error: BaseException | None = None
    except NotImplementedError:
        raise
    except Exception as exc:
        other, error = None, exc
    if error is None or not isinstance(error, kit.fx_client.ProviderError):
        raise CheckFailure(
            "The provider answered 409 CONFLICT (the key already belongs to another order), "
            "and place_order did not raise ProviderError.",
            expected="fx_client.ProviderError: a 409 says nothing about what this order did",
            actual=f"it returned {other}" if error is None else first_line(error),
            evidence=kit.provider.history()
                     + "\nthe key's order was FILLED: an exchange that took this 409 for "
                       "REJECTED would refund money the provider converted (double money)",
            fix="only FILLED, REJECTED and NOT_FOUND are answers about an order; raise "
                "ProviderError for a 409 as for any other status"
            if error is None and getattr(other, "status", None) == "REJECTED" else None,
            lesson=READ["reconcile"])


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


TIMED_OUT = "41.37"  # the amount the timed-out exchange sells


def test_timeout_leaves_the_exchange_pending(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(place="fill-then-late", delay=LATE)
    started = time.monotonic()
    try:
        # 41.37 x 0.92 = 38.0604: the estimate it answers PENDING needs rounding, to 38.06
        result = kit.start(fx, quote, source, target, TIMED_OUT, "ex-1")
    except CheckFailure:
        raise  # a stub: not written yet
    except Exception as exc:
        raise CheckFailure(
            "The provider converted the order but answered after the timeout, and exchange() "
            f"raised {type(exc).__name__} instead of returning the exchange PENDING.",
            expected="FxClient raises ProviderError (a timeout is 'no usable answer'), and "
                     "exchange() returns status PENDING",
            actual=f"{first_line(exc)}; {_money(kit, source, target)}",
            evidence=kit.provider.history(),
            fix="a timeout while reading the answer arrives as TimeoutError (socket.timeout) or "
                "http.client's RemoteDisconnected, not wrapped in urllib's URLError: catch "
                "OSError around urlopen and read, and raise ProviderError"
            if isinstance(exc, OSError) else None,
            lesson=READ["reconcile"]) from exc
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
    debited = Decimal("500.00") - Decimal(TIMED_OUT)
    if not (result.status == "PENDING" and source_now == debited and target_now == 0):
        raise CheckFailure(
            "The provider converted the order but answered after the timeout: the outcome "
            "is unknown to the caller, so the exchange must stay PENDING.",
            expected=f"status PENDING, source still debited ({fmt(debited)} USD), target not "
                     "credited",
            actual=f"status {result.status}; {_money(kit, source, target)}",
            evidence="the provider's side:\n" + kit.provider.history()
                     + f"\nit converted: {', '.join(converted) or 'nothing'}"
                     + (f"\nrefunding now pays the customer twice: the {TIMED_OUT} USD back AND "
                        "the "
                     f"{fmt(converted[str(result.exchange_id)].bought_amount)} EUR the "
                     "provider bought: double money"
                     if result.status == "FAILED" and str(result.exchange_id) in converted
                     else ""),
            fix="a timeout means 'I don't know', never 'it failed': leave the exchange "
                "PENDING and let reconcile() ask the provider",
            lesson=READ["reconcile"])
    assert_result_amounts(kit, result, quote, TIMED_OUT, "The provider answered after the "
                          "timeout")
    assert_ledger_agrees(kit.engine, "after a timed-out exchange", read="exchange")


# How the provider fails to answer an order; each leaves the exchange PENDING.
UNANSWERED = (
    ("fill-then-fail", "ex-500", "converted, then answered 500"),
    ("drop", "ex-reset", "closed the connection without an answer"),
    ("fill-then-cut", "ex-cut", "converted, then sent half the body its Content-Length "
                                "announced and closed the connection"),
    ("fill-then-garble", "ex-html", "converted, then answered 200 with an HTML page instead "
                                    "of JSON"),
    # an error status arrives as urllib's HTTPError before its body is read: reading that
    # body fails the same ways, and must be caught the same way
    ("reject-then-cut", "ex-cut-422", "refused it, then sent half the body of its 422 answer "
                                      "and closed the connection"),
    ("reject-then-stall", "ex-stall-422", "refused it, then sent the 422's headers and half "
                                          f"its body, and nothing more within the {TIMEOUT} s "
                                          "timeout"),
)
ERROR_BODY_FIX = ("an error status (here 422) arrives as urllib's HTTPError before its body is "
                  "read, and error.read() can be cut short or time out like any read: read it "
                  "inside the try whose handlers turn TimeoutError, OSError and HTTPException "
                  "into ProviderError, not in the except HTTPError handler")


# What each of them sells: estimates (x 0.92) above and below their nearest cent's half
UNANSWERED_AMOUNTS = ("123.51", "41.37", "100.00", "64.29", "100.00", "100.00")
# and a half cent: 5.00 EUR x 1.087 = 5.435 USD, after an odd cent: half-down gives 5.43, and
# so does a float's round() (5.435 is a hair under it in binary); a rate cut to 1.09, 5.45
HALF_CENT = ("EUR", "USD", "5.00")


def test_server_error_or_reset_leaves_the_exchange_pending(kit: ExchangeKit) -> None:
    funds = sum((Decimal(a) for a in UNANSWERED_AMOUNTS), Decimal("100.00"))
    source, target = _accounts(kit, usd=str(funds))
    fx = kit.client(TIMEOUT)
    for (mode, key, meaning), amount in zip(UNANSWERED, UNANSWERED_AMOUNTS, strict=True):
        quote = _quote(kit, fx)
        kit.provider.script(place=mode, delay=1.0)
        try:
            result = _exchange(kit, fx, quote, source, target, amount=amount, key=key)
        except CheckFailure:
            raise  # a stub: not written yet
        except Exception as exc:
            raise CheckFailure(
                f"The provider {meaning}, and exchange() raised {type(exc).__name__} instead "
                "of returning the exchange PENDING.",
                expected="FxClient raises ProviderError, exchange() returns status PENDING",
                actual=f"{first_line(exc)}; {_money(kit, source, target)}",
                evidence=kit.provider.history(),
                fix=ERROR_BODY_FIX if mode.startswith("reject") and isinstance(
                    exc, OSError | http.client.HTTPException) else
                "catch OSError (a reset, RemoteDisconnected, a timeout while reading) around "
                "the request and raise ProviderError" if isinstance(exc, OSError) else
                "catch http.client.HTTPException (IncompleteRead: a body cut short) around the "
                "request and raise ProviderError" if isinstance(exc, http.client.HTTPException)
                else "a body that is not JSON is no answer: catch json.loads' ValueError and "
                     "raise ProviderError" if isinstance(exc, ValueError) else None,
                lesson=READ["reconcile"]) from exc
        if result.status != "PENDING":
            raise CheckFailure(
                f"The provider {meaning}: the caller cannot know whether it converted.",
                expected="status PENDING, the source still debited",
                actual=f"status {result.status}; {_money(kit, source, target)}",
                evidence=kit.provider.history(),
                fix="only FILLED (credit) and REJECTED (refund) are answers; a 5xx, a reset, a "
                    "timeout or an unreadable body leave the exchange PENDING",
                lesson=READ["reconcile"])
        assert_result_amounts(kit, result, quote, amount, f"The provider {meaning} "
                              f"({amount} USD sold)")
    if not (balance_of(kit.engine, source) == Decimal("100.00") and
            balance_of(kit.engine, target) == 0):
        raise CheckFailure(
            f"{len(UNANSWERED)} PENDING exchanges of {', '.join(UNANSWERED_AMOUNTS)} from "
            f"{fmt(funds)}.",
            expected="source 100.00 USD, target 0.00 EUR",
            actual=_money(kit, source, target), evidence=ledger_table(kit.engine, source),
            lesson=READ["exchange"])
    sell, buy, amount = HALF_CENT
    seller = call(kit.accounts.open_account, kit.engine, currency=sell)
    call(kit.accounts.deposit, kit.engine, seller, Decimal("20.00"))
    buyer = call(kit.accounts.open_account, kit.engine, currency=buy)
    quote = kit.quote(fx, sell=sell, buy=buy)
    kit.provider.script(place="fill-then-fail")
    result = kit.start(fx, quote, seller, buyer, amount, "ex-500-gbp")
    if result.status != "PENDING":
        raise CheckFailure(
            f"The provider converted {amount} {sell} into {buy}, then answered 500: the caller "
            "cannot know whether it converted.", expected="status PENDING",
            actual=f"status {result.status}", evidence=kit.provider.history(),
            lesson=READ["reconcile"])
    assert_result_amounts(kit, result, quote, amount, f"The provider converted {amount} {sell} "
                          f"into {buy}, then answered 500")


def test_rejected_exchange_is_refunded(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(place="reject")
    result = _exchange(kit, fx, quote, source, target, amount="123.51")
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
    assert_result_amounts(kit, result, quote, "123.51", "The provider rejected 123.51 USD")
    # two more it rejects: 41.37 x 0.92 = 38.0604 lies below its nearest cent's half, and
    # 5.00 EUR x 1.087 = 5.435 is an exact half cent after an odd cent (HALF_CENT)
    below = _quote(kit, fx)
    refused = _exchange(kit, fx, below, source, target, amount="41.37", key="ex-2")
    _assert_rejected(kit, refused, "41.37 USD into EUR")
    assert_result_amounts(kit, refused, below, "41.37", "The provider rejected 41.37 USD")
    sell, buy, amount = HALF_CENT
    seller = call(kit.accounts.open_account, kit.engine, currency=sell)
    call(kit.accounts.deposit, kit.engine, seller, Decimal("20.00"))
    buyer = call(kit.accounts.open_account, kit.engine, currency=buy)
    half = kit.quote(fx, sell=sell, buy=buy)
    refused = kit.start(fx, half, seller, buyer, amount, "ex-gbp")
    _assert_rejected(kit, refused, f"{amount} {sell} into {buy}")
    assert_result_amounts(kit, refused, half, amount, f"The provider rejected {amount} {sell}")
    assert_quote_stays_used(kit, fx, quote, source, target, f"exchange {result.exchange_id} "
                            "on it was rejected by the provider and refunded", READ["exchange"])
    assert_ledger_agrees(kit.engine, "after a rejected exchange", read="exchange")


def _assert_rejected(kit: ExchangeKit, result: Any, what: str) -> None:
    if result.status != "FAILED":
        raise CheckFailure(
            f"The provider refused an exchange of {what} (422 REJECTED).",
            expected="status FAILED", actual=f"{result}", evidence=kit.provider.history(),
            lesson=READ["exchange"])


# what the exchange whose credit COMMIT is refused sells: answered PENDING, its estimate needs
# rounding (64.29 x 0.92 = 59.1468: 59.15, truncated 59.14)
SETTLE_SOLD = "64.29"


def test_a_failed_settlement_is_not_a_refund(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quote = _quote(kit, fx)
    kit.provider.script(place="fill", fill_rate=FILL_RATE)
    with failing_commits(kit.engine, target):
        answer = _refusal_or_result(kit, fx, quote, source, target, SETTLE_SOLD, "settle-fails")
    error = answer if isinstance(answer, BaseException) else None
    if error is None:
        kit.remember(answer, Decimal(SETTLE_SOLD))
    [row] = _exchange_rows(kit) or [{"id": "?", "status": "none recorded"}]
    anomalies, evidence = exchange_anomalies(kit, source, target, Decimal("500.00"))
    left = Decimal("500.00") - Decimal(SETTLE_SOLD)
    told = getattr(answer, "status", None)
    if error is None and told != row["status"]:
        anomalies.append(f"exchange() returned status {told}, its row says {row['status']}")
    if not (row["status"] in ("PENDING", "COMPLETED") and not anomalies):
        raise CheckFailure(
            "The provider FILLED the order, then the database refused the COMMIT of the "
            "transaction that credits the target: the exchange must stay PENDING for "
            "reconcile, not be refunded, and exchange() must not answer it settled.",
            expected="exchange PENDING (exchange() may raise; what it returns says the "
                     f"status its row holds), source {fmt(left)} USD, nothing refunded: the "
                     "provider converted, so the money is owed in EUR",
            actual=f"status {row['status']}; {_money(kit, source, target)}; exchange() "
                   + (f"raised {first_line(error)}" if error else "returned")
                   + (f"; {'; '.join(anomalies)}" if anomalies else ""),
            evidence=evidence + "\n\nthe provider's log:\n" + kit.provider.history(),
            fix="a failure while booking FILLED is not a rejection: let it raise (or return "
                "PENDING) and leave the exchange to reconcile, which asks the provider and "
                "completes it" if row["status"] == "FAILED" else
                "the credit's COMMIT was refused, so nothing was booked: let its error reach "
                "the caller (or answer the exchange as its row stands, PENDING), never the "
                "status you meant to write" if error is None and told != row["status"]
                and len(anomalies) == 1 else None,
            lesson=(READ["exchange"], READ["reconcile"]))
    if error is None:
        assert_result_amounts(kit, answer, quote, SETTLE_SOLD, f"The provider filled "
                              f"{SETTLE_SOLD} USD "
                              f"at {FILL_RATE} (the quote said {quote.rate}), then the COMMIT "
                              "of the credit was refused")
    assert_ledger_agrees(kit.engine, "after a failed settlement", read="exchange")


REFUND_WORKERS = 6
REFUND_ROUNDS = 2
SLOW_LOCK = 0.02  # every row-locking statement answers late, as in stage deposit-withdraw
LOCKING = r"for\s+(no\s+key\s+)?update|^\s*update\s+account"


def test_exchanges_and_refunds_do_not_deadlock(kit: ExchangeKit) -> None:
    from dojo.checks.faults import run_concurrently, slow_sql
    from dojo.checks.observers import record_sql

    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    quotes = [_quote(kit, fx) for _ in range(REFUND_WORKERS * REFUND_ROUNDS)]
    kit.provider.script(place="reject")

    def trade(index: int) -> list[Any]:
        # each worker's exchanges are refused at once: its refund runs while others debit
        return [kit.exchange.exchange(
            kit.engine, fx, kit.clock, idempotency_key=f"refused-{index}-{n}",
            quote_id=quotes[index * REFUND_ROUNDS + n].id, from_account_id=source,
            to_account_id=target, sell_amount=Decimal(f"{index + 1}.{n + 1}0"))
            for n in range(REFUND_ROUNDS)]

    with record_sql(kit.engine) as log, slow_sql(kit.engine, SLOW_LOCK, match=LOCKING):
        outcomes = run_concurrently(trade, REFUND_WORKERS, timeout=40)
    deadlocks = log.errors("40P01")
    if deadlocks:
        detail = deadlocks[0].error
        raise CheckFailure(
            f"{REFUND_WORKERS} workers, each placing {REFUND_ROUNDS} exchanges from one account "
            "that the provider REJECTED, deadlocked: a refund and a debit took the customer's "
            "and the fx clearing account's rows in opposite orders.",
            expected="no deadlock (SQLSTATE 40P01), not even one your code retried",
            actual=f"PostgreSQL detected {len(deadlocks)} deadlock(s)",
            evidence=f"PostgreSQL said: {log.name_pids(detail or '')[:400]}\n\n"
                     f"statements on account (row locks answered {SLOW_LOCK * 1000:.0f} ms "
                     "late):\n" + log.timeline(log.pids_in(detail or '')[:2],
                                               match=r"\baccount\b"),
            fix="the debit, the credit and the refund (online or in reconcile) take the "
                "customer's row and the clearing account's in one order: the customer first, "
                "say, in every operation", lesson=READ["exchange"])
    broken = [o for o in outcomes if not o.ok]
    statuses = {r["status"] for r in _exchange_rows(kit)}
    if broken or statuses != {"FAILED"} or balance_of(kit.engine, source) != 500:
        raise CheckFailure(
            f"{REFUND_WORKERS * REFUND_ROUNDS} exchanges the provider REJECTED, placed from "
            "one account at once, must all end FAILED and refunded.",
            expected="every exchange() returns FAILED; source 500.00 USD again",
            actual=f"{len(broken)} worker(s) raised"
                   + (f" ({first_line(broken[0].error)})" if broken else "")
                   + f"; statuses {sorted(statuses)}; {_money(kit, source, target)}",
            evidence=ledger_table(kit.engine, source), lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after concurrent refused exchanges", read="exchange")


MIRROR_PAIRS = 2  # per round: this many U -> E and as many E -> U, all at once
MIRROR_ROUNDS = 2
MIRROR_LOCK = 0.04  # every row-locking statement of the mirror exchanges answers this late
HOLD_DEBIT = 0.15  # every row-locking statement of the debit the credit meets answers this late
# only the statements that lock an account row: the quote's lock is not what these checks watch
LOCKING_ACCOUNT = r"^\s*update\s+account|\baccount\b.*\bfor\s+(no\s+key\s+)?update"


def _deadlock_failure(log: Any, what: str, fix: str | None, slow: float) -> CheckFailure:
    detail = log.errors("40P01")[0].error or ""
    return CheckFailure(
        what, expected="no deadlock (SQLSTATE 40P01), not even one your code retried",
        actual=f"PostgreSQL detected {len(log.errors('40P01'))} deadlock(s)",
        evidence=f"PostgreSQL said: {log.name_pids(detail)[:400]}\n\nstatements on account "
                 f"(row locks answered {slow * 1000:.0f} ms late):\n"
                 + log.timeline(log.pids_in(detail)[:2], limit=8,
                                match=r"^\s*update\s+account|\bfor\s+(no\s+key\s+)?update"
                                      r"|^\s*insert\s+into\s+exchange\b"),
        fix=fix, lesson=(READ["exchange"], READ["deadlock"]))


def test_exchanges_both_ways_do_not_deadlock(kit: ExchangeKit, database: Any) -> None:
    """Two customers trading both ways: a USD account U and an EUR account E. First, mirror
    exchanges (U -> E and E -> U) at the same instant, every row-locking statement answered
    late: each debit holds its source row while the other's INSERT of its exchange row (a
    foreign key to that account) asks for a KEY SHARE lock on it, which a FOR UPDATE blocks.
    Then a credit into E (U -> E, FILLED) released while a debit out of E (E -> U) holds E's
    row: a credit that takes the fx clearing account before the customer meets the debit,
    which takes them the other way round."""
    from dojo.checks.faults import run_concurrently, slow_sql
    from dojo.checks.observers import record_sql

    usd = int(call(kit.accounts.open_account, kit.engine, currency="USD"))
    call(kit.accounts.deposit, kit.engine, usd, Decimal("731.45"))
    eur = int(call(kit.accounts.open_account, kit.engine, currency="EUR"))
    call(kit.accounts.deposit, kit.engine, eur, Decimal("658.20"))
    fx = kit.client(timeout=5.0)
    legs = {"USD": (usd, eur, "EUR"), "EUR": (eur, usd, "USD")}

    def trade(sell: str, amount: str, key: str, engine: Any = None) -> Any:
        source, target, buy = legs[sell]
        return kit.remember(kit.exchange.exchange(
            engine or kit.engine, fx, kit.clock, idempotency_key=key,
            quote_id=kit.quote(fx, sell=sell, buy=buy).id, from_account_id=source,
            to_account_id=target, sell_amount=Decimal(amount)), Decimal(amount))

    broken: list[str] = []
    with record_sql(kit.engine) as log:
        for round_no in range(MIRROR_ROUNDS):
            jobs = [(("USD", "EUR")[i % 2], f"{3 + i}.{17 + round_no * 11}",
                     f"mirror-{round_no}-{i}") for i in range(2 * MIRROR_PAIRS)]
            # the provider holds every order until all the debits are in: only the debits
            # meet here, never a credit
            kit.provider.script(place="stall")
            with slow_sql(kit.engine, MIRROR_LOCK, match=LOCKING_ACCOUNT):
                racing = in_thread(run_concurrently, lambda i, jobs=jobs: trade(*jobs[i]),
                                   2 * MIRROR_PAIRS, timeout=40)
                held, deadline = 0, time.monotonic() + 20
                while (held < 2 * MIRROR_PAIRS and not log.errors("40P01")
                       and time.monotonic() < deadline and not racing.join(0)):
                    held += kit.provider.wait_stalled(1, timeout=0.05)
                kit.provider.script(place="fill")
                kit.provider.release()
                racing.join(40)
            if isinstance(racing.error, CheckFailure):
                raise racing.error  # a stub: not written yet
            broken += [first_line(o.error) for o in racing.value or () if not o.ok]
    if log.errors("40P01"):
        raise _deadlock_failure(
            log, f"Exchanges between a USD and an EUR account in both directions at once "
                 f"({MIRROR_PAIRS} each way) deadlocked.",
            "the debit takes the source's row lock with the UPDATE that debits it (or FOR NO "
            "KEY UPDATE): FOR UPDATE also blocks the KEY SHARE lock that another exchange's "
            "foreign key to this account takes when it inserts its exchange row"
            if log.matching(r"\baccount\b.*\bfor\s+update\b") else None, MIRROR_LOCK)
    # a credit into E, released while a debit out of E holds E's row
    observer = database.make_admin_engine()
    slow_engine = database.make_engine(pool_size=3, max_overflow=0)
    try:
        if not ensure_pgrowlocks(observer):
            raise RuntimeError("the check needs the pgrowlocks extension to read row locks")
        kit.provider.script(place="stall")
        credit = in_thread(trade, "USD", "41.73", "credit-into-eur")
        stalled = kit.provider.wait_stalled(1, timeout=10)
        kit.provider.script(place="fill")
        with record_sql(slow_engine) as debit_log, record_sql(kit.engine) as credit_log, \
                slow_sql(slow_engine, HOLD_DEBIT, match=LOCKING_ACCOUNT):
            debit = in_thread(trade, "EUR", "23.09", "debit-out-of-eur", slow_engine)
            deadline = time.monotonic() + 10
            while stalled and time.monotonic() < deadline and not debit.join(0.005):
                if any(r["row_id"] == eur and "Update" in str(r["modes"])
                       for r in row_locks(observer, "account")):
                    break
            kit.provider.release()
            credit.join(30)
            debit.join(30)
    finally:
        kit.provider.release()
        slow_engine.dispose()
        observer.dispose()
    for job in (credit, debit):
        if isinstance(job.error, CheckFailure):
            raise job.error  # a stub: not written yet
    for deadlocked in (debit_log, credit_log):
        if deadlocked.errors("40P01"):
            raise _deadlock_failure(
                deadlocked, "A credit into an EUR account (its exchange FILLED) and a debit out "
                "of the same account (an exchange to USD) deadlocked: they took the customer's "
                "and the EUR fx clearing account's rows in opposite orders.",
                "the debit, the credit and the refund take the customer's row and the clearing "
                "account's in one order: the customer first, say, in every operation",
                HOLD_DEBIT)
    broken += [first_line(j.error) for j in (credit, debit) if j.error is not None]
    if broken:
        raise CheckFailure(
            "Exchanges between a USD and an EUR account in both directions must all complete.",
            expected="every exchange() returns COMPLETED (the provider fills at once)",
            actual=f"{len(broken)} raised: {broken[0]}", evidence=kit.provider.history(),
            lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after exchanges both ways", read="exchange")


HOLD_EXCHANGE = 0.25  # every INSERT of the exchange in flight waits this long before it is sent


def test_a_refused_transfer_does_not_deadlock_an_exchange(kit: ExchangeKit,
                                                          database: Any) -> None:
    """A customer asks for a transfer between the two accounts of an exchange in flight: they
    differ in currency, so the transfer is refused, but it must not deadlock the exchange on
    its way there. The USD account has the lower id; the exchange sells EUR into it. While the
    exchange's transaction holds the EUR row (its debit) and waits before each INSERT, the
    transfer takes the lower id first, the USD row, and waits for the EUR row. The exchange's
    INSERT that refers to the USD account (a foreign key) then asks for a KEY SHARE lock on
    it, which FOR UPDATE blocks and FOR NO KEY UPDATE does not."""
    from dojo.checks.faults import slow_sql
    from dojo.checks.observers import record_sql

    usd = int(call(kit.accounts.open_account, kit.engine, currency="USD"))
    eur = int(call(kit.accounts.open_account, kit.engine, currency="EUR"))
    call(kit.accounts.deposit, kit.engine, eur, Decimal("412.37"))
    fx = kit.client(timeout=5.0)
    quote = kit.quote(fx, sell="EUR", buy="USD")
    kit.provider.script(place="fill")
    observer = database.make_admin_engine()
    other = database.make_engine(pool_size=2, max_overflow=0)
    try:
        if not ensure_pgrowlocks(observer):
            raise RuntimeError("the check needs the pgrowlocks extension to read row locks")
        with record_sql(kit.engine) as exchange_log, record_sql(other) as transfer_log:
            with slow_sql(kit.engine, HOLD_EXCHANGE, match=r"^\s*insert\b", when="before"):
                trade = in_thread(kit.start, fx, quote, eur, usd, "37.19", "ex-in-flight")
                deadline, held = time.monotonic() + 10, False
                while not held and time.monotonic() < deadline and not trade.join(0.005):
                    held = any(r["row_id"] == eur and "Update" in str(r["modes"])
                               for r in row_locks(observer, "account"))
                refused = in_thread(raised, kit.accounts.transfer, other, usd, eur,
                                    Decimal("1.00"))
                trade.join(30)
                refused.join(30)
    finally:
        other.dispose()
        observer.dispose()
    for job in (trade, refused):
        if isinstance(job.error, CheckFailure):
            raise job.error  # a stub: not written yet
    for log in (exchange_log, transfer_log):
        if log.errors("40P01"):
            raise _deadlock_failure(
                log, "A transfer between the two accounts of an exchange in flight (refused: "
                     "one is in USD, the other in EUR) deadlocked with that exchange. The "
                     "transfer held the USD account's row and waited for the EUR row the "
                     "exchange had debited; the exchange's INSERT that refers to the USD "
                     "account (a foreign key) waited for the transfer.",
                "lock the transfer's rows with FOR NO KEY UPDATE: FOR UPDATE also blocks the "
                "KEY SHARE lock a foreign key to the account takes, FOR NO KEY UPDATE does not "
                "(or check the two currencies before locking anything)"
                if transfer_log.matching(r"\baccount\b.*\bfor\s+update\b") else None,
                HOLD_EXCHANGE)
    outcome = refused.value
    if (trade.error is not None or getattr(trade.value, "status", None) != "COMPLETED"
            or not isinstance(outcome, kit.accounts.CurrencyMismatch)):
        raise CheckFailure(
            "An exchange from EUR to USD must complete while a transfer between its two "
            "accounts is refused with CurrencyMismatch.",
            expected="exchange() returns COMPLETED; transfer() raises CurrencyMismatch",
            actual=("exchange() raised " + first_line(trade.error) if trade.error is not None
                    else f"exchange() returned {getattr(trade.value, 'status', trade.value)!r}")
                   + "; transfer() " + ("returned" if outcome is None
                                        else f"raised {first_line(outcome)}"),
            evidence=kit.provider.history(), lesson=READ["exchange"])
    assert_ledger_agrees(kit.engine, "after a refused transfer met an exchange",
                         read="exchange")


def test_retried_exchange_moves_money_once(kit: ExchangeKit) -> None:
    from dojo.checks.faults import run_concurrently

    source, target = _accounts(kit)
    # a timeout generous enough that the fill's answer arrives even on a loaded machine: the
    # exchange is COMPLETED when the retry below asks for it again
    fx = kit.client(timeout=5.0)
    quote = _quote(kit, fx)
    # at its own price: what it bought differs from the quote's estimate, and a retry says which
    kit.provider.script(fill_rate=FILL_RATE)
    outcomes = run_concurrently(lambda _: kit.remember(kit.exchange.exchange(
        kit.engine, fx, kit.clock, idempotency_key="twice", quote_id=quote.id,
        from_account_id=source, to_account_id=target, sell_amount=Decimal("100.00")),
        Decimal("100.00")), 8, timeout=20)
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
    # a retry once it settled: the exchange as it stands now, not the answer first stored
    [placed] = list(ids)
    stands = {r["id"]: r["status"] for r in _exchange_rows(kit)}.get(placed)
    later = _refusal_or_result(kit, fx, quote, source, target, "100.00", "twice")
    if not (getattr(later, "exchange_id", None) is not None
            and str(later.exchange_id) == placed and later.status == stands):
        raise CheckFailure(
            f"Exchange {placed} is {stands} in the database; a retry with its key (the same "
            "request) answered something else.",
            expected=f"the same exchange_id with status {stands}: a retry returns the exchange "
                     "as it stands",
            actual=first_line(later) if isinstance(later, BaseException) else f"{later}",
            evidence=kit.provider.history(),
            fix="on a retry, read the exchange's row (status, amounts) by the stored "
                "exchange_id; a stored snapshot of the first answer stays PENDING forever"
            if getattr(later, "status", None) == "PENDING" else None,
            lesson=READ["idempotency"])
    assert_result_amounts(kit, later, quote, "100.00", f"A retry of exchange {placed} "
                          f"({stands}; the provider filled at {FILL_RATE}, the quote said "
                          f"{quote.rate})", retry=True, read="idempotency")
    # the same key for another exchange (another quote and amount) is a client bug, as for a
    # deposit: answering the old exchange would tell the client the new one was placed
    another = _quote(kit, fx)
    sent_before = len(kit.provider.order_requests())
    reuse = _refusal(kit, fx, another, source, target, "5.00", "twice")
    sent = len(kit.provider.order_requests()) - sent_before
    if not (isinstance(reuse, kit.accounts.IdempotencyConflict) and sent == 0
            and balance_of(kit.engine, source) == Decimal("400.00")):
        raise CheckFailure(
            "Key 'twice' (an exchange of 100.00) was reused for another exchange: 5.00 on "
            "another quote.",
            expected="accounts.IdempotencyConflict, nothing debited, no order sent",
            actual=(first_line(reuse) if reuse else "it returned (the old exchange, or a new "
                                                    "one)")
                   + f"; {sent} order(s) sent; {_money(kit, source, target)}",
            evidence=kit.provider.history(),
            fix="store the exchange's request (quote, accounts, amount) with its key, as for a "
                "deposit, and compare it when the key is found" if reuse is None else None,
            lesson=READ["idempotency"])
    # one field at a time: a request fingerprint that leaves any of them out answers the old
    # exchange for a new one
    spare_source = call(kit.accounts.open_account, kit.engine, currency="USD")
    call(kit.accounts.deposit, kit.engine, spare_source, Decimal("263.17"))
    spare_target = call(kit.accounts.open_account, kit.engine, currency="EUR")
    changes = [
        ("the same accounts and amount (100.00) on another quote", _quote(kit, fx), source,
         target, "100.00"),
        ("the same quote and accounts, 100.01 instead of 100.00", quote, source, target,
         "100.01"),
        ("the same quote and amount, to another EUR account", quote, source, spare_target,
         "100.00"),
        ("the same quote and amount, from another USD account", quote, spare_source, target,
         "100.00"),
    ]
    for what, other_quote, src, dst, amount in changes:
        sent_before = len(kit.provider.order_requests())
        reuse = _refusal(kit, fx, other_quote, src, dst, amount, "twice")
        sent = len(kit.provider.order_requests()) - sent_before
        money = (balance_of(kit.engine, source), balance_of(kit.engine, spare_source))
        if not (isinstance(reuse, kit.accounts.IdempotencyConflict) and sent == 0
                and money == (Decimal("400.00"), Decimal("263.17"))):
            raise CheckFailure(
                f"Key 'twice' (an exchange of 100.00) was reused for another exchange: {what}.",
                expected="accounts.IdempotencyConflict, nothing debited, no order sent",
                actual=(first_line(reuse) if reuse else "it returned (the old exchange, or a "
                                                        "new one)")
                       + f"; {sent} order(s) sent; source {fmt(money[0])} USD, the other USD "
                       f"account {fmt(money[1])} (263.17 before)",
                evidence=kit.provider.history(),
                fix="the key's stored request must hold every field of the exchange (the "
                    "quote, both accounts and the amount), and a retry must match it in each"
                if reuse is None else None,
                lesson=READ["idempotency"])
    # one key names one request whatever the operation: a deposit with the exchange's key,
    # and an exchange with a deposit's key, are other requests (keys are one namespace)
    cross = _cross_operation_reuse(kit, fx, source, target)
    if cross is not None:
        raise cross
    # long after: the quote it was placed on has expired since, and the key still answers the
    # exchange (the quote was judged once, when the exchange was placed)
    kit.clock.advance(QUOTE_TTL + 0.35)
    expired = _refusal_or_result(kit, fx, quote, source, target, "100.00", "twice")
    if not (str(getattr(expired, "exchange_id", "")) == placed
            and getattr(expired, "status", None) == stands):
        raise CheckFailure(
            f"Exchange {placed} is {stands}; its quote (TTL {QUOTE_TTL:g} s) expired "
            f"{0.35:g} s ago. A retry with its key (the same request) answered something else.",
            expected=f"the same exchange_id with status {stands}: a retry returns the exchange "
                     "as it stands, however old its quote is now (QuoteExpired and "
                     "QuoteAlreadyUsed refuse a new exchange, not a retry of one placed)",
            actual=first_line(expired) if isinstance(expired, BaseException) else f"{expired}",
            evidence=kit.provider.history(),
            fix="look the idempotency key up first and return the exchange it names; judge the "
                "quote (found, expired, used) only when the key is new"
            if isinstance(expired, kit.exchange.QuoteExpired) else None,
            lesson=READ["idempotency"])


def _cross_operation_reuse(kit: ExchangeKit, fx: Any, source: int, target: int
                           ) -> CheckFailure | None:
    """Key 'twice' names an exchange of 100.00 from `source` (which holds 400.00 after it):
    a deposit with it, and an exchange with the key of a deposit, are IdempotencyConflict
    and move nothing."""
    deposit = raised(kit.accounts.deposit, kit.engine, source, Decimal("100.00"),
                     idempotency_key="twice")
    after = balance_of(kit.engine, source)
    if not (isinstance(deposit, kit.accounts.IdempotencyConflict)
            and after == Decimal("400.00")):
        return CheckFailure(
            "Key 'twice' names an exchange of 100.00 from this account; a deposit of 100.00 "
            "into it with the same key is another request.",
            expected="accounts.IdempotencyConflict, nothing deposited (source 400.00 USD)",
            actual=(first_line(deposit) if deposit else "it returned") + f"; source "
                   f"{fmt(after)} USD",
            evidence="an idempotency key names one request, whatever the operation: a "
                     "deposit, a withdrawal, a transfer or an exchange",
            fix="keep one namespace of keys for every operation (the idempotency_key table, "
                "its request_hash covering the operation), and compare the request when the "
                "key is found" if deposit is None else None,
            lesson=READ["idempotency"])
    call(kit.accounts.deposit, kit.engine, source, Decimal("7.31"), idempotency_key="dep-key")
    sent_before = len(kit.provider.order_requests())
    exchange = _refusal(kit, fx, _quote(kit, fx), source, target, "7.31", "dep-key")
    sent = len(kit.provider.order_requests()) - sent_before
    after = balance_of(kit.engine, source)
    if not (isinstance(exchange, kit.accounts.IdempotencyConflict) and sent == 0
            and after == Decimal("407.31")):
        return CheckFailure(
            "Key 'dep-key' names a deposit of 7.31; an exchange of 7.31 from the same account "
            "with that key is another request.",
            expected="accounts.IdempotencyConflict, nothing debited (source 407.31 USD), no "
                     "order sent",
            actual=(first_line(exchange) if exchange else "it returned") + f"; {sent} order(s) "
                   f"sent; source {fmt(after)} USD",
            evidence=kit.provider.history(),
            fix="keep one namespace of keys for every operation (the idempotency_key table, "
                "its request_hash covering the operation), and compare the request when the "
                "key is found" if exchange is None else None,
            lesson=READ["idempotency"])
    # back to 400.00 for what follows (the deposit was the check's, not the exchange's)
    call(kit.accounts.withdraw, kit.engine, source, Decimal("7.31"))
    return None


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
