"""An alternative scanner: os.walk over the package directory, an ast.NodeVisitor per file,
and stereotypes resolved by a memoised depth-first search over "decorated by" edges.
The same README contract as the reference, built another way.
"""

from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BeanDefinition:
    name: str
    type_name: str
    module: str
    scope: str = "singleton"
    lazy: bool = False
    primary: bool = False
    dependencies: tuple[str, ...] = ()
    factory: str = ""
    configuration: bool = False


ROOT_MARKERS = ("component", "service", "repository", "configuration")


def _name_of(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    return getattr(target, "attr", None) or getattr(target, "id", "") or ""


def _decapitalize(name: str) -> str:
    return name if re.match(r"^[A-Z]{2}", name) else name[:1].lower() + name[1:]


class _FileVisitor(ast.NodeVisitor):
    def __init__(self) -> None:
        self.classes: list[ast.ClassDef] = []
        self.functions: dict[str, set[str]] = {}
        self._depth = 0

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        if self._depth == 0:
            self.classes.append(node)
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self.functions.setdefault(node.name, set()).update(_name_of(d)
                                                           for d in node.decorator_list)
        self._depth += 1
        self.generic_visit(node)
        self._depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef      # a coroutine's body is a function's


def _files(base_package: str, root: Path) -> list[tuple[str, Path]]:
    top = root.joinpath(*base_package.split("."))
    out = []
    for folder, dirs, files in os.walk(top):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = Path(folder) / file
            rel = path.relative_to(root).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append((".".join(parts), path))
    return out


def _params(fn: ast.FunctionDef) -> tuple[str, ...]:
    names = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]
    return tuple(names[1:])


def _options(decorators: list[ast.expr]) -> dict[str, object]:
    options: dict[str, object] = {"scope": "singleton", "lazy": False, "primary": False}
    for d in decorators:
        word = _name_of(d)
        if word in ("lazy", "primary"):
            options[word] = True
        elif word == "scope" and isinstance(d, ast.Call):
            options["scope"] = ast.literal_eval(d.args[0])
    return options


def scan(base_package: str, root: str | Path) -> list[BeanDefinition]:
    visited = []
    for module, path in _files(base_package, Path(root)):
        visitor = _FileVisitor()
        visitor.visit(ast.parse(path.read_bytes()))
        visited.append((module, visitor))
    edges: dict[str, set[str]] = {}
    for _, v in visited:
        for fn, decorators in v.functions.items():
            edges.setdefault(fn, set()).update(decorators)
    memo: dict[str, bool] = {m: True for m in ROOT_MARKERS}

    def is_marker(word: str, seen: frozenset[str] = frozenset()) -> bool:
        if word not in memo:
            memo[word] = word not in seen and any(
                is_marker(d, seen | {word}) for d in edges.get(word, ()))
        return memo[word]

    result: list[BeanDefinition] = []
    for module, v in visited:
        for cls in v.classes:
            markers = [d for d in cls.decorator_list if is_marker(_name_of(d))]
            if not markers:
                continue
            explicit = ""
            for d in markers:
                if isinstance(d, ast.Call):
                    for kw in d.keywords:
                        if kw.arg == "name":
                            explicit = ast.literal_eval(kw.value)
            init = next((n for n in cls.body if isinstance(n, ast.FunctionDef)
                         and n.name == "__init__"), None)
            config = any(_name_of(d) == "configuration" for d in markers)
            opts = _options(cls.decorator_list)
            result.append(BeanDefinition(
                explicit or _decapitalize(cls.name), f"{module}.{cls.name}", module,
                str(opts["scope"]), bool(opts["lazy"]), bool(opts["primary"]),
                _params(init) if init else (), configuration=config))
            if not config:
                continue
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and any(
                        _name_of(d) == "bean" for d in node.decorator_list):
                    o = _options(node.decorator_list)
                    result.append(BeanDefinition(
                        node.name, ast.unparse(node.returns) if node.returns else "", module,
                        str(o["scope"]), bool(o["lazy"]), bool(o["primary"]), _params(node),
                        factory=f"{module}.{cls.name}.{node.name}"))
    return result
