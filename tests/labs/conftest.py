"""Report every check the meta-tests could not verify on this broker, at the end of the run."""

from __future__ import annotations

import pytest

from tests.labs.meta import NOT_VERIFIED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if NOT_VERIFIED:
        terminalreporter.section("lab checks not verified on this broker (needs-backend)")
        for line in NOT_VERIFIED:
            terminalreporter.write_line(line)
