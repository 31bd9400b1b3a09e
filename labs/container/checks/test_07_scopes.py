"""Stage scopes: singleton, prototype and request scope, and the scoped proxy.

The applications record what happens to their beans in the probe module's `events`:
("init", what) when a constructor runs and ("destroy", what) when a destroy callback does.
Races are widened without sleeps that "usually" suffice: the threads meet at barriers, and the
first constructor of a raced singleton stays inside until a second one starts (the mistake)
or every racer has called get_bean and two more seconds have passed. The request-scoped unit
of work is proven on PostgreSQL: its connection's backend pid, in pg_stat_activity under an
application_name of the check's own.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import threading
import time
import uuid
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from _support import CHAINED_PROCESSORS, application_module, chain_problems
from sqlalchemy import text
from sqlalchemy.engine import make_url

from dojo.checks import CheckFailure, NotWritten, call, in_thread, raised, table

pytestmark = pytest.mark.stage("scopes")

SINGLETON_THREADS = "bean-scopes#a-singleton-is-shared-by-every-request-thread"
PROTOTYPE = "bean-scopes#prototype-a-new-object-then-the-container-lets-go"
REQUEST = "bean-scopes#web-scopes-request-session-application"
SHORTER_LIVED = "bean-scopes#shorter-lived-into-longer-lived-the-injection-trap"

RACERS = 4
WINDOW = 1.0            # seconds the first constructor waits for a second one, once all called
LATE = 3                # threads that ask while after_init wraps the bean
LATE_WINDOW = 1.0       # seconds after_init waits for them to get something back


def _refreshed(learner: Any, app: Any, shape: str, lesson: str) -> Any:
    """A refreshed context (no auto-configuration), or a failure naming the application."""
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    if error is not None:
        raise CheckFailure(
            "refresh() failed on an application that the README's rules can build.",
            expected="refresh() succeeds",
            actual=f"{type(error).__name__}: {error}",
            evidence=shape,
            lesson=lesson,
        )
    return ctx


def _events(app: Any, kind: str) -> list[str]:
    return [what for k, what in app.probe.events if k == kind]


def _outcomes(jobs: list[Any]) -> list[Any]:
    """Each job's value; a stub's NotWritten or a learner's error is raised as it is."""
    values = []
    for job in jobs:
        values.append(job.result(60))
    return values


# ---- singleton -----------------------------------------------------------------------------

RACED = """\
    from markers import BeanPostProcessor, component, lazy
    import {probe} as probe


    @lazy
    @component
    class RateTable:
        def __init__(self):
            probe.events.append(("init", "rateTable"))
            if sum(1 for e in probe.events if e == ("init", "rateTable")) > 1:
                probe.second.set()          # another constructor started: the race is lost
                return
            probe.all_called.wait(30)       # every racer has called get_bean ...
            probe.second.wait(probe.WINDOW)  # ... and had time to start a second constructor


    class GuardedRateTable:         # what the post-processor hands out instead of the table
        def __init__(self, target):
            self.target = target


    @component
    class Guard(BeanPostProcessor):
        def after_init(self, bean, name):
            if name != "rateTable":
                return bean
            if not probe.wrapping.is_set():
                probe.wrapping.set()        # the late threads ask for rateTable now ...
                probe.late_returned.wait(probe.LATE_WINDOW)   # ... and must wait for this
            return GuardedRateTable(bean)


    @component
    class Ledger:
        def __init__(self):
            probe.events.append(("init", "ledger"))
    """


