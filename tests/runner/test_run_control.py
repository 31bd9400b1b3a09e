"""How a run is shaped: stage order, filters, stopping at the first failing stage, the run
limit, cancelling from another thread, and checks that are themselves broken."""

from __future__ import annotations

import shutil
import threading
import time
from pathlib import Path

from dojo.content.labs import Lab, load_lab, load_mutant
from dojo.runner.execute import CheckRun, RunOptions
from dojo.runner.mutants import materialised
from dojo.runner.results import CheckResult, CheckStarted, ServicesReady, ServicesStarting
from tests.runner.conftest import FIXTURES, HANG_SECONDS, IMPLS, by_check, run

SOLUTION = FIXTURES / "solutions" / "tally"
MUTANTS = FIXTURES / "labs" / "tally" / "mutants"  # overlays: materialised on the solution


def _copy_lab(content: Path) -> Lab:
    return load_lab(content / "labs" / "tally", content)


def _add_check(lab: Lab, name: str, source: str) -> None:
    (lab.checks_dir / name).write_text(source, encoding="utf-8")


def test_results_follow_the_stage_order_of_lab_yaml(content: Path) -> None:
    manifest = content / "labs" / "tally" / "lab.yaml"
    text = manifest.read_text()
    # move the persist stage first: its check module is still test_03_persist.py
    head, persist = text.split("  - id: persist\n")
    manifest.write_text(head.replace("stages:\n", "stages:\n  - id: persist\n" + persist))
    lab = _copy_lab(content)
    assert lab.stage_ids[0] == "persist"
    stages = [r.stage for r in run(lab, SOLUTION).results]
    assert stages == sorted(stages, key=lab.stage_ids.index), stages


def test_a_started_event_precedes_each_result(tally: Lab) -> None:
    events = list(CheckRun(tally, SOLUTION, RunOptions(stages=("count",))))
    kinds = [type(e).__name__ for e in events]
    assert kinds == ["ServicesReady"] + ["CheckStarted", "CheckResult"] * 2, kinds
    started, result = events[1], events[2]
    assert isinstance(started, CheckStarted) and isinstance(result, CheckResult)
    assert started.check == result.check


def test_stage_and_check_filters_run_only_what_was_asked(tally: Lab) -> None:
    assert {r.stage for r in run(tally, SOLUTION, stages=("dedupe",)).results} == {"dedupe"}
    summary = run(tally, SOLUTION, checks=("ignores_case",))
    assert [r.check for r in summary.results] == ["ignores_case"]
    assert summary.passed, "a run of one passing check passes; other stages were not asked for"


def test_stop_at_failing_stage_runs_no_later_stage(tally: Lab) -> None:
    with materialised(tally, load_mutant(MUTANTS / "case-sensitive")) as mutant:
        summary = run(tally, mutant, stop_at_failing_stage=True)
    assert {r.stage for r in summary.results} == {"count"}
    assert [s.status for s in summary.stages()] == ["fail", "not-run", "not-run"]


def test_stop_at_failing_stage_also_after_a_hang(tally: Lab) -> None:
    summary = run(tally, IMPLS / "loops", stop_at_failing_stage=True,
                  check_seconds=HANG_SECONDS)
    assert [s.status for s in summary.stages()] == ["pass", "error", "not-run"]


def test_a_first_stage_runs_before_the_others_then_the_rest_in_lab_order(tally: Lab) -> None:
    stages = [r.stage for r in run(tally, SOLUTION, first_stage="dedupe").results]
    assert list(dict.fromkeys(stages)) == ["dedupe", "count", "persist"], stages


def test_a_failing_first_stage_still_runs_the_earlier_stages_but_not_the_later(tally: Lab
                                                                               ) -> None:
    with materialised(tally, load_mutant(MUTANTS / "dedupe-by-word")) as mutant:
        summary = run(tally, mutant, stop_at_failing_stage=True, first_stage="dedupe")
    assert summary.results[0].stage == "dedupe", "the stage being worked on answers first"
    assert [s.status for s in summary.stages()] == ["pass", "fail", "not-run"], \
        "count comes before the stage being worked on, so it is checked for a regression"


