"""Stage auto-configuration: imports file, conditions, back-off, report, real beans.

Auto-configuration classes written by a check live in their own package (or under the base
package, where the scan must leave them alone) and are listed in an imports file the check
passes as `imports_files`; the lab's own DataSource and Kafka auto-configurations are used
through the default (`imports_files=None`).
"""

from __future__ import annotations

import sys

import pytest
from _support import (
    AUTO_FILE,
    BACK_OFF,
    BOOT_SCAN,
    CONDITIONS,
    REPORT,
    application_module,
    imported_modules,
)
from sqlalchemy import text

from dojo.checks import CheckFailure, call, raised, table
from dojo.checks.observers import read_topic

pytestmark = pytest.mark.stage("auto-configuration")


def _report_rows(report):
    return [(getattr(o, "name", "?"), getattr(o, "matched", "?"),
             " | ".join(map(str, getattr(o, "messages", []) or []))) for o in report or []]


def _entries(report, prefix):
    return [o for o in report or [] if str(getattr(o, "name", "")) == prefix
            or str(getattr(o, "name", "")).startswith(prefix + ".")]


def _imports(app, *classes):
    path = app.root / "auto_configuration.imports"
    path.write_text("# written by the check\n\n" + "\n".join(classes) + "\n", encoding="utf-8")
    return path


GREETING_API = """\
    class Greeter:
        pass
    """

GREETING_AUTO = """\
    from markers import bean, conditional_on_missing_bean, configuration
    from {base}.greeting_api import Greeter
    import {probe} as probe


    class DefaultGreeter(Greeter):
        pass


    @configuration
    class GreetingAutoConfiguration:
        @bean
        @conditional_on_missing_bean(Greeter)
        def greeter(self) -> Greeter:
            probe.events.append(("init", "greeter"))
            return DefaultGreeter()
    """


def _greeting_app(make_app, under_base, with_user=True):
    """A Greeter API, the user's FriendlyGreeter, and GreetingAutoConfiguration (listed)."""
    app = make_app("shop")
    app.write("greeting_api.py", GREETING_API)
    if under_base:
        auto = app.write("autoconfig/greeting.py", GREETING_AUTO)
    else:
        app.write_top(f"{app.base}_auto/greeting.py", GREETING_AUTO)
        auto = f"{app.base}_auto.greeting"
    if not with_user:
        return app, f"{auto}.GreetingAutoConfiguration"
    app.write("zz_user.py", """\
        from markers import component
        from {base}.greeting_api import Greeter
        import {probe} as probe


        @component
        class FriendlyGreeter(Greeter):
            def __init__(self):
                probe.events.append(("init", "friendlyGreeter"))
        """)
    return app, f"{auto}.GreetingAutoConfiguration"


def _greeter_outcome(learner, app, name):
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, name)])
    error = raised(ctx.refresh)
    api = application_module(f"{app.base}.greeting_api")
    got = None if error else raised(ctx.get_bean, api.Greeter) or call(ctx.get_bean, api.Greeter)
    report = [] if error else call(ctx.condition_report)
    backed_off = [o for o in _entries(report, name) if getattr(o, "matched", None) is False
                  and "friendlyGreeter" in " ".join(map(str, getattr(o, "messages", [])))]
    ok = not error and type(got).__name__ == "FriendlyGreeter" \
        and "greeter" not in app.created() and bool(backed_off)
    actual = (f"refresh() raised {type(error).__name__}: {error}" if error else
              f"get_bean(Greeter) gave {type(got).__name__}"
              + ("; the auto-configured greeter was created"
                 if "greeter" in app.created() else "")
              + ("" if backed_off else "; no not-matched report entry naming friendlyGreeter"))
    evidence = "condition report:\n" + table(_report_rows(report),
                                             ("name", "matched", "messages"))
    return ok, actual, evidence


EXPECTED_BACK_OFF = ("get_bean(Greeter) is the user's FriendlyGreeter; the @bean greeter is "
                     "never called; the report has a not-matched entry naming friendlyGreeter")


def test_user_beans_come_before_auto_configuration(learner, make_app):
    app, name = _greeting_app(make_app, under_base=False)
    ok, actual, evidence = _greeter_outcome(learner, app, name)
    if not ok:
        raise CheckFailure(
            "@conditional_on_missing_bean must be evaluated after every bean of the "
            "application is registered, so the auto-configuration backs off when the user "
            "defined a Greeter.",
            expected=EXPECTED_BACK_OFF,
            actual=actual,
            evidence=evidence,
            lesson=BACK_OFF,
        )