def test_a_lazy_singleton_raced_by_threads_is_made_once(learner, make_app):
    app = make_app("shop")
    app.write("rates.py", RACED)
    probe = app.probe
    probe.second, probe.all_called, probe.WINDOW = threading.Event(), threading.Event(), WINDOW
    probe.wrapping, probe.late_returned = threading.Event(), threading.Event()
    probe.LATE_WINDOW = LATE_WINDOW
    ctx = _refreshed(learner, app, "RateTable (@lazy), Ledger, Guard(BeanPostProcessor) "
                                   "wrapping rateTable in a GuardedRateTable", SINGLETON_THREADS)
    rate_table = application_module(f"{app.base}.rates").RateTable
    barrier = threading.Barrier(RACERS, timeout=30)
    called: list[int] = []
    returned: list[int] = []
    guard = threading.Lock()

    def racer(index: int) -> tuple[Any, Any]:
        barrier.wait()
        with guard:
            called.append(index)
            if len(called) == RACERS:
                probe.all_called.set()
        # half the racers look the bean up by name, half by type: both must wait
        return ctx.get_bean("rateTable" if index % 2 else rate_table), ctx.get_bean("ledger")

    def late(index: int) -> Any:
        """Asks once after_init has begun wrapping the bean: it must wait for the wrapper."""
        probe.wrapping.wait(30)
        try:
            return ctx.get_bean("rateTable")
        finally:
            with guard:
                returned.append(index)
                if len(returned) == LATE:
                    probe.late_returned.set()

    jobs = [in_thread(racer, i) for i in range(RACERS)]
    late_jobs = [in_thread(late, i) for i in range(LATE)]
    try:
        got = _outcomes(jobs)
    finally:
        probe.wrapping.set()        # a racer that failed leaves no late thread waiting
    late_got = _outcomes(late_jobs)
    made = _events(app, "init")
    tables = {id(t) for t, _ in got}
    ledgers = {id(ledger) for _, ledger in got}
    problems = []
    for bean, objects in (("rateTable", tables), ("ledger", ledgers)):
        if made.count(bean) > 1:
            problems.append(f"{bean}'s constructor ran more than once")
        elif made.count(bean) == 0:
            problems.append(f"{bean}'s constructor never ran")
        if len(objects) > 1:
            problems.append(f"the threads got different {bean} objects")
    if problems:
        raise CheckFailure(
            f"A singleton is one object per context, whatever the thread: {RACERS} threads "
            "racing the first get_bean of a lazy singleton must get the one object, made once. "
            "Checking the cache and then creating is a check-then-act race unless one thread "
            "makes the bean while the others wait.",
            expected=f"rateTable made once, one object for {RACERS} threads; ledger the same",
            actual="; ".join(problems),
            evidence=f"the first RateTable constructor waited until all {RACERS} threads had "
                     f"called get_bean (threads 0 and 2 get_bean(RateTable), 1 and 3 "
                     f"get_bean('rateTable')), then up to {WINDOW} s for a second one\n"
                     f"constructor runs: rateTable {made.count('rateTable')}, "
                     f"ledger {made.count('ledger')}\n"
                     + table([(i, type(t).__name__, id(t)) for i, (t, _) in enumerate(got)],
                             ("thread", "rateTable", "id")),
            lesson=SINGLETON_THREADS,
            fix="Make the singleton under a lock, and look in the cache again once you hold "
                "it (double-checked): the threads that lost the race find the bean made."
            if made.count("rateTable") > 1 else None,
        )
    wrapper = got[0][0]
    early = [t for t in late_got if t is not wrapper]
    if early:
        kinds = " and ".join(sorted({type(t).__name__ for t in early}))
        raise CheckFailure(
            "A singleton is handed out only once it is finished: a thread that asks for it "
            "while another thread is still making it (here, while a post-processor's "
            "after_init wraps it) waits, and gets what after_init returned, never the object "
            "half-way through its lifecycle.",
            expected=f"the {LATE} threads that asked during after_init wait for it and get the "
                     f"{type(wrapper).__name__} the {RACERS} racers got",
            actual=f"{len(early)} of {LATE} threads that called get_bean('rateTable') while "
                   f"after_init was wrapping it got {kinds}, not the "
                   f"{type(wrapper).__name__} that after_init returned",
            evidence=f"after_init of rateTable waited up to {LATE_WINDOW} s for the {LATE} "
                     "late threads' get_bean to return\n"
                     + table([(f"racer {i}", type(t).__name__, id(t))
                              for i, (t, _) in enumerate(got)]
                             + [(f"late {i}", type(t).__name__, id(t))
                                for i, t in enumerate(late_got)],
                             ("thread", "rateTable", "id")),
            lesson=SINGLETON_THREADS,
            fix="Put a singleton in the cache only once after_init has returned, and let the "
                "threads that come meanwhile wait for it (read the cache under the lock)."
            if all(type(t).__name__ == "RateTable" for t in early) else None,
        )


# ---- prototype -----------------------------------------------------------------------------

PROTOTYPES = """\
    from __future__ import annotations

    from markers import component, pre_destroy, scope
    import {probe} as probe


    @scope("prototype")
    @component
    class Ticket:
        def __init__(self):
            probe.events.append(("init", "ticket"))

        @pre_destroy
        def release(self):
            probe.events.append(("destroy", "ticket"))


    @component
    class Booth:
        def __init__(self, ticket: Ticket):
            self.ticket = ticket

        @pre_destroy
        def shut(self):
            probe.events.append(("destroy", "booth"))


    @component
    class Gate:
        def __init__(self, ticket: Ticket):
            self.ticket = ticket

        @pre_destroy
        def shut(self):
            probe.events.append(("destroy", "gate"))
    """


def test_a_prototype_is_new_every_time_and_never_destroyed(learner, make_app):
    app = make_app("shop")
    app.write("tickets.py", PROTOTYPES)
    ctx = _refreshed(learner, app, "Ticket (@scope('prototype'), @pre_destroy release), "
                                   "Booth(ticket: Ticket), Gate(ticket: Ticket)", PROTOTYPE)
    booth, gate = call(ctx.get_bean, "booth"), call(ctx.get_bean, "gate")
    looked_up = [call(ctx.get_bean, "ticket"), call(ctx.get_bean, "ticket")]
    tickets = {"booth.ticket": booth.ticket, "gate.ticket": gate.ticket,
               "get_bean #1": looked_up[0], "get_bean #2": looked_up[1]}
    distinct = len({id(t) for t in tickets.values()})
    made = _events(app, "init").count("ticket")
    shown = table([(k, id(v)) for k, v in tickets.items()], ("where", "id"))
    refs = [weakref.ref(t) for t in looked_up]
    del tickets, looked_up              # the check lets go of the tickets it looked up
    kept = _still_referenced(refs)
    error = raised(ctx.close)
    destroyed = _events(app, "destroy")
    evidence = shown + "\nevents, in order:\n" + table(list(app.probe.events), ("event", "bean"))
    if distinct != 4 or made != 4:
        raise CheckFailure(
            "A prototype is made anew for every injection point and every get_bean: two "
            "singletons that both take a Ticket get one each, and each lookup makes another.",
            expected="4 Ticket objects: one per singleton, one per get_bean",
            actual=f"{distinct} distinct object(s), constructor ran {made} time(s)",
            evidence=evidence,
            lesson=PROTOTYPE,
        )
    if error is not None or "ticket" in destroyed or {"booth", "gate"} - set(destroyed):
        actual = (f"close() raised {type(error).__name__}: {error}" if error is not None
                  else f"destroy callbacks that ran: {', '.join(destroyed) or 'none'}")
        raise CheckFailure(
            "The container hands a prototype out and lets go of it: close() destroys the "
            "singletons it made, and never calls a prototype's destroy callbacks (the code "
            "that asked for it owns it).",
            expected="close() calls booth's and gate's @pre_destroy, never ticket's",
            actual=actual,
            evidence=evidence,
            lesson=PROTOTYPE,
            fix="Keep only singletons in the list that close() destroys."
            if error is None and "ticket" in destroyed else None,
        )
    if kept:
        raise CheckFailure(
            "The container keeps no reference to a prototype it handed out: once the code "
            "that asked for it lets go, nothing holds it and it is collected, with whatever "
            "it holds (a connection it opened). A prototype kept in a cache, a list of made "
            "objects or a map of raw objects lives on until the context does.",
            expected="both tickets from get_bean collected once the check dropped its "
                     "references (the context still open)",
            actual=f"{len(kept)} of 2 still alive after the check let go of them and ran "
                   "gc.collect()",
            evidence=table(kept, ("ticket", "held by")) + "\n" + evidence,
            lesson=PROTOTYPE,
        )