def test_an_earlier_stage_that_fails_stops_the_later_ones_too(tally: Lab) -> None:
    with materialised(tally, load_mutant(MUTANTS / "case-sensitive")) as mutant:
        summary = run(tally, mutant, stop_at_failing_stage=True, first_stage="dedupe")
    assert [s.status for s in summary.stages()] == ["fail", "pass", "not-run"]


def test_after_a_hang_in_the_first_stage_the_earlier_stages_still_run(tally: Lab) -> None:
    summary = run(tally, IMPLS / "loops", stop_at_failing_stage=True, first_stage="dedupe",
                  check_seconds=HANG_SECONDS)
    assert [s.status for s in summary.stages()] == ["pass", "error", "not-run"], \
        "the checks of count run in the child started after the hang"


def test_the_run_limit_ends_the_run_and_says_what_did_not_run(tally: Lab) -> None:
    started = time.monotonic()
    # 8 s: enough for the child to start and collect on a loaded 2-core machine (3.5 s seen),
    # far below the 30 s a looping check may take
    summary = run(tally, IMPLS / "loops", check_seconds=30, run_seconds=8)
    assert time.monotonic() - started < 20
    results = by_check(summary)
    assert results["duplicate_event_counted_once"].message.startswith(
        "the whole run exceeded its 8 s limit while this check ran")
    not_run = results["saving_twice_adds_up"]
    assert not_run.status == "error" and not_run.message.startswith("not run:")
    assert len(summary.results) == 6, "every check gets a result, run or not"


