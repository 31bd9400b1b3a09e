"""Moved to `dojo.checks.learner`: a re-export for old imports, during the transition."""

from dojo.checks.learner import *  # noqa: F401,F403
