"""Moved to `dojo.checks.database`: a re-export for old imports, during the transition."""

from dojo.checks.database import *  # noqa: F401,F403
