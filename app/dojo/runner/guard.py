"""Moved to `dojo.checks.guard`: a re-export for old imports, during the transition."""

from dojo.checks.guard import *  # noqa: F401,F403