def _still_referenced(refs: list[weakref.ref[Any]]) -> list[tuple[str, str]]:
    """Which objects outlived the check's references, after gc.collect(): (which, held by)."""
    gc.collect()
    kept = []
    for index, ref in enumerate(refs):
        obj = ref()
        if obj is not None:
            holders = sorted({type(r).__name__ for r in gc.get_referrers(obj)
                              if not isinstance(r, weakref.ref)})
            kept.append((f"get_bean #{index + 1}", ", ".join(holders) or "?"))
            del obj
    return kept


# ---- request scope -------------------------------------------------------------------------

BASKETS = """\
    from __future__ import annotations

    from typing import Annotated

    from markers import Autowired, bean, component, configuration, pre_destroy, scope
    import {probe} as probe


    @scope("request")
    @component
    class Basket:
        def __init__(self):
            self.items = []
            probe.events.append(("init", f"basket {id(self)}"))

        def itself(self):
            return self

        @pre_destroy
        def discard(self):
            probe.events.append(("destroy", f"basket {id(self)}"))


    @component
    class Checkout:
        def __init__(self, basket: Basket):
            self.basket = basket
            probe.events.append(("init", "checkout"))

        def add(self, item):
            self.basket.items.append(item)

        def current(self):
            return self.basket.itself()


    @component
    class Till:
        basket: Annotated[Basket, Autowired()]

        def current(self):
            return self.basket.itself()


    class Receipt:
        def __init__(self):
            probe.events.append(("init", f"receipt {id(self)}"))

        def close(self):
            probe.events.append(("destroy", f"receipt {id(self)}"))


    @configuration
    class TillConfig:
        @scope("request")
        @bean(destroy_method="close")
        def receipt(self) -> Receipt:
            return Receipt()
    """


def _baskets(learner: Any, make_app: Any, lesson: str, extra: str = ""
             ) -> tuple[Any, Any, Any]:
    app = make_app("shop")
    app.write("baskets.py", BASKETS)
    if extra:
        app.write("cashier.py", extra)
    ctx = _refreshed(learner, app, "Basket (@scope('request'), @pre_destroy discard); "
                                   "singletons Checkout(basket: Basket) and Till (basket: an "
                                   "Autowired field); TillConfig's @scope('request') "
                                   "@bean(destroy_method='close') receipt", lesson)
    return app, ctx, learner.module("scopes")


def _in_request(scopes: Any, ctx: Any, app: Any, meet: Callable[[], Any],
                receipt: bool = False) -> dict[str, Any]:
    """In one request: get_bean('basket'), meet(), again, meet(); destroyed when it ended.

    Run concurrently with meet() a barrier, every second lookup happens while all the
    requests are open and none starts or ends. With `receipt`, the request also gets the
    request-scoped @bean receipt.
    """
    seen: dict[str, Any] = {}
    with scopes.request():
        seen["first"] = ctx.get_bean("basket")
        if receipt:
            seen["receipt"] = ctx.get_bean("receipt")
        meet()
        seen["second"] = ctx.get_bean("basket")
        meet()
        seen["destroyed_inside"] = f"basket {id(seen['first'])}" in _events(app, "destroy")
    seen["destroyed_after"] = _events(app, "destroy").count(f"basket {id(seen['first'])}")
    if receipt:
        seen["receipt_closed"] = _events(app, "destroy").count(f"receipt {id(seen['receipt'])}")
    return seen


def _request_problems(runs: list[dict[str, Any]], who: str) -> list[str]:
    """What went wrong, the most telling first (one line, whatever the interleaving)."""
    for when in ("second", "first"):
        distinct = len({id(run[when]) for run in runs})
        if distinct != len(runs):
            return [f"the {when} lookups in {len(runs)} {who}s, each in its own request, "
                    f"gave {distinct} distinct basket(s)"]
    if any(run["first"] is not run["second"] for run in runs):
        return [f"in a {who}, two get_bean('basket') in one request gave two objects"]
    return []


def _request_rows(runs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(i, id(r["first"]), id(r["second"]), r["destroyed_after"])
            for i, r in enumerate(runs)]


REQUEST_COLUMNS = ("request", "first get_bean", "second get_bean", "destroyed")


class _RequestFailed(Exception):
    """Raised by the check inside a request, to end that request with an exception."""


def _failed_request(scopes: Any, ctx: Any, app: Any) -> dict[str, Any]:
    """A request that ends with an exception after its lookups; destroyed when it ended."""
    seen: dict[str, Any] = {"destroyed_inside": False}
    try:
        with scopes.request():
            seen["first"] = seen["second"] = ctx.get_bean("basket")
            seen["receipt"] = ctx.get_bean("receipt")
            raise _RequestFailed("the check ends this request with an exception")
    except _RequestFailed:
        pass
    seen["destroyed_after"] = _events(app, "destroy").count(f"basket {id(seen['first'])}")
    seen["receipt_closed"] = _events(app, "destroy").count(f"receipt {id(seen['receipt'])}")
    return seen


class _Cancelled(asyncio.CancelledError):
    """What the check raises inside a request, as a cancelled task's await would."""


