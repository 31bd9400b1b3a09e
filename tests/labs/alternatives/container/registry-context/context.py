"""The application context: definitions from the scan, auto-configuration, then objects.

`ApplicationContext(...)` scans and registers definitions only; `refresh()` imports the
classes, applies the auto-configurations whose conditions match (after every user bean is
registered) and creates the singletons, injecting constructor parameters by type.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import threading
import time
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import markers
import scopes
from scanning import BeanDefinition, scan
from startup import BeanCreationError, StartupStep

DEFAULT_IMPORTS = Path(__file__).with_name("auto_configuration.imports")


class NoSuchBeanError(LookupError):
    """No bean has the type (or name) asked for."""

    def __init__(self, required: Any, bean: str = "", parameter: str = "") -> None:
        self.required_type, self.bean, self.parameter = required, bean, parameter
        what = getattr(required, "__qualname__", str(required))
        where = f" for parameter {parameter!r} of bean {bean!r}" if bean else ""
        super().__init__(f"no bean of type {what}{where}; is it under the base package?")


class NoUniqueBeanError(LookupError):
    """Several beans have the type asked for and nothing says which one."""

    def __init__(self, required: Any, candidates: Sequence[str], bean: str = "",
                 parameter: str = "") -> None:
        self.required_type, self.candidates = required, list(candidates)
        self.bean, self.parameter = bean, parameter
        what = getattr(required, "__qualname__", str(required))
        super().__init__(f"{len(candidates)} beans of type {what} for parameter {parameter!r} "
                         f"of bean {bean!r}: {', '.join(candidates)}; mark one @primary or "
                         "use a Qualifier")


class CircularDependencyError(RuntimeError):
    """Constructors that need each other: `cycle` names them, the first again at the end."""

    def __init__(self, cycle: Sequence[str]) -> None:
        self.cycle = list(cycle)
        super().__init__("constructor cycle: " + " -> ".join(cycle))


@dataclass
class ConditionOutcome:
    """One line of the condition evaluation report."""

    name: str                       # "module.Class" or "module.Class.method"
    matched: bool
    messages: list[str] = field(default_factory=list)


def _import_class(qualified: str) -> type:
    module, _, name = qualified.rpartition(".")
    found = getattr(importlib.import_module(module), name)
    if not isinstance(found, type):
        raise TypeError(f"{qualified} is not a class")
    return found


def resolve_type(named: Any) -> Any:
    """A type, or a dotted name such as "sqlalchemy.Engine" imported now."""
    if isinstance(named, str):
        module, _, attr = named.rpartition(".")
        return getattr(importlib.import_module(module), attr)
    return named


def resolve_return(method: Any) -> Any:
    """The return type of a @bean method; a dotted name in the annotation is imported."""
    try:
        return typing.get_type_hints(method).get("return")
    except NameError:
        return resolve_type(method.__annotations__.get("return"))


def read_imports(path: Path) -> list[str]:
    """Class names listed in an imports file: one a line, `#` comments and blanks ignored."""
    names = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


@dataclass
class _Span:
    """A bean's creation as it happened: own time is worked out when the report is asked for."""

    name: str
    start: float
    end: float = 0.0
    parent: int = -1                # index of the span of the bean that was creating it


@dataclass
class _Registered:
    """A bean as refresh() knows it: its definition, its type, and how to make it."""

    definition: BeanDefinition
    type: type
    owner: str = ""                 # for a @bean method: the bean name of its configuration
    method: str = ""


