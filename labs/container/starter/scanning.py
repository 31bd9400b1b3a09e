"""Component scanning: read source files with `ast`, register definitions, import nothing.

Spring's scanner reads class files with ASM so that a class is not loaded (and its static
initialisers do not run) just because it sits under the base package. Do the same: parse every
module under the base package and never import one (README, stage 1).
"""

from __future__ import annotations

import ast  # noqa: F401  (you will need it)
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BeanDefinition:
    """What the container knows about a bean before it exists (README, stage 2)."""

    name: str
    type_name: str                 # "pkg.module.Class"; for a @bean method, its return annotation
    module: str                    # the module to import at refresh
    scope: str = "singleton"
    lazy: bool = False
    primary: bool = False
    dependencies: tuple[str, ...] = ()
    factory: str = ""              # "pkg.module.ConfigClass.method" for a @bean method
    configuration: bool = False    # a @configuration class (its @bean methods are beans too)


def scan(base_package: str, root: str | Path) -> list[BeanDefinition]:
    """Definitions of every component under `base_package` (a dotted name below `root`).

    To do (README, stage 1):
    - find the base package's directory under root and every .py file below it;
    - parse each with ast.parse; never import a module;
    - a class is a component when one of its decorators is component, service, repository,
      configuration, or a stereotype: a function decorated with one of those (repeat until no
      new stereotype appears);
    - name each bean like Spring does (name= on the marker, else Introspector.decapitalize);
    - stage 2: fill scope, lazy, primary, dependencies, and the @bean methods of
      @configuration classes.
    """
    raise NotImplementedError("scan: read the base package with ast (README, stage 1)")
