"""`dojo lint [--root DIR]`: every content problem as `path:line: message`; exit 1 if any."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dojo.cli.errors import UsageProblem

if TYPE_CHECKING:
    from dojo.content import Problem


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("lint", help="check lessons, cards and labs against their formats",
                            description="Check lessons/ and labs/ against docs/content-format.md"
                                        " and docs/lab-contract.md.")
    parser.add_argument("--root", type=Path, default=None,
                        help="content root holding lessons/ and labs/ (default: this checkout,"
                             " or DOJO_CONTENT_ROOT)")
    parser.set_defaults(handler=run_lint)


def _lab_linter() -> Callable[[Path], list[Problem]] | None:
    """`dojo.content.lab_lint.lint_labs` when the lab engine is installed."""
    try:
        module = importlib.import_module("dojo.content.lab_lint")
    except ModuleNotFoundError as exc:
        if exc.name == "dojo.content.lab_lint":
            return None
        raise
    linter: Callable[[Path], list[Problem]] = module.lint_labs
    return linter


def _shown(path: Path) -> Path:
    """Relative to the working directory when inside it, so editors can jump to it."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def run_lint(args: argparse.Namespace) -> int:
    from dojo.content import content_root, lint_lessons

    root = (args.root or content_root()).resolve()
    if not (root / "lessons").is_dir() and not (root / "labs").is_dir():
        raise UsageProblem(f"{root} has neither lessons/ nor labs/")
    problems = lint_lessons(root)
    lint_labs = _lab_linter()
    if lint_labs is not None:
        problems += lint_labs(root)
    for problem in sorted(set(problems)):
        print(f"{_shown(problem.path)}:{problem.line}: {problem.message}")
    files = len({problem.path for problem in problems})
    if problems:
        print(f"{len(problems)} problem(s) in {files} file(s)", file=sys.stderr)
        return 1
    print(f"clean: {root}", file=sys.stderr)
    return 0