class ApplicationContext:
    """Definitions at construction; modules, auto-configuration and objects at refresh()."""

    def __init__(self, base_package: str, root: str | Path,
                 properties: Mapping[str, str] | None = None,
                 imports_files: Sequence[str | Path] | None = None) -> None:
        self._properties = {str(k): str(v) for k, v in (properties or {}).items()}
        files = [DEFAULT_IMPORTS] if imports_files is None else list(imports_files)
        self._imports_files = tuple(Path(f) for f in files)
        self.definitions: dict[str, BeanDefinition] = {}
        for definition in scan(base_package, root):
            if definition.name not in self.definitions:
                self.definitions[definition.name] = definition
        self._registry: dict[str, _Registered] = {}
        self._objects: dict[str, Any] = {}
        self._in_creation: dict[str, None] = {}      # ordered set: the current creation path
        self._modules: dict[str, types.ModuleType] = {}
        self._outcomes: list[ConditionOutcome] = []
        # stage 5: a dependency graph recorded while creating, and listeners by event type
        self._needed_by: dict[str, set[str]] = {}    # bean -> the beans that asked for it
        self._raw: dict[str, Any] = {}
        self._listeners: list[tuple[type, Any]] = []
        self._processors: list[markers.BeanPostProcessor] = []
        self._skip_processing: set[str] = set()
        # stage 7: one lock for every creation (coarse: the creation path is instance-wide)
        self._creation_lock = threading.RLock()
        self._request_raw: dict[str, Any] = {}       # a request bean as made, until handed over
        # stage 8: raw marks, turned into steps by startup_steps()
        self._marks: list[tuple[str, float]] = []    # (phase, when it began)
        self._refresh_end = 0.0
        self._spans: list[_Span] = []
        self._open: list[int] = []

    def _mark(self, phase: str) -> None:
        self._marks.append((phase, time.monotonic()))

    def startup_steps(self) -> list[StartupStep]:
        """Phases end where the next begins; a bean's own time is its span minus its children's."""
        ends = [when for _, when in self._marks[1:]] + [self._refresh_end]
        steps = []
        for (phase, began), ended in zip(self._marks, ends, strict=True):
            tags = {}
            if phase == "auto-configuration":
                tags = {"outcomes": str(len(self._outcomes)),
                        "matched": str(len([o for o in self._outcomes if o.matched]))}
            steps.append(StartupStep(phase, began, ended - began, tags))
        nested = [0.0] * len(self._spans)
        for span in self._spans:
            if span.parent >= 0:
                nested[span.parent] += span.end - span.start
        steps += [StartupStep("bean", span.start, span.end - span.start - inner,
                              {"bean": span.name})
                  for span, inner in zip(self._spans, nested, strict=True)]
        return sorted(steps, key=lambda step: step.started)

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self) -> None:
        try:
            self._refresh()
        except Exception:
            with contextlib.suppress(Exception):
                self.close()                   # a failed refresh leaves nothing running
            raise
        finally:
            self._refresh_end = time.monotonic()

    def _refresh(self) -> None:
        self._mark("definitions")
        listed: list[str] = []
        for path in self._imports_files:
            listed.extend(read_imports(path))
        excluded = set(listed)

        def own(definition: BeanDefinition) -> bool:
            owner = definition.factory.rpartition(".")[0] if definition.factory else ""
            return definition.type_name not in excluded and owner not in excluded

        user = {n: d for n, d in self.definitions.items() if own(d)}
        self.definitions = {}
        self._register_environment()
        configs = {d.type_name: n for n, d in user.items() if d.configuration}
        for definition in user.values():
            if definition.factory:
                config_type, _, method = definition.factory.rpartition(".")
                cls = self._class(config_type)
                self._register(definition, self._return_type(getattr(cls, method)),
                               owner=configs[config_type], method=method)
            else:
                self._register(definition, self._class(definition.type_name))
        self._mark("auto-configuration")
        for qualified in listed:
            self._auto_configure(qualified)
        self._mark("definition-post-processors")
        self._run_definition_processors()
        self._mark("bean-post-processors")
        processors = sorted(n for n, e in self._registry.items()
                            if issubclass(e.type, markers.BeanPostProcessor))
        self._skip_processing.update(processors)
        self._processors = [self._obtain(n) for n in processors]
        self._mark("singletons")
        for name in sorted(self._registry):
            definition = self._registry[name].definition
            if definition.scope == "singleton" and not definition.lazy:
                self._obtain(name)
        self._mark("refreshed")
        event = markers.ContextRefreshed(self)
        for wanted, listener in list(self._listeners):
            if isinstance(event, wanted):
                listener(event)

    def _run_definition_processors(self) -> None:
        names = sorted(n for n, e in self._registry.items()
                       if issubclass(e.type, markers.DefinitionPostProcessor))
        self._skip_processing.update(names)
        for name in names:
            self._obtain(name).post_process_definitions(self.definitions)
        for name, entry in self._registry.items():   # the registry follows the definitions
            if name in self.definitions:
                entry.definition = self.definitions[name]

    def close(self) -> None:
        """Destroy a bean once every bean that asked for it is gone (a topological order).

        A bean whose destroy callback fails is counted as gone (the rest of its callbacks are
        skipped); the failures come back together, in one ExceptionGroup, at the end."""
        alive = [n for n in self._raw if self._registry[n].definition.scope == "singleton"]
        failures: list[Exception] = []
        while alive:
            ready = [n for n in alive if not (self._needed_by.get(n, set()) & set(alive))]
            for name in ready or alive[:1]:          # a cycle cannot happen; never loop forever
                alive.remove(name)
                try:
                    self._destroy(name, self._raw.pop(name))
                except Exception as error:
                    failures.append(error)
                self._objects.pop(name, None)
        if failures:
            raise ExceptionGroup("destroy callbacks failed", failures)

    def _destroy(self, name: str, raw: Any) -> None:
        for _, method in inspect.getmembers(type(raw), callable):
            if getattr(method, "__pre_destroy__", False):
                method(raw)
        entry = self._registry[name]
        if entry.method:
            owner = self._registry[entry.owner].type
            destroy = getattr(getattr(owner, entry.method), "__destroy_method__", "")
            if destroy:
                getattr(raw, destroy)()

    def _register_environment(self) -> None:
        definition = BeanDefinition(name="environment", type_name="markers.Environment",
                                    module="markers")
        self._register(definition, markers.Environment)
        self._objects["environment"] = markers.Environment(self._properties)

    def _register(self, definition: BeanDefinition, type_: type, owner: str = "",
                  method: str = "") -> None:
        self.definitions[definition.name] = definition
        self._registry[definition.name] = _Registered(definition, type_, owner, method)

    def _module(self, name: str) -> types.ModuleType:
        if name not in self._modules:
            self._modules[name] = importlib.import_module(name)
        return self._modules[name]

    def _class(self, qualified: str) -> type:
        module, _, name = qualified.rpartition(".")
        found = getattr(self._module(module), name)
        if not isinstance(found, type):
            raise TypeError(f"{qualified} is not a class")
        return found

    @staticmethod
    def _return_type(method: Any) -> type:
        returns = resolve_return(method)
        if not isinstance(returns, type):
            raise TypeError(f"@bean method {method.__qualname__} needs a return type")
        return returns

    def _auto_configure(self, qualified: str) -> None:
        cls = self._class(qualified)
        matched, messages = self._check(getattr(cls, markers.CONDITIONS, []))
        self._outcomes.append(ConditionOutcome(qualified, matched, messages))
        if not matched:
            return
        simple = qualified.rpartition(".")[2]
        config_name = simple[:1].lower() + simple[1:]
        if config_name in self._registry:
            config_name = qualified
        self._register(BeanDefinition(name=config_name, type_name=qualified,
                                      module=cls.__module__, configuration=True), cls)
        for attribute, method in vars(cls).items():
            if not getattr(method, "__bean__", False):
                continue
            conditions = getattr(method, markers.CONDITIONS, [])
            ok, notes = self._check(conditions)
            if conditions:
                self._outcomes.append(ConditionOutcome(f"{qualified}.{attribute}", ok, notes))
            if ok:
                signature = inspect.signature(method)
                self._register(BeanDefinition(
                    name=attribute, type_name=f"{qualified}.{attribute}", module=cls.__module__,
                    scope=getattr(method, "__scope__", "singleton"),
                    lazy=bool(getattr(method, "__lazy__", False)),
                    primary=bool(getattr(method, "__primary__", False)),
                    dependencies=tuple(signature.parameters)[1:],
                    factory=f"{qualified}.{attribute}"),
                    self._return_type(method), owner=config_name, method=attribute)

    def _check(self, conditions: list[markers.Condition]) -> tuple[bool, list[str]]:
        lines: list[str] = []
        rank = ("on_class", "on_property", "on_missing_bean")
        for c in sorted(conditions, key=lambda c: rank.index(c.kind)):
            ok, line = self._check_one(c)
            lines.append(line)
            if not ok:
                return False, lines
        return True, lines

    def _check_one(self, c: markers.Condition) -> tuple[bool, str]:
        if c.kind == "on_class":
            if importlib.util.find_spec(c.module) is None:
                return False, f"conditional_on_class did not find required module {c.module}"
            return True, f"conditional_on_class found required module {c.module}"
        if c.kind == "on_property":
            if c.prop not in self._properties:
                return c.match_if_missing, (f"conditional_on_property: {c.prop} missing, "
                                            f"match_if_missing={c.match_if_missing}")
            actual = self._properties[c.prop].casefold()
            ok = actual == c.having_value.casefold() if c.having_value else actual != "false"
            return ok, f"conditional_on_property: {c.prop} is {self._properties[c.prop]!r}"
        wanted = resolve_type(c.bean_type)
        present = self._candidates(wanted)
        if present:
            return False, ("conditional_on_missing_bean found existing bean(s) "
                           + ", ".join(present))
        return True, f"conditional_on_missing_bean: no {wanted!r} bean"

    def condition_report(self) -> list[ConditionOutcome]:
        return [ConditionOutcome(o.name, o.matched, list(o.messages)) for o in self._outcomes]

    # ---- lookup and creation -------------------------------------------------------------
    def get_bean(self, key: str | type) -> Any:
        if isinstance(key, str):
            if key not in self._registry:
                raise NoSuchBeanError(key)
            return self._obtain(key)
        return self._obtain(self._pick(key, None, "", ""))

    def _candidates(self, wanted: Any) -> list[str]:
        if not isinstance(wanted, type):
            return []
        return [name for name, entry in self._registry.items() if issubclass(entry.type, wanted)]

    def _pick(self, wanted: Any, qualifier: str | None, bean: str, parameter: str) -> str:
        candidates = self._candidates(wanted)
        if qualifier is not None:
            chosen = [c for c in candidates if c == qualifier]
        elif len(candidates) <= 1:
            chosen = candidates
        else:
            chosen = [c for c in candidates if self._registry[c].definition.primary]
            if len(chosen) != 1:
                chosen = [c for c in candidates if c == parameter] or candidates
        if not chosen:
            raise NoSuchBeanError(wanted, bean, parameter)
        if len(chosen) > 1:
            raise NoUniqueBeanError(wanted, chosen, bean, parameter)
        return chosen[0]

    def _obtain(self, name: str) -> Any:
        if self._registry[name].definition.scope == "request":
            request = scopes.current_request(name)
            return request.get(("registry", id(self), name), lambda: self._request_bean(name))
        with self._creation_lock:
            return self._obtain_locked(name)

    def _request_bean(self, name: str) -> tuple[Any, Any]:
        with self._creation_lock:
            instance = self._obtain_locked(name)
            raw = self._request_raw.pop(name)
        return instance, lambda: self._destroy(name, raw)

    def _wire(self, name: str) -> Any:
        """What an injection point receives: a request bean only through a proxy."""
        if self._registry[name].definition.scope == "request":
            return _RequestBeanProxy(self, name)
        return self._obtain(name)

    def _obtain_locked(self, name: str) -> Any:
        if self._in_creation:
            self._needed_by.setdefault(name, set()).add(next(reversed(self._in_creation)))
        if name in self._objects:
            return self._objects[name]
        if name in self._in_creation:
            path = list(self._in_creation)
            raise CircularDependencyError([*path[path.index(name):], name])
        entry = self._registry[name]
        span = _Span(name, time.monotonic(), parent=self._open[-1] if self._open else -1)
        self._spans.append(span)
        self._open.append(len(self._spans) - 1)
        try:
            instance, raw = self._build(name, entry)
        except (NoSuchBeanError, NoUniqueBeanError, CircularDependencyError):
            raise
        except BeanCreationError as inner:      # one error per level, as Spring nests them
            raise BeanCreationError([name, *inner.chain], inner) from inner
        except Exception as error:
            raise BeanCreationError([name], error) from error
        finally:
            span.end = time.monotonic()
            self._open.pop()
        if entry.definition.scope == "request":
            self._request_raw[name] = raw
        if entry.definition.scope == "singleton":
            self._objects[name] = instance
            self._raw[name] = raw
            for _, method in inspect.getmembers(type(raw), callable):
                wanted = getattr(method, "__event_listener__", None)
                if isinstance(wanted, type):
                    self._listeners.append((wanted, getattr(raw, method.__name__)))
        return instance

    def _build(self, name: str, entry: _Registered) -> tuple[Any, Any]:
        self._in_creation[name] = None
        try:
            raw = self._instantiate(name, entry)
            if not entry.method:
                for attribute, value in self._autowired(name, entry.type).items():
                    setattr(raw, attribute, value)
        finally:
            del self._in_creation[name]
        return self._initialise(name, raw), raw

    def _initialise(self, name: str, raw: Any) -> Any:
        processors = [] if name in self._skip_processing else self._processors
        bean = raw
        for processor in processors:
            bean = processor.before_init(bean, name)
        for _, method in inspect.getmembers(type(raw), callable):
            if getattr(method, "__post_construct__", False):
                getattr(bean, method.__name__)()
        for processor in processors:
            bean = processor.after_init(bean, name)
        return bean

    def _autowired(self, name: str, cls: type) -> dict[str, Any]:
        """Class-level `Annotated[T, Autowired()]` fields, resolved like parameters."""
        values: dict[str, Any] = {}
        annotated = {k: v for klass in reversed(cls.__mro__)
                     for k, v in vars(klass).get("__annotations__", {}).items()}
        wired = [k for k, v in annotated.items() if "Autowired" in str(v)]
        if not wired:
            return values
        hints = typing.get_type_hints(cls, include_extras=True)
        for attribute in wired:
            wanted, qualifier, optional = _unwrap(hints[attribute])
            try:
                chosen = self._pick(wanted, qualifier, name, attribute)
            except NoSuchBeanError:
                if not optional:
                    raise
                values[attribute] = None
                continue
            values[attribute] = self._wire(chosen)
        return values

    def _instantiate(self, name: str, entry: _Registered) -> Any:
        if entry.method:
            factory = getattr(self._obtain(entry.owner), entry.method)
            return factory(**self._inject(name, factory))
        constructor = entry.type.__init__
        if constructor is object.__init__:
            return entry.type()
        return entry.type(**self._inject(name, constructor))

    def _inject(self, name: str, fn: Any) -> dict[str, Any]:
        hints = _parameter_hints(fn)
        kwargs: dict[str, Any] = {}
        skip = inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD
        for parameter in list(inspect.signature(fn).parameters.values()):
            if parameter.name == "self" or parameter.kind in skip:
                continue
            wanted, qualifier, optional = _unwrap(hints.get(parameter.name))
            try:
                chosen = self._pick(wanted, qualifier, name, parameter.name)
            except NoSuchBeanError:
                if optional:
                    kwargs[parameter.name] = None
                elif parameter.default is inspect.Parameter.empty:
                    raise
                continue
            kwargs[parameter.name] = self._wire(chosen)
        return kwargs


