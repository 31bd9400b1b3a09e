"""Stage injection: constructor parameters resolved from type hints, like Spring's autowiring.

The applications use `from __future__ import annotations` where it matters: their annotations
are strings until `typing.get_type_hints` resolves them.
"""

from __future__ import annotations

import textwrap
from collections import Counter

import pytest
from _support import INJECTION, LIFECYCLE, NOT_FOUND, WHAT_SPRING_DOES, application_module

from dojo.checks import CheckFailure, call, raised, table

pytestmark = pytest.mark.stage("injection")


def _refreshed(learner, app, shape):
    """A refreshed context, or a failure: every parameter of this application has a bean."""
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    if error is not None:
        raise CheckFailure(
            "refresh() failed on an application where every constructor parameter can be "
            "satisfied: parameters are resolved by the type in their hint, and the parameters' "
            "names are not the names of the beans they need.",
            expected="refresh() succeeds",
            actual=f"{type(error).__name__}: {error}",
            evidence=shape,
            lesson=INJECTION,
        )
    return context, ctx


def _describe(value):
    return "None" if value is None else type(value).__name__


def test_constructor_parameters_are_injected_by_type(learner, make_app):
    app = make_app("shop")
    app.write("clock.py", """\
        import abc

        from markers import component
        import {probe} as probe


        class Clock(abc.ABC):
            @abc.abstractmethod
            def now(self) -> int: ...


        @component
        class SystemClock(Clock):
            def __init__(self):
                probe.events.append(("init", "systemClock"))

            def now(self) -> int:
                return 0


        @component(name="clock")
        class WallDisplay:
            '''Named like OrderService's parameter, but not a Clock.'''
        """)
    app.write("store.py", """\
        from markers import repository
        import {probe} as probe


        @repository
        class OrderRepository:
            def __init__(self):
                probe.events.append(("init", "orderRepository"))
        """)
    app.write("services.py", """\
        from __future__ import annotations

        from markers import service
        from {base}.clock import Clock
        from {base}.store import OrderRepository
        import {probe} as probe


        @service
        class OrderService:
            def __init__(self, orders: OrderRepository, clock: Clock):
                probe.events.append(("init", "orderService"))
                self.orders, self.clock = orders, clock


        @service
        class InvoiceService:
            def __init__(self, store: OrderRepository):
                probe.events.append(("init", "invoiceService"))
                self.store = store
        """)
    _, ctx = _refreshed(learner, app, "OrderService(orders: OrderRepository, clock: Clock); "
                                      "InvoiceService(store: OrderRepository); SystemClock(Clock); "
                                      "a bean named clock of type WallDisplay")
    services = application_module(f"{app.base}.services")
    clock = application_module(f"{app.base}.clock")
    orders = call(ctx.get_bean, services.OrderService)
    invoices = call(ctx.get_bean, "invoiceService")
    repo = call(ctx.get_bean, "orderRepository")
    system = call(ctx.get_bean, clock.Clock)
    made = Counter(app.created())
    got = [("OrderService.orders", _describe(getattr(orders, "orders", None)),
            getattr(orders, "orders", None) is repo),
           ("OrderService.clock", _describe(getattr(orders, "clock", None)),
            getattr(orders, "clock", None) is system),
           ("InvoiceService.store", _describe(getattr(invoices, "store", None)),
            getattr(invoices, "store", None) is repo)]
    wrong = [row for row in got if not row[2]]
    if wrong or made["orderRepository"] != 1 or made["orderService"] != 1:
        raise CheckFailure(
            "Each constructor parameter must receive the bean whose type matches its type hint "
            "(a subclass counts), whatever the parameter is called (a bean named like the "
            "parameter but of another type does not count), and a singleton is shared: both "
            "services get the same OrderRepository.",
            expected="OrderService.orders and InvoiceService.store are the orderRepository "
                     "bean; OrderService.clock is the systemClock bean; each made once",
            actual="; ".join(f"{w[0]} got {w[1]}" for w in wrong)
                   + (f"; orderRepository made {made['orderRepository']} time(s)"
                      if made["orderRepository"] != 1 else ""),
            evidence=table(got, ("parameter", "received", "is the bean"))
                     + "\nconstructors run: " + ", ".join(app.created()),
            lesson=INJECTION,
        )


GATEWAYS = """\
    from markers import component, primary
    import {probe} as probe


    class PaymentGateway:
        pass


    @component
    class StripeGateway(PaymentGateway):
        pass


    @primary
    @component
    class AdyenGateway(PaymentGateway):
        pass


    class Notifier:
        pass


    @component
    class EmailNotifier(Notifier):
        pass


    @component
    class SmsNotifier(Notifier):
        pass
    """