def _cancelled_request(scopes: Any, ctx: Any, app: Any) -> dict[str, Any]:
    """A request ended by asyncio.CancelledError (a BaseException, not an Exception).

    It runs in a copy of the current contextvars context, so a request left in progress by
    the code under test does not follow the check's other requests (or other checks).
    """
    def cancelled() -> dict[str, Any]:
        seen: dict[str, Any] = {"destroyed_inside": False}
        try:
            with scopes.request():
                seen["first"] = seen["second"] = ctx.get_bean("basket")
                seen["receipt"] = ctx.get_bean("receipt")
                raise _Cancelled("the check cancels this request")
        except _Cancelled:
            pass
        seen["after_lookup"] = _lookup(ctx, "basket")
        seen["destroyed_after"] = _events(app, "destroy").count(f"basket {id(seen['first'])}")
        seen["receipt_closed"] = _events(app, "destroy").count(
            f"receipt {id(seen['receipt'])}")
        return seen
    return contextvars.copy_context().run(cancelled)


ENDED = ("", "", " (ended by an exception)", " (cancelled: asyncio.CancelledError)")


def _lookup(ctx: Any, name: str) -> Any:
    """What get_bean(name) returned, or the exception it raised (a stub's still fails)."""
    try:
        return ctx.get_bean(name)
    except NotWritten:
        raise
    except Exception as error:  # ScopeNotActiveError, or the learner's own
        return error


def _nested_request(scopes: Any, ctx: Any, app: Any) -> dict[str, Any]:
    """A request with another inside it: the outer basket, the inner one, the outer again."""
    seen: dict[str, Any] = {}
    with scopes.request():
        seen["outer"] = ctx.get_bean("basket")
        with scopes.request():
            seen["inner"] = ctx.get_bean("basket")
        seen["inner_destroyed"] = _events(app, "destroy").count(f"basket {id(seen['inner'])}")
        seen["again"] = _lookup(ctx, "basket")
        seen["outer_destroyed_inside"] = _events(app, "destroy").count(
            f"basket {id(seen['outer'])}")
    seen["outer_destroyed"] = _events(app, "destroy").count(f"basket {id(seen['outer'])}")
    return seen


def _nested_problems(nested: dict[str, Any]) -> list[str]:
    outer, inner, again = nested["outer"], nested["inner"], nested["again"]
    problems = []
    if inner is outer:
        problems.append("a request started inside another got the outer request's basket, "
                        "not one of its own")
    elif nested["inner_destroyed"] != 1:
        problems.append(f"the nested request's basket: destroyed {nested['inner_destroyed']} "
                        "time(s) when the nested request ended")
    if isinstance(again, BaseException):
        problems.append("once a nested request had ended, get_bean('basket') in the outer "
                        f"request, still open, raised {type(again).__name__}: {again}")
    elif again is not outer:
        problems.append("once a nested request had ended, get_bean('basket') in the outer "
                        "request gave " + ("the nested request's basket" if again is inner
                                           else "another basket") + ", not the outer one")
    if nested["outer_destroyed_inside"]:
        problems.append("the outer request's basket was destroyed before the outer request "
                        "ended")
    elif nested["outer_destroyed"] != 1:
        problems.append(f"the outer request's basket: destroyed {nested['outer_destroyed']} "
                        "time(s) when the outer request ended")
    return problems


def test_a_request_bean_lives_as_long_as_its_request(learner, make_app):
    app, ctx, scopes = _baskets(learner, make_app, REQUEST)
    made_at_refresh = [w for w in _events(app, "init") if w.startswith("basket")]
    outside = raised(ctx.get_bean, "basket")
    nested = call(_nested_request, scopes, ctx, app)
    runs = [call(_in_request, scopes, ctx, app, lambda: None, True) for _ in range(2)]
    runs.append(call(_failed_request, scopes, ctx, app))
    runs.append(call(_cancelled_request, scopes, ctx, app))
    closed = raised(ctx.close)
    after_close = [_events(app, "destroy").count(f"basket {id(r['first'])}") for r in runs]
    problems = []
    if not isinstance(outside, scopes.ScopeNotActiveError):
        problems.append("get_bean('basket') outside a request "
                        + ("returned instead of raising" if outside is None
                           else f"raised {type(outside).__name__}: {outside}"))
    if made_at_refresh:
        problems.append(f"refresh() made {len(made_at_refresh)} basket(s)")
    problems += _request_problems(runs, "request")
    for index, run in enumerate(runs):
        how = ENDED[index]
        if run["destroyed_inside"] or run["destroyed_after"] != 1:
            problems.append(f"request {index}'s basket{how}: destroyed "
                            + ("before its request ended" if run["destroyed_inside"]
                               else f"{run['destroyed_after']} time(s) when it ended"))
        elif after_close[index] != 1:
            problems.append(f"request {index}'s basket{how}: destroyed again by close()")
    receipts = [(index, run["receipt_closed"]) for index, run in enumerate(runs)
                if run["receipt_closed"] != 1]
    if receipts:
        problems.append("receipt, a request-scoped @bean(destroy_method='close'): its close() "
                        "ran " + ", ".join(
                            f"{n} time(s) when request {index}"
                            + ENDED[index] + " ended"
                            for index, n in receipts))
    after_cancel = runs[3]["after_lookup"]
    refused = isinstance(outside, scopes.ScopeNotActiveError)   # else the same lookup is wrong
    leaked = refused and not isinstance(after_cancel, scopes.ScopeNotActiveError)
    if leaked:
        problems.append("once request 3 (cancelled) had ended, get_bean('basket') outside any "
                        "request " + (f"raised {type(after_cancel).__name__}: {after_cancel}"
                                      if isinstance(after_cancel, BaseException)
                                      else "returned a basket: that request was still the "
                                           "one in progress"))
    receipts_only = bool(receipts) and len(problems) == 1 and all(n == 0 for _, n in receipts)
    cancelled = runs[3]
    cancel_only = refused and (cancelled["destroyed_after"] == 0 or leaked) and all(
        run["destroyed_after"] == run["receipt_closed"] == 1 for run in runs[:3])
    nested_problems = _nested_problems(nested)
    problems += nested_problems
    if closed is not None:
        problems.append(f"close() raised {type(closed).__name__}: {closed}")
    if problems:
        fix = None
        if cancel_only and not nested_problems and closed is None:
            fix = ("End the request in a `finally:` (not in `except Exception:`): a cancelled "
                   "task's asyncio.CancelledError, like KeyboardInterrupt, is a BaseException "
                   "and must end the request too.")
        elif receipts_only and not nested_problems and closed is None:
            fix = ("When a request ends, destroy each of its beans as close() destroys a "
                   "singleton: its @pre_destroy methods, then a @bean's destroy_method.")
        elif nested_problems and len(problems) == len(nested_problems) and isinstance(
                nested["again"], scopes.ScopeNotActiveError):
            fix = ("When a request ends, reset the ContextVar with the token its set() "
                   "returned: the request around it is then the current one again "
                   "(set(None) forgets it).")
        raise CheckFailure(
            "A request-scoped bean belongs to the request in progress: made on its first "
            "lookup in the request, the same object for the rest of it, destroyed (its "
            "@pre_destroy, a @bean's destroy_method) when the request ends, by an exception "
            "too (a cancelled task's CancelledError included), and not to be had outside a "
            "request; a request started inside another has "
            "beans of its own, and once it ends the outer request is the one in progress "
            "again; close() destroys singletons only.",
            expected="ScopeNotActiveError outside a request; one basket and one receipt per "
                     "request, destroyed once when its `with scopes.request()` block ends; in "
                     "a nested request another basket, and the outer request's basket again "
                     "once it has ended",
            actual="; ".join(problems),
            evidence="first a request with another inside it:\n"
                     + table([("outer", id(nested["outer"]), nested["outer_destroyed"]),
                              ("nested", id(nested["inner"]), nested["inner_destroyed"]),
                              ("outer, after the nested one", _shown(nested["again"]), "")],
                             ("lookup", "basket", "destroyed"))
                     + "\nthen four requests, one after the other, the third ended by an "
                       "exception:\n"
                     + table([(*row, run["receipt_closed"], n) for row, run, n in zip(
                         _request_rows(runs), runs, after_close, strict=True)],
                             (*REQUEST_COLUMNS, "receipt closed", "destroyed, after close()"))
                     + "\nevents, in order:\n" + table(list(app.probe.events), ("event", "bean")),
            lesson=REQUEST,
            fix=fix,
        )


