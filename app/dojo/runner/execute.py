"""Run a lab's checks against a directory of learner code, streaming typed results.

Usage, from the CLI or a TUI worker thread:

    run = CheckRun(lab, impl_dir, RunOptions(stop_at_failing_stage=True))
    for event in run:            # ServicesStarting/ServicesReady first, then CheckStarted
        ...                      # and CheckResult per check, in stage order
    run.summary                  # RunSummary of every result so far
    run.cancel()                 # from any thread: the child is killed, iteration ends

The services are resolved once per run, here in the parent (started if they are down, with
`ServicesStarting` / `ServicesReady` around the wait), and handed to every child in
DOJO_ENDPOINTS: a child never resolves them again.

One child process runs the whole selection. When a check hangs past its limit, or the child
dies under it, that check is reported as an error and a new child runs the checks that
remain. The runner never hangs or dies with the learner's code.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dojo.content.lab_checks import scan_checks
from dojo.content.labs import Lab
from dojo.runner.child_process import ChildProcess, describe_exit
from dojo.runner.ledger import drop_recorded, new_ledger
from dojo.runner.limits import Limits, lab_limits
from dojo.runner.results import (
    CheckResult,
    CheckStarted,
    Collected,
    RunEvent,
    RunSummary,
    ServicesReady,
    ServicesStarting,
    decode_event,
)
from dojo.services.manager import Endpoints

POLL_SECONDS = 0.2  # how soon cancel() takes effect
STARTUP_SECONDS = 60.0  # interpreter + pytest + collection, before the first check starts
EXIT_GRACE_SECONDS = 10.0  # after the last result, for session teardown to finish
THOROUGH_EXTRA_SECONDS = 180.0  # added to the lab's run limit when the thorough checks run


@dataclass(frozen=True)
class RunOptions:
    """What to run and how long it may take. Limits default to the lab's time_limits.

    `first_stage` (watch mode: the stage being worked on) runs before the others, then the
    stages before it in lab order, then those after. With `stop_at_failing_stage` the stages
    up to `first_stage` always run (a failure there may come from an earlier stage the last
    edit broke); a failure stops only the stages after it.

    `thorough` adds the checks marked `@pytest.mark.thorough`: slow scenes (a transaction held
    past a minute) a default run leaves out. A check named in `checks` runs either way.
    """

    stages: tuple[str, ...] = ()
    checks: tuple[str, ...] = ()
    stop_at_failing_stage: bool = False
    first_stage: str = ""
    thorough: bool = False
    check_seconds: float | None = None
    run_seconds: float | None = None
    start_services: bool = True


@dataclass
class _Planned:
    nodeid: str
    stage: str
    check: str


@dataclass
class _InFlight:
    planned: _Planned
    since: float
    limit: float


@dataclass
class _ChildEnding:
    """How a child stopped: `reason` is done | hung | crashed | run-limit | cancelled | stalled."""

    reason: str
    in_flight: _InFlight | None = None
    detail: str = ""
    progressed: bool = False


def runs_despite_failure(lab: Lab, options: RunOptions, stage: str) -> bool:
    """Whether `stage` still runs after another stage failed: the stages up to
    `options.first_stage` (in lab order) do."""
    first = options.first_stage
    order = lab.stage_ids
    return bool(first) and first in order and stage in order and \
        order.index(stage) <= order.index(first)


def hang_message(seconds: float, where: str) -> str:
    text = (f"your code did not finish within {seconds:g} s (infinite loop? blocked on a lock "
            "or a poll without timeout?)")
    return text + (f"\nIt was running {where}" if where else "")


@dataclass
class CheckRun:
    """One run of `lab`'s checks against `impl`; iterate it to run it (see module docs)."""

    lab: Lab
    impl: Path
    options: RunOptions = field(default_factory=RunOptions)

    def __post_init__(self) -> None:
        self.impl = self.impl.resolve()
        wanted = self.options.stages or self.lab.stage_ids
        self.summary = RunSummary(tuple(s for s in self.lab.stage_ids if s in wanted))
        self._cancelled = threading.Event()
        self._child: ChildProcess | None = None
        self._plan: list[_Planned] | None = None  # known once the first child collected
        self._done: set[str] = set()
        self.check_seconds = self.options.check_seconds or self.lab.time_limits.check_seconds
        self.run_seconds = self.options.run_seconds or self.lab.time_limits.run_seconds
        if self.options.thorough and not self.options.run_seconds:
            self.run_seconds += THOROUGH_EXTRA_SECONDS
        self.endpoints: Endpoints | None = None  # resolved once, handed to every child

    def cancel(self) -> None:
        """Stop the run from any thread: the child is killed and iteration ends."""
        self._cancelled.set()
        child = self._child
        if child is not None:
            child.kill()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def _result(self, result: CheckResult) -> CheckResult:
        self.summary.add(result)
        if result.nodeid:
            self._done.add(result.nodeid)
        return result

    def _error(self, planned: _Planned, message: str, duration: float = 0.0) -> CheckResult:
        stage = self.lab.stage(planned.stage) if planned.stage in self.lab.stage_ids else None
        return self._result(CheckResult(
            stage=planned.stage, check=planned.check, status="error", message=message,
            hint=stage.first_hint if stage else "", lesson=stage.lesson if stage else "",
            duration=round(duration, 3), nodeid=planned.nodeid))

    def _remaining(self) -> list[_Planned]:
        return [p for p in (self._plan or []) if p.nodeid not in self._done]

    def _stopping(self) -> bool:
        """With stop_at_failing_stage: a stage already failed, so later ones do not run."""
        return self.options.stop_at_failing_stage and any(
            s.status in ("fail", "error") for s in self.summary.stages())

    def __iter__(self) -> Iterator[RunEvent]:
        if self.options.start_services and self.lab.services:
            down = _services_down()
            if down:
                yield ServicesStarting(down)
            started = time.monotonic()
            endpoints, failure = _prepare_services()
            if endpoints is None:
                yield self._result(CheckResult("", "services", "error", failure))
                return
            self.endpoints = endpoints
            yield ServicesReady(round(time.monotonic() - started, 3), down,
                                endpoints.kafka_backend)
        deadline = time.monotonic() + self.run_seconds  # a slow service start is not the run's
        scratch = Path(tempfile.mkdtemp(prefix="dojo-run-"))
        ledger = new_ledger()
        try:
            serial = 0
            nodeids: list[str] = []
            while not self.cancelled:
                serial += 1
                self._child = ChildProcess.spawn(self._child_args(nodeids), scratch, serial,
                                                 _limits_of(self.lab), ledger, self.endpoints)
                ending = yield from self._follow(self._child, deadline)
                self._child.close()
                drop_recorded(ledger)  # what a killed or crashed child could not drop
                if ending.reason == "cancelled":
                    return
                if ending.reason == "done":
                    if self._plan is None:
                        yield self._result(CheckResult(
                            "", "(startup)", "error", _startup_failure(ending.detail)))
                    elif not self._stopping():
                        yield from self._not_run(
                            ending.detail or "the test process ended before this check")
                    return
                if ending.reason == "run-limit":
                    yield from self._run_limit_hit(ending)
                    return
                if ending.reason == "stalled" and not ending.progressed:
                    yield from self._not_run(ending.detail)
                    return
                remaining = self._remaining()
                if self.options.stop_at_failing_stage and ending.in_flight:
                    stage = ending.in_flight.planned.stage
                    remaining = [p for p in remaining if p.stage == stage
                                 or runs_despite_failure(self.lab, self.options, p.stage)]
                if not remaining:
                    return
                nodeids = [p.nodeid for p in remaining]
        finally:
            if self._child is not None:
                self._child.close()
            drop_recorded(ledger)
            shutil.rmtree(scratch, ignore_errors=True)

    def _child_args(self, nodeids: list[str]) -> list[str]:
        args = ["--lab", str(self.lab.dir), "--impl", str(self.impl)]
        if self.options.first_stage:
            args += ["--first-stage", self.options.first_stage]
        if self.options.thorough:
            args.append("--thorough")  # before the restart's node ids: they pass the same filter
        if nodeids:
            return [*args, *nodeids]  # a restart: exactly these, already filtered
        for stage in self.options.stages:
            args += ["--stage", stage]
        for check in self.options.checks:
            args += ["--check", check]
        if self.options.stop_at_failing_stage:
            args.append("--stop-at-failing-stage")
        return args

    def _follow(self, child: ChildProcess, run_deadline: float
                ) -> Generator[RunEvent, None, _ChildEnding]:
        """Relay the child's events until it ends; return how it ended (`_ChildEnding`)."""
        in_flight: _InFlight | None = None
        collected = self._plan is not None
        last_event = time.monotonic()
        progressed = False
        while True:
            if self.cancelled:
                return _ChildEnding("cancelled")
            now = time.monotonic()
            if in_flight is not None:
                limit_at = in_flight.since + in_flight.limit
            elif not collected:
                limit_at = child.started + max(STARTUP_SECONDS, self.check_seconds)
            else:
                limit_at = last_event + max(EXIT_GRACE_SECONDS, self.check_seconds)
            if now >= run_deadline:
                return _ChildEnding("run-limit", in_flight, progressed=progressed,
                                    detail=child.where_stuck(self.impl))
            if now >= limit_at:
                where = child.where_stuck(self.impl)
                if in_flight is not None:
                    yield self._error(in_flight.planned, hang_message(in_flight.limit, where),
                                      now - in_flight.since)
                    return _ChildEnding("hung", in_flight, progressed=True)
                if not collected:
                    return _ChildEnding("done", detail=(
                        f"collecting the checks did not finish within "
                        f"{max(STARTUP_SECONDS, self.check_seconds):g} s"
                        + (f"; it was running {where}" if where else "")))
                return _ChildEnding("stalled", progressed=progressed,
                                    detail="the test process stopped responding between checks")
            if child.finished:
                if in_flight is not None:
                    detail = describe_exit(child.exit_code)
                    crash_at = _crash_location(child, self.impl)
                    yield self._error(in_flight.planned,
                                      detail + (f"\nIt was running {crash_at}" if crash_at else ""),
                                      now - in_flight.since)
                    return _ChildEnding("crashed", in_flight, progressed=True)
                if not collected:  # pytest itself could not start: its own words say why
                    return _ChildEnding("done", detail=child.output_tail()
                                        or describe_exit(child.exit_code))
                return _ChildEnding("done", progressed=progressed, detail=_exit_detail(child))
            timeout = min(POLL_SECONDS, limit_at - now, run_deadline - now)
            for raw in child.read_events(timeout):
                last_event = time.monotonic()
                try:
                    event = decode_event(raw)
                except ValueError:
                    continue  # not ours (a learner's print cannot reach this pipe, but still)
                if isinstance(event, Collected):
                    collected = True
                    if self._plan is None:
                        self._plan = [_Planned(c.nodeid, c.stage, c.check)
                                      for c in event.checks]
                        if self.options.checks:  # only the stages those checks belong to
                            stages_planned = {p.stage for p in self._plan}
                            self.summary.stage_order = tuple(
                                s for s in self.summary.stage_order if s in stages_planned)
                elif isinstance(event, CheckStarted):
                    planned = _Planned(event.nodeid, event.stage, event.check)
                    in_flight = _InFlight(planned, last_event, event.limit or self.check_seconds)
                    yield event
                elif isinstance(event, CheckResult):
                    progressed = True
                    in_flight = None
                    yield self._result(event)

    def _not_run(self, reason: str) -> Iterator[CheckResult]:
        """Every planned check still without a result gets one that says why."""
        for planned in self._remaining():
            yield self._error(planned, f"not run: {reason}")

    def _run_limit_hit(self, ending: _ChildEnding) -> Iterator[CheckResult]:
        limit = f"the whole run exceeded its {self.run_seconds:g} s limit"
        if self._plan is None:  # no check known yet: the run itself gets the result
            yield self._result(CheckResult("", "(startup)", "error",
                                           f"{limit} before the checks were collected"))
            return
        if ending.in_flight is not None:
            where = f"\nIt was running {ending.detail}" if ending.detail else ""
            yield self._error(ending.in_flight.planned, f"{limit} while this check ran{where}",
                              time.monotonic() - ending.in_flight.since)
        yield from self._not_run(limit)