def test_several_candidates_qualifier_then_primary_then_name(learner, make_app):
    app = make_app("shop")
    app.write("gateways.py", GATEWAYS)
    app.write("checkout.py", """\
        from __future__ import annotations

        from typing import Annotated

        from markers import Qualifier, service
        from {base}.gateways import Notifier, PaymentGateway


        @service
        class Checkout:
            def __init__(self, gateway: PaymentGateway,
                         backup: Annotated[PaymentGateway, Qualifier("stripeGateway")],
                         smsNotifier: Notifier, stripeGateway: PaymentGateway):
                self.gateway, self.backup, self.notifier = gateway, backup, smsNotifier
                self.named = stripeGateway
        """)
    _, ctx = _refreshed(learner, app, "Checkout(gateway: PaymentGateway, backup: Annotated["
                                      "PaymentGateway, Qualifier('stripeGateway')], smsNotifier: "
                                      "Notifier, stripeGateway: PaymentGateway); AdyenGateway "
                                      "is @primary")
    checkout = call(ctx.get_bean, "checkout")
    gateways = application_module(f"{app.base}.gateways")
    by_type = call(ctx.get_bean, gateways.PaymentGateway)
    got = [("gateway: PaymentGateway", "AdyenGateway (@primary)",
            _describe(getattr(checkout, "gateway", None))),
           ('backup: Annotated[PaymentGateway, Qualifier("stripeGateway")]', "StripeGateway",
            _describe(getattr(checkout, "backup", None))),
           ("smsNotifier: Notifier", "SmsNotifier (by parameter name)",
            _describe(getattr(checkout, "notifier", None))),
           # named like a non-primary candidate: the @primary still comes first
           ("stripeGateway: PaymentGateway", "AdyenGateway (@primary before the name)",
            _describe(getattr(checkout, "named", None))),
           ("get_bean(PaymentGateway)", "AdyenGateway (@primary)", _describe(by_type))]
    wrong = [row for row in got if not row[1].startswith(row[2])]
    if wrong:
        raise CheckFailure(
            "With several beans of the asked type, a Qualifier picks by bean name; without one, "
            "the single @primary bean wins, even over a bean named like the parameter; only "
            "without a primary does the bean named like the parameter win.",
            expected="; ".join(f"{w[0]} → {w[1]}" for w in wrong),
            actual="; ".join(f"{w[0]} → {w[2]}" for w in wrong),
            evidence=table(got, ("parameter", "expected", "received")),
            fix="Among several candidates try, in this order: the Qualifier's name, the single "
                "@primary candidate, and only then the parameter's name.",
            lesson=WHAT_SPRING_DOES,
        )