def test_an_auto_configuration_under_the_base_package_is_not_scanned(learner, make_app):
    app, name = _greeting_app(make_app, under_base=True)
    ok, actual, evidence = _greeter_outcome(learner, app, name)
    if not ok:
        raise CheckFailure(
            "A class listed in an imports file is an auto-configuration even when it sits "
            "under the base package: the scan must not register it as a user bean (Boot's "
            "AutoConfigurationExcludeFilter); it is applied from the imports file only, after "
            "the user's beans.",
            expected=EXPECTED_BACK_OFF,
            actual=actual,
            evidence=evidence,
            lesson=BOOT_SCAN,
        )
    app, name = _greeting_app(make_app, under_base=True, with_user=False)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, name)])
    error = raised(ctx.refresh)
    api = application_module(f"{app.base}.greeting_api")
    got = None if error else raised(ctx.get_bean, api.Greeter) or call(ctx.get_bean, api.Greeter)
    report = [] if error else call(ctx.condition_report)
    entries = _entries(report, name)
    if error or type(got).__name__ != "DefaultGreeter" or not entries or any(
            getattr(o, "matched", None) is not True for o in entries):
        raise CheckFailure(
            "The scan's definitions of a listed class (and of its @bean methods) are not the "
            "application's: they are gone before any condition is evaluated, so the class's "
            "own @conditional_on_missing_bean(Greeter) does not see the scanned greeter and, "
            "with no Greeter of the user's, matches.",
            expected="get_bean(Greeter) is the auto-configured DefaultGreeter; every report "
                     "entry of GreetingAutoConfiguration matched",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    f"get_bean(Greeter) gave {type(got).__name__}; report: " + "; ".join(
                        f"{getattr(o, 'name', '?')} "
                        f"{'matched' if getattr(o, 'matched', None) else 'not matched'}"
                        for o in entries)),
            evidence="GreetingAutoConfiguration (under the base package, listed) with @bean "
                     "@conditional_on_missing_bean(Greeter) greeter; no user Greeter\n"
                     "condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=BOOT_SCAN,
        )


def test_an_auto_configuration_applies_when_nothing_replaces_it(learner, make_app):
    app = make_app("shop")
    app.write("greeting_api.py", GREETING_API)
    app.write_top(f"{app.base}_auto/greeting.py", GREETING_AUTO)
    auto = f"{app.base}_auto.greeting"
    app.write("welcome.py", """\
        from __future__ import annotations

        from markers import service
        from {base}.greeting_api import Greeter


        @service
        class Welcome:
            def __init__(self, greeter: Greeter):
                self.greeter = greeter
        """)
    name = f"{auto}.GreetingAutoConfiguration"
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, name)])
    error = raised(ctx.refresh)
    welcome = None if error else call(ctx.get_bean, "welcome")
    given = getattr(welcome, "greeter", None)
    report = [] if error else call(ctx.condition_report)
    entries = _entries(report, name)
    matched = bool(entries) and all(getattr(o, "matched", None) is True for o in entries)
    if error or type(given).__name__ != "DefaultGreeter" or not matched:
        raise CheckFailure(
            "A class listed in the imports file is an auto-configuration: when its conditions "
            "match, its @bean methods define beans that the application's own beans can "
            "inject, and the report says it matched.",
            expected="Welcome.greeter is the auto-configured DefaultGreeter; report entries "
                     f"for {name.split('.')[-1]} all matched",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    f"Welcome.greeter is {type(given).__name__ if given else None}; report "
                    + (f"entries matched: {[getattr(o, 'matched', '?') for o in entries]}"
                       if entries else "has no entry for it")),
            evidence="condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=AUTO_FILE,
        )


def test_conditional_on_class_looks_without_importing(learner, make_app, import_log,
                                                     database):
    app = make_app("shop")
    present, absent = f"optlib_{app.base[-8:]}", f"absentlib_{app.base[-8:]}"
    app.write_top(f"{present}.py", "VERSION = '1.0'\n", side_effect=database.dsn)
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    app.write_top(f"{app.base}_auto/clients.py", f"""\
        from markers import bean, conditional_on_class, configuration


        class LibClient:
            pass


        @configuration
        @conditional_on_class("{present}")
        class WithLibAutoConfiguration:
            @bean
            def lib_client(self) -> LibClient:
                return LibClient()


        @configuration
        @conditional_on_class("{absent}")
        class WithoutLibAutoConfiguration:
            @bean
            def absent_client(self) -> LibClient:
                return LibClient()
        """)
    with_lib = f"{app.base}_auto.clients.WithLibAutoConfiguration"
    without = f"{app.base}_auto.clients.WithoutLibAutoConfiguration"
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {},
               [_imports(app, with_lib, without)])
    call(ctx.refresh)
    rows = imported_modules(import_log)
    if rows or present in sys.modules:
        raise CheckFailure(
            "@conditional_on_class must find out whether a module exists without importing "
            "it (importlib.util.find_spec), as Spring reads a class name without loading the "
            "class: importing runs the module's code.",
            expected=f"no row in import_log; {present} not in sys.modules",
            actual=f"{len(rows)} row(s) in import_log; {present} in sys.modules: "
                   f"{present in sys.modules}",
            evidence=table([(m,) for m in rows], ("module imported",)),
            lesson=CONDITIONS,
            fix="importlib.util.find_spec(name) is not None, never import_module",
        )
    have = call(ctx.get_bean, "lib_client") if "lib_client" in ctx.definitions else None
    wrong_absent = "absent_client" in ctx.definitions
    report = call(ctx.condition_report)
    entry = _entries(report, without)
    told = [o for o in entry if getattr(o, "matched", None) is False
            and absent in " ".join(map(str, getattr(o, "messages", [])))]
    if have is None or wrong_absent or not told:
        raise CheckFailure(
            "An auto-configuration whose module is importable applies; one whose module is "
            "not backs off, and the report says which module was missing.",
            expected=f"lib_client defined, absent_client not; a not-matched report entry "
                     f"for {without.split('.')[-1]} naming {absent.split('_')[0]}_…",
            actual=f"lib_client: {'defined' if have is not None else 'missing'}; "
                   f"absent_client: {'defined' if wrong_absent else 'not defined'}; "
                   + ("report names the module" if told else
                      "no not-matched report entry naming the missing module"),
            evidence="condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=REPORT if have is not None and not wrong_absent else CONDITIONS,
        )


