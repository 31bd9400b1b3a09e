"""The engine never imports Textual: only app/dojo/tui may (DESIGN.md, three layers)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "app" / "dojo"
UI = PACKAGE / "tui"


def textual_imports(path: Path, base: Path = PACKAGE.parent) -> list[str]:
    """`file:line: imports …` for every import of textual (or a submodule) in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name == "textual" or name.startswith("textual."):
                found.append(f"{path.relative_to(base)}:{node.lineno}: imports {name}")
    return found


def test_no_module_outside_the_tui_imports_textual() -> None:
    modules = [path for path in PACKAGE.rglob("*.py") if UI not in path.parents]
    assert len(modules) > 20, f"expected the engine's modules under {PACKAGE}"
    offenders = [line for path in modules for line in textual_imports(path)]
    assert not offenders, ("the engine must stay UI-free; move this code into app/dojo/tui or "
                           "pass data to it instead:\n" + "\n".join(offenders))


def test_the_check_sees_an_import_of_textual(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom textual.widgets import Static\nimport textual\n",
                      encoding="utf-8")
    assert textual_imports(sample, tmp_path) == ["sample.py:2: imports textual.widgets",
                                                 "sample.py:3: imports textual"]


def test_the_tui_itself_is_found_and_does_import_textual() -> None:
    assert any(textual_imports(path) for path in UI.rglob("*.py"))
