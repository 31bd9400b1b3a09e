"""The application context: definitions from the scan, auto-configuration, then objects.

`ApplicationContext(...)` scans and registers definitions only; `refresh()` imports the
classes, applies the auto-configurations whose conditions match (after every user bean is
registered) and creates the singletons, injecting constructor parameters by type.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import markers  # noqa: F401  (you will need it)
from scanning import BeanDefinition
from startup import StartupStep

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
                         f"of bean {bean!r}: {', '.join(candidates)}")


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


class ApplicationContext:
    def __init__(self, base_package: str, root: str | Path,
                 properties: Mapping[str, str] | None = None,
                 imports_files: Sequence[str | Path] | None = None) -> None:
        """Scan and register definitions; create nothing (README, stage 2).

        To do: keep the properties and the imports files (DEFAULT_IMPORTS when None), and
        fill self.definitions (bean name -> BeanDefinition) from scanning.scan.
        """
        self.definitions: dict[str, BeanDefinition] = {}
        raise NotImplementedError("ApplicationContext: register definitions (README, stage 2)")

    def refresh(self) -> None:
        """Import the classes, apply auto-configuration, create the singletons (stages 2-4)."""
        raise NotImplementedError("refresh: create the non-lazy singletons (README, stage 2)")

    def get_bean(self, key: str | type) -> Any:
        """The bean named `key`, or the one bean of type `key` (README, stages 2-3)."""
        raise NotImplementedError("get_bean: look a bean up by name or type (README, stage 2)")

    def condition_report(self) -> list[ConditionOutcome]:
        """Why each auto-configuration matched or not (README, stage 4)."""
        raise NotImplementedError("condition_report: (README, stage 4)")

    def close(self) -> None:
        """Destroy the singletons, each before the beans it depends on (README, stage 5)."""
        raise NotImplementedError("close: destroy the singletons (README, stage 5)")

    def startup_steps(self) -> list[StartupStep]:
        """refresh()'s phases and the beans it created, timed (README, stage 8)."""
        raise NotImplementedError("startup_steps: record refresh()'s phases (README, stage 8)")