GUARDED_BY_CLASS = """\
    from markers import bean, conditional_on_class, conditional_on_missing_bean, configuration


    class Fallback:
        pass


    @configuration
    @conditional_on_missing_bean("{absent}.Client")
    @conditional_on_class("{absent}")
    class MissingBeanWrittenFirst:
        @bean
        def first_client(self) -> Fallback:
            return Fallback()


    @configuration
    @conditional_on_class("{absent}")
    @conditional_on_missing_bean("{absent}.Client")
    class ClassWrittenFirst:
        @bean
        def second_client(self) -> Fallback:
            return Fallback()


    @configuration
    class GuardedMethods:
        @bean
        @conditional_on_missing_bean("{absent}.Client")
        @conditional_on_class("{absent}")
        def third_client(self) -> Fallback:
            return Fallback()

        @bean
        @conditional_on_class("{absent}")
        @conditional_on_missing_bean("{absent}.Client")
        def fourth_client(self) -> Fallback:
            return Fallback()
    """


def test_a_failed_class_condition_ends_the_evaluation(learner, make_app):
    app = make_app("shop")
    absent = f"gonelib_{app.base[-7:]}"
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    app.write_top(f"{app.base}_auto/guarded.py", GUARDED_BY_CLASS.replace("{absent}", absent))
    module = f"{app.base}_auto.guarded"
    listed = [f"{module}.{c}" for c in ("MissingBeanWrittenFirst", "ClassWrittenFirst",
                                         "GuardedMethods")]
    guarded = [listed[0], listed[1], f"{listed[2]}.third_client",
               f"{listed[2]}.fourth_client"]
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, *listed)])
    error = raised(ctx.refresh)
    report = [] if error else call(ctx.condition_report)
    rows = []
    for name in guarded:
        entries = _entries(report, name) if name in listed[:2] else \
            [o for o in report if str(getattr(o, "name", "")) == name]
        told = any(getattr(o, "matched", None) is False
                   and absent in " ".join(map(str, getattr(o, "messages", [])))
                   for o in entries)
        rows.append((name.removeprefix(module + "."), "yes" if told else "no"))
    defined = [] if error else [n for n in ("first_client", "second_client", "third_client",
                                            "fourth_client") if n in ctx.definitions]
    if error or defined or any(row[1] == "no" for row in rows):
        raise CheckFailure(
            "A condition that does not match ends the evaluation, and @conditional_on_class "
            "is evaluated first wherever it is written (Spring orders class conditions before "
            "property and bean conditions): a @conditional_on_missing_bean naming a type of "
            "the module that was not found is then never evaluated, so nothing tries to "
            "import that module.",
            expected=f"refresh() succeeds; no bean from the four guarded places; each has a "
                     f"not-matched report entry naming {absent.split('_')[0]}_…",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    "; ".join(filter(None, [
                        f"defined: {', '.join(defined)}" if defined else "",
                        "no not-matched entry naming the module for: " + ", ".join(
                            r[0] for r in rows if r[1] == "no")
                        if any(r[1] == "no" for r in rows) else ""]))),
            evidence=f"each guarded by @conditional_on_class({absent!r}) and "
                     f"@conditional_on_missing_bean(\"{absent}.Client\"), in both orders\n"
                     + table(rows, ("guarded", "reported as not matched, naming the module"))
                     + "\ncondition report:\n"
                     + table(_report_rows(report), ("name", "matched", "messages")),
            fix="Evaluate @conditional_on_class, then @conditional_on_property, then "
                "@conditional_on_missing_bean, and stop at the first that does not match.",
            lesson=CONDITIONS,
        )