FAILING_DESTROY = """\
    from markers import component, pre_destroy, scope
    import {probe} as probe


    class TillJammed(Exception):
        pass


    @scope("request")
    @component
    class Cart:
        @pre_destroy
        def unlock(self):
            probe.events.append(("destroy", "cart"))


    @scope("request")
    @component
    class Till:
        @pre_destroy
        def close(self):
            probe.events.append(("destroy", "till"))
            raise TillJammed("the till is jammed")


    @scope("request")
    @component
    class Tray:
        @pre_destroy
        def empty(self):
            probe.events.append(("destroy", "tray"))
    """


def test_a_failing_destroy_callback_keeps_no_other_request_bean_alive(learner, make_app):
    app = make_app("shop")
    app.write("tills.py", FAILING_DESTROY)
    ctx = _refreshed(learner, app, "Cart, Till and Tray (@scope('request'), each with a "
                                   "@pre_destroy; Till's raises TillJammed)", REQUEST)
    scopes = learner.module("scopes")

    def one_request() -> tuple[Any, Any]:
        def run() -> None:
            with scopes.request():
                for name in ("cart", "till", "tray"):   # made in this order: whichever order
                    call(ctx.get_bean, name)            # they go in, one goes after till
        ended = raised(run)
        return ended, _lookup(ctx, "cart")
    # in a copy of the context: a request left in progress does not follow the check
    ended, after = contextvars.copy_context().run(one_request)
    destroyed = _events(app, "destroy")
    problems = [f"{name}'s @pre_destroy never ran" for name in ("cart", "till", "tray")
                if name not in destroyed]
    if not isinstance(after, scopes.ScopeNotActiveError):
        problems.append("after that request, get_bean('cart') outside any request "
                        + (f"raised {type(after).__name__}: {after}"
                           if isinstance(after, BaseException)
                           else "returned a cart: the request was still in progress"))
    if problems:
        stopped = "till" in destroyed and destroyed[-1] == "till" and len(destroyed) < 3
        raise CheckFailure(
            "A destroy callback that raises when a request ends keeps no other bean of the "
            "request alive: each of them is still destroyed, and the request is over (the "
            "with statement may then raise that error, or only log it).",
            expected="cart's, till's (raises TillJammed) and tray's @pre_destroy all run; no "
                     "request in progress afterwards",
            actual="; ".join(problems),
            evidence="destroy callbacks that ran, in order: " + (", ".join(destroyed) or "none")
            + "\nthe with statement "
            + (f"raised {type(ended).__name__}: {ended}" if ended else "returned"),
            lesson=REQUEST,
            fix="Destroy each bean of the request in its own try: one whose callback raises "
                "must not stop the others (raise or log its error once all are done)."
            if stopped else None,
        )


