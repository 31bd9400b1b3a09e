"""A pytest plugin (`-p dojo.runner.report`) that turns test reports into dojo's JSON lines.

It orders the checks by the stages of lab.yaml, keeps only the stages or checks asked for,
and writes one event per line to `--dojo-results` (a path, or `fd:N`), in the protocol of
`dojo.runner.results` (collected, started, result). A CheckFailure's fields and a
needs-backend skip's missing capabilities go into the result as data.

The runner (`dojo.runner.execute`) reads them; nobody parses pytest's terminal output.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path
from typing import IO

import pytest

from dojo.checks.failure import FailureReport
from dojo.checks.plugin import NEEDS_BACKEND, NeedsBackend
from dojo.content.labs import Lab, LabError, load_lab
from dojo.runner.failure_message import Diagnosis, clip, describe
from dojo.runner.results import (
    CheckResult,
    CheckStarted,
    Collected,
    PlannedCheck,
    ProtocolEvent,
    Status,
    encode_event,
)

PLUGIN_NAME = "dojo-report"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("dojo")
    group.addoption("--dojo-lab", default=None, help="the lab folder (for stage order and hints)")
    group.addoption("--dojo-results", default=None,
                    help="where to write JSON lines: a path, or fd:N for an open descriptor")
    group.addoption("--dojo-stage", action="append", default=[],
                    help="run only this stage (repeatable)")
    group.addoption("--dojo-check", action="append", default=[],
                    help="run only this check id (repeatable)")
    group.addoption("--dojo-stop-at-failing-stage", action="store_true", default=False,
                    help="stop after the first stage in which a check failed or errored")
    group.addoption("--dojo-thorough", action="store_true", default=False,
                    help="also run the checks marked thorough (slow scenes); a check named "
                         "with --dojo-check runs either way")
    group.addoption("--dojo-first-stage", default="",
                    help="run this stage first, then the earlier ones (they run even after "
                         "a failure), then the later ones")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "check_seconds(n): this check's own time limit, when the lab's is too short")
    config.addinivalue_line(
        "markers", "thorough: a slow scene, run only with --thorough or when named by --check")
    config.pluginmanager.register(DojoReport(config), PLUGIN_NAME)


def check_id(item: pytest.Item) -> str:
    """The check id: the test's name without the `test_` prefix (parameters kept)."""
    name = item.name
    return name[len("test_"):] if name.startswith("test_") else name


def stage_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("stage")
    return str(marker.args[0]) if marker and marker.args else ""


def _open_results(target: str | None) -> IO[str] | None:
    if not target:
        return None
    if target.startswith("fd:"):
        return os.fdopen(int(target[3:]), "w", encoding="utf-8", buffering=1)
    return open(target, "a", encoding="utf-8", buffering=1)