def test_a_run_limit_hit_while_collecting_is_said_as_a_result(content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_00_slow_import.py", "import time\n\ntime.sleep(60)\n")
    started = time.monotonic()
    summary = run(lab, SOLUTION, check_seconds=30, run_seconds=2)
    assert time.monotonic() - started < 15
    assert [(r.check, r.status) for r in summary.results] == [("(startup)", "error")]
    assert summary.results[0].message == (
        "the whole run exceeded its 2 s limit before the checks were collected")
    assert not summary.passed


def test_cancel_from_another_thread_stops_the_run_quickly(tally: Lab) -> None:
    check_run = CheckRun(tally, IMPLS / "loops", RunOptions(check_seconds=60))
    seen: list[object] = []

    def consume() -> None:
        seen.extend(check_run)

    worker = threading.Thread(target=consume)
    worker.start()
    deadline = time.monotonic() + 20
    while not any(isinstance(e, CheckStarted) and e.stage == "dedupe" for e in seen):
        assert time.monotonic() < deadline, "the dedupe stage never started"
        time.sleep(0.05)
    cancelled_at = time.monotonic()
    check_run.cancel()
    worker.join(timeout=5)
    assert not worker.is_alive(), "iteration did not end after cancel()"
    assert time.monotonic() - cancelled_at < 2
    assert check_run.cancelled
    assert "duplicate_event_counted_once" not in by_check(check_run.summary)


def test_a_check_module_that_does_not_import_is_an_error_and_others_still_run(
        content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_broken.py", "import pytest\nimport not_a_module_anywhere\n")
    summary = run(lab, SOLUTION)
    broken = by_check(summary)["test_04_broken.py"]
    assert broken.status == "error"
    assert "could not be loaded" in broken.message and "not_a_module_anywhere" in broken.message
    assert by_check(summary)["counts_each_word"].status == "pass"


def test_a_check_without_a_stage_marker_is_an_error(content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_unmarked.py", "def test_orphan_check():\n    assert True\n")
    result = by_check(run(lab, SOLUTION))["orphan_check"]
    assert result.status == "error" and "no @pytest.mark.stage" in result.message


def test_a_skipping_check_is_an_error_never_a_pass(content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_skips.py",
               "import pytest\n\n@pytest.mark.stage('count')\ndef test_skips():\n"
               "    pytest.skip('not today')\n")
    result = by_check(run(lab, SOLUTION, stages=("count",)))["skips"]
    assert result.status == "error" and "not today" in result.message


def test_an_exception_in_learner_code_names_the_learner_line(content: Path,
                                                             tmp_path: Path) -> None:
    impl = tmp_path / "impl"
    impl.mkdir()
    source = (SOLUTION / "tally.py").read_text().replace(
        "    return dict(Counter(word.lower() for word in text.split()))",
        "    return {word: 1 / 0 for word in text.split()}")
    (impl / "tally.py").write_text(source)
    result = by_check(run(_copy_lab(content), impl, stages=("count",)))["counts_each_word"]
    assert result.status == "error"
    assert result.message.startswith("your code raised ZeroDivisionError: division by zero")
    assert "tally.py line 13, in " in result.message
    assert "return {word: 1 / 0 for word in text.split()}" in result.message


def test_an_assertion_message_arrives_without_pytest_introspection(tally: Lab) -> None:
    with materialised(tally, load_mutant(MUTANTS / "case-sensitive")) as mutant:
        result = by_check(run(tally, mutant, checks=("ignores_case",)))["ignores_case"]
    assert result.message == (
        "'Kafka', 'kafka' and 'KAFKA' are one word: counting must be case-insensitive.\n"
        "  expected {'kafka': 3}\n  got      {'Kafka': 1, 'kafka': 1, 'KAFKA': 1}")
    assert result.hint == "Split on whitespace and lower-case each word."
    assert result.lesson == "idempotent-consumer#the-idea"


def test_a_check_may_ask_for_a_longer_limit_than_the_lab(content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_slow.py",
               "import time\nimport pytest\n\n@pytest.mark.stage('count')\n"
               "@pytest.mark.check_seconds(3)\ndef test_slow_but_allowed():\n"
               "    time.sleep(1.5)\n")
    results = by_check(run(lab, SOLUTION, stages=("count",), check_seconds=1))
    assert results["slow_but_allowed"].status == "pass", results["slow_but_allowed"]


def test_checks_that_cannot_start_give_one_error_in_pytests_words(content: Path) -> None:
    lab = _copy_lab(content)
    shutil.rmtree(lab.checks_dir)
    summary = run(lab, SOLUTION)
    assert [(r.check, r.status) for r in summary.results] == [("(startup)", "error")]
    assert summary.results[0].message.startswith("the checks could not start: ")
    assert "checks" in summary.results[0].message


def test_the_services_are_resolved_once_in_the_parent_and_handed_to_the_child(
        content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_endpoints.py", '''
import os
import pytest
from dojo.services.manager import Endpoints

pytestmark = pytest.mark.stage("count")


def test_the_child_uses_the_endpoints_it_was_handed(services):
    handed = os.environ.get("DOJO_ENDPOINTS")
    assert handed, "the runner did not hand its endpoints to the child"
    assert services == Endpoints.from_json(handed)
''')
    run = CheckRun(lab, SOLUTION,
                   RunOptions(checks=("the_child_uses_the_endpoints_it_was_handed",)))
    events = list(run)
    assert run.endpoints is not None
    results = [e for e in events if isinstance(e, CheckResult)]
    assert [r.status for r in results] == ["pass"], results


def test_services_that_are_down_are_announced_before_they_start(
        tally: Lab, monkeypatch) -> None:
    from dojo.services import manager

    real = manager.status()
    stopped = [manager.ServiceStatus(s.name, s.backend, "stopped") if s.name == "kafka" else s
               for s in real]
    monkeypatch.setattr(manager, "status", lambda: stopped)
    events = list(CheckRun(tally, SOLUTION, RunOptions(stages=("count",))))
    starting, ready = events[0], events[1]
    assert isinstance(starting, ServicesStarting) and starting.services == ("kafka",)
    assert isinstance(ready, ServicesReady) and ready.started == ("kafka",)
    assert ready.seconds >= 0 and ready.backend


THOROUGH_CHECK = ("import pytest\n\n@pytest.mark.stage('count')\n@pytest.mark.thorough\n"
                  "def test_slow_scene():\n    assert True\n")


def test_a_thorough_check_runs_only_with_thorough_or_when_named(content: Path) -> None:
    lab = _copy_lab(content)
    _add_check(lab, "test_04_thorough.py", THOROUGH_CHECK)
    default = by_check(run(lab, SOLUTION, stages=("count",)))
    assert "slow_scene" not in default and default, default
    thorough = by_check(run(lab, SOLUTION, stages=("count",), thorough=True))
    assert thorough["slow_scene"].status == "pass", thorough
    assert set(thorough) == set(default) | {"slow_scene"}
    named = by_check(run(lab, SOLUTION, checks=("slow_scene",)))
    assert set(named) == {"slow_scene"} and named["slow_scene"].status == "pass", named
