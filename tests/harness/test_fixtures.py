"""The pytest plugin's fixtures and its safety guard."""

from __future__ import annotations

import dataclasses

import psycopg
import pytest
from sqlalchemy import text

from dojo.checks.database import create_database, drop_database
from dojo.checks.guard import GuardError, check_database_name, check_topic_name
from dojo.checks.kafka import KafkaEnv
from dojo.services.postgres import libpq_url

pytest_plugins = ["pytester"]


def _databases(services) -> set[str]:
    with psycopg.connect(libpq_url(services.database_url)) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_database_fixture_gives_an_empty_database_of_its_own(database):
    assert database.name.startswith("dojo_")
    with database.engine.connect() as conn:
        assert conn.execute(text("SELECT current_database()")).scalar() == database.name
        tables = conn.execute(text(
            "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar()
    assert tables == 0
    with psycopg.connect(database.dsn) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_created_database_is_dropped_even_with_sessions_left_open(services):
    db = create_database(services, hint="leak")
    leaked = psycopg.connect(db.dsn)  # learner code that forgot to close its connection
    assert db.name in _databases(services)
    drop_database(services, db)
    assert db.name not in _databases(services)
    leaked.close()


def test_the_guard_refuses_names_that_are_not_dojos():
    with pytest.raises(GuardError, match="dojo_"):
        check_database_name("orders")
    with pytest.raises(GuardError, match="dojo."):
        check_topic_name("payments")


def test_the_guard_refuses_an_external_server_without_dojos_marker(services, monkeypatch):
    monkeypatch.delenv("DOJO_ALLOW_EXTERNAL", raising=False)
    # The shared server carries `dojo_owned`; asking the live server for a marker name it does
    # not have makes it a server dojo did not set up, as far as the guard can tell.
    external = dataclasses.replace(services, database_source="external")
    from dojo.services import postgres

    monkeypatch.setattr(postgres, "MARKER_DB", "dojo_owned_missing_marker")
    with pytest.raises(GuardError, match="DOJO_ALLOW_EXTERNAL=1"):
        create_database(external)
    monkeypatch.setenv("DOJO_ALLOW_EXTERNAL", "1")
    db = create_database(external)
    drop_database(external, db)


def test_an_external_server_with_the_marker_is_accepted(services, monkeypatch):
    monkeypatch.delenv("DOJO_ALLOW_EXTERNAL", raising=False)
    external = dataclasses.replace(services, database_source="external")
    db = create_database(external)  # the shared embedded server carries dojo_owned
    drop_database(external, db)


def test_the_guard_refuses_an_external_kafka_without_the_marker_topic(services, monkeypatch):
    monkeypatch.delenv("DOJO_ALLOW_EXTERNAL", raising=False)
    env = KafkaEnv(dataclasses.replace(services, kafka_backend="external"))
    try:
        with pytest.raises(GuardError, match="dojo.owned"):
            env.topic(1, hint="guard")
        assert env.created == []
    finally:
        env.close()


def test_kafka_topics_are_unique_and_deleted_at_teardown(kafka):
    first, second = kafka.topic(1, hint="a"), kafka.topic(2, hint="a")
    assert first != second and first.startswith("dojo.a.")
    meta = kafka.admin().list_topics(timeout=10).topics
    assert len(meta[second].partitions) == 2
    kafka.close()
    remaining = set(kafka.admin().list_topics(timeout=10).topics)
    assert first not in remaining and second not in remaining


def test_consumer_config_is_tuned_to_the_backend(kafka):
    config = kafka.consumer_config()
    if kafka.backend == "tansu":
        assert (config["session.timeout.ms"], config["heartbeat.interval.ms"]) == (6000, 500)
    else:
        assert "session.timeout.ms" not in config
    assert config["enable.auto.commit"] is False
    assert kafka.producer_config()["partitioner"] == "murmur2_random"


def test_needs_kafka_is_reported_as_needs_backend_never_as_passed(pytester, kafka):
    pytester.makepyfile(
        """
        import pytest

        @pytest.mark.needs_kafka("transactions")
        def test_uses_read_committed():
            assert True
        """
    )
    result = pytester.runpytest_subprocess("-p", "dojo.checks.plugin", "-rs")
    if kafka.has("transactions"):
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(skipped=1)
        result.stdout.fnmatch_lines(["*needs-backend: needs Apache Kafka (transactions)*"])


def test_learner_modules_are_imported_fresh_from_the_directory_under_test(pytester, tmp_path):
    impl = tmp_path / "impl"
    impl.mkdir()
    (impl / "answer.py").write_text("VALUE = 41\n")
    pytester.makepyfile(
        f"""
        import pathlib

        def test_first(learner):
            assert learner.module("answer").VALUE == 41
            pathlib.Path({str(impl / 'answer.py')!r}).write_text("VALUE = 42\\n")

        def test_second(learner):
            assert learner.module("answer").VALUE == 42

        def test_missing_file_is_named(learner):
            try:
                learner.module("relay")
            except FileNotFoundError as exc:
                assert "relay.py is missing" in str(exc)
            else:
                raise AssertionError("expected FileNotFoundError")
        """
    )
    result = pytester.runpytest_subprocess("-p", "dojo.checks.plugin", f"--dojo-impl={impl}")
    result.assert_outcomes(passed=3)


def test_the_database_belongs_to_a_role_with_no_other_power(services, database):
    """Learner code logs in as the database's own role: not a superuser, no way into another
    database, no COPY TO PROGRAM; the administrator's URL is for observers only."""
    assert database.role == database.name
    other = create_database(services, hint="other")
    try:
        with psycopg.connect(database.dsn, autocommit=True) as conn:
            assert conn.execute("SELECT current_user, rolsuper, rolcreatedb, rolcreaterole "
                                "FROM pg_roles WHERE rolname = current_user").fetchone() == (
                database.role, False, False, False)
            conn.execute("CREATE TABLE t (id int PRIMARY KEY)")  # it owns its database
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("COPY (SELECT 1) TO PROGRAM 'id'")
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute("CREATE DATABASE dojo_not_mine")
        for elsewhere in (other.name, "postgres", "dojo_owned"):
            with pytest.raises(psycopg.OperationalError, match="permission denied"):
                psycopg.connect(database.dsn.rsplit("/", 1)[0] + "/" + elsewhere).close()
        with psycopg.connect(libpq_url(database.admin_url)) as conn:
            assert conn.execute("SELECT rolsuper FROM pg_roles "
                                "WHERE rolname = current_user").fetchone() == (True,)
    finally:
        drop_database(services, other)


def test_dropping_a_database_drops_its_role(services):
    db = create_database(services, hint="role")
    drop_database(services, db)
    with psycopg.connect(libpq_url(services.database_url)) as conn:
        assert conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s",
                            (db.role,)).fetchone() is None


def test_row_locks_are_readable_by_the_databases_own_role(database):
    from dojo.checks.observers import ensure_pgrowlocks

    assert ensure_pgrowlocks(database.engine), "pgrowlocks is created for the role to use"


def test_a_dropped_database_leaves_no_statements_in_pg_stat_statements(services):
    """pg_stat_statements keeps a dropped database's statements until it is full and then
    evicts live ones too (the incident lab lost a 3-call statement mid-check after a few
    hundred checks): dropping a database forgets its entries."""
    db = create_database(services)
    with db.engine.begin() as conn:
        for n in range(1, 6):
            conn.execute(text("SELECT " + ", ".join(["1"] * n)))
    with psycopg.connect(libpq_url(services.database_url), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = %s",
                           (db.name,)).fetchone()[0]
        count = "SELECT count(*) FROM pg_stat_statements WHERE dbid = %s"
        assert conn.execute(count, (oid,)).fetchone()[0] >= 5
        drop_database(services, db)
        assert conn.execute(count, (oid,)).fetchone()[0] == 0