class DojoReport:
    """Collects each check's setup/call/teardown reports into one `CheckResult`."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        lab_dir = config.getoption("--dojo-lab")
        self.lab: Lab | None = None
        self.lab_error = ""
        if lab_dir:
            try:
                self.lab = load_lab(Path(lab_dir))
            except LabError as exc:
                self.lab_error = str(exc)
        impl = config.getoption("--dojo-impl", default=None)
        self.impl = Path(impl).resolve() if impl else None
        self.checks_dir = self.lab.checks_dir if self.lab else None
        self.out = _open_results(config.getoption("--dojo-results"))
        self.stop_at_failing_stage = bool(config.getoption("--dojo-stop-at-failing-stage"))
        self.first_stage = str(config.getoption("--dojo-first-stage") or "")
        self._diagnoses: dict[tuple[str, str], Diagnosis] = {}
        self._needs: dict[str, tuple[str, ...]] = {}  # nodeid -> capabilities the broker lacks
        self._reports: dict[str, list[pytest.TestReport]] = {}
        self._failed_stages: set[str] = set()

    def emit(self, event: ProtocolEvent) -> None:
        if self.out is not None:
            self.out.write(encode_event(event) + "\n")
            self.out.flush()

    # --- collection: order by stage, filter, announce ------------------------------------

    def _stage_rank(self, stage: str) -> int:
        """Lab order, with the first stage (when one is given) before all the others."""
        if self.first_stage and stage == self.first_stage:
            return -1
        return self._lab_index(stage)

    def _lab_index(self, stage: str) -> int:
        order = self.lab.stage_ids if self.lab else ()
        return order.index(stage) if stage in order else len(order)

    def _runs_despite_failure(self, current: str, following: str) -> bool:
        """After a failure, the checks of the same stage still run, and so do the stages up
        to the first stage."""
        return following == current or (
            bool(self.first_stage)
            and self._lab_index(following) <= self._lab_index(self.first_stage))

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config: pytest.Config,
                                      items: list[pytest.Item]) -> None:
        stages = set(config.getoption("--dojo-stage"))
        checks = set(config.getoption("--dojo-check"))
        thorough = bool(config.getoption("--dojo-thorough"))
        keep: list[pytest.Item] = []
        drop: list[pytest.Item] = []
        for item in items:
            cid = check_id(item)
            named = cid in checks or cid.split("[", 1)[0] in checks
            wanted = (not stages or stage_of(item) in stages) and (not checks or named) and (
                named or thorough or item.get_closest_marker("thorough") is None)
            (keep if wanted else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
        # sorted() is stable: inside a stage, checks keep the order they are written in
        items[:] = sorted(keep, key=lambda item: self._stage_rank(stage_of(item)))

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            # a check module that does not import is the lab's bug, reported as an error
            path = Path(str(report.fspath)).name if report.fspath else report.nodeid
            text = str(report.longrepr).strip().splitlines()
            detail = "\n".join(text[-8:])
            self._emit_result(CheckResult(
                stage="", check=path, status="error", nodeid=report.nodeid,
                message=clip(f"the checks in {path} could not be loaded:\n{detail}")))

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if self.lab_error:
            self._emit_result(CheckResult("", "lab.yaml", "error", self.lab_error))
        self.emit(Collected(tuple(PlannedCheck(item.nodeid, stage_of(item), check_id(item))
                                  for item in session.items)))

    # --- running -------------------------------------------------------------------------

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int, str]) -> None:
        self._reports[nodeid] = []

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        marker = item.get_closest_marker("check_seconds")
        limit = float(marker.args[0]) if marker and marker.args else None
        self.emit(CheckStarted(stage_of(item), check_id(item), item.nodeid, limit))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if call.excinfo is not None and isinstance(call.excinfo.value, NeedsBackend):
            self._needs[item.nodeid] = call.excinfo.value.capabilities
        elif call.excinfo is not None and not call.excinfo.errisinstance(pytest.skip.Exception):
            self._diagnoses[(item.nodeid, call.when)] = describe(
                call.excinfo.value, self.impl, self.checks_dir, call.when)
        report.user_properties.append(("dojo_stage", stage_of(item)))
        return report

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._reports.setdefault(report.nodeid, []).append(report)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None
                                ) -> Generator[None, object, object]:
        outcome = yield
        result = self._result_for(item)
        self._emit_result(result)
        if result.status in ("fail", "error"):
            self._failed_stages.add(result.stage)
        if (self.stop_at_failing_stage and self._failed_stages and nextitem is not None
                and not self._runs_despite_failure(result.stage, stage_of(nextitem))):
            failed = next(iter(sorted(self._failed_stages, key=self._stage_rank)))
            item.session.shouldstop = f"stage {failed!r} did not pass"
        return outcome

    def _emit_result(self, result: CheckResult) -> None:
        self.emit(result)

    def _result_for(self, item: pytest.Item) -> CheckResult:
        stage = stage_of(item)
        reports = self._reports.pop(item.nodeid, [])
        status, message, failure = self._verdict(item.nodeid, reports)
        needs = self._needs.pop(item.nodeid, ())
        hint = lesson = ""
        if self.lab and stage in self.lab.stage_ids:
            lab_stage = self.lab.stage(stage)
            hint, lesson = lab_stage.first_hint, lab_stage.lesson
        elif not stage:
            status, message, failure = "error", (
                "this check has no @pytest.mark.stage(...) marker, so no stage owns it "
                "(a bug in the lab; `dojo lint` names it)"), None
        duration = sum(report.duration for report in reports)
        return CheckResult(stage=stage, check=check_id(item), status=status,
                           message=message if status != "pass" else "",
                           hint=hint if status in ("fail", "error") else "", lesson=lesson,
                           duration=round(duration, 3), nodeid=item.nodeid,
                           failure=failure if status in ("fail", "error") else None,
                           needs=needs if status == "needs-backend" else ())

    def _verdict(self, nodeid: str, reports: list[pytest.TestReport]
                 ) -> tuple[Status, str, FailureReport | None]:
        """One status for setup + call + teardown: the first phase that did not pass wins,
        except that a failed cleanup after a failed call keeps the call's message."""
        for report in reports:
            if report.skipped:
                reason = _skip_reason(report)
                if nodeid in self._needs or reason.startswith(NEEDS_BACKEND):
                    return ("needs-backend", reason.removeprefix(NEEDS_BACKEND).strip(),
                            None)
                return "error", (f"the check was skipped ({reason}); a check must pass or "
                                 "fail, never skip (a bug in the lab)"), None
            if report.failed:
                diagnosis = self._diagnoses.pop((nodeid, report.when), None)
                text = diagnosis.message if diagnosis else _longrepr_tail(report)
                failure = diagnosis.failure if diagnosis else None
                if diagnosis is not None and diagnosis.kind == "infra":
                    return "infra", text, None
                if report.when == "setup":
                    # a check's verdict raised by a fixture (schema.sql refused, a stub the
                    # fixture called) is the learner's failure, not the lab's error
                    if failure is not None:
                        return "fail", text, failure
                    return "error", f"the check could not be prepared: {text}", None
                if report.when == "teardown":
                    return ("error", f"the check passed, but cleaning up after it failed: "
                                     f"{text}", None)
                kind: Status = "fail" if diagnosis is None or diagnosis.kind == "fail" \
                    else "error"
                return kind, text, failure
        if not any(r.when == "call" for r in reports):
            return "error", "the check did not run", None
        return "pass", "", None

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        if self.out is not None:
            self.out.close()
            self.out = None


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        reason = str(longrepr[2])
        if NEEDS_BACKEND in reason:     # a NeedsBackend raised in the call: "<class>: ..."
            return reason[reason.index(NEEDS_BACKEND):]
        return reason[len("Skipped: "):] if reason.startswith("Skipped: ") else reason
    return str(longrepr)


def _longrepr_tail(report: pytest.TestReport) -> str:
    lines = str(report.longrepr).strip().splitlines()
    return clip("\n".join(lines[-6:]))
