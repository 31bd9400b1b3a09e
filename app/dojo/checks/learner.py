"""The `learner` fixture: the code under test (workspace, solution or mutant), imported fresh."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


class Learner:
    """Imports modules from one directory, fresh for each test."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory.resolve()

    def purge(self) -> None:
        """Forget modules imported from this directory, so the next import reads the files again."""
        for name, module in list(sys.modules.items()):
            file = getattr(module, "__file__", None)
            if file and Path(file).resolve().is_relative_to(self.dir):
                del sys.modules[name]
        importlib.invalidate_caches()

    def module(self, name: str) -> ModuleType:
        """Import `name` (e.g. "relay" for relay.py) from the directory under test."""
        path = str(self.dir)
        if path in sys.path:
            sys.path.remove(path)
        sys.path.insert(0, path)
        if not (self.dir / f"{name}.py").exists() and not (self.dir / name).is_dir():
            raise FileNotFoundError(
                f"{name}.py is missing from {self.dir}: the lab expects it (see the lab README)."
            )
        module = importlib.import_module(name)
        origin = getattr(module, "__file__", None)
        if origin is None or not Path(origin).resolve().is_relative_to(self.dir):
            raise ImportError(f"{name} resolved to {origin}, not to a file in {self.dir}")
        return module
