"""Moved to `dojo.checks.kafka`: a re-export for old imports, during the transition."""

from dojo.checks.kafka import *  # noqa: F401,F403
