"""The engine parts of this area never pull in Textual (DESIGN.md: the engine is UI-free)."""

from __future__ import annotations

import subprocess
import sys


def test_content_quiz_store_and_their_cli_modules_do_not_import_textual() -> None:
    code = ("import sys, dojo.content, dojo.quiz, dojo.store, dojo.quiz.anki, dojo.cli.quiz, "
            "dojo.cli.lessons, dojo.cli.lint; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'textual'))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