def test_an_optional_dependency_without_a_bean_is_none(learner, make_app):
    app = make_app("shop")
    app.write("reporting.py", """\
        from __future__ import annotations

        from typing import Optional

        from markers import component, service


        class AuditLog:
            pass


        class Metrics:
            pass


        @component
        class PrometheusMetrics(Metrics):
            pass


        class Limits:
            pass


        DEFAULT_LIMITS = Limits()


        @service
        class Reporter:
            def __init__(self, audit: AuditLog | None, metrics: Optional[Metrics],
                         trail: Optional[AuditLog], limits: Limits = DEFAULT_LIMITS):
                self.audit, self.metrics, self.trail = audit, metrics, trail
                self.limits = limits
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    reporter = None if error else call(ctx.get_bean, "reporter")
    got = [("audit: AuditLog | None", "None", _describe(getattr(reporter, "audit", "?"))),
           ("metrics: Optional[Metrics]", "PrometheusMetrics",
            _describe(getattr(reporter, "metrics", "?"))),
           ("trail: Optional[AuditLog]", "None", _describe(getattr(reporter, "trail", "?"))),
           ("limits: Limits = DEFAULT_LIMITS", "DEFAULT_LIMITS",
            "DEFAULT_LIMITS" if reporter is not None and getattr(reporter, "limits", None)
            is application_module(f"{app.base}.reporting").DEFAULT_LIMITS
            else _describe(getattr(reporter, "limits", "?")))]
    wrong = [row for row in got if row[1] != row[2]]
    if error or wrong:
        raise CheckFailure(
            "A parameter typed `T | None` or `Optional[T]` receives the bean of type T when "
            "there is one, and None when there is none: it is not an error. A parameter with "
            "a default value and no candidate keeps its default.",
            expected="audit=None, metrics=PrometheusMetrics, trail=None, "
                     "limits=DEFAULT_LIMITS (the default object)",
            actual=f"refresh() raised {type(error).__name__}: {error}" if error
                   else "; ".join(f"{w[0]} got {w[2]}" for w in wrong),
            evidence=table(got, ("parameter", "expected", "received")),
            lesson=WHAT_SPRING_DOES,
        )


def test_a_missing_bean_is_a_clear_error(learner, make_app):
    app = make_app("shop")
    app.write_top(f"{app.base}_mail/__init__.py", """\
        from markers import component


        class Mailer:
            pass


        @component
        class SmtpMailer(Mailer):
            pass
        """)
    app.write("signup.py", """\
        from __future__ import annotations

        from markers import service
        from {base}_mail import Mailer


        @service
        class Signup:
            def __init__(self, mailer: Mailer):
                self.mailer = mailer
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    mailer = application_module(f"{app.base}_mail").Mailer
    fields = (getattr(error, "required_type", None), getattr(error, "bean", None),
              getattr(error, "parameter", None))
    if not isinstance(error, context.NoSuchBeanError) or fields != (mailer, "signup", "mailer"):
        made = None
        if error is None:
            made = getattr(call(ctx.get_bean, "signup"), "mailer", "?")
        raise CheckFailure(
            "A constructor parameter that no bean can satisfy must stop refresh() with "
            "NoSuchBeanError naming the type, the bean that needs it and the parameter (the "
            "only Mailer lives outside the base package, so it was never scanned).",
            expected="NoSuchBeanError(required_type=Mailer, bean='signup', parameter='mailer')",
            actual=(f"refresh() succeeded and Signup.mailer is {_describe(made)}"
                    if error is None else
                    f"{type(error).__name__}: {error}; required_type="
                    f"{getattr(fields[0], '__name__', fields[0])!r}, bean={fields[1]!r}, "
                    f"parameter={fields[2]!r}"),
            evidence=f"{app.base}.signup.Signup(mailer: Mailer); SmtpMailer is in "
                     f"{app.base}_mail, outside the base package {app.base}",
            lesson=NOT_FOUND,
        )
    _a_bean_methods_missing_parameter_names_its_bean(learner, make_app)


def _a_bean_methods_missing_parameter_names_its_bean(learner, make_app):
    """A @bean method's parameters are its bean's: the error names the @bean, not the
    configuration the method is called on."""
    app = make_app("clocks")
    app.write_top(f"{app.base}_zones/__init__.py", """\
        class Zone:
            pass
        """)
    app.write("clock_config.py", """\
        from __future__ import annotations

        from markers import bean, configuration
        from {base}_zones import Zone


        class Clock:
            def __init__(self, zone):
                self.zone = zone


        @configuration
        class ClockConfig:
            @bean
            def shopClock(self, zone: Zone) -> Clock:
                return Clock(zone)
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    zone = application_module(f"{app.base}_zones").Zone
    fields = (getattr(error, "required_type", None), getattr(error, "bean", None),
              getattr(error, "parameter", None))
    if not isinstance(error, context.NoSuchBeanError) or fields != (zone, "shopClock", "zone"):
        raise CheckFailure(
            "A @bean method's parameters are the needs of its bean: one that no bean can "
            "satisfy stops refresh() with NoSuchBeanError naming the type, the @bean whose "
            "method needs it and the parameter (the configuration the method is called on is "
            "another bean).",
            expected="NoSuchBeanError(required_type=Zone, bean='shopClock', parameter='zone')",
            actual=("refresh() succeeded" if error is None else
                    f"{type(error).__name__}: {error}; required_type="
                    f"{getattr(fields[0], '__name__', fields[0])!r}, bean={fields[1]!r}, "
                    f"parameter={fields[2]!r}"),
            evidence=f"{app.base}.clock_config.ClockConfig.shopClock(self, zone: Zone) -> Clock;"
                     f" Zone is in {app.base}_zones, which holds no bean",
            lesson=NOT_FOUND,
            fix="Resolve a @bean method's parameters on behalf of its own bean (shopClock), not "
                "of its configuration (clockConfig)."
            if isinstance(error, context.NoSuchBeanError) and fields[1] == "clockConfig"
            else None,
        )


TWO_STORES = """\
    from __future__ import annotations

    from markers import bean, component, configuration, service


    class Store:
        pass


    @component
    class RedisStore(Store):
        pass


    @component
    class MemoryStore(Store):
        pass


    @component(name="store")
    class StoreFront:
        '''Named like the consumers' parameter, but not a Store.'''


    {consumer}
    """

UNDECIDED_CONSUMERS = (
    ("Cart(store: Store)", """\
    @service
    class Cart:
        def __init__(self, store: Store):
            self.store = store
    """),
    ("Cart(store: Store | None)", """\
    @service
    class Cart:
        def __init__(self, store: Store | None):
            self.store = store
    """),
    ("@bean cart(self, store: Store) -> Cart", """\
    class Cart:
        def __init__(self, store):
            self.store = store


    @configuration
    class CartConfig:
        @bean
        def cart(self, store: Store) -> Cart:
            return Cart(store)
    """),
)


def test_two_candidates_without_a_primary_is_an_error(learner, make_app):
    context = learner.module("context")
    rows = []
    for shape, consumer in UNDECIDED_CONSUMERS:
        app = make_app("shop")
        app.write("cart.py", TWO_STORES.replace("{consumer}", textwrap.indent(
            textwrap.dedent(consumer), "    ").strip()))
        ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
        error = raised(ctx.refresh)
        candidates = sorted(getattr(error, "candidates", None) or [])
        chosen = "-"
        if error is None:
            chosen = _describe(getattr(call(ctx.get_bean, "cart"), "store", None))
            got = f"refresh() succeeded and Cart.store is {chosen}"
        else:
            got = f"{type(error).__name__}: {error}; candidates={candidates}"
        ok = isinstance(error, context.NoUniqueBeanError) \
            and candidates == ["memoryStore", "redisStore"]
        rows.append((shape, got, chosen, ok))
    wrong = [row for row in rows if not row[3]]
    if wrong:
        by_name = any(row[2] == "StoreFront" for row in wrong)
        picked = all(row[2] in ("RedisStore", "MemoryStore") for row in wrong)
        raise CheckFailure(
            "Two beans of the parameter's type, neither @primary nor named like the parameter, "
            "and no Qualifier: refresh() must fail with NoUniqueBeanError listing both, not "
            "pick one. The bean named store is a StoreFront, not a Store: it is no candidate, "
            "so the parameter's name settles nothing.",
            expected="; ".join(f"{w[0]}: NoUniqueBeanError with candidates memoryStore, "
                               "redisStore" for w in wrong),
            actual="; ".join(f"{w[0]}: {w[1]}" for w in wrong),
            evidence=table([row[:2] for row in rows], ("consumer", "got"))
                     + "\nRedisStore(Store) and MemoryStore(Store) are both components; "
                       "StoreFront, a component named store, is not a Store",
            lesson=WHAT_SPRING_DOES,
            fix="The parameter's name only chooses among the candidates of its type: look "
                "for it in the candidates, not among every bean name." if by_name else
                "When several candidates remain after Qualifier, @primary and the parameter "
                "name, raise NoUniqueBeanError." if picked else None,
        )


CYCLE = """\
    from __future__ import annotations

    from markers import component


    @component
    class Aardvark:
        def __init__(self, alpha: Alpha):
            self.alpha = alpha


    @component
    class Alpha:
        def __init__(self, beta: Beta):
            self.beta = beta


    @component
    class Beta:
        def __init__(self, gamma: Gamma):
            self.gamma = gamma


    @component
    class Gamma:
        def __init__(self, alpha: Alpha):
            self.alpha = alpha
    """


def _is_rotation(cycle, ring):
    if len(cycle) != len(ring) + 1 or cycle[0] != cycle[-1]:
        return False
    body = list(cycle[:-1])
    return any(body == ring[i:] + ring[:i] for i in range(len(ring)))


def test_a_constructor_cycle_is_named(learner, make_app):
    app = make_app("shop")
    app.write("cycle.py", CYCLE)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    cycle = list(getattr(error, "cycle", None) or [])
    ring = ["alpha", "beta", "gamma"]
    if not isinstance(error, context.CircularDependencyError) or not _is_rotation(cycle, ring):
        raise CheckFailure(
            "Constructors that need each other can never be called: refresh() must fail with "
            "CircularDependencyError whose cycle names the beans of the loop, in dependency "
            "order, the first again at the end, and no bean outside the loop (aardvark only "
            "leads into it).",
            expected="CircularDependencyError, cycle alpha → beta → gamma → alpha (any "
                     "rotation)",
            actual=("no error" if error is None else f"{type(error).__name__}")
                   + (f", cycle {' → '.join(map(str, cycle))}" if cycle else ""),
            evidence="Aardvark(alpha: Alpha); Alpha(beta: Beta); Beta(gamma: Gamma); "
                     "Gamma(alpha: Alpha)",
            lesson=INJECTION,
            fix="Keep the beans currently being created in order; when one is asked for "
                "again, the cycle is the part of that list from its first appearance."
            if isinstance(error, RecursionError) else None,
        )


def test_a_shared_dependency_is_not_a_cycle(learner, make_app):
    app = make_app("shop")
    app.write("diamond.py", """\
        from __future__ import annotations

        from markers import component
        import {probe} as probe


        @component
        class Top:
            def __init__(self, left: Left, right: Right):
                self.left, self.right = left, right


        @component
        class Left:
            def __init__(self, base: Base):
                self.base = base


        @component
        class Right:
            def __init__(self, base: Base):
                self.base = base


        @component
        class Base:
            def __init__(self):
                probe.events.append(("init", "base"))
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    made = Counter(app.created())
    if error is not None or made["base"] != 1:
        raise CheckFailure(
            "Two beans that need the same third bean form a diamond, not a cycle: Base is "
            "created once and shared, and refresh() succeeds.",
            expected="refresh() succeeds; base made once",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error
                    else f"base made {made['base']} time(s)"),
            evidence="Top(left: Left, right: Right); Left(base: Base); Right(base: Base)",
            lesson=INJECTION,
        )


def test_a_qualifier_only_picks_among_beans_of_the_type(learner, make_app):
    app = make_app("shop")
    app.write("billing.py", """\
        from __future__ import annotations

        from typing import Annotated

        from markers import Qualifier, component, service


        class PaymentGateway:
            pass


        @component
        class AuditLog:
            '''A bean named auditLog, but not a PaymentGateway.'''


        @service
        class Refunds:
            def __init__(self, gateway: Annotated[PaymentGateway, Qualifier("auditLog")]):
                self.gateway = gateway
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(ctx.refresh)
    gateway_type = application_module(f"{app.base}.billing").PaymentGateway
    fields = (getattr(error, "required_type", None), getattr(error, "bean", None),
              getattr(error, "parameter", None))
    if not isinstance(error, context.NoSuchBeanError) \
            or fields != (gateway_type, "refunds", "gateway"):
        given = None if error is not None else getattr(call(ctx.get_bean, "refunds"),
                                                       "gateway", None)
        raise CheckFailure(
            "A Qualifier chooses among the candidates, the beans of the parameter's type: a "
            "bean with that name but of another type is not one of them, so nothing can be "
            "injected and refresh() fails with NoSuchBeanError.",
            expected="NoSuchBeanError(required_type=PaymentGateway, bean='refunds', "
                     "parameter='gateway')",
            actual=(f"refresh() succeeded and Refunds.gateway is {_describe(given)}"
                    if error is None else
                    f"{type(error).__name__}: {error}; required_type="
                    f"{getattr(fields[0], '__name__', fields[0])!r}, bean={fields[1]!r}, "
                    f"parameter={fields[2]!r}"),
            evidence="Refunds(gateway: Annotated[PaymentGateway, Qualifier('auditLog')]); "
                     "auditLog is an AuditLog, no bean is a PaymentGateway",
            lesson=WHAT_SPRING_DOES,
        )


PROTOTYPE_CYCLE = """\
    from __future__ import annotations

    from markers import component, scope


    @component
    class Ledger:
        def __init__(self, entry: Entry):
            self.entry = entry


    @component
    @scope("prototype")
    class Entry:
        def __init__(self, journal: Journal):
            self.journal = journal


    @component
    class Journal:
        def __init__(self, ledger: Ledger):
            self.ledger = ledger
    """

PROTOTYPE_PAIR = """\
    from __future__ import annotations

    from markers import component, scope


    @component
    @scope("prototype")
    class Draft:
        def __init__(self, sketch: Sketch):
            self.sketch = sketch


    @component
    @scope("prototype")
    class Sketch:
        def __init__(self, draft: Draft):
            self.draft = draft
    """


def test_a_cycle_through_prototypes_is_named(learner, make_app):
    context = learner.module("context")
    mixed = make_app("shop")
    mixed.write("books.py", PROTOTYPE_CYCLE)
    ctx = call(context.ApplicationContext, mixed.base, mixed.root, {}, [])
    mixed_error = raised(ctx.refresh)
    pair = make_app("shop")
    pair.write("notes.py", PROTOTYPE_PAIR)
    ctx = call(context.ApplicationContext, pair.base, pair.root, {}, [])
    pair_error = raised(ctx.refresh) or raised(ctx.get_bean, "draft")
    rows = []
    for label, error, ring in (
            ("refresh(): Ledger → Entry (prototype) → Journal → Ledger", mixed_error,
             ["ledger", "entry", "journal"]),
            ("get_bean('draft'): Draft (prototype) ↔ Sketch (prototype)", pair_error,
             ["draft", "sketch"])):
        cycle = list(getattr(error, "cycle", None) or [])
        ok = isinstance(error, context.CircularDependencyError) and _is_rotation(cycle, ring)
        rows.append((label, " → ".join([*ring, ring[0]]),
                     ("no error" if error is None else type(error).__name__)
                     + (f", cycle {' → '.join(map(str, cycle))}" if cycle else ""), ok))
    wrong = [row for row in rows if not row[3]]
    if wrong:
        raise CheckFailure(
            "A prototype being created is on the path of beans in creation like a singleton: "
            "a loop through prototypes is a cycle too, named with every bean of the loop "
            "(a new object each time would never end the recursion).",
            expected="; ".join(f"{w[0]}: CircularDependencyError, cycle {w[1]} (any rotation)"
                               for w in wrong),
            actual="; ".join(f"{w[0]}: {w[2]}" for w in wrong),
            evidence=table([r[:3] for r in rows], ("case", "expected cycle", "got")),
            lesson=INJECTION,
        )


def test_a_lazy_singleton_is_one_object_however_it_is_reached(learner, make_app):
    app = make_app("shop")
    app.write("rates.py", """\
        from __future__ import annotations

        from markers import bean, component, configuration, lazy, service
        import {probe} as probe


        @lazy
        @component
        class RateTable:
            def __init__(self):
                probe.events.append(("init", "rateTable"))


        class FxFeed:
            pass


        @configuration
        class FxConfig:
            @lazy
            @bean
            def fx_feed(self) -> FxFeed:
                probe.events.append(("init", "fx_feed"))
                return FxFeed()


        @service
        class Pricing:
            def __init__(self, rates: RateTable, feed: FxFeed):
                self.rates, self.feed = rates, feed


        @service
        class Billing:
            def __init__(self, table: RateTable, fx: FxFeed):
                self.rates, self.feed = table, fx


        @lazy
        @service
        class Audit:
            def __init__(self, rates: RateTable):
                self.rates = rates
        """)
    _, ctx = _refreshed(learner, app, "@lazy RateTable and @lazy @bean fx_feed, each needed by "
                                      "Pricing and Billing; @lazy Audit(rates: RateTable)")
    rates = application_module(f"{app.base}.rates")
    pricing, billing = call(ctx.get_bean, "pricing"), call(ctx.get_bean, "billing")
    audit = call(ctx.get_bean, "audit")
    table_bean = call(ctx.get_bean, "rateTable")
    feed_bean = call(ctx.get_bean, "fx_feed")
    reached = [
        ("Pricing.rates", getattr(pricing, "rates", None), table_bean),
        ("Billing.rates", getattr(billing, "rates", None), table_bean),
        ("Audit.rates (a lazy bean made by get_bean)", getattr(audit, "rates", None), table_bean),
        ("get_bean(RateTable)", call(ctx.get_bean, rates.RateTable), table_bean),
        ("Pricing.feed", getattr(pricing, "feed", None), feed_bean),
        ("Billing.feed", getattr(billing, "feed", None), feed_bean),
        ("get_bean(FxFeed)", call(ctx.get_bean, rates.FxFeed), feed_bean),
    ]
    made = Counter(app.created())
    rows = [(route, _describe(got), got is bean) for route, got, bean in reached]
    wrong = [row for row in rows if not row[2]]
    if wrong or made["rateTable"] != 1 or made["fx_feed"] != 1:
        raise CheckFailure(
            "A lazy singleton is still a singleton: whether the first to ask for it is "
            "get_bean or another bean's constructor, it is made once, kept, and every later "
            "injection or lookup (by name or by type) gets that same object.",
            expected="rateTable and fx_feed made once each; every route below is "
                     "get_bean('rateTable') / get_bean('fx_feed')",
            actual=f"rateTable made {made['rateTable']} time(s), fx_feed made "
                   f"{made['fx_feed']} time(s)"
                   + ("; not the same object: " + ", ".join(w[0] for w in wrong)
                      if wrong else ""),
            evidence=table(rows, ("route", "received", "is the bean from get_bean(name)"))
                     + "\nconstructors run: " + ", ".join(app.created()),
            lesson=LIFECYCLE,
        )


def test_a_lookup_by_type_follows_the_beans_scope(learner, make_app):
    app = make_app("shop")
    app.write("quotes.py", """\
        from __future__ import annotations

        from markers import bean, component, configuration, scope
        import {probe} as probe


        @component
        @scope("prototype")
        class Quote:
            def __init__(self):
                probe.events.append(("init", "quote"))


        class Draft:
            pass


        @configuration
        class DraftConfig:
            @bean
            @scope("prototype")
            def draft(self) -> Draft:
                probe.events.append(("init", "draft"))
                return Draft()
        """)
    _, ctx = _refreshed(learner, app, "@scope('prototype') Quote; @bean @scope('prototype') "
                                      "draft(self) -> Draft")
    quotes = application_module(f"{app.base}.quotes")
    # by type, by type, by name, by type again: every lookup must be a new object
    lookups = [("get_bean(Quote)", call(ctx.get_bean, quotes.Quote)),
               ("get_bean(Quote)", call(ctx.get_bean, quotes.Quote)),
               ("get_bean('quote')", call(ctx.get_bean, "quote")),
               ("get_bean(Quote)", call(ctx.get_bean, quotes.Quote)),
               ("get_bean(Draft)", call(ctx.get_bean, quotes.Draft)),
               ("get_bean(Draft)", call(ctx.get_bean, quotes.Draft))]
    made = Counter(app.created())
    seen: dict[int, int] = {}
    rows = []
    for n, (route, got) in enumerate(lookups, 1):
        first = seen.setdefault(id(got), n)
        rows.append((n, route, _describe(got), "new" if first == n else f"same as #{first}"))
    repeated = [row for row in rows if row[3] != "new"]
    if repeated or made["quote"] != 4 or made["draft"] != 2:
        by_type_kept = all(row[1] != "get_bean('quote')" for row in repeated) \
            and rows[2][3] == "new"
        raise CheckFailure(
            "get_bean(SomeType) returns what get_bean of the chosen bean's name returns: a "
            "prototype is made anew on every lookup, by type as by name, so no lookup may "
            "hand back an object an earlier one returned.",
            expected="6 new objects: Quote made 4 times, draft made 2 times",
            actual=f"Quote made {made['quote']} time(s), draft {made['draft']} time(s); "
                   + ", ".join(f"lookup #{row[0]} {row[1]} returned the object of "
                               f"#{row[3].removeprefix('same as #')}" for row in repeated),
            evidence=table(rows, ("#", "lookup", "returned", "object")),
            lesson=LIFECYCLE,
            fix="Do not keep what a lookup by type returned: resolve the type to a bean name "
                "each time and return get_bean(name)." if repeated and by_type_kept else None,
        )


STORES = """\
    from __future__ import annotations

    from markers import component, lazy, scope, service


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


    @component
    @lazy
    class AuditLog:
        def __init__(self, sink: Missing):
            self.sink = sink


    class PrinterJammed(Exception):
        pass


    @component
    @scope("prototype")
    class Receipt:
        def __init__(self):
            raise PrinterJammed("receipt printer jammed")


    @component
    @lazy
    class Ledger:
        def __init__(self):
            raise PrinterJammed("ledger printer jammed")


    {consumer}
    """

AMBIGUOUS_CONSUMERS = (
    ("Cart(store: Store | None)", "NoUniqueBeanError", ["memoryStore", "redisStore"], """\
    @service
    class Cart:
        def __init__(self, store: Store | None):
            self.store = store
    """),
    ("Cart(store: Store = FALLBACK)", "NoUniqueBeanError", ["memoryStore", "redisStore"], """\
    FALLBACK = Store()


    @service
    class Cart:
        def __init__(self, store: Store = FALLBACK):
            self.store = store
    """),
    ("Cart(audit: AuditLog | None), AuditLog(sink: Missing)", "NoSuchBeanError", None, """\
    @service
    class Cart:
        def __init__(self, audit: AuditLog | None):
            self.audit = audit
    """),
    ("Cart(receipt: Receipt | None), Receipt a prototype whose constructor raises",
     "PrinterJammed", None, """\
    @service
    class Cart:
        def __init__(self, receipt: Receipt | None):
            self.receipt = receipt
    """),
    ("Cart(ledger: Ledger | None = None), Ledger @lazy whose constructor raises",
     "PrinterJammed", None, """\
    @service
    class Cart:
        def __init__(self, ledger: Ledger | None = None):
            self.ledger = ledger
    """),
)
OWN_ERROR = "PrinterJammed"     # a candidate's own exception: itself, or as a __cause__


def _raised_own(error):
    """Whether error is the candidate's own PrinterJammed, or reaches it by __cause__."""
    seen = 0
    while error is not None and seen < 20:
        if type(error).__name__ == OWN_ERROR:
            return True
        error, seen = error.__cause__, seen + 1
    return False


def test_optional_or_default_only_covers_no_candidate(learner, make_app):
    context = learner.module("context")
    rows = []
    for shape, wanted, candidates, consumer in AMBIGUOUS_CONSUMERS:
        app = make_app("shop")
        app.write("cart.py", STORES.replace("{consumer}", textwrap.indent(
            textwrap.dedent(consumer), "    ").strip()))
        ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
        error = raised(ctx.refresh)
        if error is None:
            cart = call(ctx.get_bean, "cart")
            got = "refresh() succeeded; Cart." + ", Cart.".join(
                f"{k}={_describe(v)}" for k, v in vars(cart).items())
        else:
            got = f"{type(error).__name__}: {error}"
        if wanted == OWN_ERROR:
            rows.append((shape, "refresh() raises the constructor's PrinterJammed (itself or "
                                "as the __cause__ of the error raised)", got,
                         _raised_own(error)))
            continue
        ok = isinstance(error, getattr(context, wanted)) and (
            candidates is None or sorted(getattr(error, "candidates", None) or []) == candidates)
        if candidates is None and ok:
            ok = getattr(error, "bean", None) == "auditLog" \
                and getattr(error, "parameter", None) == "sink"
        rows.append((shape, wanted + (f" {candidates}" if candidates else
                                      " (bean auditLog, parameter sink)"), got, ok))
    wrong = [row for row in rows if not row[3]]
    if wrong:
        swallowed = any(row[2].startswith("refresh() succeeded") for row in wrong)
        raise CheckFailure(
            "`T | None` and a default value stand in only when no bean of type T exists. "
            "Two candidates without a primary are still NoUniqueBeanError, and a candidate "
            "that cannot be built is still its own error; neither may turn into None or the "
            "default.",
            expected="; ".join(f"{w[0]}: {w[1]}" for w in wrong),
            actual="; ".join(f"{w[0]}: {w[2]}" for w in wrong),
            evidence=table([r[:3] for r in rows], ("constructor", "expected", "got"))
                     + "\nStore has two beans, redisStore and memoryStore; AuditLog has one, "
                       "auditLog, whose constructor needs a Missing that no bean provides; "
                       "Receipt (a prototype) and Ledger (@lazy) have one each, whose "
                       "constructor raises PrinterJammed",
            lesson=WHAT_SPRING_DOES,
            fix="Fall back to None or the default only on NoSuchBeanError for the "
                "parameter's own type, raised before any candidate is created."
            if swallowed else None,
        )


OWN_BEAN_CYCLES = (
    ("ClockConfig(clock: Clock) with @bean clock(self) -> Clock", ["clockConfig", "clock"], """\
    from __future__ import annotations

    from markers import bean, configuration


    class Clock:
        pass


    @configuration
    class ClockConfig:
        def __init__(self, clock: Clock):
            self.clock = clock

        @bean
        def clock(self) -> Clock:
            return Clock()
    """),
    ("FeedConfig(parser: Parser); Parser(feed: Feed); @bean feed(self) -> Feed on FeedConfig",
     ["feedConfig", "parser", "feed"], """\
    from __future__ import annotations

    from markers import bean, component, configuration


    class Feed:
        pass


    @component
    class Parser:
        def __init__(self, feed: Feed):
            self.feed = feed


    @configuration
    class FeedConfig:
        def __init__(self, parser: Parser):
            self.parser = parser

        @bean
        def feed(self) -> Feed:
            return Feed()
    """),
)


def test_a_cycle_through_a_configuration_and_its_bean_is_named(learner, make_app):
    context = learner.module("context")
    rows = []
    for shape, ring, source in OWN_BEAN_CYCLES:
        app = make_app("shop")
        app.write("config.py", source)
        ctx = call(context.ApplicationContext, app.base, app.root, {}, [])
        error = raised(ctx.refresh)
        cycle = list(getattr(error, "cycle", None) or [])
        ok = isinstance(error, context.CircularDependencyError) and _is_rotation(cycle, ring)
        rows.append((shape, " → ".join([*ring, ring[0]]),
                     ("no error" if error is None else type(error).__name__)
                     + (f", cycle {' → '.join(map(str, cycle))}" if cycle else ""), ok))
    wrong = [row for row in rows if not row[3]]
    if wrong:
        recursed = any(row[2].startswith("RecursionError") for row in wrong)
        raise CheckFailure(
            "A @bean method's bean is made by calling the method on its configuration bean, "
            "so it depends on that bean: a configuration whose constructor needs (directly or "
            "not) one of its own @bean beans is a cycle, and refresh() must name it.",
            expected="; ".join(f"{w[0]}: CircularDependencyError, cycle {w[1]} (any rotation)"
                               for w in wrong),
            actual="; ".join(f"{w[0]}: {w[2]}" for w in wrong),
            evidence=table([r[:3] for r in rows], ("application", "expected cycle", "got")),
            lesson=INJECTION,
            fix="Create the configuration bean on the same path of beans in creation as the "
                "@bean that needs it, so that the loop through it is seen."
            if recursed else None,
        )
