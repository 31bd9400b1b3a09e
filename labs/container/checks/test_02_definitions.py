"""Stage definitions: the context registers definitions; objects exist only after refresh().

The application's constructors append ("init", bean) to the probe module's `events`, and some
of its modules write a row to import_log when imported: the check sees when objects are made
and when modules are loaded without asking the container.
"""

from __future__ import annotations

from collections import Counter

import pytest
from _support import DEFINITIONS, LIFECYCLE, imported_modules

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("definitions")

SHOP = {
    "prices.py": """\
        from markers import component, primary
        import {probe} as probe


        class PriceList:
            pass


        @primary
        @component
        class FastPrices(PriceList):
            def __init__(self):
                probe.events.append(("init", "fastPrices"))


        @component
        class SlowPrices(PriceList):
            def __init__(self):
                probe.events.append(("init", "slowPrices"))
        """,
    "quotes.py": """\
        from markers import scope, service
        from {base}.prices import PriceList
        import {probe} as probe


        @service
        @scope("prototype")
        class Quote:
            def __init__(self{quote_params}):
                probe.events.append(("init", "quote"))
        """,
    "archive.py": """\
        from markers import lazy, repository
        import {probe} as probe


        @lazy
        @repository
        class ArchiveStore:
            def __init__(self):
                probe.events.append(("init", "archiveStore"))
        """,
    "config.py": """\
        from markers import bean, configuration, lazy, primary, scope
        from {base}.prices import PriceList
        import {probe} as probe


        @configuration
        class AppConfig:
            @bean
            def price_cache(self{cache_params}) -> dict:
                probe.events.append(("init", "price_cache"))
                return {"made": True}

            @lazy
            @bean
            def report_cache(self) -> dict:
                probe.events.append(("init", "report_cache"))
                return {}

            @bean
            @scope("prototype")
            def scratch(self) -> list:
                probe.events.append(("init", "scratch"))
                return []

            @primary
            @bean
            def main_cache(self) -> dict:
                probe.events.append(("init", "main_cache"))
                return {}
        """,
}


STAR_ARGS = ("extra_prices", "pricing_options")


def _context(learner, app):
    context = learner.module("context")
    return context, call(context.ApplicationContext, app.base, app.root, {}, [])


def _write_shop(app, dsn="", with_parameters=True):
    """The shop; without parameters, refresh() needs no injection (that is stage 3)."""
    # *args and **kwargs receive no bean: they are no dependency (one of each kind, apart)
    quote = f", prices: PriceList, *{STAR_ARGS[0]}, rounding: PriceList | None = None"
    cache = f", prices: PriceList, archive: PriceList | None = None, **{STAR_ARGS[1]}"
    for name, source in SHOP.items():
        source = source.replace("{quote_params}", quote if with_parameters else "")
        source = source.replace("{cache_params}", cache if with_parameters else "")
        app.write(name, source, side_effect=dsn if name == "quotes.py" else "")


# only in the definitions check (it never refreshes): a flag on a configuration class is not
# its @bean methods', and a positional-only parameter is a dependency like any other
EXTRA = {
    "tools.py": """\
        from markers import bean, configuration, primary


        @primary
        @configuration
        class ToolConfig:
            @bean
            def toolbox(self) -> set:
                return set()
        """,
    "ledger.py": """\
        from markers import component
        from {base}.prices import PriceList


        @component
        class Ledger:
            def __init__(self, prices: PriceList, /, audit: PriceList | None = None):
                self.prices, self.audit = prices, audit
        """,
}


