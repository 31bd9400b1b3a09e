"""A check that needs a PostgreSQL server setting (a preloaded library) is needs-backend, and
says so as a PostgreSQL need, not as a missing Kafka broker."""

from __future__ import annotations

import pytest

from dojo.checks.plugin import NEEDS_BACKEND, NeedsBackend
from dojo.cli.lab_render import LABELS, POSTGRES_LABEL, _label
from dojo.runner.report import _skip_reason
from dojo.runner.results import CheckResult


def test_a_message_replaces_the_kafka_wording() -> None:
    need = NeedsBackend(("pg_stat_statements",), "postgres", message="needs pg_stat_statements")
    assert str(need.msg) == f"{NEEDS_BACKEND} needs pg_stat_statements"
    assert "Apache Kafka" in str(NeedsBackend(("transactions",), "tansu").msg)


def test_the_label_names_postgres_only_for_postgres_needs() -> None:
    pg = CheckResult("slow", "c", "needs-backend", needs=("pg_stat_statements",))
    kafka = CheckResult("s", "c", "needs-backend", needs=("transactions",))
    assert _label(pg) == POSTGRES_LABEL
    assert _label(kafka) == LABELS["needs-backend"] == "needs Apache Kafka"


class _Report:
    def __init__(self, text: str) -> None:
        self.longrepr = ("checks/test_x.py", 3, text)


@pytest.mark.parametrize("text", [
    f"Skipped: {NEEDS_BACKEND} needs pg_stat_statements",
    f"dojo.checks.plugin.NeedsBackend: {NEEDS_BACKEND} needs pg_stat_statements",
])
def test_the_reason_is_read_without_the_exception_class(text: str) -> None:
    assert _skip_reason(_Report(text)) == f"{NEEDS_BACKEND} needs pg_stat_statements"  # type: ignore[arg-type]


def test_the_result_itself_knows_what_it_waits_for() -> None:
    """The TUI's check log reads the label from the result, as the CLI does: a missing
    pg_stat_statements is not reported as a missing Kafka broker."""
    pg = CheckResult("slow", "c", "needs-backend", needs=("pg_stat_statements",))
    mixed = CheckResult("s", "c", "needs-backend", needs=("pg_stat_statements", "transactions"))
    assert pg.needs_postgres_setting and pg.needs_label == POSTGRES_LABEL
    assert not mixed.needs_postgres_setting and mixed.needs_label == "needs Apache Kafka"
    assert not CheckResult("s", "c", "fail", needs=("pg_stat_statements",)).needs_postgres_setting
