"""Fault tools for lab checks: crash a process at an exact point, slow a broker or a database,
race workers behind a barrier, point a client at nothing, deliver twice and out of order.

Every tool works through the same objects the learner's code receives (a producer, an engine,
a function), so a check attacks the code through its documented API and never its internals.

    producer = kill_after_ack(Producer(config))       # SIGKILL right after the first ack
    result = run_in_subprocess("checks/_relay_child.py:relay_child", ..., path=[learner.dir])
    assert result.killed
"""

from dojo.checks.faults._kafka import SlowProducer, kill_after_ack, unreachable_bootstrap
from dojo.checks.faults._process import (
    ProcessResult,
    kill_after,
    kill_before,
    run_in_subprocess,
)
from dojo.checks.faults._races import Outcome, duplicate_and_reorder, run_concurrently
from dojo.checks.faults._sql import InjectedFault, fail_sql, slow_sql

__all__ = [
    "InjectedFault",
    "Outcome",
    "ProcessResult",
    "SlowProducer",
    "duplicate_and_reorder",
    "fail_sql",
    "kill_after",
    "kill_after_ack",
    "kill_before",
    "run_concurrently",
    "run_in_subprocess",
    "slow_sql",
    "unreachable_bootstrap",
]
