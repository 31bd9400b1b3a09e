"""The container's vocabulary: the decorators application code puts on its classes.

They only leave marks (attributes) on what they decorate; the container reads the marks. The
scanner does not even do that: it reads the decorators' *names* in the source with `ast`
(README, stage 1), so nothing here runs while scanning.
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

STEREOTYPE = "__stereotype__"     # set on a decorator function that carries @component
COMPONENT = "__component__"       # set on a class: the bean name given, or ""
CONDITIONS = "__conditions__"     # list of Condition on a class or a @bean method


def _mark_class(cls: type, name: str) -> type:
    setattr(cls, COMPONENT, name)
    return cls


def component(target: Any = None, *, name: str = "") -> Any:
    """Mark a class as a component, or a decorator function as a stereotype that carries it.

    `@component`, `@component(name="x")`; on a function, `@component def controller(cls)` makes
    `@controller` a meta-marker: classes it decorates are components too.
    """
    if target is None:
        return lambda t: component(t, name=name)
    if isinstance(target, type):
        return _mark_class(target, name)

    def stereotype(cls: Any = None, *, name: str = "") -> Any:
        if cls is None:
            return lambda c: stereotype(c, name=name)
        if not isinstance(cls, type):
            return component(cls)          # a stereotype of a stereotype
        marked = target(cls)
        return _mark_class(marked if isinstance(marked, type) else cls, name)

    setattr(stereotype, STEREOTYPE, True)
    stereotype.__name__ = getattr(target, "__name__", "stereotype")
    return stereotype


@component
def service(cls: type) -> type:
    """A component that holds business logic."""
    return cls


@component
def repository(cls: type) -> type:
    """A component that talks to storage."""
    return cls


@component
def configuration(cls: type) -> type:
    """A component whose @bean methods define more beans."""
    return cls


def bean(method: Any = None, *, destroy_method: str = "") -> Any:
    """Mark a method of a @configuration class as a bean factory (the bean is named after it).

    `@bean`, or `@bean(destroy_method="close")`: on close the container calls that method of
    the object the factory returned (README, stage 5).
    """
    if method is None:
        return lambda m: bean(m, destroy_method=destroy_method)
    method.__bean__ = True
    method.__destroy_method__ = destroy_method
    return method


def primary(target: T) -> T:
    """Prefer this bean when several beans have the type asked for."""
    target.__primary__ = True  # type: ignore[attr-defined]
    return target


def lazy(target: T) -> T:
    """Create this singleton on first lookup instead of at refresh."""
    target.__lazy__ = True  # type: ignore[attr-defined]
    return target


def scope(name: str) -> Callable[[T], T]:
    """Give a bean a scope: "singleton" (the default), "prototype" or "request" (stage 7)."""
    def mark(target: T) -> T:
        target.__scope__ = name  # type: ignore[attr-defined]
        return target
    return mark


@dataclass(frozen=True)
class Qualifier:
    """`Annotated[Type, Qualifier("beanName")]` on a constructor parameter picks a bean by name."""

    name: str


@dataclass(frozen=True)
class Condition:
    """One condition on an auto-configuration class or one of its @bean methods."""

    kind: str                 # "on_class" | "on_property" | "on_missing_bean"
    module: str = ""          # on_class: the module that must be importable
    prop: str = ""            # on_property: the property name
    having_value: str = ""    # on_property: the value it must have ("" = anything but "false")
    match_if_missing: bool = False
    bean_type: Any = None     # on_missing_bean: the type no bean may have yet


def _condition(condition: Condition) -> Callable[[T], T]:
    def mark(target: T) -> T:
        found = list(getattr(target, CONDITIONS, ()))
        setattr(target, CONDITIONS, [*found, condition])
        return target
    return mark


def conditional_on_class(module: str) -> Callable[[T], T]:
    """Match only if `module` can be imported (checked without importing it)."""
    return _condition(Condition("on_class", module=module))


def conditional_on_property(prop: str, having_value: str = "",
                            match_if_missing: bool = False) -> Callable[[T], T]:
    """Match only if the property is set (to `having_value`, when given)."""
    return _condition(Condition("on_property", prop=prop, having_value=having_value,
                                match_if_missing=match_if_missing))


def conditional_on_missing_bean(bean_type: Any) -> Callable[[T], T]:
    """Match only if no bean of `bean_type` is defined yet (user beans are registered first)."""
    return _condition(Condition("on_missing_bean", bean_type=bean_type))


class Environment:
    """The properties the context was given; the context registers it as bean "environment"."""

    def __init__(self, properties: dict[str, str]) -> None:
        self.properties = dict(properties)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.properties.get(key, default)

    def with_prefix(self, prefix: str) -> dict[str, str]:
        """Every property under `prefix`, keyed by the rest of its name."""
        return {k[len(prefix):]: v for k, v in self.properties.items() if k.startswith(prefix)}


# ---- the lifecycle (README, stage 5) ---------------------------------------------------------

def post_construct(method: Callable[..., T]) -> Callable[..., T]:
    """An init callback: called with no arguments once the bean's dependencies are injected."""
    method.__post_construct__ = True  # type: ignore[attr-defined]
    return method


