"""Component scanning: read source files with `ast`, register definitions, import nothing.

Spring's scanner reads class files with ASM so that a class is not loaded (and its static
initialisers do not run) just because it sits under the base package. Here the same holds:
`scan` parses every module under the base package and never imports one.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

BUILTIN_STEREOTYPES = frozenset({"component", "service", "repository", "configuration"})


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


def bean_name(class_name: str) -> str:
    """The default bean name: java.beans.Introspector.decapitalize of the class name."""
    if len(class_name) > 1 and class_name[0].isupper() and class_name[1].isupper():
        return class_name
    return class_name[:1].lower() + class_name[1:]


def decorator_name(node: ast.expr) -> str:
    """`@x`, `@mod.x`, `@x(...)` and `@mod.x(...)` are all named "x"."""
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _keyword(node: ast.expr, key: str) -> str:
    if isinstance(node, ast.Call):
        for kw in node.keywords:
            if kw.arg == key and isinstance(kw.value, ast.Constant):
                return str(kw.value.value)
        if key == "name" and node.args and isinstance(node.args[0], ast.Constant):
            return str(node.args[0].value)
    return ""


def _modules(base_package: str, root: Path) -> list[tuple[str, Path]]:
    base_dir = root.joinpath(*base_package.split("."))
    found: list[tuple[str, Path]] = []
    single = base_dir.with_suffix(".py")
    if single.is_file() and not base_dir.is_dir():
        return [(base_package, single)]
    if not base_dir.is_dir():
        return found
    for path in sorted(base_dir.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if "__pycache__" in parts:
            continue
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append((".".join(parts), path))
    return found


def _stereotypes(trees: list[ast.Module]) -> set[str]:
    """Every decorator name that carries @component, directly or through another stereotype."""
    known = set(BUILTIN_STEREOTYPES)
    functions = [node for tree in trees for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
    grew = True
    while grew:
        grew = False
        for fn in functions:
            if fn.name not in known and any(decorator_name(d) in known
                                             for d in fn.decorator_list):
                known.add(fn.name)
                grew = True
    return known


def _init_parameters(cls: ast.ClassDef) -> tuple[str, ...]:
    for node in reversed(cls.body):  # a later def replaces an earlier one, as in Python
        if isinstance(node, ast.FunctionDef) and node.name == "__init__":
            return _parameters(node)
    return ()


def _parameters(fn: ast.FunctionDef) -> tuple[str, ...]:
    args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
    return tuple(a.arg for a in args[1:] if a.arg != "self") if args else ()


def _flags(decorators: list[ast.expr]) -> tuple[str, bool, bool]:
    scope, lazy, primary = "singleton", False, False
    for d in decorators:
        name = decorator_name(d)
        if name == "scope" and isinstance(d, ast.Call) and d.args \
                and isinstance(d.args[0], ast.Constant):
            scope = str(d.args[0].value)
        elif name == "lazy":
            lazy = True
        elif name == "primary":
            primary = True
    return scope, lazy, primary


def scan(base_package: str, root: str | Path) -> list[BeanDefinition]:
    """Definitions of every component under `base_package` (a dotted name below `root`)."""
    root = Path(root)
    parsed = []
    for module, path in _modules(base_package, root):
        # bytes: ast then honours a BOM and a coding line, as Python does on import
        parsed.append((module, ast.parse(path.read_bytes(), str(path))))
    stereotypes = _stereotypes([tree for _, tree in parsed])
    definitions: list[BeanDefinition] = []
    for module, tree in parsed:
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            marks = [d for d in node.decorator_list if decorator_name(d) in stereotypes]
            if not marks:
                continue
            given = next((_keyword(d, "name") for d in marks if _keyword(d, "name")), "")
            scope, lazy, primary = _flags(node.decorator_list)
            is_config = any(decorator_name(d) == "configuration" for d in marks)
            definitions.append(BeanDefinition(
                name=given or bean_name(node.name), type_name=f"{module}.{node.name}",
                module=module, scope=scope, lazy=lazy, primary=primary,
                dependencies=_init_parameters(node), configuration=is_config))
            methods = _bean_methods(module, node)
            if methods:                       # Spring's "lite" mode: any component's @bean methods
                definitions[-1] = BeanDefinition(**{**definitions[-1].__dict__,
                                                    "configuration": True})
                definitions.extend(methods)
    return definitions


def _bean_methods(module: str, cls: ast.ClassDef) -> list[BeanDefinition]:
    found = []
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and any(decorator_name(d) == "bean"
                                                     for d in node.decorator_list):
            scope, lazy, primary = _flags(node.decorator_list)
            returns = ast.unparse(node.returns) if node.returns is not None else ""
            found.append(BeanDefinition(
                name=node.name, type_name=returns, module=module, scope=scope, lazy=lazy,
                primary=primary, dependencies=_parameters(node),
                factory=f"{module}.{cls.name}.{node.name}"))
    return found
