"""`scan_checks` reads which checks reach Kafka from the fixtures they request (at any depth),
without importing the check modules: CI reruns on Apache Kafka only the mutants whose check does."""

from __future__ import annotations

from pathlib import Path

from dojo.content.lab_checks import scan_checks

CONFTEST = '''
import pytest

@pytest.fixture
def relay(kafka, database):
    return kafka, database

@pytest.fixture(name="topic_reader")
def _reader(relay):
    return relay

@pytest.fixture
def rows(database):
    return database
'''

CHECKS = '''
import pytest

pytestmark = pytest.mark.stage("s")

def test_direct(kafka): ...
def test_through_two_fixtures(topic_reader): ...
def test_endpoints(services): ...
def test_database_only(rows, learner): ...
def test_nothing(): ...
'''


def test_a_check_reaches_kafka_through_any_chain_of_fixtures(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    (tmp_path / "test_a.py").write_text(CHECKS, encoding="utf-8")
    uses = {c.id: c.uses_kafka for c in scan_checks(tmp_path).checks}
    assert uses == {"direct": True, "through_two_fixtures": True, "endpoints": True,
                    "database_only": False, "nothing": False}


def test_a_helper_module_that_does_not_parse_is_no_check_error(tmp_path: Path) -> None:
    (tmp_path / "_broken.py").write_text("def (:\n", encoding="utf-8")
    (tmp_path / "test_a.py").write_text(CHECKS, encoding="utf-8")
    scan = scan_checks(tmp_path)
    assert scan.syntax_errors == () and len(scan.checks) == 5


def test_a_check_marked_thorough_is_known_without_importing_it(tmp_path: Path) -> None:
    (tmp_path / "test_a.py").write_text(
        CHECKS + "@pytest.mark.thorough\n@pytest.mark.check_seconds(90)\n"
                 "def test_slow(): ...\n", encoding="utf-8")
    thorough = {c.id: c.thorough for c in scan_checks(tmp_path).checks}
    assert thorough == {"direct": False, "through_two_fixtures": False, "endpoints": False,
                        "database_only": False, "nothing": False, "slow": True}
