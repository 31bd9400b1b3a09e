"""`python -m dojo.checks.faults SPEC`: the child side of run_in_subprocess."""

import sys

from dojo.checks.faults._process import _child_main

_child_main(sys.argv[1])
