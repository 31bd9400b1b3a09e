"""The lab engine stays framework-free: learner code runs in a child that never loads the
TUI, and the CLI's lab commands do not pay for Textual."""

from __future__ import annotations

import subprocess
import sys


def test_lab_engine_and_cli_never_import_textual() -> None:
    modules = ("dojo.content.labs", "dojo.content.lab_lint", "dojo.runner.execute",
               "dojo.runner.child", "dojo.runner.report", "dojo.runner.workspace",
               "dojo.runner.progress", "dojo.cli.lab")
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", f"textual was imported: {result.stdout}"