def test_conditional_on_property(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    classes = []
    body = ["from markers import bean, conditional_on_property, configuration\n\n",
            "class Feature:\n    pass\n"]
    cases = [  # bean, decorator arguments, expected
        ("feature_a", '"shop.feature-a"', True),
        ("feature_b", '"shop.feature-b", having_value="on"', False),
        ("feature_c", '"shop.feature-c", match_if_missing=True', True),
        ("feature_d", '"shop.feature-d"', False),
        ("feature_e", '"shop.feature-e"', False),
        ("feature_f", '"shop.feature-f", having_value="on"', True),
        # "false" is switched off only without having_value; with it, it is a value like any
        ("feature_g", '"shop.feature-g", having_value="false"', True),
        ("feature_h", '"shop.feature-h", having_value="False"', True),
        ("feature_i", '"shop.feature-i", having_value="false"', False),
        ("feature_j", '"shop.feature-j"', False),
        ("feature_k", '"shop.feature-k"', True),
        # on a @bean method of a class that matched
        ("feature_m", '"shop.feature-m", having_value="false"', True),
    ]
    for bean, args, _ in cases:
        cls = bean.title().replace("_", "") + "AutoConfiguration"
        classes.append(f"{app.base}_auto.features.{cls}")
        on_class, on_method = (f"@conditional_on_property({args})\n", "") \
            if bean != "feature_m" else ("", f"    @conditional_on_property({args})\n")
        body.append(f"\n\n@configuration\n{on_class}class {cls}:\n    @bean\n{on_method}"
                    f"    def {bean}(self) -> Feature:\n        return Feature()\n")
    app.write_top(f"{app.base}_auto/features.py", "".join(body))
    properties = {"shop.feature-a": "yes", "shop.feature-b": "off", "shop.feature-e": "false",
                  "shop.feature-f": "ON", "shop.feature-g": "FALSE", "shop.feature-h": "false",
                  "shop.feature-i": "true", "shop.feature-j": "False", "shop.feature-k": "0",
                  "shop.feature-m": "false", "shop.unrelated": "on"}
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, properties,
               [_imports(app, *classes)])
    call(ctx.refresh)
    got = [(bean, args + (" (on the @bean method)" if bean == "feature_m" else ""),
            properties.get(f"shop.{bean.replace('_', '-')}", "(absent)"), want,
            bean in ctx.definitions) for bean, args, want in cases]
    wrong = [(row[0], row[3], row[4]) for row in got if row[3] != row[4]]
    if wrong:
        # only the conditions that want "false" fail: "false" was read as off before having_value
        failed = {w[0] for w in wrong}
        off_first = "feature_g" in failed and failed <= {"feature_g", "feature_h", "feature_m"}
        raise CheckFailure(
            "@conditional_on_property matches when the property is set to anything but "
            "\"false\" in any case (no having_value), or to having_value ignoring case (so "
            "having_value=\"false\" matches \"false\"), or is absent with "
            "match_if_missing=True.",
            expected="; ".join(f"{w[0]} {'defined' if w[1] else 'not defined'}"
                               for w in wrong),
            actual="; ".join(f"{w[0]} {'defined' if w[2] else 'not defined'}" for w in wrong),
            evidence=table(got, ("bean", "condition", "property", "expected", "defined")),
            lesson=CONDITIONS,
            fix="With having_value, compare the value with it (ignoring case) and nothing else: "
                "\"false\" switches a condition off only when it has no having_value."
            if off_first else None,
        )


def _kafka_properties(kafka):
    out = {"dojo.kafka.bootstrap-servers": kafka.bootstrap}
    for key, value in kafka.producer_config().items():
        if key != "bootstrap.servers":
            out[f"dojo.kafka.producer.{key}"] = (str(value).lower() if isinstance(value, bool)
                                                 else str(value))
    return out


def test_the_datasource_and_kafka_auto_configurations_give_real_beans(learner, make_app,
                                                                      database, kafka):
    from confluent_kafka import Producer
    from sqlalchemy import Engine

    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    properties = {"dojo.datasource.url": database.url, **_kafka_properties(kafka)}
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, properties, None)
    call(ctx.refresh)
    engine = raised(ctx.get_bean, Engine) or call(ctx.get_bean, Engine)
    producer = raised(ctx.get_bean, Producer) or call(ctx.get_bean, Producer)
    report = call(ctx.condition_report)
    problems = []
    database_name = None
    if isinstance(engine, Engine):
        try:
            with engine.connect() as conn:
                database_name = conn.execute(text("SELECT current_database()")).scalar()
        finally:
            engine.dispose()
        if database_name != database.name:
            problems.append(f"the Engine connects to {database_name!r}")
    else:
        problems.append(f"get_bean(Engine) gave {type(engine).__name__}: {engine}")
    topic = kafka.topic(hint="container")
    sent = [("order-17", "placed 17.35"), ("order-4", "paid 4.02"), ("order-9", "placed 9.99")]
    if isinstance(producer, Producer):
        for key, value in sent:
            producer.produce(topic, key=key.encode(), value=value.encode())
        left = producer.flush(15)
        got = [(r.key_text, (r.value or b"").decode()) for r in read_topic(kafka, topic, 1)]
        if left or sorted(got) != sorted(sent):
            problems.append(f"the Producer delivered {len(got)} of {len(sent)} records "
                            f"({left} still queued)")
    else:
        problems.append(f"get_bean(Producer) gave {type(producer).__name__}: {producer}")
    if problems:
        raise CheckFailure(
            "With dojo.datasource.url and dojo.kafka.bootstrap-servers set, the lab's own "
            "auto-configurations (auto_configuration.imports) must give a working SQLAlchemy "
            "Engine for that URL and a confluent-kafka Producer for that broker, passing every "
            "dojo.kafka.producer.* property on.",
            expected=f"an Engine connected to {database.name}; a Producer that delivers "
                     f"{len(sent)} records",
            actual="; ".join(problems),
            evidence="condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=BACK_OFF,
        )


