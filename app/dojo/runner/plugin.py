"""Moved to `dojo.checks.plugin`. `-p dojo.runner.plugin` still works: it loads the real
plugin (registered once, under its own name, even when both are given)."""

pytest_plugins = ("dojo.checks.plugin",)
