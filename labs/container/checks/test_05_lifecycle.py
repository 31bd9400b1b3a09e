"""Stage lifecycle: post-processors, init callbacks, ContextRefreshed, and close().

The applications record what happens to them in the probe module's `events`: ("init", bean)
when a constructor runs, and ("before", bean), ("post_construct", bean), ("after", bean),
("refreshed", bean), ("destroy", bean) for the other steps. The Engine and the Producer are
proven from outside: pg_stat_activity by the application_name the check gave the datasource
URL, and the records that reached the topic.
"""

from __future__ import annotations

import textwrap
import time
import uuid
from collections import Counter

import pytest
from _support import (
    CHAINED_PROCESSORS,
    EVENTS,
    SHUTDOWN,
    SINGLETON_LIFE,
    TWO_PROCESSORS,
    application_module,
    chain_problems,
)
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from dojo.checks import CheckFailure, call, raised, table
from dojo.checks.observers import read_topic

pytestmark = pytest.mark.stage("lifecycle")


def _refreshed(learner, app, shape, properties=None, imports=()):
    """A refreshed context, or a failure naming the application's shape."""
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, properties or {},
               list(imports) if imports is not None else None)
    error = raised(ctx.refresh)
    if error is not None:
        raise CheckFailure(
            "refresh() failed on an application that the README's rules can build.",
            expected="refresh() succeeds",
            actual=f"{type(error).__name__}: {error}",
            evidence=shape,
            lesson=SINGLETON_LIFE,
        )
    return ctx


def _steps(app, kinds):
    return [(kind, bean) for kind, bean in app.probe.events if kind in kinds]


def test_definition_post_processors_run_before_any_bean_exists(learner, make_app):
    app = make_app("shop")
    app.write("jobs.py", """\
        from markers import component
        import {probe} as probe


        @component
        class ReportJob:
            def __init__(self):
                probe.events.append(("init", "reportJob"))


        @component
        class Draft:
            def __init__(self):
                probe.events.append(("init", "draft"))
        """)
    app.write("zz_tuning.py", """\
        from dataclasses import replace

        from markers import DefinitionPostProcessor, component
        import {probe} as probe


        @component
        class Tuner(DefinitionPostProcessor):
            def __init__(self):
                probe.events.append(("init", "tuner"))

            def post_process_definitions(self, definitions):
                made = [bean for kind, bean in probe.events if kind == "init"]
                probe.events.append(("post_process", ",".join(made)))
                definitions["reportJob"] = replace(definitions["reportJob"], lazy=True)
                definitions["draft"] = replace(definitions["draft"], scope="prototype")
        """)
    ctx = _refreshed(learner, app, "ReportJob, Draft; Tuner(DefinitionPostProcessor) makes "
                                   "reportJob lazy and draft a prototype", imports=[])
    calls = [made for kind, made in app.probe.events if kind == "post_process"]
    after_refresh = Counter(app.created())
    first, second = call(ctx.get_bean, "draft"), call(ctx.get_bean, "draft")
    problems = []
    if len(calls) != 1:
        problems.append(f"post_process_definitions called {len(calls)} time(s)")
    elif calls[0] != "tuner":
        problems.append(f"when post_process_definitions ran, these beans existed: {calls[0]}")
    if after_refresh["reportJob"]:
        problems.append("reportJob (made lazy by the post-processor) was created by refresh()")
    if first is second:
        problems.append("draft (made a prototype) gave the same object to two get_bean calls")
    if problems:
        raise CheckFailure(
            "Definition post-processors work on definitions, not objects: they are created "
            "and called before any other bean of the application exists, and what they "
            "change in ctx.definitions is what the context then builds.",
            expected="post_process_definitions called once, with only tuner made; reportJob "
                     "not created by refresh(); two get_bean('draft') give two objects",
            actual="; ".join(problems),
            evidence="events, in order:\n" + table(list(app.probe.events), ("event", "bean")),
            lesson=TWO_PROCESSORS,
        )


PROCESSED = """\
    from __future__ import annotations

    from markers import BeanPostProcessor, bean, component, configuration, post_construct
    import {probe} as probe


    @component
    class Inventory:
        def __init__(self):
            probe.events.append(("init", "inventory"))

        @post_construct
        def warm(self):
            probe.events.append(("post_construct", "inventory"))


    @component
    class Orders:
        def __init__(self, inventory: Inventory):
            probe.events.append(("init", "orders"))
            self.inventory = inventory

        @post_construct
        def check(self):
            probe.events.append(("post_construct", "orders"))


    class Catalog:
        pass


    @configuration
    class CatalogConfig:
        @bean
        def catalog(self) -> Catalog:
            probe.events.append(("init", "catalog"))
            return Catalog()


    class TracedInventory(Inventory):
        '''What the post-processor hands out instead of the inventory: a wrapper.'''

        def __init__(self, target):
            self.target = target


    @component
    class Tracer(BeanPostProcessor):
        def before_init(self, bean, name):
            probe.events.append(("before", name))
            return bean

        def after_init(self, bean, name):
            probe.events.append(("after", name))
            return TracedInventory(bean) if name == "inventory" else bean
    """


