"""Stage scan: components are found by reading source with `ast`; nothing is imported.

Each check writes an application package of its own (see _support.App) and calls
`scanning.scan(base_package, root)`; the README fixes that API and the BeanDefinition fields.
"""

from __future__ import annotations

import pytest
from _support import ASM, META, NAMING, SCAN, WHERE, imported_modules, names

from dojo.checks import CheckFailure, call, table

pytestmark = pytest.mark.stage("scan")


def test_marked_classes_are_found_and_unmarked_ones_are_not(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    app.write("orders/service.py", """\
        from dataclasses import dataclass

        import markers
        from markers import repository, service


        class Money:
            '''Not a component: @component appears only in this docstring.'''


        @dataclass
        class Invoice:
            total: int


        @service
        class OrderService:
            @markers.component
            class Line:
                '''Marked, but nested in a marked class: the module has no attribute Line.'''

            def build(self):
                @service
                class Built:
                    '''Marked, local to a method.'''

                return Built()


        @markers.component
        class PriceCalculator:
            pass


        class Registry:
            @repository
            class Entry:
                '''Marked, nested in a class that is not a component.'''


        def component_factory():
            @markers.component
            class Local:
                '''Marked, but local to a function: no module attribute names it.'''

            return Local()


        async def async_factory():
            @markers.component
            class AsyncLocal:
                '''Marked, local to a coroutine.'''

            return AsyncLocal()
        """)
    app.write("orders/store.py", """\
        from markers import repository


        @repository(name="orderStore")
        class SqlOrderRepository:
            pass


        class Row:
            pass
        """)
    app.write("deep/er/still/audit.py", """\
        from markers import component


        @component
        class AuditTrail:
            pass
        """)
    found = call(scanning.scan, app.base, app.root)
    got = names(found)
    wanted = sorted(["orderService", "priceCalculator", "orderStore", "auditTrail"])
    # marked, but inside a class body (Line in @service OrderService, Entry in a plain
    # class) or a function body (a method, a function, a coroutine): never module attributes
    inner = {"line", "built", "entry", "local", "asyncLocal"}
    if got != wanted:
        extra = sorted(set(got) - set(wanted))
        missing = sorted(set(wanted) - set(got))
        raise CheckFailure(
            "scan must register every class marked @component, @service, @repository or "
            "@configuration at the top level of a module under the base package, in any "
            "sub-package, and nothing else.",
            expected=", ".join(wanted),
            actual=(", ".join(got) or "nothing")
                   + (f" (registered, but not a top-level marked class: {', '.join(extra)})"
                      if extra else "")
                   + (f" (marked, but missing: {', '.join(missing)})" if missing else ""),
            evidence="files under the base package:\n" + "\n".join(app.written)
                     + "\norders/service.py also holds marked classes nested in a class "
                       "(OrderService.Line, Registry.Entry) or local to a function (in "
                       "OrderService.build, component_factory, async_factory)",
            lesson=SCAN,
            fix="Take the candidates from the module's own body (the ClassDef nodes of "
                "tree.body), without descending into classes or functions: a nested class "
                "is no attribute of the module, so refresh() could not import it."
            if extra and set(extra) <= inner and not missing else None,
        )
    types = {d.name: getattr(d, "type_name", None) for d in found}
    wrong = [(n, types[n], t) for n, t in (
        ("orderService", f"{app.base}.orders.service.OrderService"),
        ("orderStore", f"{app.base}.orders.store.SqlOrderRepository"),
        ("auditTrail", f"{app.base}.deep.er.still.audit.AuditTrail")) if types[n] != t]
    if wrong:
        raise CheckFailure(
            "A scanned definition's type_name must be the class's module and name, dotted.",
            expected="; ".join(f"{n}: {t}" for n, _, t in wrong),
            actual="; ".join(f"{n}: {g!r}" for n, g, _ in wrong),
            evidence=table(wrong, ("bean", "type_name", "expected")),
            lesson=SCAN,
        )


def test_scanning_imports_no_module(learner, make_app, import_log, database):
    scanning = learner.module("scanning")
    app = make_app("shop")
    mailer = app.write("notifications.py", """\

        from markers import component


        @component
        class Mailer:
            pass
        """, side_effect=database.dsn)
    app.write("reports.py", """\

        from markers import service


        @service
        class MonthlyReport:
            pass
        """, side_effect=database.dsn)
    # A dotted base package too: even finding where it lives must not import its parents
    # (importlib.util.find_spec("a.b") imports the package a).
    app.write("__init__.py", "", side_effect=database.dsn)
    app.write("sales/__init__.py", "", side_effect=database.dsn)
    app.write("sales/desk.py", """\

        from markers import component


        @component
        class SalesDesk:
            pass
        """, side_effect=database.dsn)
    found = call(scanning.scan, app.base, app.root)
    found_sales = call(scanning.scan, f"{app.base}.sales", app.root)
    rows = imported_modules(import_log)
    loaded = app.loaded()
    if rows or loaded:
        raise CheckFailure(
            "Scanning imported the application's modules: their import-time code ran. Read the "
            "source with ast instead, the way Spring's scanner reads class files without "
            "loading the classes.",
            expected="no row in import_log, no module of the application in sys.modules "
                     f"(after scan({app.base!r}) and scan({app.base + '.sales'!r}))",
            actual=f"{len(rows)} row(s) in import_log; loaded: {', '.join(loaded) or 'none'}",
            evidence="import_log (written by each module when it is imported):\n"
                     + table([(m,) for m in rows], ("module",)),
            lesson=ASM,
            fix=("Map the base package to its directory yourself (root / 'shop' / 'sales'): "
                 "importlib.util.find_spec('shop.sales') imports the package shop to find it."
                 if set(rows) | set(loaded) <= {app.base} else
                 "Parse each file with ast.parse(path.read_text()) and look at the ClassDef "
                 "nodes' decorator_list; never import_module while scanning."),
        )
    got, got_sales = names(found), names(found_sales)
    if got != ["mailer", "monthlyReport", "salesDesk"] or got_sales != ["salesDesk"]:
        raise CheckFailure(
            "scan imported nothing (good) but did not register the marked classes of modules "
            "whose import has side effects.",
            expected=f"scan({app.base!r}): mailer, monthlyReport, salesDesk; "
                     f"scan({app.base + '.sales'!r}): salesDesk",
            actual=f"scan({app.base!r}): {', '.join(got) or 'nothing'}; "
                   f"scan({app.base + '.sales'!r}): {', '.join(got_sales) or 'nothing'}",
            evidence=f"module {mailer} declares @component class Mailer",
            lesson=SCAN,
        )


def test_stereotypes_count_as_component(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    app.write("web/stereotypes.py", """\
        from markers import component


        @component
        def controller(cls):
            '''A stereotype: it carries @component.'''
            return cls


        @controller
        def rest_controller(cls):
            '''A stereotype of a stereotype.'''
            return cls


        def traced(cls):
            '''An ordinary class decorator: it carries nothing.'''
            return cls


        @controller
        class StatusPage:
            '''Marked in the module that defines the stereotype.'''
        """)
    app.write("web/pages.py", """\
        from {base}.web import stereotypes
        from {base}.web.stereotypes import controller, rest_controller, traced
        from markers import configuration, service


        @controller
        class HomePage:
            pass


        @rest_controller
        class OrderApi:
            pass


        @stereotypes.rest_controller
        class StockApi:
            pass


        @traced
        class Plain:
            pass


        @configuration
        class WebConfig:
            pass


        @traced
        @service
        class Search:
            pass
        """)
    # A chain whose links sit in modules out of order both ways (mm, then aa, then zz): no
    # single pass over the files, in either order, sees every link.
    app.write("web/mm_links.py", """\
        from markers import component


        @component
        def endpoint(cls):
            return cls
        """)
    app.write("web/aa_links.py", """\
        from {base}.web.mm_links import endpoint


        @endpoint
        def api_endpoint(cls):
            return cls
        """)
    app.write("web/zz_links.py", """\
        from {base}.web.aa_links import api_endpoint


        @api_endpoint
        def versioned_endpoint(cls):
            return cls


        @versioned_endpoint
        class PriceApi:
            pass
        """)
    got = names(call(scanning.scan, app.base, app.root))
    wanted = sorted(["homePage", "orderApi", "stockApi", "webConfig", "search", "priceApi",
                     "statusPage"])
    if got != wanted:
        missing = sorted(set(wanted) - set(got))
        extra = sorted(set(got) - set(wanted))
        # statusPage sits next to the definition of @controller, homePage in another module:
        # finding only the first means stereotypes were looked up per module
        per_module = "statusPage" in got and "homePage" in missing
        raise CheckFailure(
            "A decorator function that is itself marked @component (directly or through "
            "another such decorator) is a stereotype: the classes it marks are components. "
            "A decorator that carries no @component is not.",
            expected=", ".join(wanted),
            actual=(", ".join(got) or "nothing")
                   + (f"; missing {', '.join(missing)}" if missing else "")
                   + (f"; not components, but registered: {', '.join(extra)}" if extra else ""),
            evidence="web/stereotypes.py: @component def controller; @controller def "
                     "rest_controller; def traced (no marker); @controller class StatusPage\n"
                     "web/pages.py: @controller HomePage, @rest_controller OrderApi, "
                     "@stereotypes.rest_controller StockApi, @traced Plain, @configuration "
                     "WebConfig, @traced @service Search\n"
                     "web/mm_links.py: @component def endpoint; web/aa_links.py: @endpoint def "
                     "api_endpoint; web/zz_links.py: @api_endpoint def versioned_endpoint, "
                     "@versioned_endpoint class PriceApi",
            lesson=META,
            fix="A stereotype defined in one module marks classes in every module: collect the "
                "stereotypes of all the files under the base package before looking at any "
                "class." if per_module else None,
        )


def test_beans_are_named_like_spring_names_them(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    app.write("naming.py", """\
        from markers import component, service


        @component
        class URLSigner:
            pass


        @service
        class Q:
            pass


        @component(name="ledger")
        class GeneralLedgerService:
            pass


        @service
        class PdfRenderer:
            pass


        @component
        class A1Service:
            pass


        @component
        class X_Handler:
            pass
        """)
    found = call(scanning.scan, app.base, app.root)
    got = names(found)
    wanted = sorted(["URLSigner", "q", "ledger", "pdfRenderer", "a1Service", "x_Handler"])
    if got != wanted:
        raise CheckFailure(
            "A bean is named by its marker's name= when given, else by the class name with the "
            "first letter lower-cased, unless the first two characters are both capital "
            "letters (java.beans.Introspector.decapitalize: URLSigner stays URLSigner, "
            "A1Service becomes a1Service, X_Handler becomes x_Handler).",
            expected=", ".join(wanted),
            actual=", ".join(got) or "nothing",
            evidence="classes: URLSigner, Q, GeneralLedgerService (name='ledger'), PdfRenderer, "
                     "A1Service, X_Handler",
            lesson=NAMING,
        )


# (class, its decorators as written, the bean name, what another decorator was given)
OTHER_DECORATORS = (
    ("OrderStore", '@table(name="orders") above @repository', "orderStore", "orders"),
    ("BillingService", '@audited(name="billingAudit") below @service', "billingService",
     "billingAudit"),
    ("PriceEngine", '@traced("pricingTrace") above @component', "priceEngine", "pricingTrace"),
    ("RateCache", '@table(name="rates") above @component(name="fxRates")', "fxRates", "rates"),
    ("TaxRules", '@component(name="taxes") above @audited(name="taxAudit")', "taxes",
     "taxAudit"),
    ("HomePage", '@controller(name="home"), a stereotype, below @traced("homeTrace")', "home",
     "homeTrace"),
)


def test_only_the_markers_name_names_the_bean(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    app.write("web.py", """\
        from markers import component, repository, service


        def table(name):
            '''An ORM-style decorator: it names a table, not a bean.'''
            return lambda cls: cls


        def audited(cls=None, *, name=""):
            return cls if cls is not None else (lambda c: c)


        def traced(label):
            return lambda cls: cls


        @component
        def controller(cls=None, *, name=""):
            '''A stereotype: its name= names the bean, like a marker's.'''
            return cls


        @table(name="orders")
        @repository
        class OrderStore:
            pass


        @service
        @audited(name="billingAudit")
        class BillingService:
            pass


        @traced("pricingTrace")
        @component
        class PriceEngine:
            pass


        @table(name="rates")
        @component(name="fxRates")
        class RateCache:
            pass


        @component(name="taxes")
        @audited(name="taxAudit")
        class TaxRules:
            pass


        @traced("homeTrace")
        @controller(name="home")
        class HomePage:
            pass
        """)
    found = call(scanning.scan, app.base, app.root)
    got = names(found)
    wanted = sorted(row[2] for row in OTHER_DECORATORS)
    if got != wanted:
        borrowed = sorted(set(got) & {row[3] for row in OTHER_DECORATORS})
        raise CheckFailure(
            "A bean is named by name= on its marker (@component, @service, @repository, "
            "@configuration or a stereotype), else after its class; a name or any other "
            "argument given to another decorator of the class, above or below the marker, "
            "is that decorator's business and never the bean's name.",
            expected=", ".join(wanted),
            actual=(", ".join(got) or "nothing")
                   + (f" (named after another decorator's argument: {', '.join(borrowed)})"
                      if borrowed else ""),
            evidence=table(OTHER_DECORATORS,
                           ("class", "decorators", "bean name", "another decorator's argument")),
            lesson=NAMING,
            fix="Read name= only from the decorators that are markers, not from every "
                "decorator of the class." if borrowed else None,
        )


def test_a_package_outside_the_base_package_is_not_found(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    marked = """\
        from markers import component


        @component
        class {name}:
            pass
        """
    app.write("catalog/item.py", marked.replace("{name}", "CatalogItem"))
    app.write("__init__.py", marked.replace("{name}", "ShopRoot"))
    app.write_top(f"{app.base}_admin/users.py", marked.replace("{name}", "AdminUsers"))
    app.write_top(f"{app.base}x.py", marked.replace("{name}", "Neighbour"))
    app.write_top("tools_outside/cli.py", marked.replace("{name}", "CliTool"))
    # a stereotype declared outside the base package is no marker of the application's
    app.write_top("tools_outside/stereo.py", """\
        from markers import component


        @component
        def endpoint(cls):
            return cls
        """)
    app.write("hooks.py", """\
        from tools_outside.stereo import endpoint


        @endpoint
        class Webhook:
            pass
        """)
    got = names(call(scanning.scan, app.base, app.root))
    wanted = ["catalogItem", "shopRoot"]
    if got != wanted:
        extra = sorted(set(got) - set(wanted) - {"webhook"})
        raise CheckFailure(
            "scan must look only inside the base package (its directory and sub-packages); a "
            "package whose name merely starts with the same letters is another package, and a "
            "stereotype declared outside the base package marks nothing.",
            expected=", ".join(wanted),
            actual=(", ".join(got) or "nothing")
                   + (f" (outside {app.base}: {', '.join(extra)})" if extra else "")
                   + (" (webhook: marked only by the stereotype @endpoint of tools_outside)"
                      if "webhook" in got else ""),
            evidence=f"base package {app.base}; also on the path: {app.base}_admin/users.py, "
                     f"{app.base}x.py, tools_outside/cli.py, tools_outside/stereo.py (@component "
                     f"def endpoint); {app.base}/hooks.py: @endpoint class Webhook",
            lesson=WHERE,
            fix=None if not extra else "Map the base package to its directory "
                "(root / 'a' / 'b' for 'a.b') and walk only that directory; do not compare "
                "module names as strings.",
        )


def test_a_class_in_a_package_init_belongs_to_the_package(learner, make_app):
    scanning = learner.module("scanning")
    app = make_app("shop")
    marked = """\
        from markers import {marker}


        @{marker}
        class {name}:
            pass
        """
    app.write("__init__.py", marked.format(marker="component", name="ShopRoot"))
    app.write("billing/__init__.py", marked.format(marker="service", name="BillingFacade"))
    app.write("billing/ledger.py", marked.format(marker="component", name="Ledger"))
    app.write("billing/tax/__init__.py", marked.format(marker="repository", name="TaxTables"))
    found = call(scanning.scan, app.base, app.root)
    types = {getattr(d, "name", "?"): getattr(d, "type_name", None) for d in found}
    wanted = [("shopRoot", f"{app.base}.ShopRoot", "__init__.py"),
              ("billingFacade", f"{app.base}.billing.BillingFacade", "billing/__init__.py"),
              ("ledger", f"{app.base}.billing.ledger.Ledger", "billing/ledger.py"),
              ("taxTables", f"{app.base}.billing.tax.TaxTables", "billing/tax/__init__.py")]
    rows = [(bean, file, types.get(bean, "no definition"), want) for bean, want, file in wanted]
    wrong = [row for row in rows if row[2] != row[3]]
    if wrong:
        init_named = any(".__init__." in str(row[2]) for row in wrong)
        raise CheckFailure(
            "A package's __init__.py is the module named by the package itself: a class "
            "defined there has the package's dotted name as its module (importing "
            "`pkg.__init__` would load the file a second time, as another module with other "
            "class objects).",
            expected="; ".join(f"{row[0]}: {row[3]}" for row in wrong),
            actual="; ".join(f"{row[0]}: {row[2]}" for row in wrong),
            evidence=table(rows, ("bean", "file", "type_name", "expected")),
            lesson=SCAN,
            fix="Drop the trailing __init__ from the dotted name built from the file's path."
            if init_named else None,
        )