def test_a_user_engine_makes_the_datasource_back_off(learner, make_app, database):
    from sqlalchemy import Engine

    app = make_app("shop")
    app.write("persistence.py", f"""\
        from markers import bean, configuration
        from sqlalchemy import Engine, create_engine
        import {{probe}} as probe


        @configuration
        class Persistence:
            @bean
            def reporting_engine(self) -> Engine:
                probe.engine = create_engine({database.url!r}, pool_size=2)
                return probe.engine
        """)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root,
               {"dojo.datasource.url": database.url}, None)
    call(ctx.refresh)
    try:
        engine = raised(ctx.get_bean, Engine) or call(ctx.get_bean, Engine)
        report = call(ctx.condition_report)
        mine = getattr(app.probe, "engine", None)
        entries = _entries(report, "autoconfigure.DataSourceAutoConfiguration")
        said = [o for o in entries if getattr(o, "matched", None) is False
                and "reporting_engine" in " ".join(map(str, getattr(o, "messages", [])))]
        if engine is not mine or not said:
            raise CheckFailure(
                "A user-defined Engine bean makes the DataSource auto-configuration back off "
                "(@conditional_on_missing_bean, evaluated after the user's beans), and the "
                "report says which bean made it back off.",
                expected="get_bean(Engine) is the user's reporting_engine; a not-matched "
                         "report entry for DataSourceAutoConfiguration naming reporting_engine",
                actual=(f"get_bean(Engine) gave {type(engine).__name__}"
                        + ("" if engine is mine else " (not the user's engine)")
                        + ("" if said else "; no such report entry")),
                evidence="condition report:\n" + table(_report_rows(report),
                                                       ("name", "matched", "messages")),
                lesson=BACK_OFF,
            )
    finally:
        for candidate in (getattr(app.probe, "engine", None),):
            if candidate is not None:
                candidate.dispose()


def test_every_producer_property_reaches_the_producer(learner, make_app, kafka):
    from confluent_kafka import Producer

    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    # Values chosen so that each one is observable: a Producer with idempotence on refuses
    # max.in.flight 10 (and acks other than all), and message.max.bytes 2048 makes produce()
    # refuse a 6000-byte value on the spot, before anything reaches the broker.
    chosen = {"acks": "1", "enable.idempotence": "false",
              "max.in.flight.requests.per.connection": "10", "message.max.bytes": "2048"}
    properties = {"dojo.kafka.bootstrap-servers": kafka.bootstrap,
                  **{f"dojo.kafka.producer.{k}": v for k, v in chosen.items()}}
    error, producer, refused = _producer_from(learner, app, kafka, properties)
    if error or not isinstance(producer, Producer) or refused is None:
        raise CheckFailure(
            "Every dojo.kafka.producer.<key> property must reach the Producer as <key>, with "
            "the application's value: a default the auto-configuration adds may only fill in "
            "a key the application did not set, never replace its value.",
            expected="refresh() succeeds; get_bean(Producer) is a Producer; produce() of a "
                     "6000-byte value fails at once (message.max.bytes=2048)",
            actual=_what_refresh_gave(error, producer),
            evidence="properties:\n" + table(sorted(properties.items()), ("property", "value")),
            lesson=BACK_OFF,
        )
    # only acks=1 set: a default enable.idempotence=true would make the Producer refuse it
    alone = {"dojo.kafka.bootstrap-servers": kafka.bootstrap,
             "dojo.kafka.producer.acks": "1", "dojo.kafka.producer.message.max.bytes": "2048"}
    error, producer, refused = _producer_from(learner, app, kafka, alone)
    if error or not isinstance(producer, Producer) or refused is None:
        raise CheckFailure(
            "A default the auto-configuration adds must leave the application's values "
            "usable: with only dojo.kafka.producer.acks=1 set, a default that needs acks=all "
            "(enable.idempotence=true does) makes the Producer refuse the application's acks.",
            expected="refresh() succeeds; get_bean(Producer) is a Producer; produce() of a "
                     "6000-byte value fails at once (message.max.bytes=2048)",
            actual=_what_refresh_gave(error, producer),
            evidence="properties:\n" + table(sorted(alone.items()), ("property", "value")),
            lesson=BACK_OFF,
            fix="Add enable.idempotence=true only where the application's keys allow it (acks "
                "unset or all, no max.in.flight nor retries of its own)."
            if error is not None and "idempotence" in str(error) else None,
        )
    # acks=0: the broker answers nothing, so a delivery report carries no offset; with any
    # other acks it carries the record's offset
    unacked = {"dojo.kafka.bootstrap-servers": kafka.bootstrap, "dojo.kafka.producer.acks": "0"}
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, unacked, None)
    error = raised(ctx.refresh)
    producer = None if error else raised(ctx.get_bean, Producer) or call(ctx.get_bean, Producer)
    reports: list = []
    if isinstance(producer, Producer):
        try:
            producer.produce(kafka.topic(hint="container-acks"), value=b"acks-0",
                             on_delivery=lambda err, msg: reports.append((err, msg.offset())))
        finally:
            producer.flush(10)
    if error or not isinstance(producer, Producer) or len(reports) != 1 \
            or reports[0][0] is not None or reports[0][1] is not None:
        raise CheckFailure(
            "dojo.kafka.producer.acks=0 must reach the Producer as acks=0: a default acks "
            "of the auto-configuration fills in an acks the application did not set, and "
            "never replaces one it did.",
            expected="one delivery report, without error and without an offset (acks=0: the "
                     "broker acknowledges nothing)",
            actual=_what_refresh_gave(error, producer) if error or not isinstance(
                producer, Producer) else
            "no delivery report" if not reports else
            f"the delivery report carried error {reports[0][0]} and offset {reports[0][1]}"
            + (" (the broker acknowledged the record: acks was not 0)"
               if reports[0][1] is not None else ""),
            evidence="properties:\n" + table(sorted(unacked.items()), ("property", "value")),
            lesson=BACK_OFF,
        )


