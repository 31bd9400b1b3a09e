"""Moved to `dojo.checks.partitioning`: a re-export for old imports, during the transition."""

from dojo.checks.partitioning import *  # noqa: F401,F403