def pre_destroy(method: Callable[..., T]) -> Callable[..., T]:
    """A destroy callback: called with no arguments when the context closes."""
    method.__pre_destroy__ = True  # type: ignore[attr-defined]
    return method


@dataclass(frozen=True)
class Autowired:
    """`name: Annotated[Type, Autowired()]` in a class body: a field the container injects."""


@dataclass(frozen=True)
class ContextRefreshed:
    """Published once refresh() has made every non-lazy singleton."""

    context: Any


def event_listener(event_type: type) -> Callable[[T], T]:
    """Make a bean's method receive the events of `event_type` (its only argument)."""
    def mark(method: T) -> T:
        method.__event_listener__ = event_type  # type: ignore[attr-defined]
        return method
    return mark


class DefinitionPostProcessor:
    """A bean that may change the bean definitions before any other bean is made."""

    def post_process_definitions(self, definitions: MutableMapping[str, Any]) -> None:
        """Change, add or remove entries of `definitions` (bean name -> BeanDefinition)."""


class BeanPostProcessor:
    """A bean that sees every other bean around its init callbacks, and may replace it."""

    def before_init(self, bean: Any, name: str) -> Any:
        """Called before the bean's @post_construct methods; what it returns is the bean."""
        return bean

    def after_init(self, bean: Any, name: str) -> Any:
        """Called after them; what it returns is the bean the context keeps and injects."""
        return bean


# ---- transactions (README, stage 6) ----------------------------------------------------------

REQUIRED = "REQUIRED"            # join the caller's transaction, or start one
REQUIRES_NEW = "REQUIRES_NEW"    # suspend the caller's transaction and start one of its own


@dataclass(frozen=True)
class TransactionAttribute:
    """What @transactional put on a method: its propagation and the exceptions that commit."""

    propagation: str = REQUIRED
    no_rollback_for: tuple[type[BaseException], ...] = ()


def transactional(method: Any = None, *, propagation: str = REQUIRED,
                  no_rollback_for: tuple[type[BaseException], ...] = ()) -> Any:
    """Mark a bean's method as running in a transaction (when it is called through the proxy).

    `@transactional`, or `@transactional(propagation=REQUIRES_NEW, no_rollback_for=(E,))`:
    an exception that is an instance of a class in `no_rollback_for` leaves the method and
    the transaction still commits; any other exception rolls it back.
    """
    if method is None:
        return lambda m: transactional(m, propagation=propagation,
                                       no_rollback_for=no_rollback_for)
    method.__transactional__ = TransactionAttribute(propagation, tuple(no_rollback_for))
    return method
