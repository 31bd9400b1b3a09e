"""The runner against learner code that misbehaves: each yields a result that says what
happened, and the runner survives to run the checks that remain (CodeCrafters-style: the
tester is itself tested against deliberately broken programs)."""

from __future__ import annotations

import os
import time
from functools import cache
from pathlib import Path

import pytest

from dojo.content.labs import Lab
from dojo.runner.results import RunSummary
from dojo.runner.sandbox import ALLOW_ENV
from tests.runner.conftest import FIXTURES, HANG_SECONDS, IMPLS, by_check, kafka_has, run

DEDUPE = ("duplicate_event_counted_once", "same_word_in_two_events_counts_twice")


@cache
def _outcome(lab: Lab, impl: Path) -> tuple[RunSummary, float]:
    """Run every check against `impl` once per session; (summary, seconds)."""
    started = time.monotonic()
    summary = run(lab, impl, check_seconds=HANG_SECONDS)
    return summary, time.monotonic() - started


def _assert_others_ran_normally(summary: RunSummary) -> None:
    """The checks the misbehaviour does not touch still ran, in a fresh child, and passed."""
    results = by_check(summary)
    for check in ("counts_each_word", "ignores_case", "saving_twice_adds_up"):
        assert results[check].status == "pass", (
            f"{check} should pass after the runner recovered; got {results[check]}")


@pytest.mark.kafka  # CI reruns it on Apache Kafka, where the needs_kafka check must pass
def test_the_solution_passes_and_needs_backend_is_reported_not_passed(tally: Lab) -> None:
    summary, _ = _outcome(tally, FIXTURES / "solutions" / "tally")
    results = by_check(summary)
    waiting = results["counts_survive_a_transactional_replay"]
    if kafka_has("transactions"):
        assert waiting.status == "pass"
    else:
        assert waiting.status == "needs-backend"
        assert waiting.needs == ("transactions",), "what the broker lacks travels as data"
        assert "needs Apache Kafka" in waiting.message
        assert "dojo services up --kafka apache" in waiting.message
        assert not summary.passed, "a needs-backend check must keep the run from passing"
    others = [r for r in summary.results if r is not waiting]
    assert others and all(r.status == "pass" for r in others), f"the solution failed: {others}"


def test_an_infinite_loop_is_stopped_at_the_check_limit_and_named(tally: Lab) -> None:
    summary, seconds = _outcome(tally, IMPLS / "loops")
    results = by_check(summary)
    for check in DEDUPE:
        assert results[check].status == "error"
        assert f"did not finish within {HANG_SECONDS:g} s" in results[check].message
        assert "infinite loop?" in results[check].message
        assert "tally.py line 1" in results[check].message, (
            f"the message should point at the looping line; got {results[check].message!r}")
        assert "in apply_events" in results[check].message
        assert results[check].hint == "Remember the event ids you have applied."
    _assert_others_ran_normally(summary)
    hangs = 3 if kafka_has("transactions") else 2
    assert seconds < hangs * HANG_SECONDS + 15, f"the run took {seconds:.1f} s"


def test_os_exit_mid_check_is_an_error_with_the_exit_code(tally: Lab) -> None:
    summary, _ = _outcome(tally, IMPLS / "exits")
    for check in DEDUPE:
        result = by_check(summary)[check]
        assert result.status == "error"
        assert "exited with code 3" in result.message
    _assert_others_ran_normally(summary)


def test_a_segfault_is_an_error_naming_the_signal_and_the_line(tally: Lab) -> None:
    summary, _ = _outcome(tally, IMPLS / "segfault")
    for check in DEDUPE:
        result = by_check(summary)[check]
        assert result.status == "error"
        assert "SIGSEGV" in result.message
        assert "tally.py line" in result.message and "ctypes.string_at(0)" in result.message
    _assert_others_ran_normally(summary)


def test_a_syntax_error_names_file_line_and_the_code(tally: Lab, tmp_path: Path) -> None:
    # written here, not kept as a fixture file: the project's linters would reject it
    source = (FIXTURES / "solutions/tally/tally.py").read_text()
    broken = source.replace("def count_words(text: str) -> dict[str, int]:",
                            "def count_words(text: str) -> dict[str, int]")
    assert broken != source
    (tmp_path / "tally.py").write_text(broken)
    summary, _ = _outcome(tally, tmp_path)
    runnable = [r for r in summary.results if r.status != "needs-backend"]
    assert runnable and all(r.status == "error" for r in runnable)
    message = runnable[0].message
    assert "SyntaxError in tally.py, line 11" in message
    assert "def count_words(text: str) -> dict[str, int]" in message
    assert "Traceback" not in message and "_pytest" not in message


def test_an_exception_at_import_names_the_module_and_line(tally: Lab) -> None:
    summary, _ = _outcome(tally, IMPLS / "raises_at_import")
    runnable = [r for r in summary.results if r.status != "needs-backend"]
    assert runnable and all(r.status == "error" for r in runnable)
    assert runnable[0].message.startswith(
        "importing tally.py raised RuntimeError: TALLY_CONFIG is not set")
    assert "tally.py line 10" in runnable[0].message


def test_a_flood_of_output_neither_blocks_nor_pollutes_results(tally: Lab) -> None:
    # The lab's own check limit, not the 2 s hang limit: printing 15 MB takes 2-4 s on a
    # 2-core machine, and what is tested here is that it neither blocks nor leaks.
    started = time.monotonic()
    summary = run(tally, IMPLS / "noisy")
    seconds = time.monotonic() - started
    assert by_check(summary)["counts_each_word"].status == "pass"
    assert all(len(r.message) < 500 for r in summary.results), "output leaked into messages"
    assert seconds < 30, f"15 MB of prints should not take {seconds:.0f} s"


def test_a_thread_that_never_ends_does_not_keep_the_run_waiting(tally: Lab) -> None:
    summary, seconds = _outcome(tally, IMPLS / "lingering_thread")
    _assert_others_ran_normally(summary)
    assert seconds < 15, f"the run waited {seconds:.0f} s for a stray thread"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def test_processes_the_learner_started_are_killed_with_the_child(
        tally: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "report" / "orphans.txt"
    pidfile.parent.mkdir()
    monkeypatch.setenv("TALLY_ORPHAN_PIDFILE", str(pidfile))
    monkeypatch.setenv(ALLOW_ENV, str(pidfile.parent))  # the file sandbox lets the fixture report
    summary = run(tally, IMPLS / "orphan", check_seconds=HANG_SECONDS, stages=("dedupe",))
    for check in DEDUPE:
        assert "exited with code 4" in by_check(summary)[check].message
    pids = [int(line) for line in pidfile.read_text().split()]
    assert pids, "the orphan implementation did not fork"
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [pid for pid in pids if _alive(pid)], "forked processes outlived the run"


def test_the_untouched_starter_fails_with_not_implemented(tally: Lab) -> None:
    summary = run(tally, FIXTURES / "labs" / "tally" / "starter", stages=("count",))
    result = by_check(summary)["counts_each_word"]
    assert result.status == "fail"
    assert result.message.startswith("tally.count_words() is not written yet.\n")
    assert result.failure is not None
    assert result.failure.actual.startswith("it raises NotImplementedError at tally.py line 10")
