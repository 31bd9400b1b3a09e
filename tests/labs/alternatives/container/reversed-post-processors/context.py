"""The application context: definitions from the scan, auto-configuration, then objects.

`ApplicationContext(...)` scans and registers definitions only; `refresh()` imports the
classes, applies the auto-configurations whose conditions match (after every user bean is
registered), lets the definition post-processors change the definitions, creates the bean
post-processors, then the singletons (constructor injection, field injection, init callbacks
between the post-processors' before and after hooks), and publishes ContextRefreshed.
`close()` destroys the singletons in the reverse order of their completion: a bean is
finished only after everything it depends on, so it is destroyed before any of them.
Scopes (stage 7): a singleton is made under a lock, so racing threads get one object; a
request-scoped bean lives in the request of `scopes.request()` and reaches longer-lived beans
through a `scopes.ScopedProxy`.
Startup (stage 8): refresh() records its phases and every bean it creates (startup.py); a
bean whose own code fails stops it with a BeanCreationError naming the chain of beans, after
the singletons made so far are destroyed.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import sys
import threading
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import markers
import scopes
from scanning import BeanDefinition, scan
from startup import BeanCreationError, StartupRecorder, StartupStep

DEFAULT_IMPORTS = Path(__file__).with_name("auto_configuration.imports")
_CONDITION_ORDER = {"on_class": 0, "on_property": 1, "on_missing_bean": 2}


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


def defined_where(listed: list[str], scanned: list[BeanDefinition]) -> set[str]:
    """Where listed classes the scan may have seen are defined, when that is not where they
    are listed (a package re-exporting a class of its own module): the scan named them by the
    defining module."""
    names, modules = {d.type_name for d in scanned}, {d.module for d in scanned}
    under = [q for q in listed if q not in names
             and any(m.startswith(q.rpartition(".")[0] + ".") for m in modules)]
    return {f"{cls.__module__}.{cls.__qualname__}" for cls in map(_import_class, under)}


def read_imports(path: Path) -> list[str]:
    """Class names listed in an imports file: one a line, `#` comments and blanks ignored."""
    names = []
    for line in path.read_text(encoding="utf-8-sig").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.append(line)
    return names


class ApplicationContext:
    def __init__(self, base_package: str, root: str | Path,
                 properties: Mapping[str, str] | None = None,
                 imports_files: Sequence[str | Path] | None = None) -> None:
        self.properties = dict(properties or {})
        self.imports_files = [Path(p) for p in (imports_files if imports_files is not None
                                                else [DEFAULT_IMPORTS])]
        self.definitions: dict[str, BeanDefinition] = {}
        self._scanned = list(scan(base_package, root))
        for definition in self._scanned:
            self.definitions.setdefault(definition.name, definition)
        self._types: dict[str, type] = {}
        self._singletons: dict[str, Any] = {}
        self._report: list[ConditionOutcome] = []
        self._refreshed = False
        self._post_processors: list[markers.BeanPostProcessor] = []
        self._raw: dict[str, Any] = {}             # singletons as made, before after_init
        self._finished: list[str] = []             # singletons in the order they were finished
        self._destroy_methods: dict[str, str] = {}
        self._singleton_lock = threading.RLock()   # one maker per singleton, whatever the thread
        self._startup = StartupRecorder()

    # ---- refresh -------------------------------------------------------------------------
    def refresh(self) -> None:
        try:
            self._refresh()
        except BaseException:
            self._startup.end()
            with contextlib.suppress(Exception):   # the refresh's own error is the one to see
                self.close()                        # Spring destroys what a failed refresh made
            raise
        self._startup.end()

    def startup_steps(self) -> list[StartupStep]:
        return list(self._startup.steps)

    def _refresh(self) -> None:
        self._startup.phase("definitions")
        auto = [name for path in self.imports_files for name in read_imports(path)]
        listed = set(auto)

        def own(d: BeanDefinition) -> bool:
            return d.type_name not in listed and d.factory.rpartition(".")[0] not in listed
        taken = {n for n, d in self.definitions.items() if not own(d)}
        self.definitions = {n: d for n, d in self.definitions.items() if own(d)}
        for definition in self._scanned:   # a name a listed class took goes back to the app
            if definition.name in taken and own(definition):
                self.definitions.setdefault(definition.name, definition)
        environment = BeanDefinition(name="environment", type_name="markers.Environment",
                                     module="markers")
        self.definitions = {"environment": environment, **self.definitions}
        for where in defined_where(auto, self._scanned):   # listed through a re-export
            self.definitions = {n: d for n, d in self.definitions.items()
                                if where not in (d.type_name, d.factory.rpartition(".")[0])}
        self._singletons["environment"] = markers.Environment(self.properties)
        for name, definition in self.definitions.items():
            self._types[name] = self._load_type(definition)
        self._startup.phase("auto-configuration")
        for qualified in auto:
            self._apply_auto_configuration(qualified)
        self._startup.tag(outcomes=str(len(self._report)),
                          matched=str(sum(o.matched for o in self._report)))
        self._refreshed = True
        self._startup.phase("definition-post-processors")
        self._post_process_definitions()
        self._startup.phase("bean-post-processors")
        processors = sorted((name for name, t in self._types.items()
                             if issubclass(t, markers.BeanPostProcessor)), reverse=True)
        self._post_processors = [self._get(name, []) for name in processors]
        self._startup.phase("singletons")
        for name, definition in list(self.definitions.items()):
            if definition.scope == "singleton" and not definition.lazy:
                self._get(name, [])
        self._startup.phase("refreshed")
        self.publish(markers.ContextRefreshed(self))

    def _post_process_definitions(self) -> None:
        """Definition post-processors run before any other bean of the application exists."""
        for name in [n for n, t in self._types.items()
                     if issubclass(t, markers.DefinitionPostProcessor)]:
            self._get(name, []).post_process_definitions(self.definitions)
        for name in [n for n in self._types if n not in self.definitions]:
            del self._types[name]
        for name, definition in self.definitions.items():
            if name not in self._types:
                self._types[name] = self._load_type(definition)

    def publish(self, event: Any) -> None:
        """Call every listener of the event's type on the singletons made so far."""
        for name in list(self._finished):
            raw = self._raw[name]
            for attr, member in _members(type(raw)):
                wanted = getattr(member, "__event_listener__", None)
                if isinstance(wanted, type) and isinstance(event, wanted):
                    getattr(raw, attr)(event)

    def close(self) -> None:
        """Destroy the singletons, each before the beans it depends on."""
        errors: list[BaseException] = []
        while self._finished:
            name = self._finished.pop()
            raw = self._raw.pop(name)
            self._singletons.pop(name, None)
            for callback in self._destroy_callbacks(name, raw):
                try:
                    callback()
                except Exception as error:  # one bean's failure must not keep the rest alive
                    errors.append(error)
        if errors:
            raise errors[0]

    def _destroy_callbacks(self, name: str, raw: Any) -> list[Any]:
        callbacks = [getattr(raw, attr) for attr, member in _members(type(raw))
                     if getattr(member, "__pre_destroy__", False)]
        if self._destroy_methods.get(name):
            callbacks.append(getattr(raw, self._destroy_methods[name]))
        return callbacks

    def _load_type(self, definition: BeanDefinition) -> type:
        if not definition.factory:
            return _import_class(definition.type_name)
        config, _, method = definition.factory.rpartition(".")
        returns = resolve_return(getattr(_import_class(config), method))
        if not isinstance(returns, type):
            raise TypeError(f"@bean method {definition.factory} needs a return type annotation")
        return returns

    def _apply_auto_configuration(self, qualified: str) -> None:
        cls = _import_class(qualified)
        matched, messages = self._evaluate(getattr(cls, markers.CONDITIONS, []))
        self._report.append(ConditionOutcome(qualified, matched, messages))
        if not matched:
            return
        config = BeanDefinition(name=qualified, type_name=qualified, module=cls.__module__,
                                configuration=True)
        self.definitions[qualified] = config
        self._types[qualified] = cls
        for method_name, method in vars(cls).items():
            if not getattr(method, "__bean__", False):
                continue
            conditions = getattr(method, markers.CONDITIONS, [])
            ok, notes = self._evaluate(conditions)
            if conditions:
                self._report.append(ConditionOutcome(f"{qualified}.{method_name}", ok, notes))
            if not ok:
                continue
            definition = BeanDefinition(
                name=method_name, type_name=f"{qualified}.{method_name}", module=cls.__module__,
                scope=getattr(method, "__scope__", "singleton"),
                lazy=getattr(method, "__lazy__", False),
                primary=getattr(method, "__primary__", False),
                dependencies=tuple(inspect.signature(method).parameters)[1:],
                factory=f"{qualified}.{method_name}")
            self.definitions[method_name] = definition
            self._types[method_name] = self._load_type(definition)

    def _evaluate(self, conditions: list[markers.Condition]) -> tuple[bool, list[str]]:
        """Spring's order (class, property, then bean conditions), up to the first miss: a
        missing-bean type of a module that was not found is then never imported."""
        messages: list[str] = []
        for c in sorted(conditions, key=lambda c: _CONDITION_ORDER[c.kind]):
            if c.kind == "on_class":
                ok = importlib.util.find_spec(c.module) is not None
                messages.append(f"@conditional_on_class: module {c.module!r} "
                                + ("found" if ok else "not found"))
            elif c.kind == "on_property":
                value = self.properties.get(c.prop)
                if value is None:
                    ok = c.match_if_missing
                    messages.append(f"@conditional_on_property: {c.prop} is not set")
                else:
                    ok = (value.lower() == c.having_value.lower() if c.having_value
                          else value.lower() != "false")
                    messages.append(f"@conditional_on_property: {c.prop}={value!r}"
                                    + ("" if ok else f", wanted {c.having_value or 'set'!r}"))
            else:
                wanted = resolve_type(c.bean_type)
                found = self._candidates(wanted)
                ok = not found
                what = getattr(wanted, "__qualname__", str(wanted))
                messages.append("@conditional_on_missing_bean: " + (
                    f"no bean of type {what}" if ok
                    else f"found bean(s) of type {what}: {', '.join(found)}"))
            if not ok:
                return False, messages
        return True, messages

    # ---- lookup and creation -------------------------------------------------------------
    def condition_report(self) -> list[ConditionOutcome]:
        return list(self._report)

    def get_bean(self, key: str | type) -> Any:
        if isinstance(key, str):
            if key not in self.definitions:
                raise NoSuchBeanError(key)
            return self._get(key, [])
        return self._get(self._choose(key, "", "", None), [])

    def _candidates(self, required: Any) -> list[str]:
        return [n for n, t in self._types.items()
                if isinstance(required, type) and issubclass(t, required)]

    def _choose(self, required: Any, bean: str, parameter: str, qualifier: str | None) -> str:
        found = self._candidates(required)
        if qualifier is not None:
            if qualifier in found:
                return qualifier
            raise NoSuchBeanError(required, bean, parameter)
        if not found:
            raise NoSuchBeanError(required, bean, parameter)
        if len(found) == 1:
            return found[0]
        primaries = [n for n in found if self.definitions[n].primary]
        if len(primaries) == 1:
            return primaries[0]
        if parameter in found:
            return parameter
        raise NoUniqueBeanError(required, found, bean, parameter)

    def _get(self, name: str, creating: list[str]) -> Any:
        if name in self._singletons:
            return self._singletons[name]
        definition = self.definitions[name]
        if definition.scope == "request":
            return scopes.current_request(name).get(
                (id(self), name), lambda: self._make_request_bean(name, creating))
        if definition.scope != "singleton":
            return self._make(name, creating)
        with self._singleton_lock:          # a thread that lost the race finds it made
            if name in self._singletons:
                return self._singletons[name]
            return self._make(name, creating)

    def _make_request_bean(self, name: str, creating: list[str]) -> tuple[Any, Any]:
        raw, instance = self._build(name, creating)

        def destroy() -> None:
            errors: list[BaseException] = []
            for callback in self._destroy_callbacks(name, raw):
                try:
                    callback()
                except Exception as error:  # as in close(): a failing one stops nothing else
                    errors.append(error)
            if errors:
                raise errors[0]
        return instance, destroy

    def _inject(self, name: str, creating: list[str]) -> Any:
        """What a parameter or field receives: a request bean only through a scoped proxy."""
        if self.definitions[name].scope == "request":
            return scopes.ScopedProxy(name, lambda: self._get(name, []))
        return self._get(name, creating)

    def _make(self, name: str, creating: list[str]) -> Any:
        definition = self.definitions[name]
        raw, instance = self._build(name, creating)
        if definition.scope == "singleton":
            self._singletons[name] = instance
            self._raw[name] = raw
            self._finished.append(name)
        return instance

    def _build(self, name: str, creating: list[str]) -> tuple[Any, Any]:
        """(the object as made, the bean to keep) of a new instance of `name`."""
        if name in creating:
            raise CircularDependencyError([*creating[creating.index(name):], name])
        definition = self.definitions[name]
        path = [*creating, name]
        with self._startup.bean(name):
            try:
                raw = self._create(name, definition, path)
                return raw, self._initialise(name, definition, raw, path)
            except (*CONTAINER_ERRORS, RecursionError):   # the container's, not the bean's
                raise
            except Exception as error:          # the bean's own code: name the chain to it
                raise BeanCreationError(path, error) from error

    def _initialise(self, name: str, definition: BeanDefinition, raw: Any,
                    creating: list[str]) -> Any:
        """Fields, then before_init, the init callbacks, after_init: the bean to keep."""
        if not definition.factory:
            for field_name, value in self._fields(name, type(raw), creating).items():
                setattr(raw, field_name, value)
        bean = raw
        processors = [] if self._is_post_processor(name) else self._post_processors
        for processor in processors:
            bean = processor.before_init(bean, name)
        for attr, member in _members(type(raw)):
            if getattr(member, "__post_construct__", False):
                getattr(bean, attr)()
        for processor in reversed(processors):     # unwinding: the last one wraps first
            bean = processor.after_init(bean, name)
        return bean

    def _is_post_processor(self, name: str) -> bool:
        return issubclass(self._types[name], (markers.BeanPostProcessor,
                                              markers.DefinitionPostProcessor))

    def _fields(self, name: str, cls: type, creating: list[str]) -> dict[str, Any]:
        """Values of the class's `Annotated[T, Autowired()]` fields, resolved like parameters."""
        values: dict[str, Any] = {}
        for field_name, hint in _field_hints(cls).items():
            if typing.get_origin(hint) is not typing.Annotated or not any(
                    isinstance(extra, markers.Autowired) for extra in hint.__metadata__):
                continue
            required, qualifier, optional = _unwrap(hint)
            try:
                chosen = self._choose(required, name, field_name, qualifier)
            except NoSuchBeanError:
                if optional:
                    values[field_name] = None
                    continue
                raise
            values[field_name] = self._inject(chosen, creating)
        return values

    def _create(self, name: str, definition: BeanDefinition, creating: list[str]) -> Any:
        if definition.factory:
            config_name, _, method_name = definition.factory.rpartition(".")
            owner = next(n for n, d in self.definitions.items()
                         if d.configuration and d.type_name == config_name)
            config = self._get(owner, creating)
            method = getattr(config, method_name)
            self._destroy_methods[name] = getattr(method, "__destroy_method__", "")
            return method(**self._arguments(name, method, creating))
        cls = self._types[name]
        return cls(**self._arguments(name, cls.__init__, creating))

    def _arguments(self, name: str, fn: Any, creating: list[str]) -> dict[str, Any]:
        if fn is object.__init__:
            return {}
        hints = _parameter_hints(fn)
        arguments: dict[str, Any] = {}
        for parameter in inspect.signature(fn).parameters.values():
            if parameter.name == "self" or parameter.kind in (parameter.VAR_POSITIONAL,
                                                              parameter.VAR_KEYWORD):
                continue
            hint = hints.get(parameter.name)
            required, qualifier, optional = _unwrap(hint)
            try:
                chosen = self._choose(required, name, parameter.name, qualifier)
            except NoSuchBeanError:
                if optional:
                    arguments[parameter.name] = None
                    continue
                if parameter.default is not inspect.Parameter.empty:
                    continue
                raise
            arguments[parameter.name] = self._inject(chosen, creating)
        return arguments


CONTAINER_ERRORS = (NoSuchBeanError, NoUniqueBeanError, CircularDependencyError,
                    BeanCreationError)


def _members(cls: type) -> list[tuple[str, Any]]:
    """The attributes of a class and its bases, bases first, each name once."""
    found: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        found.update(vars(klass))
    return list(found.items())


def _field_hints(cls: type) -> dict[str, Any]:
    """The class-level annotations of a class and its bases, each evaluated on its own: one
    that cannot be (a name imported only under TYPE_CHECKING) is not a field to inject and
    stays unread, unless it mentions Autowired, whose error then surfaces."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        module = sys.modules.get(klass.__module__)
        for field_name, written in inspect.get_annotations(klass).items():
            # a function carrying only this annotation, evaluated in the class's module
            shim = types.FunctionType((lambda: None).__code__, getattr(module, "__dict__", {}))
            shim.__annotations__ = {field_name: written}
            try:
                hints[field_name] = typing.get_type_hints(
                    shim, localns=dict(vars(klass)), include_extras=True)[field_name]
            except Exception:
                if "Autowired" in str(written):
                    raise
                hints.pop(field_name, None)
    return hints


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