def test_bean_post_processors_wrap_each_bean_around_its_init(learner, make_app):
    app = make_app("shop")
    app.write("stock.py", PROCESSED)
    ctx = _refreshed(learner, app, "Tracer(BeanPostProcessor) wraps inventory in a "
                                   "TracedInventory; Orders(inventory: Inventory); @bean catalog",
                     imports=[])
    stock = application_module(f"{app.base}.stock")
    kept = call(ctx.get_bean, "inventory")
    orders = call(ctx.get_bean, "orders")
    by_type = call(ctx.get_bean, stock.Inventory)
    steps = _steps(app, ("init", "before", "post_construct", "after"))
    rows, wrong = [], []
    for name, wanted in (("inventory", ["init", "before", "post_construct", "after"]),
                         ("orders", ["init", "before", "post_construct", "after"]),
                         ("catalogConfig", ["before", "after"]),
                         ("catalog", ["init", "before", "after"])):
        got = [kind for kind, bean in steps if bean == name]
        rows.append((name, " → ".join(wanted), " → ".join(got) or "nothing"))
        if got != wanted:
            wrong.append(f"{name}: {' → '.join(got) or 'nothing'}")
    seen_by_itself = sorted({bean for kind, bean in steps
                             if kind in ("before", "after") and bean == "tracer"})
    if seen_by_itself:
        wrong.append("the post-processor was handed itself")
    kept_rows = [("get_bean('inventory')", type(kept).__name__),
                 ("Orders.inventory", type(getattr(orders, "inventory", None)).__name__),
                 ("get_bean(Inventory)", type(by_type).__name__)]
    proxied = [row for row in kept_rows if row[1] != "TracedInventory"]
    same = kept is getattr(orders, "inventory", None) is by_type
    if wrong or proxied or not same:
        raise CheckFailure(
            "Every bean the container makes passes through each bean post-processor: "
            "before_init, then its @post_construct methods, then after_init, whose return "
            "value is the bean from then on (kept, injected, returned by get_bean), as "
            "Spring's proxies are.",
            expected="for each bean: before → post_construct → after, right after its "
                     "constructor; inventory, Orders.inventory and get_bean(Inventory) are the "
                     "one TracedInventory after_init returned",
            actual="; ".join(wrong
                             + [f"{r[0]} is of type {r[1]}" for r in proxied]
                             + ([] if same or proxied else ["not one object"])),
            evidence=table(rows, ("bean", "expected steps", "steps seen"))
                     + "\n" + table(kept_rows, ("lookup", "type"))
                     + "\nevents, in order:\n" + table(steps, ("event", "bean")),
            lesson=SINGLETON_LIFE,
            fix="Keep, inject and return what after_init returned, not the object the "
                "constructor made." if proxied and not wrong
            and all(r[1] == "Inventory" for r in proxied) else None,
        )


def test_init_callbacks_run_after_injection(learner, make_app):
    app = make_app("shop")
    app.write("pricing.py", """\
        from __future__ import annotations

        from typing import Annotated

        from markers import Autowired, component, post_construct
        import {probe} as probe


        @component
        class Pricing:
            audit: Annotated[AuditTrail, Autowired()]

            def __init__(self, rates: Rates):
                probe.events.append(("seen", f"constructor: rates loaded={rates.loaded}"))
                self.rates = rates

            @post_construct
            def start(self):
                audit = getattr(self, "audit", None)
                probe.events.append(("seen", "init: audit="
                                     + type(audit).__name__
                                     + f" ready={getattr(audit, 'ready', None)}"))
                probe.events.append(("seen", f"init: rates loaded={self.rates.loaded}"))


        @component
        class Rates:
            def __init__(self):
                self.loaded = False

            @post_construct
            def load(self):
                self.loaded = True


        @component
        class AuditTrail:
            def __init__(self):
                self.ready = False

            @post_construct
            def open(self):
                self.ready = True
        """)
    ctx = _refreshed(learner, app, "Pricing(rates: Rates) with a field audit: Annotated["
                                   "AuditTrail, Autowired()]; Rates and AuditTrail set a flag "
                                   "in @post_construct", imports=[])
    seen = [what for kind, what in app.probe.events if kind == "seen"]
    wanted = ["constructor: rates loaded=True", "init: audit=AuditTrail ready=True",
              "init: rates loaded=True"]
    pricing = call(ctx.get_bean, "pricing")
    field = type(getattr(pricing, "audit", None)).__name__
    if seen != wanted or field != "AuditTrail":
        raise CheckFailure(
            "Init callbacks run on a finished bean: its fields are injected before its "
            "@post_construct methods run, and every dependency (parameter or field) has "
            "finished its own init callbacks before it is handed over.",
            expected="; ".join(wanted) + "; Pricing.audit is the AuditTrail",
            actual="; ".join(seen) + f"; Pricing.audit is {field}",
            evidence="Pricing is defined first, so Rates and AuditTrail are made for it\n"
                     + table([(w, "yes" if w in seen else "no") for w in wanted],
                             ("expected observation", "seen")),
            lesson=SINGLETON_LIFE,
            fix="Set the Autowired fields before calling the @post_construct methods."
            if seen[1:2] == ["init: audit=NoneType ready=None"] and field == "AuditTrail" else
            "Finish each bean (fields, init callbacks, post-processors) as soon as it is "
            "made, so that it is complete when it is handed to the bean that needs it."
            if seen[:1] == ["constructor: rates loaded=False"] else None,
        )


INHERITED = """\
    from markers import ContextRefreshed, component, event_listener, post_construct, pre_destroy
    import {probe} as probe


    class Resource:             # not a bean: two levels above the component
        @post_construct
        def open_resource(self):
            probe.events.append(("callback", "Resource.open_resource"))

        @pre_destroy
        def release_resource(self):
            probe.events.append(("callback", "Resource.release_resource"))


    class Announcing(Resource):
        @event_listener(ContextRefreshed)
        def announce(self, event):
            probe.events.append(("callback", "Announcing.announce"))


    class Audited:              # a second base class, a mixin
        @pre_destroy
        def flush_audit(self):
            probe.events.append(("callback", "Audited.flush_audit"))


    @component
    class PriceFeed(Announcing, Audited):
        def __init__(self):
            probe.events.append(("init", "priceFeed"))

        @post_construct
        def subscribe(self):
            probe.events.append(("callback", "PriceFeed.subscribe"))
    """

# (callback, what it is, where the class got it)
INHERITED_CALLBACKS = [
    ("PriceFeed.subscribe", "@post_construct", "its own"),
    ("Resource.open_resource", "@post_construct", "from Resource, its base's base"),
    ("Announcing.announce", "@event_listener(ContextRefreshed)", "from Announcing, its base"),
    ("Resource.release_resource", "@pre_destroy", "from Resource, its base's base"),
    ("Audited.flush_audit", "@pre_destroy", "from Audited, its second base"),
]