def test_definitions_carry_scope_lazy_primary_and_dependencies(learner, make_app):
    app = make_app("shop")
    _write_shop(app)
    for name, source in EXTRA.items():
        app.write(name, source)
    _, ctx = _context(learner, app)
    found = dict(getattr(ctx, "definitions", {}) or {})
    wanted = {
        "fastPrices": ("singleton", False, True, ()),
        "slowPrices": ("singleton", False, False, ()),
        "quote": ("prototype", False, False, ("prices", "rounding")),
        "archiveStore": ("singleton", True, False, ()),
        "appConfig": ("singleton", False, False, ()),
        "price_cache": ("singleton", False, False, ("prices", "archive")),
        "report_cache": ("singleton", True, False, ()),
        "scratch": ("prototype", False, False, ()),
        "main_cache": ("singleton", False, True, ()),
        "toolConfig": ("singleton", False, True, ()),
        "toolbox": ("singleton", False, False, ()),
        "ledger": ("singleton", False, False, ("prices", "audit")),
    }
    # where each class's flag is written relative to its marker (the README: either side)
    above = {"fastPrices": "@primary above @component", "archiveStore": "@lazy above @repository",
             "toolConfig": "@primary above @configuration"}
    below = {"quote": "@scope below @service"}
    rows, wrong = [], []
    for name, (scope, lazy, primary, deps) in wanted.items():
        d = found.get(name)
        got = None if d is None else (getattr(d, "scope", None), getattr(d, "lazy", None),
                                      getattr(d, "primary", None),
                                      tuple(getattr(d, "dependencies", ()) or ()))
        rows.append((name, *(got or ("missing",) * 4)))
        if got != (scope, lazy, primary, deps):
            where = above.get(name) or below.get(name)
            wrong.append(f"{name}{f' ({where})' if where else ''}: expected scope={scope} "
                         f"lazy={lazy} primary={primary} "
                         f"dependencies={deps}, got " + (
                             "no definition" if got is None else
                             f"scope={got[0]} lazy={got[1]} primary={got[2]} "
                             f"dependencies={got[3]}"))
    if wrong:
        # both classes with a flag above the marker lost it, everything else is right (the
        # same flags on @bean methods, @scope below @service): the position was the mistake
        lost = {w.split(" ", 1)[0].split(":")[0] for w in wrong}
        one_side = lost == set(above)
        starred = sorted({n for row in rows for n in (row[4] if isinstance(row[4], tuple) else ())
                          if n in STAR_ARGS})
        raise CheckFailure(
            "The definitions registered by the context must say what each bean will be: its "
            "scope, whether it is lazy or primary, and the names of its constructor's (or "
            "@bean method's) parameters, for classes and for the @bean methods of "
            "@configuration classes (a @bean method's flags are its own, not its class's).",
            expected="definitions for " + ", ".join(wanted),
            actual="; ".join(wrong),
            evidence=table(rows, ("bean", "scope", "lazy", "primary", "dependencies")),
            lesson=DEFINITIONS,
            fix="Read scope, lazy and primary from every decorator of the class, above and below "
                "its marker: their order is free." if one_side else
                f"Leave *args and **kwargs ({', '.join(starred)}) out of dependencies: they "
                "receive no bean." if starred else None,
        )


def test_nothing_is_created_before_refresh(learner, make_app, import_log, database):
    app = make_app("shop")
    _write_shop(app, database.dsn, with_parameters=False)
    _, ctx = _context(learner, app)
    before_rows = imported_modules(import_log)
    before = (app.loaded(), app.created())
    if before_rows or before[0] or before[1]:
        raise CheckFailure(
            "Creating the context must only register definitions: no module of the "
            "application imported, no object made, until refresh().",
            expected="no row in import_log, no application module loaded, no constructor run",
            actual=f"{len(before_rows)} import_log row(s); loaded: "
                   f"{', '.join(before[0]) or 'none'}; constructors run: "
                   f"{', '.join(before[1]) or 'none'}",
            evidence="import_log:\n" + table([(m,) for m in before_rows], ("module",)),
            lesson=DEFINITIONS,
        )
    call(ctx.refresh)
    made = Counter(app.created())
    wanted = Counter({"fastPrices": 1, "slowPrices": 1, "price_cache": 1, "main_cache": 1})
    if made != wanted:
        early = sorted(set(made) & {"archiveStore", "quote", "report_cache", "scratch"})
        raise CheckFailure(
            "refresh() must create every non-lazy singleton exactly once, and neither a lazy "
            "singleton (made on its first lookup) nor a prototype (made on each lookup).",
            expected=", ".join(f"{n} ×1" for n in sorted(wanted)),
            actual=", ".join(f"{n} ×{c}" for n, c in sorted(made.items())) or "nothing",
            evidence="constructors run, in order:\n"
                     + table([(n,) for n in app.created()], ("bean",)),
            lesson=LIFECYCLE,
            fix=None if not early else f"{', '.join(early)} must wait for get_bean().",
        )
    rows = imported_modules(import_log)
    if rows != [f"{app.base}.quotes"]:
        raise CheckFailure(
            "refresh() must import the application's modules once each (here: the module of "
            "the prototype bean, which writes a row when imported).",
            expected=f"one row: {app.base}.quotes",
            actual=f"{len(rows)} row(s)",
            evidence=table([(m,) for m in rows], ("module",)),
            lesson=LIFECYCLE,
        )
    first, again = call(ctx.get_bean, "archiveStore"), call(ctx.get_bean, "archiveStore")
    q1, q2 = call(ctx.get_bean, "quote"), call(ctx.get_bean, "quote")
    made = Counter(app.created())
    problems = []
    if made["archiveStore"] != 1 or first is not again:
        problems.append(f"the lazy singleton archiveStore: constructor ran "
                        f"{made['archiveStore']} time(s) for two lookups, "
                        f"same object: {first is again}")
    if made["quote"] != 2 or q1 is q2:
        problems.append(f"the prototype quote: constructor ran {made['quote']} time(s) for two "
                        f"lookups, same object: {q1 is q2}")
    if problems:
        raise CheckFailure(
            "get_bean must make a lazy singleton on its first lookup and return that object "
            "afterwards, and make a new prototype on every lookup.",
            expected="archiveStore made once and shared; quote made twice, two objects",
            actual="; ".join(problems),
            evidence="constructors run, in order:\n"
                     + table([(n,) for n in app.created()], ("bean",)),
            lesson=LIFECYCLE,
        )