def _crash_location(child: ChildProcess, impl: Path) -> str:
    from dojo.runner.child_process import learner_frame

    return learner_frame(child.trace_text(), impl)


def _exit_detail(child: ChildProcess) -> str:
    code = child.exit_code
    return "" if code in (0, 1, 2, 5) else describe_exit(code)


def _startup_failure(detail: str) -> str:
    return f"the checks could not start: {detail or 'the test process ended at once'}"


def _services_down() -> tuple[str, ...]:
    """The services that are neither external nor running (what resolve() will start)."""
    from dojo.services.errors import ServiceError
    from dojo.services.manager import status

    try:
        return tuple(s.name for s in status() if s.state not in ("up", "external"))
    except ServiceError:
        return ("postgres", "kafka")  # a broken state file: resolve() says what is wrong


def _prepare_services() -> tuple[Endpoints | None, str]:
    """Resolve (and start, if need be) PostgreSQL and Kafka now, once for the whole run, so
    their start-up time never counts against a check. Returns (the endpoints, "") or
    (None, what went wrong)."""
    from dojo.services.errors import ServiceError
    from dojo.services.manager import resolve

    try:
        return resolve(start=True), ""
    except ServiceError as exc:
        return None, f"the services this lab needs could not start: {exc}"


def _limits_of(lab: Lab) -> Limits:
    """The lab's `limits:` from lab.yaml (memory_mb, processes, file_mb, cpu_seconds)."""
    import yaml

    try:
        raw = yaml.safe_load((lab.dir / "lab.yaml").read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return Limits()
    return lab_limits(raw.get("limits") if isinstance(raw, dict) else None)


def run_checks(lab: Lab, impl: Path, options: RunOptions | None = None,
               on_event: Callable[[RunEvent], None] | None = None) -> RunSummary:
    """Run to the end (blocking) and return the summary; `on_event` sees every event."""
    run = CheckRun(lab, impl, options or RunOptions())
    for event in run:
        if on_event is not None:
            on_event(event)
    return run.summary


def left_out_thorough(lab: Lab, options: RunOptions, summary: RunSummary) -> tuple[str, ...]:
    """`stage/check` of every thorough check of the stages `summary` ran that `options` left
    out (none when the run was thorough, or named its checks)."""
    if options.thorough or options.checks:
        return ()
    ran = {r.check_id for r in summary.results}
    stages = {r.stage for r in summary.results}
    return tuple(f"{c.stage}/{c.id}" for c in scan_checks(lab.checks_dir).checks
                 if c.thorough and c.stage in stages and c.id not in ran)