def test_inherited_callbacks_run_like_the_beans_own(learner, make_app):
    app = make_app("shop")
    app.write("feeds.py", INHERITED)
    ctx = _refreshed(learner, app, "PriceFeed(Announcing, Audited) with a @post_construct of "
                                   "its own; Announcing(Resource) has a ContextRefreshed "
                                   "listener, Resource a @post_construct and a @pre_destroy, "
                                   "Audited a @pre_destroy; none of the bases is a bean",
                     imports=[])
    closed = raised(ctx.close)
    ran = Counter(what for kind, what in app.probe.events if kind == "callback")
    rows = [(callback, kind, where, ran[callback]) for callback, kind, where in INHERITED_CALLBACKS]
    wrong = [row for row in rows if row[3] != 1]
    if wrong or closed is not None:
        inherited_only = all(row[2] != "its own" for row in wrong) and all(
            row[3] == 0 for row in wrong) and closed is None
        raise CheckFailure(
            "A bean's callbacks are its methods, inherited ones included: a @post_construct, "
            "@pre_destroy or ContextRefreshed listener written on a base class runs once, "
            "like one written on the bean's own class (Spring finds them along the whole "
            "class hierarchy).",
            expected="each of the five callbacks ran once (refresh(), then close())",
            actual="; ".join([f"{row[0]} ({row[1]}, {row[2]}) ran {row[3]} time(s)"
                              for row in wrong]
                             + ([f"close() raised {type(closed).__name__}: {closed}"]
                                if closed is not None else [])),
            evidence=table(rows, ("callback", "kind", "the bean's class has it", "ran")),
            lesson=SINGLETON_LIFE,
            fix="Look the callbacks up along the class's __mro__ (or with dir() / "
                "inspect.getmembers on the class), not in its own __dict__."
            if wrong and inherited_only else None,
        )


def test_context_refreshed_comes_after_every_singleton(learner, make_app):
    app = make_app("shop")
    app.write("startup.py", """\
        from markers import ContextRefreshed, component, event_listener, lazy, post_construct
        import {probe} as probe


        @component
        class Warmup:
            def __init__(self):
                probe.events.append(("init", "warmup"))

            @event_listener(ContextRefreshed)
            def on_refreshed(self, event):
                probe.events.append(("refreshed", "warmup"))
                probe.contexts = [*getattr(probe, "contexts", []), event.context]


        @component
        class Cache:
            def __init__(self):
                probe.events.append(("init", "cache"))

            @post_construct
            def fill(self):
                probe.events.append(("post_construct", "cache"))


        @component
        class Index:
            def __init__(self, cache: Cache):
                probe.events.append(("init", "index"))


        @component
        class Announcer:
            def __init__(self):
                probe.events.append(("init", "announcer"))

            @event_listener(ContextRefreshed)
            def ready(self, event):
                probe.events.append(("refreshed", "announcer"))
                probe.contexts = [*getattr(probe, "contexts", []), event.context]


        @lazy
        @component
        class Later:
            def __init__(self):
                probe.events.append(("init", "later"))
        """)
    ctx = _refreshed(learner, app, "Warmup and Announcer listen for ContextRefreshed; Cache, "
                                   "Index(cache: Cache); @lazy Later", imports=[])
    events = _steps(app, ("init", "post_construct", "refreshed"))
    first = next((i for i, (kind, _) in enumerate(events) if kind == "refreshed"), None)
    before = [bean for kind, bean in events[:first] if kind != "refreshed"] \
        if first is not None else []
    heard = Counter(bean for kind, bean in events if kind == "refreshed")
    contexts = getattr(app.probe, "contexts", [])
    problems = []
    for listener in ("warmup", "announcer"):
        if heard[listener] != 1:
            problems.append(f"{listener} heard ContextRefreshed {heard[listener]} time(s)")
    missing = [b for b in ("warmup", "cache", "index", "announcer") if b not in before]
    if first is not None and missing:
        problems.append("published before these were finished: " + ", ".join(missing))
    if first is not None and ("post_construct", "cache") not in events[:first]:
        problems.append("published before cache's @post_construct ran")
    if any(c is not ctx for c in contexts):
        problems.append("event.context is not the context")
    if "later" in app.created():
        problems.append("the lazy bean later was created")
    if problems:
        raise CheckFailure(
            "ContextRefreshed is published once, after refresh() has finished every "
            "non-lazy singleton (init callbacks included): a listener may rely on the whole "
            "application being there.",
            expected="warmup and announcer each hear it once, after warmup, cache (and its "
                     "@post_construct), index and announcer are made; event.context is the "
                     "context",
            actual="; ".join(problems),
            evidence="events, in order:\n" + table(events, ("event", "bean")),
            lesson=EVENTS,
            fix="Publish ContextRefreshed once, after the loop that creates the singletons, "
                "not as each bean is made." if first is not None and missing else None,
        )


DESTROYED = """\
    from __future__ import annotations

    from typing import Annotated

    from markers import Autowired, bean, component, configuration, lazy, pre_destroy, scope
    import {probe} as probe


    def _gone(name):
        probe.events.append(("destroy", name))


    @component
    class Api:
        def __init__(self, orders: OrderService):
            self.orders = orders

        @pre_destroy
        def stop(self):
            _gone("api")


    @component
    class OrderService:
        def __init__(self, repo: OrderRepo):
            self.repo = repo

        @pre_destroy
        def stop(self):
            _gone("orderService")


    @component
    class OrderRepo:
        def __init__(self, pool: Pool):
            self.pool = pool

        @pre_destroy
        def stop(self):
            _gone("orderRepo")


    @component
    class Pool:
        @pre_destroy
        def stop(self):
            _gone("pool")


    @component
    class Clock:
        @pre_destroy
        def stop(self):
            _gone("clock")


    @component
    class Scheduler:
        def __init__(self, clock: Clock):
            self.clock = clock

        @pre_destroy
        def stop(self):
            _gone("scheduler")


    @component
    class Reporter:
        metrics: Annotated[Metrics, Autowired()]

        @pre_destroy
        def stop(self):
            _gone("reporter")


    @component
    class Metrics:
        @pre_destroy
        def stop(self):
            _gone("metrics")


    @component
    class Catalogue:            # written (and named) before the beans that take it ...
        @pre_destroy
        def stop(self):
            _gone("catalogue")


    @component
    class Currency:
        @pre_destroy
        def stop(self):
            _gone("currency")


    @component
    class Gateway:
        @pre_destroy
        def stop(self):
            _gone("gateway")


    @component
    class Shelf:                # ... under a parameter name that is not the bean's
        def __init__(self, index: Catalogue):
            self.index = index

        @pre_destroy
        def stop(self):
            _gone("shelf")


    @component
    class Invoicer:
        money: Annotated[Currency, Autowired()]

        @pre_destroy
        def stop(self):
            _gone("invoicer")


    class Mailer:
        def __init__(self, smtp):
            self.smtp = smtp

        def shutdown(self):
            _gone("mailer")


    @configuration
    class MailConfig:
        @bean(destroy_method="shutdown")
        def mailer(self, smtp: Gateway) -> Mailer:
            return Mailer(smtp)

        @pre_destroy
        def stop(self):
            _gone("mailConfig")


    @lazy
    @component
    class Archive:
        @pre_destroy
        def stop(self):
            _gone("archive")


    @scope("prototype")
    @component
    class Draft:
        @pre_destroy
        def stop(self):
            _gone("draft")
    """