def _what_refresh_gave(error: BaseException | None, producer: object) -> str:
    """What a refresh with producer properties came to, when it was not a working Producer
    that refuses a 6000-byte value."""
    from confluent_kafka import Producer

    if error:
        return f"refresh() raised {type(error).__name__}: {error}"
    if not isinstance(producer, Producer):
        return f"get_bean(Producer) gave {type(producer).__name__}: {producer}"
    return "produce() of a 6000-byte value was accepted"


def _producer_from(learner, app, kafka, properties):
    """(refresh()'s error, the Producer bean, what produce() of 6000 bytes raised)."""
    from confluent_kafka import KafkaException, Producer

    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, properties, None)
    error = raised(ctx.refresh)
    producer = None if error else raised(ctx.get_bean, Producer) or call(ctx.get_bean,
                                                                          Producer)
    refused = None
    if isinstance(producer, Producer):
        try:
            producer.produce(kafka.topic(hint="container-size"), value=b"x" * 6000)
        except (KafkaException, BufferError) as exc:
            refused = exc
        finally:
            producer.flush(5)
    return error, producer, refused


def test_a_later_auto_configuration_sees_the_beans_of_earlier_ones(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    # both classes ask for a Cache: an answer kept from the first class's question is stale
    # once it registered redis_cache
    app.write_top(f"{app.base}_auto/caching.py", """\
        from markers import bean, conditional_on_missing_bean, configuration
        import {probe} as probe


        class Cache:
            pass


        @configuration
        class RedisCacheAutoConfiguration:
            @bean
            @conditional_on_missing_bean(Cache)
            def redis_cache(self) -> Cache:
                probe.events.append(("init", "redis_cache"))
                return Cache()


        @configuration
        @conditional_on_missing_bean(Cache)
        class SimpleCacheAutoConfiguration:
            @bean
            def simple_cache(self) -> Cache:
                probe.events.append(("init", "simple_cache"))
                return Cache()
        """)
    first = f"{app.base}_auto.caching.RedisCacheAutoConfiguration"
    later = f"{app.base}_auto.caching.SimpleCacheAutoConfiguration"
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, first, later)])
    error = raised(ctx.refresh)
    report = [] if error else call(ctx.condition_report)
    backed_off = [o for o in _entries(report, later) if getattr(o, "matched", None) is False
                  and "redis_cache" in " ".join(map(str, getattr(o, "messages", [])))]
    defined = sorted(n for n in ("redis_cache", "simple_cache") if n in ctx.definitions)
    if error or defined != ["redis_cache"] or "simple_cache" in app.created() \
            or not backed_off:
        raise CheckFailure(
            "Listed classes are applied one after another: each one's conditions are "
            "evaluated when its turn comes, after the earlier auto-configurations registered "
            "their beans, so a later @conditional_on_missing_bean backs off for a bean an "
            "earlier one defined.",
            expected="redis_cache defined, simple_cache not; a not-matched report entry for "
                     "SimpleCacheAutoConfiguration naming redis_cache",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    f"defined: {', '.join(defined) or 'neither'}"
                    + ("" if backed_off else "; no not-matched report entry naming "
                                             "redis_cache")),
            evidence="imports file: RedisCacheAutoConfiguration (@bean "
                     "@conditional_on_missing_bean(Cache) redis_cache: Cache), "
                     "then SimpleCacheAutoConfiguration (@conditional_on_missing_bean(Cache))\n"
                     "condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=CONDITIONS,
        )


