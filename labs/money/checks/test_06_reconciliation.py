"""Stage reconciliation: reconcile() settles what a timeout left PENDING by asking the
provider by idempotency key: FILLED completes, REJECTED or NOT_FOUND refunds, no answer leaves
it PENDING. Each exchange is settled exactly once, whoever gets there first.

Every check ends by comparing each exchange with what the provider really did, and the
customer balances with both: a refund of something the provider converted is double money."""

from __future__ import annotations

import threading
from decimal import Decimal
from typing import Any

import pytest
from _support import (
    ExchangeKit,
    assert_ledger_agrees,
    balance_of,
    call,
    describe_errors,
    exchange_anomalies,
    explain,
    first_line,
    fmt,
    not_written,
    rows,
)

from dojo.checks.faults import run_concurrently

pytestmark = pytest.mark.stage("reconciliation")

TIMEOUT = 0.4
FUNDS = Decimal("1000.00")


def _accounts(kit: ExchangeKit) -> tuple[int, int]:
    source = call(kit.accounts.open_account, kit.engine, currency="USD")
    call(kit.accounts.deposit, kit.engine, source, FUNDS)
    return int(source), int(call(kit.accounts.open_account, kit.engine, currency="EUR"))


def _pending(kit: ExchangeKit, fx: Any, source: int, target: int, mode: str, count: int = 1,
             prefix: str = "ex") -> list[str]:
    """`count` exchanges of 100.00 USD the provider leaves unanswered in `mode`; their ids."""
    kit.provider.script(place=mode)
    ids = []
    for n in range(count):
        quote = call(kit.exchange.create_quote, kit.engine, fx, kit.clock,
                     sell_currency="USD", buy_currency="EUR", ttl_seconds=30)
        result = call(kit.exchange.exchange, kit.engine, fx, kit.clock,
                      idempotency_key=f"{prefix}-{n}", quote_id=quote.id,
                      from_account_id=source, to_account_id=target,
                      sell_amount=Decimal("100.00"))
        assert result.status == "PENDING", explain(
            "Setting up: an exchange whose provider call got no answer must be PENDING "
            "(stage exchange).", expected="PENDING", actual=f"{result}",
            state=kit.provider.history(), read="exchange")
        ids.append(str(result.exchange_id))
    kit.provider.script(place="fill")
    return ids


def _statuses(kit: ExchangeKit) -> dict[str, str]:
    return {r["id"]: r["status"] for r in rows(kit.engine, "SELECT id::text AS id, status "
                                                          "FROM exchange")}


def _reconcile(kit: ExchangeKit, fx: Any, older_than: float = 30.0) -> Any:
    return call(kit.exchange.reconcile, kit.engine, fx, kit.clock,
                older_than_seconds=older_than)


def _assert_consistent(kit: ExchangeKit, source: int, target: int, what: str) -> None:
    anomalies, evidence = exchange_anomalies(kit, source, target, FUNDS)
    assert not anomalies, explain(
        f"{what}: the exchanges disagree with what the provider did.",
        expected="COMPLETED exactly for the orders the provider converted, FAILED (refunded "
                 "once) for the ones it did not, and balances that match",
        actual="; ".join(anomalies[:4]),
        state=evidence + "\n\nthe provider's log:\n" + kit.provider.history(16),
        fix="settle with UPDATE exchange SET status = ... WHERE id = :id AND status = "
            "'PENDING', and credit or refund only when that updated a row",
        read="reconcile")
    assert_ledger_agrees(kit.engine, what, read="reconcile")