# dependant -> dependency: the first must be destroyed before the second
EDGES = [("api", "orderService"), ("orderService", "orderRepo"), ("orderRepo", "pool"),
         ("scheduler", "clock"), ("reporter", "metrics"), ("mailer", "mailConfig"),
         ("shelf", "catalogue"), ("invoicer", "currency"), ("mailer", "gateway")]
# the edges no constructor parameter names after its bean: a field, or another name
NOT_BY_NAME = {("api", "orderService"), ("orderService", "orderRepo"), ("reporter", "metrics"),
               ("shelf", "catalogue"), ("invoicer", "currency"), ("mailer", "gateway")}


def test_close_destroys_in_reverse_dependency_order(learner, make_app):
    app = make_app("shop")
    app.write("shop.py", DESTROYED)
    ctx = _refreshed(learner, app, "Api → OrderService → OrderRepo → Pool (written in that "
                                   "order); Clock, then Scheduler(clock); Reporter with a field "
                                   "metrics; Catalogue, Currency, Gateway, then Shelf(index: "
                                   "Catalogue), Invoicer with a field money: Currency; "
                                   "MailConfig's @bean(destroy_method='shutdown') mailer(smtp: "
                                   "Gateway); @lazy Archive; prototype Draft", imports=[])
    call(ctx.get_bean, "draft")
    call(ctx.close)
    order = [bean for kind, bean in app.probe.events if kind == "destroy"]
    position = {bean: i for i, bean in enumerate(order)}
    wanted = {a for edge in EDGES for a in edge}
    counts = Counter(order)
    problems = [f"{bean} destroyed {counts[bean]} time(s)" for bean in sorted(wanted)
                if counts[bean] != 1]
    problems += [f"{bean} destroyed, but the context never made it as a singleton"
                 for bean in ("archive", "draft") if counts[bean]]
    rows, reversed_edges = [], set()
    for dependant, dependency in EDGES:
        ok = dependant in position and dependency in position \
            and position[dependant] < position[dependency]
        rows.append((dependant, dependency, ok))
        if not ok and counts[dependant] == 1 and counts[dependency] == 1:
            reversed_edges.add((dependant, dependency))
            problems.append(f"{dependency} destroyed before {dependant}, which needs it")
    if problems:
        by_name = bool(reversed_edges) and reversed_edges <= NOT_BY_NAME \
            and len(problems) == len(reversed_edges)
        raise CheckFailure(
            "close() destroys each singleton once, before every bean it depends on "
            "(constructor parameters, fields, a @bean's configuration), calling its "
            "@pre_destroy methods and a @bean's destroy_method; lazy beans never made and "
            "prototypes are not destroyed.",
            expected="each of " + ", ".join(sorted(wanted)) + " destroyed once, dependants "
                     "first; archive and draft not destroyed",
            actual="; ".join(problems),
            evidence="destroyed, in order: " + (", ".join(order) or "nothing") + "\n"
                     + table(rows, ("dependant", "dependency", "dependant destroyed first")),
            lesson=SHUTDOWN,
            fix="Only the edges no parameter names after its bean were broken: take the order "
                "from what was actually injected (record it as beans are made, or destroy in "
                "the reverse of the order beans were finished), not from parameter names."
            if by_name else None,
        )


FAILING_DESTROY = """\
    from __future__ import annotations

    from markers import bean, component, configuration, pre_destroy
    import {probe} as probe


    class FlushFailed(Exception):
        pass


    class Pool:
        def dispose(self):
            probe.events.append(("destroy", "pool"))


    @configuration
    class PoolConfig:
        @bean(destroy_method="dispose")
        def pool(self) -> Pool:
            return Pool()


    @component
    class Cache:
        @pre_destroy
        def stop(self):
            probe.events.append(("destroy", "cache"))


    @component
    class Sessions:
        def __init__(self, pool: Pool, cache: Cache):
            self.pool, self.cache = pool, cache

        @pre_destroy
        def stop(self):
            probe.events.append(("destroy", "sessions"))
            probe.failure = FlushFailed("sessions could not flush")
            raise probe.failure
    """


