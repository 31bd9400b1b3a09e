"""Find a lab's checks and their stage markers by reading the check modules, not importing them.

Reading (ast) rather than importing keeps the linter and `dojo lab list` free of side effects
and fast, and lets them name the file and line of every check.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class CheckDecl:
    """A check as written: `def test_<id>` in `file` at `line`, marked with `stage`."""

    id: str
    stage: str  # "" when neither the function nor its module carries a stage marker
    file: Path
    line: int
    stage_line: int  # where the marker is (the decorator, or the module's pytestmark)
    needs_kafka: bool = False  # marked @pytest.mark.needs_kafka(...): may be needs-backend
    uses_kafka: bool = True  # requests the kit's `kafka` or `services` fixture, at any depth
    thorough: bool = False  # marked @pytest.mark.thorough: runs with --thorough or by name


@dataclass(frozen=True)
class ChecksScan:
    checks: tuple[CheckDecl, ...]
    syntax_errors: tuple[tuple[Path, int, str], ...]


def _stage_marks(node: ast.expr) -> list[tuple[str, int]]:
    """Stage ids in `pytest.mark.stage("x")`, or in a list/tuple of marks."""
    if isinstance(node, ast.List | ast.Tuple):
        return [mark for element in node.elts for mark in _stage_marks(element)]
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and node.func.attr == "stage" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return [(node.args[0].value, node.lineno)]
    return []


def _names_mark(node: ast.expr, mark: str) -> bool:
    """Whether `node` is (or lists) `pytest.mark.<mark>` or `pytest.mark.<mark>(...)`."""
    if isinstance(node, ast.List | ast.Tuple):
        return any(_names_mark(element, mark) for element in node.elts)
    target = node.func if isinstance(node, ast.Call) else node
    return isinstance(target, ast.Attribute) and target.attr == mark


def _names_needs_kafka(node: ast.expr) -> bool:
    """Whether `node` is (or lists) `pytest.mark.needs_kafka(...)`."""
    return _names_mark(node, "needs_kafka")


def _pytestmarks(tree: ast.Module) -> list[ast.expr]:
    return [node.value for node in tree.body if isinstance(node, ast.Assign) and any(
        isinstance(target, ast.Name) and target.id == "pytestmark" for target in node.targets)]


def _module_stage(tree: ast.Module) -> tuple[str, int]:
    for value in _pytestmarks(tree):
        marks = _stage_marks(value)
        if marks:
            return marks[0]
    return "", 0


def _functions(tree: ast.Module) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """Module-level test functions and those of `Test*` classes (what pytest collects)."""
    found: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.append(node)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            found += [n for n in node.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    return [f for f in found if f.name.startswith("test_")]


# kit fixtures through which a check reaches the broker (`database` needs `services` too, but
# hands out only PostgreSQL)
KAFKA_FIXTURES = frozenset({"kafka", "services"})


def _fixture_name(func: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name `func` is requested by when it is a pytest fixture (`name=` wins), else None."""
    for decorator in func.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if (isinstance(target, ast.Attribute) and target.attr == "fixture") or (
                isinstance(target, ast.Name) and target.id == "fixture"):
            if isinstance(decorator, ast.Call):
                for keyword in decorator.keywords:
                    if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                        return str(keyword.value.value)
            return func.name
    return None


def _parameters(func: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    args = func.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)} - {"self"}


def kafka_fixtures(trees: list[ast.Module]) -> set[str]:
    """The fixtures defined in `trees` (and the kit's) that reach Kafka, directly or through
    another fixture."""
    fixtures: dict[str, set[str]] = {}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                name = _fixture_name(node)
                if name is not None:
                    fixtures.setdefault(name, set()).update(_parameters(node))
    reach = set(KAFKA_FIXTURES)
    grew = True
    while grew:
        grew = False
        for name, needs in fixtures.items():
            if name not in reach and needs & reach:
                reach.add(name)
                grew = True
    return reach


def scan_checks(checks_dir: Path) -> ChecksScan:
    """Every check in `checks_dir/test_*.py`, in file then source order."""
    checks: list[CheckDecl] = []
    errors: list[tuple[Path, int, str]] = []
    parsed: list[tuple[Path, ast.Module]] = []
    helpers: list[ast.Module] = []
    for path in sorted(checks_dir.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except SyntaxError as exc:
            if path.name.startswith("test_"):
                errors.append((path, exc.lineno or 1, f"syntax error: {exc.msg}"))
            continue
        helpers.append(tree)
        if path.name.startswith("test_"):
            parsed.append((path, tree))
    reach = kafka_fixtures(helpers)
    for path, tree in parsed:
        module_stage, module_line = _module_stage(tree)
        module_kafka = any(_names_needs_kafka(value) for value in _pytestmarks(tree))
        for func in _functions(tree):
            marks = [m for d in func.decorator_list for m in _stage_marks(d)]
            stage, stage_line = marks[0] if marks else (module_stage, module_line)
            needs_kafka = module_kafka or any(_names_needs_kafka(d) for d in func.decorator_list)
            thorough = any(_names_mark(d, "thorough") for d in func.decorator_list)
            checks.append(CheckDecl(func.name[len("test_"):], stage, path, func.lineno,
                                    stage_line or func.lineno, needs_kafka,
                                    needs_kafka or bool(_parameters(func) & reach), thorough))
    return ChecksScan(tuple(checks), tuple(errors))
