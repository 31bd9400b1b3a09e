"""Component scanning with os.walk and a stereotype graph (a different design from the reference).

Every function definition under the base package contributes an edge "its name -> each of its
decorators' names"; a name is a marker when a path leads from it to one of the four built-in
markers. A class of a module's own body is a component when one of its decorators is a marker.
Nothing is imported.
"""

from __future__ import annotations

import ast
import os
from collections import defaultdict, deque
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BeanDefinition:
    """What the container knows about a bean before it exists (README, stage 2)."""

    name: str
    type_name: str
    module: str
    scope: str = "singleton"
    lazy: bool = False
    primary: bool = False
    dependencies: tuple[str, ...] = ()
    factory: str = ""
    configuration: bool = False


_BUILTIN = ("component", "service", "repository", "configuration")


def _decapitalize(name: str) -> str:
    if len(name) >= 2 and name[0].isupper() and name[1].isupper():
        return name
    return name[:1].lower() + name[1:]


def _called_name(node: ast.expr) -> str:
    target = node.func if isinstance(node, ast.Call) else node
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    return ""


def _module_files(base_package: str, root: Path) -> list[tuple[str, Path]]:
    base = root.joinpath(*base_package.split("."))
    if not base.is_dir():
        single = base.with_suffix(".py")
        return [(base_package, single)] if single.is_file() else []
    out = []
    for dirpath, dirnames, filenames in os.walk(base):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            path = Path(dirpath, filename)
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append((".".join(parts), path))
    return out


def _markers(trees: list[ast.Module]) -> set[str]:
    users: dict[str, set[str]] = defaultdict(set)     # decorator name -> functions it decorates
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for decorator in node.decorator_list:
                    users[_called_name(decorator)].add(node.name)
    found = set(_BUILTIN)
    queue = deque(_BUILTIN)
    while queue:
        for fn in users.get(queue.popleft(), ()):
            if fn not in found:
                found.add(fn)
                queue.append(fn)
    return found


def _params(fn: ast.FunctionDef | None) -> tuple[str, ...]:
    if fn is None:
        return ()
    names = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)]
    return tuple(names[1:])


def _given_name(decorator: ast.expr) -> str:
    if isinstance(decorator, ast.Call):
        for keyword in decorator.keywords:
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                return str(keyword.value.value)
    return ""


def _flags(decorators: list[ast.expr]) -> dict[str, object]:
    flags: dict[str, object] = {}
    for d in decorators:
        called = _called_name(d)
        if called == "lazy":
            flags["lazy"] = True
        elif called == "primary":
            flags["primary"] = True
        elif called == "scope" and isinstance(d, ast.Call) and d.args \
                and isinstance(d.args[0], ast.Constant):
            flags["scope"] = str(d.args[0].value)
    return flags


def scan(base_package: str, root: str | Path) -> list[BeanDefinition]:
    modules = [(m, ast.parse(p.read_bytes(), str(p))) for m, p in
               _module_files(base_package, Path(root))]
    markers = _markers([tree for _, tree in modules])
    result: list[BeanDefinition] = []
    for module, tree in modules:
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            marks = [d for d in cls.decorator_list if _called_name(d) in markers]
            if not marks:
                continue
            name = next((g for g in map(_given_name, marks) if g), "") or _decapitalize(cls.name)
            init = None
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and node.name == "__init__":
                    init = node
            is_config = any(_called_name(d) == "configuration" for d in marks)
            result.append(BeanDefinition(name=name, type_name=f"{module}.{cls.name}",
                                         module=module, dependencies=_params(init),
                                         configuration=is_config,
                                         **_flags(cls.decorator_list)))  # type: ignore[arg-type]
            if not is_config:
                continue
            for node in cls.body:
                if isinstance(node, ast.FunctionDef) and any(
                        _called_name(d) == "bean" for d in node.decorator_list):
                    result.append(BeanDefinition(
                        name=node.name,
                        type_name=ast.unparse(node.returns) if node.returns else "",
                        module=module, dependencies=_params(node),
                        factory=f"{module}.{cls.name}.{node.name}",
                        **_flags(node.decorator_list)))  # type: ignore[arg-type]
    return result