def test_each_context_has_its_own_request_beans(learner, make_app):
    shop, shop_ctx, scopes = _baskets(learner, make_app, REQUEST)
    cafe, cafe_ctx, _ = _baskets(learner, make_app, REQUEST)
    seen: dict[str, Any] = {}
    with scopes.request():
        seen["shop"] = call(shop_ctx.get_bean, "basket")
        seen["cafe"] = call(cafe_ctx.get_bean, "basket")
        seen["shop again"] = call(shop_ctx.get_bean, "basket")
        seen["cafe again"] = call(cafe_ctx.get_bean, "basket")
    apps = {"shop": shop, "cafe": cafe}
    made = {name: [w for w in _events(app, "init") if w.startswith("basket")]
            for name, app in apps.items()}
    destroyed = {name: [w for w in _events(app, "destroy") if w.startswith("basket")]
                 for name, app in apps.items()}
    problems = []
    for name, app in apps.items():
        own, again = seen[name], seen[f"{name} again"]
        if not type(own).__module__.startswith(app.base + "."):
            other = "the other context's" if own is seen["cafe" if name == "shop" else "shop"] \
                else "an object of another application's"
            problems.append(f"{name}'s context gave {other} basket ({type(own).__module__})")
        elif again is not own:
            problems.append(f"{name}'s context gave another basket at its second lookup")
        if len(made[name]) != 1:
            problems.append(f"{name}'s Basket constructor ran {len(made[name])} time(s)")
        if len(destroyed[name]) != len(made[name]):
            problems.append(f"{name}: {len(made[name])} basket(s) made, "
                            f"{len(destroyed[name])} destroyed when the request ended")
    if problems:
        shared = seen["shop"] is seen["cafe"] or seen["cafe"] is seen["shop again"]
        raise CheckFailure(
            "A request holds the request-scoped beans of every context used in it, each "
            "context's its own: two applications whose request-scoped beans have the same "
            "name each make their own in the request and get it back at every lookup, and "
            "both are destroyed when the request ends.",
            expected="in one request, each context's get_bean('basket') makes a basket of its "
                     "own application once and gives it back again; both destroyed at the end",
            actual="; ".join(problems),
            evidence=table([(k, type(v).__module__, id(v)) for k, v in seen.items()],
                           ("get_bean('basket') of", "class from", "id"))
            + "\n" + "\n".join(f"{name} ({app.base}) events: "
                                + ", ".join(f"{k} {w}" for k, w in app.probe.events)
                                for name, app in apps.items())
            + "\ntwo applications, each with a request-scoped Basket named basket, refreshed "
              "in two contexts; one request uses both",
            lesson=REQUEST,
            fix="Keep a request's beans per context and name (the context is part of the key), "
                "not by the bean's name alone." if shared else None,
        )


def _shown(found: Any) -> Any:
    """A basket's id, or the exception a lookup raised."""
    if isinstance(found, BaseException):
        return f"{type(found).__name__}: {found}"
    return id(found)


def test_concurrent_requests_in_threads_each_have_their_own_bean(learner, make_app):
    app, ctx, scopes = _baskets(learner, make_app, REQUEST)
    barrier = threading.Barrier(3, timeout=30)

    def one_request() -> dict[str, Any]:
        try:
            return _in_request(scopes, ctx, app, barrier.wait)
        except BaseException:
            barrier.abort()                 # the other threads stop waiting for this one
            raise

    runs = _outcomes([in_thread(one_request) for _ in range(3)])
    problems = _request_problems(runs, "thread")
    if problems:
        raise CheckFailure(
            "Three threads, each in its own request at the same time, must each get their "
            "own basket, and keep it: the request in progress is per thread, not one "
            "module-wide value that the last request to start overwrites.",
            expected="3 distinct baskets, each the same for both lookups in its thread",
            actual="; ".join(problems),
            evidence="the threads met at a barrier before and after their second lookup:\n"
                     + table(_request_rows(runs), REQUEST_COLUMNS),
            lesson=REQUEST,
            fix="Keep the request in progress in a contextvars.ContextVar, set when the "
                "request starts and reset with its token when it ends."
            if len({id(r["second"]) for r in runs}) == 1 else None,
        )


def test_concurrent_requests_in_asyncio_tasks_each_have_their_own_bean(learner, make_app):
    app, ctx, scopes = _baskets(learner, make_app, REQUEST)

    async def main() -> list[Any]:
        barrier = asyncio.Barrier(3)

        async def one_request() -> dict[str, Any]:
            seen: dict[str, Any] = {}
            with scopes.request():
                seen["first"] = ctx.get_bean("basket")
                await asyncio.wait_for(barrier.wait(), 30)
                seen["second"] = ctx.get_bean("basket")
                await asyncio.wait_for(barrier.wait(), 30)
                seen["destroyed_inside"] = False
            seen["destroyed_after"] = _events(app, "destroy").count(f"basket {id(seen['first'])}")
            return seen

        return list(await asyncio.gather(*(one_request() for _ in range(3))))

    runs = call(asyncio.run, main())
    problems = _request_problems(runs, "task")
    if problems:
        raise CheckFailure(
            "Three asyncio tasks on one thread, each in its own request at the same time, "
            "must each get their own basket: a task runs in its own copy of the contextvars "
            "context, which a threading.local or a module-wide value does not follow (the "
            "tasks share the thread).",
            expected="3 distinct baskets, each the same for both lookups in its task",
            actual="; ".join(problems),
            evidence="the tasks met at an asyncio.Barrier before and after their second lookup:\n"
                     + table(_request_rows(runs), REQUEST_COLUMNS),
            lesson=REQUEST,
            fix="Keep the request in progress in a contextvars.ContextVar: each task sees "
                "its own value, a threading.local is one per thread."
            if len({id(r["second"]) for r in runs}) == 1 else None,
        )


LATE_CASHIER = """\
    from markers import component, lazy
    from {base}.baskets import Basket


    @lazy
    @component
    class Cashier:          # first made inside a request, yet it outlives that request
        def __init__(self, basket: Basket):
            self.basket = basket

        def current(self):
            return self.basket.itself()
    """


