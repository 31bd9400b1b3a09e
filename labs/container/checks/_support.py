"""Helpers of the container checks: application packages written on disk for each check.

Every check writes a small application (a base package of its own, with a unique name) into
a temporary directory, puts that directory on sys.path, and hands the learner's container the
base package and the directory. Two things let a check see what the container did without
asking it:

- a probe module (`probe_<hex>.py`, imported by the check before the container runs) whose
  `events` list the application's constructors append to: ("init", bean) when an object is
  made;
- the `import_log` table: a module written with `IMPORT_SIDE_EFFECT` inserts a row naming
  itself the moment it is imported, so the database proves whether scanning imported it.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import Engine, text

SCAN = "component-scan#the-mechanism-step-by-step"
NAMING = "component-scan#how-a-scanned-bean-is-named"
META = "component-scan#what-counts-as-a-component"
WHERE = "component-scan#where-it-looks"
NOT_FOUND = "component-scan#required-a-bean--that-could-not-be-found"
ASM = "reflection#scanning-reads-bytes-not-classes"
DEFINITIONS = "component-scan#definitions-now-objects-later"
LIFECYCLE = "spring-context#definitions-objects-lifecycle"
INJECTION = "reflection#a-container-in-forty-lines"
WHAT_SPRING_DOES = "reflection#what-spring-actually-does-with-it"
AUTO_FILE = "spring-boot-application#the-registration-file"
CONDITIONS = "spring-boot-application#conditions-how-boot-backs-off"
BACK_OFF = "spring-boot-application#back-off-in-practice-the-datasource"
REPORT = "spring-boot-application#reading-the-condition-evaluation-report"
BOOT_SCAN = "spring-boot-application#componentscan-with-two-filters-from-boot"
TWO_PROCESSORS = "spring-context#two-kinds-of-post-processor"
SINGLETON_LIFE = "spring-context#the-life-of-a-singleton"
EVENTS = "spring-context#events"
SHUTDOWN = "spring-context#shutdown"

IMPORT_LOG = "CREATE TABLE IF NOT EXISTS import_log (module text NOT NULL, at timestamptz " \
             "NOT NULL DEFAULT clock_timestamp())"


def import_side_effect(dsn: str) -> str:
    """Source lines that insert a row into import_log naming the module, at import time."""
    return textwrap.dedent(f"""\
        import psycopg as _psycopg
        with _psycopg.connect({dsn!r}, autocommit=True) as _conn:
            _conn.execute("INSERT INTO import_log (module) VALUES (%s)", (__name__,))
        """)


def imported_modules(engine: Engine) -> list[str]:
    """Modules whose import wrote their row, in order."""
    with engine.connect() as conn:
        return [r[0] for r in conn.execute(text("SELECT module FROM import_log ORDER BY at"))]


@dataclass
class App:
    """An application package on disk: `base` under `root`, and its probe module."""

    root: Path
    base: str
    probe_name: str
    written: list[str] = field(default_factory=list)
    _probe: ModuleType | None = None

    def write(self, relative: str, source: str, side_effect: str = "") -> str:
        """Write `relative` (e.g. "orders/service.py") under the base package; its module name.

        `{base}` and `{probe}` in the source become the base package and the probe module;
        `side_effect` (a DSN) makes the module write its row to import_log when imported.
        """
        path = self.root / self.base / relative
        self._write(path, source, side_effect)
        module = ".".join((self.base, *Path(relative).with_suffix("").parts))
        return module.removesuffix(".__init__")

    def write_top(self, relative: str, source: str, side_effect: str = "") -> None:
        """Write a file at the top of root (another package, or a top-level module)."""
        self._write(self.root / relative, source, side_effect)

    def _write(self, path: Path, source: str, side_effect: str = "") -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.parents:
            if parent == self.root or not parent.is_relative_to(self.root):
                break
            init = parent / "__init__.py"
            if not init.exists():
                init.write_text("", encoding="utf-8")
        body = textwrap.dedent(source)
        if side_effect:
            body = import_side_effect(side_effect) + "\n" + body
        body = body.replace("{base}", self.base)
        body = body.replace("{probe}", self.probe_name)
        path.write_text(body, encoding="utf-8")
        self.written.append(str(path.relative_to(self.root)))

    @property
    def probe(self) -> Any:
        if self._probe is None:
            self._probe = importlib.import_module(self.probe_name)
        return self._probe

    def created(self) -> list[str]:
        """Beans whose constructor ran, in order."""
        return [bean for kind, bean in self.probe.events if kind == "init"]

    def loaded(self) -> list[str]:
        """Modules of this application that are in sys.modules now."""
        return sorted(name for name in sys.modules
                      if name == self.base or name.startswith(self.base + "."))


def new_app(root: Path, hint: str) -> App:
    """An empty application under `root` (put on sys.path) with a probe module."""
    suffix = uuid.uuid4().hex[:8]
    app = App(root=root, base=f"{hint}_{suffix}", probe_name=f"probe_{suffix}")
    (root / f"{app.probe_name}.py").write_text("events: list = []\n", encoding="utf-8")
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.invalidate_caches()
    return app


def forget(root: Path) -> None:
    """Take root off sys.path and forget every module imported from it."""
    while str(root) in sys.path:
        sys.path.remove(str(root))
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and Path(file).resolve().is_relative_to(root.resolve()):
            del sys.modules[name]


def names(definitions: Any) -> list[str]:
    """Bean names of what scan() or context.definitions returned (a list or a dict)."""
    if isinstance(definitions, dict):
        return sorted(definitions)
    return sorted(getattr(d, "name", repr(d)) for d in definitions)


def application_module(name: str) -> ModuleType:
    """A module of the application, as the container imported it (or now, if it did not)."""
    return importlib.import_module(name)


# ---- two post-processors that each wrap every watched bean (stages lifecycle and scopes) ----

CHAINED_PROCESSORS = """\
    from __future__ import annotations

    from markers import BeanPostProcessor, component
    import {probe} as probe


    class Wrapped:
        '''What a post-processor hands on: a new object, with none of the bean's methods.'''

        def __init__(self, inner, by, hook):
            self.inner, self.by, self.hook = inner, by, hook


    class Recording(BeanPostProcessor):
        label = ""

        def before_init(self, bean, name):
            return self._wrap("before", bean, name)

        def after_init(self, bean, name):
            return self._wrap("after", bean, name)

        def _wrap(self, hook, bean, name):
            if name not in probe.WATCHED:
                return bean
            out = Wrapped(bean, self.label, hook)
            probe.events.append((hook, name, self.label, bean, out))
            return out


    @component
    class Stamper(Recording):
        label = "stamper"


    @component
    class Sealer(Recording):
        label = "sealer"
    """


def chain_problems(events: list[Any], name: str, made: Any) -> tuple[Any, list[str]]:
    """(the object the post-processors' chain ended with, what was wrong with the chain) for
    the object `made` of bean `name`: each of the two post-processors' before_init, then each
    after_init (in any order of the processors), each handed what the previous one returned,
    the first handed the object as made.

    The events of one creation are those of `name` after its ("made", name, made) event and
    before the next object of that name was made."""
    start = next((i for i, e in enumerate(events)
                  if e[0] == "made" and e[1] == name and e[2] is made), None)
    if start is None:
        return None, [f"{name}: its object was never made"]
    hooks = []
    for event in events[start + 1:]:
        if event[0] == "made" and event[1] == name:
            break
        if event[0] in ("before", "after") and event[1] == name:
            hooks.append(event)
    if not hooks:
        return None, [f"{name}: went through no post-processor (no before_init, no after_init)"]
    problems = []
    got = [f"{hook}_init of {label}" for hook, _, label, _, _ in hooks]
    kinds = [hook for hook, *_ in hooks]
    if kinds != ["before", "before", "after", "after"] \
            or {hooks[0][2], hooks[1][2]} != {"stamper", "sealer"} \
            or {hooks[2][2], hooks[3][2]} != {"stamper", "sealer"}:
        problems.append(f"{name}: post-processor calls {', '.join(got)}; expected "
                        "before_init of each of the two, then after_init of each")
    current, previous = made, "the object as made"
    for hook, _, label, received, out in hooks:
        if received is not current:
            handed = ("the object as made" if received is made else
                      f"what {received.hook}_init of {received.by} returned"
                      if type(received).__name__ == "Wrapped" else type(received).__name__)
            problems.append(f"{name}: {hook}_init of {label} was handed {handed}, not "
                            f"{previous}")
        current, previous = out, f"what {hook}_init of {label} returned"
    return current, problems
