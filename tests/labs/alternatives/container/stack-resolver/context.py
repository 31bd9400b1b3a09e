"""An alternative context: an explicit creation stack, a condition evaluator of its own, and
annotations evaluated one parameter at a time (no typing.get_type_hints on the whole
function). The same README contract as the reference, built another way.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import threading
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

import markers
import scopes
from scanning import BeanDefinition, scan
from startup import BeanCreationError, StartupStep

DEFAULT_IMPORTS = Path(__file__).with_name("auto_configuration.imports")


class NoSuchBeanError(LookupError):
    def __init__(self, required: Any, bean: str = "", parameter: str = "") -> None:
        self.required_type, self.bean, self.parameter = required, bean, parameter
        super().__init__(f"nothing of type {required!r} for {bean}.{parameter}")


class NoUniqueBeanError(LookupError):
    def __init__(self, required: Any, candidates: Sequence[str], bean: str = "",
                 parameter: str = "") -> None:
        self.required_type, self.candidates = required, list(candidates)
        self.bean, self.parameter = bean, parameter
        super().__init__(f"ambiguous {required!r} for {bean}.{parameter}: {candidates}")


class CircularDependencyError(RuntimeError):
    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        super().__init__(" => ".join(cycle))


@dataclass
class ConditionOutcome:
    name: str
    matched: bool
    messages: list[str] = field(default_factory=list)


def _dotted(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


class Conditions:
    """Evaluates one condition at a time against the properties and the known bean types."""

    def __init__(self, properties: Mapping[str, str], types: Mapping[str, type]) -> None:
        self.properties, self.types = properties, types

    def check(self, condition: markers.Condition) -> tuple[bool, str]:
        return getattr(self, condition.kind)(condition)

    def on_class(self, c: markers.Condition) -> tuple[bool, str]:
        spec = importlib.util.find_spec(c.module)
        return spec is not None, f"class condition on {c.module}: " + (
            "present" if spec else "absent")

    def on_property(self, c: markers.Condition) -> tuple[bool, str]:
        if c.prop not in self.properties:
            return c.match_if_missing, f"{c.prop} absent"
        value = self.properties[c.prop].casefold()
        wanted = c.having_value.casefold()
        ok = value == wanted if wanted else value != "false"
        return ok, f"{c.prop} is {self.properties[c.prop]!r}"

    def on_missing_bean(self, c: markers.Condition) -> tuple[bool, str]:
        wanted = _dotted(c.bean_type) if isinstance(c.bean_type, str) else c.bean_type
        clash = sorted(n for n, t in self.types.items() if issubclass(t, wanted))
        if clash:
            return False, f"beans already present: {clash}"
        return True, f"no {wanted.__name__} bean"

    def all(self, target: Any) -> tuple[bool, list[str]]:
        # Spring's order (class, property, bean conditions), up to the first miss
        pending = sorted(getattr(target, markers.CONDITIONS, []),
                         key=lambda c: c.kind != "on_class")
        pending.sort(key=lambda c: c.kind == "on_missing_bean")
        notes = []
        for condition in pending:
            ok, note = self.check(condition)
            notes.append(note)
            if not ok:
                return False, notes
        return True, notes


def _param_types(fn: Any) -> dict[str, Any]:
    fn = getattr(fn, "__func__", fn)
    out = {}
    namespace = dict(fn.__globals__)
    namespace.update({"Optional": Optional, "Union": Union})
    for name, ann in getattr(fn, "__annotations__", {}).items():
        if name == "return":
            continue
        out[name] = eval(ann, namespace) if isinstance(ann, str) else ann  # noqa: S307
    return out


def _return_type(fn: Any) -> Any:
    ann = fn.__annotations__.get("return")
    if not isinstance(ann, str):
        return ann
    try:
        return eval(ann, dict(fn.__globals__))  # noqa: S307
    except NameError:
        return _dotted(ann)


class ApplicationContext:
    def __init__(self, base_package: str, root: str | Path,
                 properties: Mapping[str, str] | None = None,
                 imports_files: Sequence[str | Path] | None = None) -> None:
        self._properties = dict(properties or {})
        self._files = [DEFAULT_IMPORTS] if imports_files is None else list(imports_files)
        self.definitions: dict[str, BeanDefinition] = {d.name: d
                                                       for d in scan(base_package, root)}
        self._types: dict[str, type] = {}
        self._objects: dict[str, Any] = {}
        self._stack: list[str] = []
        self._outcomes: dict[str, ConditionOutcome] = {}
        self._plain: set[str] = set()                  # post-processors: not post-processed
        self._hooks: list[markers.BeanPostProcessor] = []
        self._disposal: list[tuple[Any, str]] = []     # (object made, destroy method) stack
        self._lock = threading.RLock()                 # the stack is instance-wide: one maker
        self._report: list[StartupStep] = []
        self._nested_ns: list[int] = []                # per bean in creation: its children's ns

    def _phase(self, name: str) -> None:
        """Close the phase in progress (if any) and open `name` ("" only closes)."""
        now = time.monotonic_ns()
        current = next((s for s in reversed(self._report) if s.name != "bean"), None)
        if current is not None and current.duration < 0:
            current.duration = now / 1e9 - current.started
        if name:
            self._report.append(StartupStep(name, now / 1e9, -1.0))

    def startup_steps(self) -> list[StartupStep]:
        return sorted(self._report, key=lambda step: step.started)

    def refresh(self) -> None:
        try:
            self._refresh()
        except Exception:
            self._phase("")
            try:
                self.close()
            except Exception:  # noqa: S110  (the refresh's error is the one the caller sees)
                pass
            raise
        self._phase("")

    def _refresh(self) -> None:
        self._phase("definitions")
        listed: list[str] = []
        for file in self._files:
            for raw in Path(file).read_text(encoding="utf-8").splitlines():
                entry = raw.partition("#")[0].strip()
                if entry:
                    listed.append(entry)
        owners = set(listed)
        for name in [n for n, d in self.definitions.items()
                     if d.type_name in owners or d.factory[:d.factory.rfind(".")] in owners]:
            del self.definitions[name]
        self.definitions["environment"] = BeanDefinition("environment", "markers.Environment",
                                                         "markers")
        self._objects["environment"] = markers.Environment(self._properties)
        for name, d in self.definitions.items():
            if d.factory:
                owner, _, method = d.factory.rpartition(".")
                self._types[name] = _return_type(getattr(_dotted(owner), method))
            else:
                self._types[name] = _dotted(d.type_name)
        self._phase("auto-configuration")
        conditions = Conditions(self._properties, self._types)
        for qualified in listed:
            cls = _dotted(qualified)
            ok, notes = conditions.all(cls)
            self._outcomes[qualified] = ConditionOutcome(qualified, ok, notes)
            if not ok:
                continue
            self.definitions[qualified] = BeanDefinition(qualified, qualified, cls.__module__,
                                                         configuration=True)
            self._types[qualified] = cls
            for attr, member in list(vars(cls).items()):
                if not getattr(member, "__bean__", False):
                    continue
                if getattr(member, markers.CONDITIONS, None):
                    ok, notes = conditions.all(member)
                    key = f"{qualified}.{attr}"
                    self._outcomes[key] = ConditionOutcome(key, ok, notes)
                    if not ok:
                        continue
                self.definitions[attr] = BeanDefinition(
                    attr, "", cls.__module__, primary=getattr(member, "__primary__", False),
                    lazy=getattr(member, "__lazy__", False),
                    scope=getattr(member, "__scope__", "singleton"),
                    factory=f"{qualified}.{attr}")
                self._types[attr] = _return_type(member)
        outcomes = list(self._outcomes.values())
        self._report[-1].tags.update(outcomes=str(len(outcomes)),
                                     matched=str(sum(1 for o in outcomes if o.matched)))
        self._phase("definition-post-processors")
        for name in [n for n, t in self._types.items()
                     if isinstance(t, type) and issubclass(t, markers.DefinitionPostProcessor)]:
            self._plain.add(name)
            self._obtain(name).post_process_definitions(self.definitions)
        self._phase("bean-post-processors")
        late = [n for n, t in self._types.items()
                if isinstance(t, type) and issubclass(t, markers.BeanPostProcessor)]
        self._plain.update(late)
        self._hooks = [self._obtain(n) for n in late]
        self._phase("singletons")
        for name, d in list(self.definitions.items()):
            if d.scope == "singleton" and not d.lazy:
                self._obtain(name)
        self._phase("refreshed")
        refreshed = markers.ContextRefreshed(self)
        for raw, _ in list(self._disposal):
            for attr in dir(type(raw)):
                kind = getattr(getattr(type(raw), attr, None), "__event_listener__", None)
                if kind is not None and isinstance(refreshed, kind):
                    getattr(raw, attr)(refreshed)

    def close(self) -> None:
        """Pop the disposal stack: the last bean finished is the first destroyed. A failing
        callback is logged and the stack goes on, as Spring's DisposableBeanAdapter does."""
        while self._disposal:
            raw, extra = self._disposal.pop()
            try:
                self._dispose(raw, extra)
            except Exception:
                logging.getLogger(__name__).exception("destroying %r failed", raw)
        self._objects = {k: v for k, v in self._objects.items() if k == "environment"}

    @staticmethod
    def _dispose(raw: Any, extra: str) -> None:
        for attr in dir(type(raw)):
            if getattr(getattr(type(raw), attr, None), "__pre_destroy__", False):
                getattr(raw, attr)()
        if extra:
            getattr(raw, extra)()

    def condition_report(self) -> list[ConditionOutcome]:
        return list(self._outcomes.values())

    def get_bean(self, key: str | type) -> Any:
        if isinstance(key, str):
            if key not in self.definitions:
                raise NoSuchBeanError(key)
            return self._obtain(key)
        return self._obtain(self._pick(key))

    def _pick(self, wanted: Any, bean: str = "", parameter: str = "",
              qualifier: str | None = None) -> str:
        matches = [n for n, t in self._types.items()
                   if isinstance(wanted, type) and isinstance(t, type) and issubclass(t, wanted)]
        if qualifier is not None:
            matches = [n for n in matches if n == qualifier]
        if not matches:
            raise NoSuchBeanError(wanted, bean, parameter)
        if len(matches) > 1:
            primary = [n for n in matches if self.definitions[n].primary]
            by_name = [n for n in matches if n == parameter]
            matches = primary if len(primary) == 1 else by_name
            if len(matches) != 1:
                raise NoUniqueBeanError(wanted, [n for n, t in self._types.items()
                                                 if isinstance(t, type) and
                                                 issubclass(t, wanted)], bean, parameter)
        return matches[0]

    def _obtain(self, name: str) -> Any:
        d = self.definitions.get(name)
        if d is not None and d.scope == "request":
            store = scopes.store_for(name)
            if (self, name) not in store.beans:
                with self._lock:
                    store.beans[(self, name)] = self._timed(name)
            return store.beans[(self, name)]
        with self._lock:
            return self._timed(name)

    def _wired(self, name: str) -> Any:
        """An injection point's value: for a request bean, a stand-in that looks it up."""
        if self.definitions[name].scope == "request":
            return _StandIn(lambda: self._obtain(name))
        return self._obtain(name)

    def _timed(self, name: str) -> Any:
        """The cached bean, or a new one timed as a step and named in a BeanCreationError."""
        if name in self._objects:
            return self._objects[name]
        if name in self._stack:
            start = self._stack.index(name)
            raise CircularDependencyError(self._stack[start:] + [name])
        chain = [*self._stack, name]
        began = time.monotonic_ns()
        self._nested_ns.append(0)
        try:
            return self._make(name)
        except (NoSuchBeanError, NoUniqueBeanError, CircularDependencyError, BeanCreationError):
            raise
        except Exception as error:
            raise BeanCreationError(chain, error) from error
        finally:
            span = time.monotonic_ns() - began
            own = span - self._nested_ns.pop()
            if self._nested_ns:
                self._nested_ns[-1] += span
            self._report.append(StartupStep("bean", began / 1e9, own / 1e9, {"bean": name}))

    def _make(self, name: str) -> Any:
        self._stack.append(name)
        try:
            d = self.definitions[name]
            extra = ""
            if d.factory:
                owner, _, method = d.factory.rpartition(".")
                config = next(n for n, x in self.definitions.items()
                              if x.configuration and x.type_name == owner)
                fn = getattr(self._obtain(config), method)
                extra = getattr(fn, "__destroy_method__", "")
            else:
                fn = self._types[name]
            made = fn(**self._inject(name, fn.__init__ if isinstance(fn, type) else fn))
            if not d.factory:
                self._wire_fields(name, made)
        finally:
            self._stack.pop()
        bean = made
        hooks = [] if name in self._plain else self._hooks
        for hook in hooks:
            bean = hook.before_init(bean, name)
        for attr in dir(type(made)):
            if getattr(getattr(type(made), attr, None), "__post_construct__", False):
                getattr(bean, attr)()
        for hook in hooks:
            bean = hook.after_init(bean, name)
        if d.scope == "singleton":
            self._objects[name] = bean
            self._disposal.append((made, extra))
        elif d.scope == "request":
            scopes.store_for(name).on_end.append(lambda: self._dispose(made, extra))
        return bean

    def _wire_fields(self, name: str, made: Any) -> None:
        """Fields annotated `Annotated[T, Autowired()]`, evaluated one at a time."""
        for klass in type(made).__mro__:
            module = importlib.import_module(klass.__module__)
            for attr, ann in vars(klass).get("__annotations__", {}).items():
                if "Autowired" not in str(ann):
                    continue
                hint = eval(ann, dict(vars(module))) if isinstance(ann, str) else ann  # noqa: S307
                wanted, *meta = typing.get_args(hint)
                qualifier = next((m.name for m in meta if isinstance(m, markers.Qualifier)),
                                 None)
                nullable = type(None) in typing.get_args(wanted)
                if nullable:
                    wanted = next(a for a in typing.get_args(wanted) if a is not type(None))
                try:
                    chosen = self._pick(wanted, name, attr, qualifier)
                except NoSuchBeanError:
                    if not nullable:
                        raise
                    setattr(made, attr, None)
                    continue
                setattr(made, attr, self._wired(chosen))

    def _inject(self, name: str, fn: Any) -> dict[str, Any]:
        if fn is object.__init__:
            return {}
        types = _param_types(fn)
        kwargs: dict[str, Any] = {}
        for p in list(inspect.signature(fn).parameters.values()):
            if p.name == "self" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                continue
            wanted, qualifier, nullable = types.get(p.name), None, False
            if typing.get_origin(wanted) is typing.Annotated:
                wanted, *meta = typing.get_args(wanted)
                qualifier = next((m.name for m in meta if isinstance(m, markers.Qualifier)),
                                 None)
            args = typing.get_args(wanted)
            if type(None) in args:
                nullable = True
                rest = [a for a in args if a is not type(None)]
                wanted = rest[0] if len(rest) == 1 else wanted
            try:
                chosen = self._pick(wanted, name, p.name, qualifier)
            except NoSuchBeanError:
                if nullable:
                    kwargs[p.name] = None
                elif p.default is p.empty:
                    raise
                continue
            kwargs[p.name] = self._wired(chosen)
        return kwargs


class _StandIn:
    """The scoped proxy: every attribute read is the current request's bean's."""

    __slots__ = ("_find",)

    def __init__(self, find: Any) -> None:
        object.__setattr__(self, "_find", find)

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._find(), attr)