def test_a_singleton_reaches_each_requests_bean_through_a_scoped_proxy(learner, make_app):
    app, ctx, scopes = _baskets(learner, make_app, SHORTER_LIVED, extra=LATE_CASHIER)
    checkout, till = call(ctx.get_bean, "checkout"), call(ctx.get_bean, "till")
    outside = raised(checkout.current)
    seen = []
    orders = (["tea"], ["bread", "jam"])
    for items in orders:
        def shop(items: list[str] = items) -> tuple[Any, Any, Any, list[str]]:
            with scopes.request():
                for item in items:
                    checkout.add(item)
                return checkout.current(), till.current(), ctx.get_bean("basket"), list(
                    ctx.get_bean("basket").items)
        seen.append(call(shop))
    problems = []
    if not isinstance(outside, scopes.ScopeNotActiveError):
        problems.append("checkout.current() outside a request "
                        + ("returned instead of raising" if outside is None
                           else f"raised {type(outside).__name__}: {outside}"))
    for index, ((through, field, own, items), wanted) in enumerate(zip(seen, orders,
                                                                       strict=True)):
        if through is not own:
            problems.append(f"request {index}: checkout's basket is not the request's own")
        if field is not own:
            problems.append(f"request {index}: till's Autowired basket is not the request's own")
        if items != wanted:
            problems.append(f"request {index}: its basket holds {items}, expected {wanted}")
    late = []
    for _ in range(2):
        def pay() -> tuple[Any, Any]:
            with scopes.request():
                return ctx.get_bean("cashier").current(), ctx.get_bean("basket")
        late.append(call(pay))
    for index, (through, own) in enumerate(late):
        if through is not own:
            problems.append(f"@lazy cashier, first made in a request, in request "
                            f"{len(seen) + index}: its basket is not the request's own"
                            + (" (it is the one of the request that made cashier)"
                               if index and through is late[0][1] else ""))
    if problems:
        raise CheckFailure(
            "A singleton is built once, but a request-scoped bean it takes must be a scoped "
            "proxy: a stand-in that finds the current request's bean on every use, so each "
            "request works on its own basket and a use outside a request is an error.",
            expected="ScopeNotActiveError from checkout.current() outside a request; in each "
                     "request, checkout's basket (a constructor parameter) and till's (an "
                     "Autowired field) are that request's basket, and so is the basket of "
                     "cashier, a @lazy singleton first made inside a request",
            actual="; ".join(problems),
            evidence=table([(i, id(t), id(f), id(o), items)
                            for i, (t, f, o, items) in enumerate(seen)],
                           ("request", "checkout.current()", "till.current()",
                            "get_bean('basket')", "items"))
            + "\nevents, in order:\n" + table(list(app.probe.events), ("event", "bean")),
            lesson=SHORTER_LIVED,
        )


# ---- a request-scoped unit of work on PostgreSQL -------------------------------------------

UNIT_OF_WORK = """\
    from __future__ import annotations

    from sqlalchemy import Engine, create_engine, text
    from sqlalchemy.pool import NullPool

    from markers import bean, component, configuration, pre_destroy, scope
    import {probe} as probe


    @configuration
    class DataConfig:
        @bean(destroy_method="dispose")
        def engine(self) -> Engine:
            return create_engine(probe.URL, poolclass=NullPool)


    @scope("request")
    @component
    class UnitOfWork:
        def __init__(self, engine: Engine):
            self.connection = engine.connect()
            self.pid = self.connection.execute(text("SELECT pg_backend_pid()")).scalar_one()
            probe.events.append(("init", f"unitOfWork on backend {self.pid}"))

        def backend(self):
            return self.pid

        @pre_destroy
        def end(self):
            self.connection.close()
            probe.events.append(("destroy", f"unitOfWork on backend {self.pid}"))


    @component
    class ReportService:
        def __init__(self, work: UnitOfWork):
            self.work = work

        def backend(self):
            return self.work.backend()
    """


def _sessions_named(engine: Any, name: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT pid, state, backend_start::text FROM pg_stat_activity "
            "WHERE application_name = :name ORDER BY pid"), {"name": name})]