def _carries(error, original):
    """Whether `error` is `original`, or holds it (its cause or context, an exception group)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if error is original:
            return True
        seen.add(id(error))
        if any(_carries(inner, original) for inner in getattr(error, "exceptions", ())):
            return True
        error = error.__cause__ or error.__context__
    return False


def test_close_goes_on_past_a_failing_destroy_callback(learner, make_app):
    app = make_app("shop")
    app.write("store.py", FAILING_DESTROY)
    ctx = _refreshed(learner, app, "Sessions(pool: Pool, cache: Cache), whose @pre_destroy "
                                   "raises FlushFailed; pool is PoolConfig's "
                                   "@bean(destroy_method='dispose'), Cache has a @pre_destroy",
                     imports=[])
    closed = raised(ctx.close)
    destroyed = Counter(bean for kind, bean in app.probe.events if kind == "destroy")
    failure = getattr(app.probe, "failure", None)
    problems = [f"{bean} destroyed {destroyed[bean]} time(s)"
                for bean in ("sessions", "pool", "cache") if destroyed[bean] != 1]
    if closed is not None and (failure is None or not _carries(closed, failure)):
        problems.append(f"close() raised {type(closed).__name__}: {closed}, which is not "
                        "the FlushFailed that sessions' @pre_destroy raised")
    if problems:
        stopped = destroyed["sessions"] == 1 and not destroyed["pool"] \
            and not destroyed["cache"] and closed is not None and closed is failure
        raise CheckFailure(
            "One bean whose destroy callback raises must not keep the others alive: close() "
            "goes on and destroys every other singleton (Spring logs the failure and goes "
            "on), so the pool and the cache that sessions needed are still released.",
            expected="sessions, then pool (its destroy_method) and cache, each destroyed once; "
                     "close() raises nothing, or the FlushFailed (itself or as the cause of "
                     "an error of its own)",
            actual="; ".join(problems),
            evidence="destroyed, in order: " + (", ".join(
                bean for kind, bean in app.probe.events if kind == "destroy") or "nothing")
                     + "\nclose() raised: "
                     + ("nothing" if closed is None else f"{type(closed).__name__}: {closed}"),
            lesson=SHUTDOWN,
            fix="Catch what each destroy callback raises, go on with the next bean, and raise "
                "(or log) the first failure once every bean is destroyed." if stopped else None,
        )


REPLACED = """\
    from __future__ import annotations

    from markers import BeanPostProcessor, bean, component, configuration, pre_destroy
    import {probe} as probe


    def _gone(name, obj):
        probe.events.append(("destroy", f"{name} on {type(obj).__name__}"))


    @component
    class Ledger:
        @pre_destroy
        def close_ledger(self):
            _gone("ledger", self)


    @component
    class Journal:
        @pre_destroy
        def close_journal(self):
            _gone("journal", self)


    @component
    class Payments:
        @pre_destroy
        def close_payments(self):
            _gone("payments", self)


    @component
    class Clerk:
        @pre_destroy
        def close_clerk(self):
            _gone("clerk", self)


    class Feed:
        def shutdown(self):
            _gone("feed", self)


    @configuration
    class FeedConfig:
        @bean(destroy_method="shutdown")
        def feed(self) -> Feed:
            return Feed()


    class Sealed:
        '''Hands out nothing of its target: a wrapper of another class.'''

        def __init__(self, target):
            self._target = target


    class JournalView(Journal):
        '''A wrapper that is a subclass of its target's class.'''

        def __init__(self, target):
            self._target = target


    class Forwarding:
        '''A proxy: every attribute is its target's (as a @transactional proxy's).'''

        def __init__(self, target):
            self._target = target

        def __getattr__(self, attribute):
            return getattr(self._target, attribute)


    @component
    class Wrapper(BeanPostProcessor):
        def before_init(self, bean, name):
            return bean

        def after_init(self, bean, name):
            wrap = {"ledger": Sealed, "feed": Sealed, "journal": JournalView,
                    "payments": Forwarding}.get(name)
            return wrap(bean) if wrap else bean
    """

# bean -> (the class of its object as made, what the post-processor returned in its place)
AS_MADE = {"ledger": ("Ledger", "Sealed: nothing of the target's"),
           "journal": ("Journal", "JournalView: a subclass of Journal"),
           "payments": ("Payments", "Forwarding: a proxy with the target's attributes"),
           "feed": ("Feed", "Sealed (its @bean(destroy_method='shutdown'))"),
           "clerk": ("Clerk", "not replaced")}


def test_close_destroys_the_object_as_made(learner, make_app):
    app = make_app("shop")
    app.write("books.py", REPLACED)
    ctx = _refreshed(learner, app, "Wrapper(BeanPostProcessor) replaces ledger and feed with a "
                                   "Sealed, journal with a JournalView(Journal), payments with "
                                   "a forwarding proxy; clerk is kept as made", imports=[])
    closed = raised(ctx.close)          # no callback of this application raises
    seen = [bean.split(" on ", 1) for kind, bean in app.probe.events if kind == "destroy"]
    rows, wrong = [], []
    for name, (made, replaced) in AS_MADE.items():
        got = [on for bean, on in seen if bean == name]
        rows.append((name, replaced, made, ", ".join(got) or "nothing"))
        if got != [made]:
            wrong.append(f"{name}: " + (f"destroyed on {', '.join(got)}" if got
                                         else "not destroyed"))
    if closed is not None:
        wrong.append(f"close() raised {type(closed).__name__}: {closed}")
    if wrong:
        # a callback ran on a wrapper, or close() looked one up on it: the callbacks were
        # taken from what after_init returned
        on_kept = any(on in ("JournalView", "Sealed", "Forwarding") for _, on in seen) or (
            isinstance(closed, AttributeError) and "Sealed" in str(closed))
        raise CheckFailure(
            "close() destroys the object the constructor (or @bean method) made, even when a "
            "bean post-processor replaced it: its @pre_destroy methods and a @bean's "
            "destroy_method are called on that object, once, whatever after_init returned "
            "in its place (Spring keeps the raw bean for its destruction).",
            expected="; ".join(f"{n} destroyed once, on its {m}"
                               for n, (m, _) in AS_MADE.items()),
            actual="; ".join(wrong),
            evidence=table(rows, ("bean", "after_init returned", "made as", "destroyed on")),
            lesson=SHUTDOWN,
            fix="Keep the object as made (before after_init) for close(): look up its "
                "@pre_destroy methods on its class and call them on it." if on_kept else None,
        )


def _sessions_named(engine, name):
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text(
            "SELECT pid, state, backend_start::text FROM pg_stat_activity "
            "WHERE application_name = :name ORDER BY pid"), {"name": name})]


def test_close_disposes_the_engine_pool(learner, make_app, database):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    name = f"dojo_ctx_{uuid.uuid4().hex[:8]}"
    url = make_url(database.url).update_query_dict({"application_name": name})
    properties = {"dojo.datasource.url": url.render_as_string(hide_password=False)}
    ctx = _refreshed(learner, app, "the lab's DataSourceAutoConfiguration with "
                                   f"application_name={name}", properties, imports=None)
    engine = raised(ctx.get_bean, Engine) or call(ctx.get_bean, Engine)
    if not isinstance(engine, Engine):
        raise CheckFailure(
            "With dojo.datasource.url set, get_bean(Engine) must give the auto-configured "
            "SQLAlchemy Engine (stage 4).",
            expected="an Engine",
            actual=f"{type(engine).__name__}: {engine}",
            evidence=f"properties: dojo.datasource.url with application_name={name}",
            lesson=SHUTDOWN,
        )
    try:
        connections = [engine.connect() for _ in range(3)]
        for conn in connections:
            conn.execute(text("SELECT 1"))
        for conn in connections:
            conn.close()                    # back to the pool: idle sessions, still open
        pooled = _sessions_named(database.engine, name)
        call(ctx.close)
        # a backend leaves pg_stat_activity a moment after its client hung up
        deadline = time.monotonic() + 5
        left = _sessions_named(database.engine, name)
        while left and time.monotonic() < deadline:
            time.sleep(0.05)
            left = _sessions_named(database.engine, name)
    finally:
        engine.dispose()
    if left:
        raise CheckFailure(
            "close() must release what the context's beans hold: the auto-configured "
            "Engine's pool is disposed, so none of its connections stays open on the server.",
            expected=f"no session with application_name {name} after close()",
            actual=f"{len(left)} session(s) still open 5 s after close()",
            evidence=f"pooled before close(): {len(pooled)} session(s)\nleft after close():\n"
                     + table(left, ("pid", "state", "backend_start")),
            lesson=SHUTDOWN,
            fix="Declare @bean(destroy_method=\"dispose\") on the Engine bean, and have close() "
                "call a @bean's destroy_method.",
        )


def test_close_flushes_the_producer(learner, make_app, kafka):
    from confluent_kafka import Producer

    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    topic = kafka.topic(hint="container-close")
    properties = {"dojo.kafka.bootstrap-servers": kafka.bootstrap}
    for key, value in kafka.producer_config(**{"linger.ms": 60000}).items():
        if key != "bootstrap.servers":
            properties[f"dojo.kafka.producer.{key}"] = str(value)
    ctx = _refreshed(learner, app, "the lab's KafkaAutoConfiguration with linger.ms=60000",
                     properties, imports=None)
    producer = raised(ctx.get_bean, Producer) or call(ctx.get_bean, Producer)
    if not isinstance(producer, Producer):
        raise CheckFailure(
            "With dojo.kafka.bootstrap-servers set, get_bean(Producer) must give the "
            "auto-configured confluent-kafka Producer (stage 4).",
            expected="a Producer",
            actual=f"{type(producer).__name__}: {producer}",
            evidence="properties:\n" + table(sorted(properties.items()), ("property", "value")),
            lesson=SHUTDOWN,
        )
    sent = [f"order-{n}" for n in range(5)]
    try:
        for key in sent:
            producer.produce(topic, key=key.encode(), value=b"placed")
        producer.poll(0)
        queued = len(producer)
        call(ctx.close)
        left = len(producer)
        got = sorted(str(r.key_text) for r in read_topic(kafka, topic, 1))
    finally:
        producer.purge()
        producer.flush(0)
    if got != sorted(sent):
        raise CheckFailure(
            "close() must not lose what the auto-configured Producer still buffers: it "
            "flushes the Producer, so every record produced before close() is in the topic.",
            expected=f"{len(sent)} records in {topic}: " + ", ".join(sent),
            actual=f"{len(got)} record(s) in the topic; {left} still queued in the Producer "
                   "after close()",
            evidence=f"queued before close(): {queued} (linger.ms=60000)\n"
                     f"in the topic: {', '.join(got) or 'nothing'}",
            lesson=SHUTDOWN,
            fix="Declare @bean(destroy_method=\"flush\") on the Producer bean, and have close() "
                "call a @bean's destroy_method." if left == queued else None,
        )


OPTIONAL_FIELDS = """\
    from __future__ import annotations

    from typing import Annotated

    from markers import Autowired, component, lazy, service


    class Store:
        pass


    @component
    class RedisStore(Store):
        pass


    @component
    class MemoryStore(Store):
        pass


    class Missing:
        '''No bean has this type.'''


    class Tracker:
        '''No bean has this type either.'''


    @component
    @lazy
    class AuditLog:
        def __init__(self, sink: Missing):
            self.sink = sink


    {consumer}
    """

# (shape, what refresh() must do, the consumer): the field rules are the parameter rules
FIELD_CONSUMERS = (
    ("tracker: Annotated[Tracker | None, Autowired()]", "Cart.tracker=None", """\
    @service
    class Cart:
        tracker: Annotated[Tracker | None, Autowired()]
    """),
    ("store: Annotated[Store | None, Autowired()]",
     "NoUniqueBeanError ['memoryStore', 'redisStore']", """\
    @service
    class Cart:
        store: Annotated[Store | None, Autowired()]
    """),
    ("audit: Annotated[AuditLog | None, Autowired()], AuditLog(sink: Missing)",
     "NoSuchBeanError (bean auditLog, parameter sink)", """\
    @service
    class Cart:
        audit: Annotated[AuditLog | None, Autowired()]
    """),
)


def test_autowired_fields_follow_the_parameter_rules(learner, make_app):
    context = learner.module("context")
    rows = []
    for shape, wanted, consumer in FIELD_CONSUMERS:
        app = make_app("shop")
        app.write("cart.py", OPTIONAL_FIELDS.replace("{consumer}", textwrap.indent(
            textwrap.dedent(consumer), "    ").strip()))
        ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
        error = raised(ctx.refresh)
        if error is None:
            cart = call(ctx.get_bean, "cart")
            got = "refresh() succeeded; " + (", ".join(
                f"Cart.{k}={'None' if v is None else type(v).__name__}"
                for k, v in vars(cart).items()) or "no field set")
        elif hasattr(error, "candidates"):
            got = f"{type(error).__name__} {sorted(error.candidates)}"
        elif hasattr(error, "parameter"):
            got = (f"{type(error).__name__} (bean {getattr(error, 'bean', '?')}, "
                   f"parameter {error.parameter})")
        else:
            got = f"{type(error).__name__}: {error}"
        if wanted.startswith("Cart."):
            ok = error is None and "tracker" in vars(cart) and vars(cart)["tracker"] is None
        elif wanted.startswith("NoUnique"):
            ok = isinstance(error, context.NoUniqueBeanError) and sorted(
                getattr(error, "candidates", None) or []) == ["memoryStore", "redisStore"]
        else:
            ok = isinstance(error, context.NoSuchBeanError) \
                and getattr(error, "bean", None) == "auditLog" \
                and getattr(error, "parameter", None) == "sink"
        rows.append((shape, wanted, got, ok))
    wrong = [row for row in rows if not row[3]]
    if wrong:
        raise CheckFailure(
            "An Autowired field is resolved like a constructor parameter of its name: "
            "`Annotated[T | None, Autowired()]` receives None when no bean of type T exists, "
            "and only then; two candidates are still NoUniqueBeanError and a candidate whose "
            "own creation fails is still its error.",
            expected="; ".join(f"{w[0]}: {w[1]}" for w in wrong),
            actual="; ".join(f"{w[0]}: {w[2]}" for w in wrong),
            evidence=table([r[:3] for r in rows], ("field of Cart", "expected", "got"))
                     + "\nStore has two beans, redisStore and memoryStore; AuditLog has one, "
                       "auditLog, whose constructor needs a Missing that no bean provides; "
                       "Tracker has none",
            lesson=SINGLETON_LIFE,
        )


LISTENERS = """\
    from __future__ import annotations

    from markers import ContextRefreshed, bean, component, configuration, event_listener
    from markers import post_construct
    import {probe} as probe


    class PriceChanged:
        '''An event of the application's own: refresh() never publishes it.'''


    class Feed:
        @post_construct
        def start(self):
            probe.events.append(("post_construct", "feed"))

        @event_listener(ContextRefreshed)
        def ready(self, event):
            probe.events.append(("refreshed", "feed"))


    @configuration
    class FeedConfig:
        @bean
        def feed(self) -> Feed:
            return Feed()


    class BaseJob:
        @event_listener(ContextRefreshed)
        def ready(self, event):
            probe.events.append(("refreshed", "BaseJob.ready"))


    @component
    class NightlyJob(BaseJob):
        @event_listener(ContextRefreshed)
        def ready(self, event):
            probe.events.append(("refreshed", "nightlyJob"))


    @component
    class Repricer:
        @event_listener(PriceChanged)
        def reprice(self, event):
            probe.events.append(("refreshed", "Repricer.reprice(PriceChanged)"))
    """


def test_every_bean_is_initialised_and_hears_only_its_own_event_once(learner, make_app):
    app = make_app("shop")
    app.write("jobs.py", LISTENERS)
    _refreshed(learner, app, "FeedConfig's @bean feed() -> Feed (a @post_construct and a "
                             "ContextRefreshed listener on Feed); NightlyJob(BaseJob) overriding "
                             "BaseJob's listener; Repricer listening for PriceChanged",
               imports=[])
    seen = Counter(app.probe.events)
    wanted = {("post_construct", "feed"): 1, ("refreshed", "feed"): 1,
              ("refreshed", "nightlyJob"): 1, ("refreshed", "BaseJob.ready"): 0,
              ("refreshed", "Repricer.reprice(PriceChanged)"): 0}
    rows = [(f"{kind} {who}", n, seen[(kind, who)]) for (kind, who), n in wanted.items()]
    wrong = [row for row in rows if row[1] != row[2]]
    if wrong:
        raise CheckFailure(
            "What a @bean method returns is a bean like any other: its @post_construct "
            "methods run and its ContextRefreshed listeners are called. Each listener of a "
            "bean is called once, for its own event type only: a method a subclass overrides "
            "is the subclass's, called once, and a listener of another event is not called.",
            expected="; ".join(f"{w[0]}: {w[1]} call(s)" for w in wrong),
            actual="; ".join(f"{w[0]}: {w[2]} call(s)" for w in wrong),
            evidence=table(rows, ("callback", "expected calls", "calls seen")),
            lesson=EVENTS,
        )


ORDERED_PROCESSORS = """\
    from __future__ import annotations

    from typing import Annotated

    from markers import Autowired, BeanPostProcessor, component
    import {probe} as probe


    @component
    class Clock:
        pass


    @component
    class Billing:
        clock: Annotated[Clock, Autowired()]


    @component
    class Recorder(BeanPostProcessor):
        def before_init(self, bean, name):
            probe.events.append(("before", name, getattr(bean, "clock", None) is not None))
            return bean

        def after_init(self, bean, name):
            probe.events.append(("after", name, None))
            return bean


    @component
    class Stamper(BeanPostProcessor):
        def before_init(self, bean, name):
            return bean

        def after_init(self, bean, name):
            return bean
    """


def test_post_processors_see_injected_fields_and_never_each_other(learner, make_app):
    app = make_app("shop")
    app.write("billing.py", ORDERED_PROCESSORS)
    _refreshed(learner, app, "Recorder and Stamper (bean post-processors, in that order); "
                             "Billing with a field clock: Annotated[Clock, Autowired()]",
               imports=[])
    events = [e for e in app.probe.events if e[0] in ("before", "after")]
    handed = sorted({name for _, name, _ in events})
    problems = [f"Recorder was handed the post-processor {name}"
                for name in handed if name in ("recorder", "stamper")]
    billing = [has for kind, name, has in events if kind == "before" and name == "billing"]
    if billing != [True]:
        problems.append("before_init saw billing without its clock field" if billing
                        else "before_init was never handed billing")
    if problems:
        raise CheckFailure(
            "A bean's Autowired fields are set before any post-processor's before_init sees "
            "it, and the post-processors themselves go through no post-processor, not even "
            "one made before them.",
            expected="Recorder handed billing (with its clock set) and clock, never recorder "
                     "or stamper",
            actual="; ".join(problems),
            evidence=table([(k, n, "" if h is None else ("set" if h else "not set"))
                            for k, n, h in events], ("call", "bean", "billing.clock")),
            lesson=TWO_PROCESSORS,
        )


PROMOTED = """\
    from __future__ import annotations

    from dataclasses import replace

    from markers import DefinitionPostProcessor, component
    import {probe} as probe


    class Store:
        pass


    @component
    class RedisStore(Store):
        pass


    @component
    class MemoryStore(Store):
        pass


    @component
    class Cart:
        def __init__(self, store: Store):
            self.store = store


    @component
    class Promote(DefinitionPostProcessor):
        def post_process_definitions(self, definitions):
            probe.events.append(("handed", definitions))
            definitions["memoryStore"] = replace(definitions["memoryStore"], primary=True)
    """


def test_a_definition_post_processor_edits_the_definitions_in_use(learner, make_app):
    app = make_app("shop")
    app.write("cart.py", PROMOTED)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    handed = [m for kind, m in app.probe.events if kind == "handed"]
    problems = []
    if len(handed) != 1:
        problems.append(f"post_process_definitions called {len(handed)} time(s)")
    elif handed[0] is not ctx.definitions:
        problems.append(f"it was handed a {type(handed[0]).__name__} that is not "
                        "ctx.definitions")
    store = None
    if error is not None:
        problems.append(f"refresh() raised {type(error).__name__}: {error}")
    else:
        store = type(getattr(call(ctx.get_bean, "cart"), "store", None)).__name__
        if store != "MemoryStore":
            problems.append(f"Cart received a {store}")
    if problems:
        raise CheckFailure(
            "A definition post-processor is handed ctx.definitions itself, and what it "
            "changes there is what the context goes on with: a definition it makes @primary "
            "decides between two candidates.",
            expected="Promote handed ctx.definitions once; Cart(store: Store) receives "
                     "MemoryStore, made primary by Promote",
            actual="; ".join(problems),
            evidence="RedisStore and MemoryStore are Stores, neither @primary as written; "
                     "Promote replaces memoryStore's definition with primary=True",
            lesson=TWO_PROCESSORS,
        )


ALL_DESTROYED = """\
    from __future__ import annotations

    from markers import BeanPostProcessor, DefinitionPostProcessor, bean, component
    from markers import configuration, lazy, pre_destroy
    import {probe} as probe


    def _gone(name):
        probe.events.append(("destroy", name))


    @component
    class Ledger:
        @pre_destroy
        def stop(self):
            _gone("ledger")


    @lazy
    @component
    class Statement:            # made after refresh(), by get_bean
        def __init__(self, ledger: Ledger):
            self.ledger = ledger

        @pre_destroy
        def stop(self):
            _gone("statement")


    @component
    class Audit(BeanPostProcessor):
        def before_init(self, bean, name):
            return bean

        def after_init(self, bean, name):
            return bean

        @pre_destroy
        def stop(self):
            _gone("audit")


    @component
    class Tidy(DefinitionPostProcessor):
        def post_process_definitions(self, definitions):
            pass

        @pre_destroy
        def stop(self):
            _gone("tidy")


    class Pool:
        @pre_destroy
        def drain(self):
            _gone("pool @pre_destroy")

        def dispose(self):
            _gone("pool destroy_method")


    @configuration
    class PoolConfig:
        @bean(destroy_method="dispose")
        def pool(self) -> Pool:
            return Pool()
    """


def test_close_destroys_every_singleton_it_made_callbacks_in_order(learner, make_app):
    app = make_app("shop")
    app.write("ledger.py", ALL_DESTROYED)
    ctx = _refreshed(learner, app, "Ledger; @lazy Statement(ledger: Ledger), got after "
                                   "refresh(); Audit (a BeanPostProcessor) and Tidy (a "
                                   "DefinitionPostProcessor), each with a @pre_destroy; "
                                   "@bean(destroy_method='dispose') pool() -> Pool, Pool "
                                   "with a @pre_destroy", imports=[])
    call(ctx.get_bean, "statement")
    call(ctx.close)
    order = [bean for kind, bean in app.probe.events if kind == "destroy"]
    counts = Counter(order)
    problems = [f"{bean} destroyed {counts[bean]} time(s)"
                for bean in ("ledger", "statement", "audit", "tidy", "pool @pre_destroy",
                             "pool destroy_method") if counts[bean] != 1]
    if not problems:
        for first, then in (("statement", "ledger"),
                            ("pool @pre_destroy", "pool destroy_method")):
            if order.index(first) > order.index(then):
                problems.append(f"{then} before {first}")
    if problems:
        raise CheckFailure(
            "close() destroys every singleton the context made: a lazy one made after "
            "refresh() too, before the beans it depends on, and the post-processors; a bean's "
            "@pre_destroy methods run before a @bean's destroy_method.",
            expected="each destroyed once; statement before ledger; pool's @pre_destroy "
                     "before its destroy_method",
            actual="; ".join(problems),
            evidence="destroyed, in order: " + (", ".join(order) or "nothing"),
            lesson=SHUTDOWN,
        )


CHAINED_BEANS = """\
    from __future__ import annotations

    from markers import component, scope
    import {probe} as probe


    @scope("prototype")
    @component
    class Slip:
        def __init__(self):
            probe.events.append(("made", "slip", self))


    @component
    class Invoice:
        def __init__(self, slip: Slip):
            self.slip = slip
            probe.events.append(("made", "invoice", self))
    """

CHAINED_SHAPE = ("Stamper and Sealer (BeanPostProcessors): each before_init and after_init "
                 "returns a new Wrapped(bean) for invoice and slip; Invoice(slip: Slip), Slip "
                 "@scope(\"prototype\")")


def test_post_processors_chain_on_every_bean_whatever_its_scope(learner, make_app):
    app = make_app("shop")
    app.write("processors.py", CHAINED_PROCESSORS)
    app.write("billing.py", CHAINED_BEANS)
    app.probe.WATCHED = {"invoice", "slip"}
    ctx = _refreshed(learner, app, CHAINED_SHAPE, imports=[])
    billing = application_module(f"{app.base}.billing")
    lookups = [("get_bean('invoice')", "invoice", call(ctx.get_bean, "invoice")),
               ("get_bean(Invoice)", "invoice", call(ctx.get_bean, billing.Invoice)),
               ("get_bean('slip')", "slip", call(ctx.get_bean, "slip")),
               ("get_bean(Slip)", "slip", call(ctx.get_bean, billing.Slip))]
    events = list(app.probe.events)
    made = [(e[1], e[2]) for e in events if e[0] == "made"]
    problems: list[str] = []
    finals: list[tuple[str, object]] = []
    for name, obj in made:
        final, wrong = chain_problems(events, name, obj)
        problems += [p for p in wrong if p not in problems]
        finals.append((name, final))
    invoices = [obj for name, obj in made if name == "invoice"]
    rows = []
    if len(invoices) == 1:
        injected = getattr(invoices[0], "slip", None)
        lookups.insert(0, ("Invoice.slip (its constructor's parameter)", "slip", injected))
    for what, name, got in lookups:
        mine = [final for n, final in finals if n == name and final is got and final is not None]
        rows.append((what, "what the last after_init returned" if mine else
                     type(got).__name__ + ("" if got is None or type(got).__name__ != "Wrapped"
                                           else f" from {got.hook}_init of {got.by}")))
        if not mine and not problems:
            problems.append(f"{what} is not what the last after_init of that object returned")
    if problems:
        raise CheckFailure(
            "Every bean the container creates, a prototype too, passes through every bean "
            "post-processor: before_init hands on what it returns to the next one, then "
            "after_init likewise, and what the last after_init returned is the bean (kept, "
            "injected, returned by get_bean), however many post-processors there are.",
            expected="for each invoice and slip made: before_init of both post-processors, "
                     "the first handed the object as made and the second what the first "
                     "returned, then after_init of both, chained the same way; every lookup "
                     "and injection gets what the last after_init returned",
            actual="; ".join(problems),
            evidence=CHAINED_SHAPE + "\n" + table(rows, ("lookup", "got"))
                     + "\nevents, in order:\n" + table(
                         [(e[0], e[1], e[2] if e[0] in ("before", "after") else "")
                          for e in events], ("event", "bean", "post-processor")),
            lesson=SINGLETON_LIFE,
        )
