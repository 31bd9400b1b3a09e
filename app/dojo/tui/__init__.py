"""The Textual app: `dojo` with no arguments. It renders what the engine provides.

`run_app()` is the entry point `dojo.cli` calls; the app itself is `dojo.tui.app.DojoApp`.
"""

from __future__ import annotations


def run_app() -> int:
    """Run the app until the learner quits; the exit code for the shell."""
    from dojo.tui.app import DojoApp

    DojoApp().run()
    return 0


__all__ = ["run_app"]
