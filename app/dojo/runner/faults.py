"""Moved to `dojo.checks.faults`: a re-export for old imports, during the transition."""

from dojo.checks.faults import *  # noqa: F401,F403
from dojo.checks.faults import __all__  # noqa: F401