def test_each_request_has_its_own_unit_of_work_on_postgresql(learner, make_app, database):
    app = make_app("shop")
    app.write("work.py", UNIT_OF_WORK)
    name = f"dojo_uow_{uuid.uuid4().hex[:8]}"
    app.probe.URL = make_url(database.url).update_query_dict(
        {"application_name": name}).render_as_string(hide_password=False)
    ctx = _refreshed(learner, app, "UnitOfWork (@scope('request'): its own connection, closed "
                                   "by @pre_destroy), ReportService(work: UnitOfWork)",
                     SHORTER_LIVED)
    scopes = learner.module("scopes")
    service = call(ctx.get_bean, "reportService")
    requests = 3
    held = threading.Barrier(requests + 1, timeout=30)
    released = threading.Barrier(requests + 1, timeout=30)

    def one_request() -> tuple[int, int, int]:
        try:
            with scopes.request():
                through_proxy = service.backend()
                own = ctx.get_bean("unitOfWork").backend()
                held.wait()                 # the check reads pg_stat_activity now
                released.wait()
                again = service.backend()
            return through_proxy, own, again
        except BaseException:
            held.abort()
            released.abort()
            raise

    jobs = [in_thread(one_request) for _ in range(requests)]
    during: list[tuple[Any, ...]] = []
    try:
        held.wait()
        during = _sessions_named(database.engine, name)
        released.wait()
    except threading.BrokenBarrierError:
        pass                                # a request failed: its error is raised below
    try:
        got = _outcomes(jobs)
        deadline = time.monotonic() + 10    # a backend leaves a moment after its client
        left = _sessions_named(database.engine, name)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = _sessions_named(database.engine, name)
    finally:
        raised(ctx.close)
    rows = [(i, proxy, own, again) for i, (proxy, own, again) in enumerate(got)]
    evidence = ("backend pids seen by each request:\n"
                + table(rows, ("request", "reportService.backend()", "its unitOfWork",
                               "after the pause"))
                + f"\npg_stat_activity ({name}) while all {requests} requests were open:\n"
                + table(during, ("pid", "state", "backend_start")))
    owns = [own for _, own, _ in got]
    if len(set(owns)) != requests:
        raise CheckFailure(
            f"{requests} concurrent requests must each get their own request-scoped unit of "
            "work, holding its own PostgreSQL connection.",
            expected=f"{requests} distinct backend pids",
            actual=f"{len(set(owns))} distinct backend pid(s)",
            evidence=evidence,
            lesson=REQUEST,
        )
    wrong = [i for i, (proxy, own, again) in enumerate(got) if not proxy == own == again]
    if wrong:
        raise CheckFailure(
            "The singleton ReportService must reach the current request's unit of work "
            "through its scoped proxy on every call; a proxy that keeps the first bean it "
            "found hands one request's connection to every other request.",
            expected="in each request, reportService.backend() is that request's own backend",
            actual=f"{len(wrong)} of {requests} requests got another request's backend "
                   "through the scoped proxy",
            evidence=evidence,
            lesson=SHORTER_LIVED,
            fix="Resolve the target in the proxy on every attribute access; never store it.",
        )
    seen = {row[0] for row in during}
    if seen != set(owns):
        raise CheckFailure(
            "While the requests are open, their connections are the application's sessions "
            "in pg_stat_activity: one backend per request.",
            expected=f"the backends {sorted(owns)}",
            actual=f"pg_stat_activity showed {sorted(seen)}",
            evidence=evidence,
            lesson=REQUEST,
        )
    if left:
        raise CheckFailure(
            "A request-scoped bean is destroyed when its request ends: the unit of work's "
            "@pre_destroy closes its connection, so no session of the application is left "
            "once every request is over.",
            expected=f"no session with application_name {name} after the requests ended",
            actual=f"{len(left)} session(s) still open 10 s later",
            evidence=evidence + "\nleft after the requests:\n"
            + table(left, ("pid", "state", "backend_start")),
            lesson=REQUEST,
        )



PROCESSED_BASKET = """\
    from __future__ import annotations

    from markers import component, pre_destroy, scope
    import {probe} as probe


    @scope("request")
    @component
    class Basket:
        def __init__(self):
            probe.events.append(("made", "basket", self))

        @pre_destroy
        def empty(self):
            probe.events.append(("destroyed", "basket", self))
    """

PROCESSED_SHAPE = ("Basket @scope(\"request\") with a @pre_destroy; Stamper and Sealer "
                   "(BeanPostProcessors): each before_init and after_init returns a new "
                   "Wrapped(bean), an object without the bean's methods")


def test_a_request_bean_is_post_processed_shared_and_destroyed_as_made(learner, make_app):
    app = make_app("shop")
    app.write("processors.py", CHAINED_PROCESSORS)
    app.write("basket.py", PROCESSED_BASKET)
    app.probe.WATCHED = {"basket"}
    ctx = _refreshed(learner, app, PROCESSED_SHAPE, REQUEST)
    scopes = learner.module("scopes")
    basket_type = application_module(f"{app.base}.basket").Basket
    with scopes.request():
        lookups = [("get_bean('basket')", call(ctx.get_bean, "basket")),
                   ("get_bean(Basket)", call(ctx.get_bean, basket_type)),
                   ("get_bean('basket') again", call(ctx.get_bean, "basket"))]
        destroyed_inside = [e for e in app.probe.events if e[0] == "destroyed"]
    events = list(app.probe.events)
    made = [e[2] for e in events if e[0] == "made"]
    destroyed = [e[2] for e in events if e[0] == "destroyed"]
    problems: list[str] = []
    finals = []
    for obj in made:
        final, wrong = chain_problems(events, "basket", obj)
        problems += [p for p in wrong if p not in problems]
        finals.append(final)
    if len(made) != 1:
        problems.append(f"{len(made)} baskets made in one request")
    if len({id(got) for _, got in lookups}) != 1:
        problems.append("the lookups in one request did not all return the same object")
    elif not any(final is lookups[0][1] for final in finals if final is not None):
        problems.append("get_bean in the request is not what the last after_init returned")
    if destroyed_inside:
        problems.append("the basket was destroyed before its request ended")
    if len(made) == 1 and [id(d) for d in destroyed] != [id(made[0])]:
        problems.append("when the request ended, " + (
            "the basket's @pre_destroy never ran" if not destroyed else
            f"@pre_destroy ran {len(destroyed)} time(s)" if len(destroyed) != 1 else
            "@pre_destroy ran on another object than the one its constructor made"))
    if problems:
        rows = [(what, "the Wrapped the last after_init returned"
                 if any(f is got and f is not None for f in finals)
                 else type(got).__name__, id(got)) for what, got in lookups]
        raise CheckFailure(
            "A request-scoped bean is made once per request and, like every bean the "
            "container creates, passes through every bean post-processor (each handed what "
            "the previous one returned); every lookup in the request, by name or by type, "
            "returns what the last after_init returned, and when the request ends its "
            "destroy callbacks run once, on the object as made (as close() does for "
            "singletons: what after_init returned may be a wrapper without them).",
            expected="one basket made; before_init, then after_init, of both post-processors, "
                     "chained; the three lookups return the one object the last after_init "
                     "returned; its @pre_destroy runs once, on the object as made, when the "
                     "request ends",
            actual="; ".join(problems),
            evidence=PROCESSED_SHAPE + "\n" + table(rows, ("lookup in one request", "got",
                                                           "id"))
                     + "\nevents, in order:\n" + table(
                         [(e[0], e[2] if e[0] in ("before", "after") else "",
                           "the object as made" if any(e[-1] is m for m in made)
                           else type(e[-1]).__name__) for e in events],
                         ("event", "post-processor", "object")),
            lesson=REQUEST,
        )