class _RequestBeanProxy:
    """Asks the context for the current request's bean on every attribute access."""

    def __init__(self, context: ApplicationContext, name: str) -> None:
        vars(self).update(_context=context, _name=name)

    def __getattr__(self, attribute: str) -> Any:
        return getattr(vars(self)["_context"].get_bean(vars(self)["_name"]), attribute)


def _parameter_hints(fn: Any) -> dict[str, Any]:
    """Type hints of the parameters (a return annotation naming an unimported module is fine)."""
    fn = getattr(fn, "__func__", fn)
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except NameError:
        shim = types.FunctionType(fn.__code__, fn.__globals__)
        shim.__annotations__ = {k: v for k, v in fn.__annotations__.items() if k != "return"}
        return typing.get_type_hints(shim, include_extras=True)


def _unwrap(hint: Any) -> tuple[Any, str | None, bool]:
    """(type, qualifier name or None, optional) of a constructor parameter's annotation."""
    qualifier = None
    if typing.get_origin(hint) is typing.Annotated:
        hint, *extras = typing.get_args(hint)
        for extra in extras:
            if isinstance(extra, markers.Qualifier):
                qualifier = extra.name
    optional = False
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        optional = len(args) < len(typing.get_args(hint))
        hint = args[0] if len(args) == 1 else hint
        if typing.get_origin(hint) is typing.Annotated:
            inner, qualifier = _unwrap(hint)[:2]
            hint = inner
    return hint, qualifier, optional


__all__ = ["ApplicationContext", "CircularDependencyError", "ConditionOutcome",
           "NoSuchBeanError", "NoUniqueBeanError", "read_imports"]