def test_a_bean_method_sees_the_beans_of_the_methods_before_it(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    # both methods ask for a Clock (Boot's fallback pattern): an answer kept from the first
    # method's question (a memoised lookup) is stale once it registered system_clock
    app.write_top(f"{app.base}_auto/clocks.py", """\
        from markers import bean, conditional_on_missing_bean, configuration
        import {probe} as probe


        class Clock:
            pass


        @configuration
        class ClockAutoConfiguration:
            @bean
            @conditional_on_missing_bean(Clock)
            def system_clock(self) -> Clock:
                probe.events.append(("init", "system_clock"))
                return Clock()

            @bean
            @conditional_on_missing_bean(Clock)
            def fallback_clock(self) -> Clock:
                probe.events.append(("init", "fallback_clock"))
                return Clock()
        """)
    name = f"{app.base}_auto.clocks.ClockAutoConfiguration"
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [_imports(app, name)])
    error = raised(ctx.refresh)
    report = [] if error else call(ctx.condition_report)
    backed_off = [o for o in _entries(report, name) if getattr(o, "matched", None) is False
                  and "system_clock" in " ".join(map(str, getattr(o, "messages", [])))]
    defined = sorted(n for n in ("system_clock", "fallback_clock") if n in ctx.definitions)
    if error or defined != ["system_clock"] or "fallback_clock" in app.created() \
            or not backed_off:
        raise CheckFailure(
            "The @bean methods of an auto-configuration are registered one after another, in "
            "the order they are written, and each method's conditions are evaluated when its "
            "turn comes: a @conditional_on_missing_bean on a later method sees the bean an "
            "earlier method of the same class registered.",
            expected="system_clock defined, fallback_clock not; a not-matched report entry "
                     "for ClockAutoConfiguration.fallback_clock naming system_clock",
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    f"defined: {', '.join(defined) or 'neither'}"
                    + ("" if backed_off else "; no not-matched report entry naming "
                                             "system_clock")),
            evidence="ClockAutoConfiguration: @bean @conditional_on_missing_bean(Clock) "
                     "system_clock() -> Clock, then @bean @conditional_on_missing_bean(Clock) "
                     "fallback_clock() -> Clock\n"
                     "condition report:\n" + table(_report_rows(report),
                                                   ("name", "matched", "messages")),
            lesson=CONDITIONS,
        )


def test_a_property_set_to_an_empty_string_is_present(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    classes = []
    body = ["from markers import bean, conditional_on_property, configuration\n\n",
            "class Feature:\n    pass\n"]
    cases = [  # bean, decorator arguments, property value, expected
        ("blank_plain", '"shop.blank-a"', "", True),
        ("blank_having", '"shop.blank-b", having_value="on", match_if_missing=True', "", False),
        ("zero_plain", '"shop.zero"', "0", True),
        ("upper_false", '"shop.upper-false", match_if_missing=True', "FALSE", False),
        ("spaces_plain", '"shop.spaces"', " ", True),
    ]
    properties = {}
    for bean, args, value, _ in cases:
        cls = bean.title().replace("_", "") + "AutoConfiguration"
        classes.append(f"{app.base}_auto.flags.{cls}")
        properties[args.split('"')[1]] = value
        body.append(f"\n\n@configuration\n@conditional_on_property({args})\nclass {cls}:\n"
                    f"    @bean\n    def {bean}(self) -> Feature:\n        return Feature()\n")
    app.write_top(f"{app.base}_auto/flags.py", "".join(body))
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, properties,
               [_imports(app, *classes)])
    call(ctx.refresh)
    got = [(bean, args, repr(value), want, bean in ctx.definitions)
           for bean, args, value, want in cases]
    wrong = [row for row in got if row[3] != row[4]]
    if wrong:
        raise CheckFailure(
            "A property is present when its key is in the properties, whatever its value: an "
            "empty string is set (so it matches without having_value, and is not 'missing' "
            "for match_if_missing), and only \"false\" in any case turns a plain "
            "@conditional_on_property off.",
            expected="; ".join(f"{w[0]} {'defined' if w[3] else 'not defined'} ({w[2]})"
                               for w in wrong),
            actual="; ".join(f"{w[0]} {'defined' if w[4] else 'not defined'}" for w in wrong),
            evidence=f"properties: {properties}\n"
                     + table(got, ("bean", "condition", "value", "expected", "defined")),
            lesson=CONDITIONS,
            fix="Test `key in properties` (or `get(key) is None`), not the value's truth."
            if any(w[2] in ("''", "' '") for w in wrong) else None,
        )


TOOLS_AUTO = """\
    from markers import bean, conditional_on_property, configuration


    class Hammer:
        pass


    class Saw:
        pass


    class Bit:
        pass


    @configuration
    class ToolsAutoConfiguration:
        @bean
        def hammer(self) -> Hammer:
            return Hammer()

        @bean
        @conditional_on_property("tools.saw")
        def saw(self) -> Saw:
            return Saw()


    @configuration
    @conditional_on_property("tools.drill")
    class DrillAutoConfiguration:
        @bean
        @conditional_on_property("tools.bit")
        def bit(self) -> Bit:
            return Bit()
    """