def test_reconcile_completes_what_the_provider_filled(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    kit.provider.script(delay=1.0)
    old = _pending(kit, fx, source, target, "fill-then-fail", count=2, prefix="old")
    old += _pending(kit, fx, source, target, "fill-then-late", count=1, prefix="late")
    kit.clock.advance(60)
    fresh = _pending(kit, fx, source, target, "fill-then-fail", count=1, prefix="fresh")
    report = _reconcile(kit, fx, older_than=30)
    statuses = _statuses(kit)
    still = [i for i in old if statuses.get(i) != "COMPLETED"]
    assert not still, explain(
        f"After reconcile(), {len(still)} of {len(old)} exchanges older than 30 s are still "
        "not COMPLETED, although the provider FILLED every one of them.",
        expected="each COMPLETED, and its EUR credited once",
        actual=", ".join(f"{i} {statuses.get(i)}" for i in still),
        state="the provider's log (did reconcile ask it?):\n" + kit.provider.history(16),
        fix="select the PENDING exchanges older than older_than_seconds (by clock()), ask "
            "fx.get_order(str(exchange_id)) for each, complete the FILLED ones with the "
            "conditional tx 2", read="reconcile")
    asked = {c.key for c in kit.provider.requests("GET") if c.key}
    assert statuses.get(fresh[0]) == "PENDING" and fresh[0] not in asked, explain(
        "reconcile(older_than_seconds=30) settled an exchange created a moment ago.",
        expected=f"exchange {fresh[0]} (0 s old by the clock) left PENDING, its provider "
                 "order not asked about: its own call may still be in flight",
        actual=f"status {statuses.get(fresh[0])}", state=kit.provider.history(16),
        fix="WHERE status = 'PENDING' AND created_at <= :now - older_than_seconds, with "
            "created_at and now both from the clock you are given", read="reconcile")
    completed = getattr(report, "completed", None)
    assert completed == len(old), explain(
        "reconcile() reports what it settled.",
        expected=f"ReconcileReport(completed={len(old)}, ...)", actual=f"{report!r}",
        read="reconcile")
    _assert_consistent(kit, source, target, "after reconciling filled orders")


def test_reconcile_refunds_what_the_provider_never_received(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    [lost] = _pending(kit, fx, source, target, "drop")
    kit.clock.advance(60)
    _reconcile(kit, fx)
    status = _statuses(kit).get(lost)
    assert status in ("FAILED", "COMPLETED"), explain(
        "The provider never received the order (the connection dropped before it) and "
        "answers NOT_FOUND for its key, which also voids the key.",
        expected=f"exchange FAILED and the 100.00 USD refunded (source {fmt(FUNDS)}); or, if "
                 "you resend the order with the same key, whatever that settles",
        actual=f"status {status}; source {fmt(balance_of(kit.engine, source))}",
        state=kit.provider.history(),
        fix="NOT_FOUND from GET /v1/orders/<key> is final: the provider refuses that key from "
            "then on, so refund (a REVERSAL entry) and mark FAILED", read="reconcile")
    _assert_consistent(kit, source, target, "after reconciling a lost order")


def test_reconcile_refunds_what_the_provider_rejected(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    [rejected] = _pending(kit, fx, source, target, "reject-then-fail")
    kit.clock.advance(60)
    _reconcile(kit, fx)
    status = _statuses(kit).get(rejected)
    anomalies, evidence = exchange_anomalies(kit, source, target, FUNDS)
    assert status == "FAILED" and not anomalies, explain(
        "The provider refused the order, then answered 500; asked again by key, it says "
        "REJECTED: nothing was converted.",
        expected=f"exchange FAILED, the 100.00 USD refunded once (source {fmt(FUNDS)}), "
                 "nothing credited in EUR",
        actual=f"status {status}; source {fmt(balance_of(kit.engine, source))} USD, target "
               f"{fmt(balance_of(kit.engine, target))} EUR"
               + (f"; {'; '.join(anomalies)}" if anomalies else ""),
        state=evidence + "\n\nthe provider's log:\n" + kit.provider.history(),
        fix="GET /v1/orders/<key> answering REJECTED is final, like NOT_FOUND: refund with a "
            "REVERSAL entry and mark FAILED. Only FILLED completes (and credits what the "
            "provider bought); leaving it PENDING keeps the customer's money for ever",
        read="reconcile")
    _assert_consistent(kit, source, target, "after reconciling a rejected order")


def test_reconcile_keeps_pending_while_the_provider_cannot_answer(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(TIMEOUT)
    [filled] = _pending(kit, fx, source, target, "fill-then-fail")
    kit.clock.advance(60)
    for mode, meaning in (("fail", "answers 503"), ("slow", "answers after the timeout")):
        # both ways of asking fail: GET /v1/orders/<key>, and a resend with the same key
        kit.provider.script(status=mode, place=mode, delay=1.0)
        _reconcile(kit, fx)
        status = _statuses(kit).get(filled)
        anomalies, evidence = exchange_anomalies(kit, source, target, FUNDS)
        assert status == "PENDING" and not anomalies, explain(
            f"While the provider {meaning}, reconcile() must not decide.",
            expected="the exchange stays PENDING: nothing credited, nothing refunded",
            actual=f"status {status}; " + ("; ".join(anomalies) or "balances unchanged"),
            state=evidence + "\n" + kit.provider.history(),
            fix="an error from get_order is 'still unknown', exactly like the timeout of the "
                "original call: skip the exchange this run, and it is asked about next time",
            read="reconcile")
    kit.provider.script(status="answer", place="fill")
    _reconcile(kit, fx)
    assert _statuses(kit).get(filled) == "COMPLETED", explain(
        "Once the provider answers again, the next run settles the exchange.",
        expected="COMPLETED", actual=str(_statuses(kit).get(filled)),
        state=kit.provider.history(), read="reconcile")
    _assert_consistent(kit, source, target, "after the provider came back")


def test_concurrent_reconcilers_settle_each_exchange_once(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(timeout=2.0)
    ids = _pending(kit, fx, source, target, "fill-then-fail", count=5)
    kit.clock.advance(60)
    # slow answers keep every reconciler busy with the same PENDING rows at the same time
    kit.provider.script(status="slow", place="slow", delay=0.1)
    outcomes = run_concurrently(lambda _: kit.exchange.reconcile(
        kit.engine, fx, kit.clock, older_than_seconds=30), 4, timeout=30)
    for o in outcomes:
        if isinstance(o.error, NotImplementedError):
            not_written(o.error)
    broken = [o for o in outcomes if not o.ok]
    assert not broken, explain(
        "Four reconcilers running at once raised errors.",
        expected="each returns its ReconcileReport", actual=describe_errors(broken),
        read="reconcile")
    statuses = _statuses(kit)
    assert all(statuses[i] == "COMPLETED" for i in ids), explain(
        "Four concurrent reconcilers left exchanges unsettled.",
        expected="all 5 COMPLETED", actual=str(sorted(statuses.values())), read="reconcile")
    credits = rows(kit.engine, "SELECT count(*) AS n FROM posting WHERE account_id = :t "
                               "AND amount > 0", t=target)[0]["n"]
    assert credits == len(ids), explain(
        f"Four reconcilers settled the same {len(ids)} exchanges at the same moment, and "
        "some were credited more than once.",
        expected=f"{len(ids)} credit postings on the EUR account, one per exchange",
        actual=f"{credits} credit postings; EUR balance "
               f"{fmt(balance_of(kit.engine, target))}",
        state=exchange_anomalies(kit, source, target, FUNDS)[1],
        fix="settle with UPDATE exchange SET status = 'COMPLETED' WHERE id = :id AND status "
            "= 'PENDING' RETURNING ...: only the reconciler whose UPDATE returned the row "
            "credits; the others see zero rows and do nothing",
        read="reconcile")
    _assert_consistent(kit, source, target, "after four concurrent reconcilers")


def test_reconcile_racing_the_online_call_settles_once(kit: ExchangeKit) -> None:
    source, target = _accounts(kit)
    fx = kit.client(timeout=5.0)
    quote = call(kit.exchange.create_quote, kit.engine, fx, kit.clock, sell_currency="USD",
                 buy_currency="EUR", ttl_seconds=30)
    kit.provider.script(place="stall")
    box: dict[str, Any] = {}

    def online() -> None:
        try:
            box["result"] = kit.exchange.exchange(
                kit.engine, fx, kit.clock, idempotency_key="online", quote_id=quote.id,
                from_account_id=source, to_account_id=target, sell_amount=Decimal("100.00"))
        except BaseException as exc:  # reported below
            box["error"] = exc

    thread = threading.Thread(target=online, name="dojo-worker-online", daemon=True)
    thread.start()
    try:
        assert kit.provider.wait_stalled(1, timeout=5), explain(
            "Setting up: exchange() never called the provider.", expected="POST /v1/orders",
            actual=first_line(box.get("error")), state=kit.provider.history(),
            read="exchange")
        kit.provider.script(place="fill")  # only the online call stays held
        kit.clock.advance(60)  # the online call "has been running" for a minute
        reconciled = kit.exchange.reconcile(kit.engine, fx, kit.clock, older_than_seconds=30)
    finally:
        kit.provider.release()
        thread.join(10)
    assert "error" not in box, explain(
        "The online exchange raised after reconcile() settled it first.",
        expected="it returns the exchange as it stands (FAILED or COMPLETED)",
        actual=first_line(box["error"]), read="reconcile")
    _assert_consistent(kit, source, target, f"reconcile() ({reconciled!r}) ran while the "
                                            "online call was stalled at the provider")