def test_the_report_holds_exactly_the_listed_classes_and_their_conditions(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    app.write_top(f"{app.base}_auto/tools.py", TOOLS_AUTO)
    auto = f"{app.base}_auto.tools"
    listed = app.root / "tools.imports"
    listed.write_text(f"# the tools\n{auto}.ToolsAutoConfiguration   # always applies\n\n"
                      f"{auto}.DrillAutoConfiguration# only with tools.drill\n",
                      encoding="utf-8")
    context = learner.module("context")
    problems, rows = [], []
    ctx = call(context.ApplicationContext, app.base, app.root, {}, [listed])
    error = raised(ctx.refresh)
    if error is not None:
        problems.append(f"with the imports file: refresh() raised {type(error).__name__}: "
                        f"{error}")
    else:
        rows = _report_rows(call(ctx.condition_report))
        got = [str(r[0]).replace(auto + ".", "") for r in rows]
        wanted = ["ToolsAutoConfiguration", "ToolsAutoConfiguration.saw",
                  "DrillAutoConfiguration"]
        if sorted(got) != sorted(wanted):
            problems.append("report names " + (", ".join(got) or "nothing"))
        if "hammer" not in ctx.definitions:
            problems.append("hammer not defined")
    empty = call(context.ApplicationContext, app.base, app.root, {}, [])
    error = raised(empty.refresh)
    if error is not None:
        problems.append(f"with imports_files=[]: refresh() raised {type(error).__name__}: "
                        f"{error}")
    else:
        none = [str(getattr(o, "name", "?")) for o in call(empty.condition_report) or []]
        if none:
            problems.append("with imports_files=[], the report names " + ", ".join(none))
    if problems:
        raise CheckFailure(
            "An imports file lists one class a line, and everything after a `#` is a comment; "
            "imports_files=[] lists no class at all. The report has one outcome per listed "
            "class, and one per @bean method with conditions of its own on a class that "
            "matched: nothing for a method without conditions, nothing for the methods of a "
            "class that did not match.",
            expected="ToolsAutoConfiguration, ToolsAutoConfiguration.saw, "
                     "DrillAutoConfiguration; an empty report with imports_files=[]",
            actual="; ".join(problems),
            evidence="imports file:\n" + listed.read_text(encoding="utf-8")
                     + "ToolsAutoConfiguration: @bean hammer (no condition), @bean saw "
                       "(@conditional_on_property('tools.saw')); DrillAutoConfiguration "
                       "(@conditional_on_property('tools.drill')): @bean bit "
                       "(@conditional_on_property('tools.bit')); no property set\n"
                     + ("condition report:\n" + table(rows, ("name", "matched", "messages"))
                        if rows else ""),
            lesson=REPORT,
        )


LISTED_ORDER = (("first.imports", ("Kilo", "Alpha", "Zulu")), ("second.imports", ("Delta",
                                                                                   "Bravo")))


def test_listed_classes_are_applied_in_the_order_listed(learner, make_app):
    app = make_app("shop")
    app.write("core.py", """\
        from markers import component


        @component
        class Core:
            pass
        """)
    classes = [name for _, names in LISTED_ORDER for name in names]
    for name in classes:
        # the type a class's missing-bean condition names is imported when it is evaluated
        app.write_top(f"{app.base}_turn_{name.lower()}.py", f"""\
            import {{probe}} as probe

            probe.events.append(("evaluated", "{name}"))


            class Marker:
                pass
            """)
    app.write_top(f"{app.base}_auto/__init__.py", "")
    app.write_top(f"{app.base}_auto/ordered.py", "from markers import bean, "
                  "conditional_on_missing_bean, configuration\n\n" + "\n".join(f"""
@configuration
@conditional_on_missing_bean("{app.base}_turn_{name.lower()}.Marker")
class {name}AutoConfiguration:
    pass
""" for name in classes))
    files = []
    for file_name, names in LISTED_ORDER:
        path = app.root / file_name
        path.write_text("".join(f"{app.base}_auto.ordered.{n}AutoConfiguration\n"
                                for n in names), encoding="utf-8")
        files.append(path)
    context = learner.module("context")
    ctx = call(context.ApplicationContext, app.base, app.root, {}, files)
    error = raised(ctx.refresh)
    evaluated = [e[1] for e in app.probe.events if e[0] == "evaluated"]
    if error or evaluated != classes:
        raise CheckFailure(
            "The listed classes are applied in the order they are listed, file by file: each "
            "one's conditions are evaluated when its turn comes (here each class's "
            "@conditional_on_missing_bean names a type of a module of its own, imported when "
            "that condition is evaluated, which records the turn).",
            expected="conditions evaluated in the order " + ", ".join(classes),
            actual=(f"refresh() raised {type(error).__name__}: {error}" if error else
                    "conditions evaluated in the order " + (", ".join(evaluated) or "(none)")),
            evidence="\n".join(f"{file_name}: " + ", ".join(f"{n}AutoConfiguration"
                                                            for n in names)
                               for file_name, names in LISTED_ORDER),
            lesson=AUTO_FILE,
            fix="Apply the classes in the order of the files and of their lines: a list, not "
                "a set nor a sorted copy." if not error and sorted(evaluated) == sorted(classes)
            else None,
        )
