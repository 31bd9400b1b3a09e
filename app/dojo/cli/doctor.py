"""`dojo doctor [--json]`: is this machine ready? Each finding says what to fix.

Checks Python, the services (recorded and live), the ports they use, Java and Maven for the
Apache Kafka backend, the sandbox mode check children run under, disk space where dojo writes,
and the content lint. Exit 1 when something is broken; warnings alone exit 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

MIN_PYTHON = (3, 11)  # an interpreter other than the venv's may run this module
MIN_FREE_BYTES = 1 << 30  # an Apache Kafka jar cache and a PostgreSQL cluster need room


@dataclass(frozen=True)
class Finding:
    """One check: `level` is ok | warn | broken; `fix` says what to do when it is not ok."""

    area: str
    level: str
    what: str
    fix: str = ""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("doctor", help="check this machine is ready and say what to fix",
                            description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="one JSON object per finding")
    parser.set_defaults(handler=run_doctor)


def _python() -> Iterator[Finding]:
    version = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:2] >= MIN_PYTHON:
        yield Finding("python", "ok", f"Python {version} at {sys.executable}")
    else:
        yield Finding("python", "broken", f"Python {version} is older than 3.11",
                      "install Python 3.11 or newer and recreate .venv (`make clean run`)")


def _services() -> Iterator[Finding]:
    from dojo.services.manager import status

    for service in status():
        where = f"{service.name} ({service.backend})"
        if service.state in ("up", "external"):
            yield Finding("services", "ok", f"{where} {service.state} at {service.url}")
        elif service.state == "stopped":
            yield Finding("services", "warn", f"{where} is not running",
                          "`dojo services up` (checks also start it on demand)")
        else:
            yield Finding("services", "broken", f"{where} is {service.state}: {service.detail}",
                          "`dojo services up`" if service.backend != "external"
                          else "start the server the environment variable names")


def _ports() -> Iterator[Finding]:
    import psutil

    from dojo.services.state import load_records

    for record in load_records().values():
        if not record.is_alive():
            continue
        try:
            owners = {c.pid for c in psutil.net_connections("tcp")
                      if c.laddr and c.laddr.port == record.port and c.status == "LISTEN"}
        except psutil.Error:
            continue
        if owners and owners - {record.pid} and record.pid not in owners:
            yield Finding("ports", "broken",
                          f"port {record.port} of {record.name} is held by pid "
                          f"{', '.join(map(str, sorted(owners)))}, not by dojo's {record.pid}",
                          "stop that process, or `dojo services down && dojo services up`")
        else:
            yield Finding("ports", "ok", f"{record.name} listens on 127.0.0.1:{record.port}")


def _java() -> Iterator[Finding]:
    java, mvn = shutil.which("java"), shutil.which("mvn")
    fix = ("install Java 17+ and Maven to use `dojo services up --kafka apache` "
           "(Tansu needs neither)")
    if not java:
        yield Finding("apache-kafka", "warn", "no `java` on PATH", fix)
        return
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=20)
        first = (out.stderr or out.stdout).strip().splitlines()[0]
    except (OSError, subprocess.TimeoutExpired, IndexError):
        first = "java -version gave no answer"
    yield Finding("apache-kafka", "ok", f"{first} ({java})")
    if not mvn:
        yield Finding("apache-kafka", "warn", "no `mvn` on PATH", fix)
    else:
        yield Finding("apache-kafka", "ok", f"Maven at {mvn}")


def _sandbox() -> Iterator[Finding]:
    from dojo.runner.limits import Limits, sandbox_mode

    mode, why = sandbox_mode()
    limits = Limits()
    text = (f"check children run under {mode}, not cgroup v2 ({why})" if mode == "rlimits"
            else f"cgroup v2 is available ({why})")
    yield Finding("sandbox", "ok", f"{text}; rlimits in force: memory "
                  f"{limits.describe_memory()}, CPU {limits.cpu_seconds} s, "
                  f"files {limits.file_bytes >> 20} MiB")
    from dojo.runner.sandbox import file_sandbox

    enforced, why = file_sandbox()
    if enforced:
        yield Finding("sandbox", "ok", f"file sandbox on: {why}")
    else:
        yield Finding("sandbox", "warn", f"file sandbox off: {why}; learner code can open "
                      "any file this user can (the progress store, the services' state)")


def _disk() -> Iterator[Finding]:
    from dojo.services.paths import cache_dir, state_dir
    from dojo.store.paths import data_dir

    for label, path in (("state", state_dir()), ("cache", cache_dir()), ("data", data_dir())):
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent
        free = shutil.disk_usage(probe).free
        if free < MIN_FREE_BYTES:
            yield Finding("disk", "broken", f"{free >> 20} MiB free for the {label} dir {path}",
                          "free some space (a PostgreSQL cluster and the jar cache need ~1 GiB)")
        else:
            yield Finding("disk", "ok", f"{free >> 30} GiB free for the {label} dir {path}")


def _content() -> Iterator[Finding]:
    from dojo.cli.lint import _lab_linter
    from dojo.content import content_root, lint_lessons

    root = content_root()
    problems = lint_lessons(root)
    lint_labs = _lab_linter()
    if lint_labs is not None:
        problems += lint_labs(root)
    if problems:
        first = problems[0]
        yield Finding("content", "broken",
                      f"{len(problems)} content problem(s), first {first.path}:{first.line}: "
                      f"{first.message}", "`dojo lint` lists them all")
    else:
        yield Finding("content", "ok", f"lessons and labs under {root} lint clean")


CHECKS: tuple[Callable[[], Iterator[Finding]], ...] = (
    _python, _services, _ports, _java, _sandbox, _disk, _content)


def diagnose() -> list[Finding]:
    """Every finding; a check that itself crashes is a broken finding, not a traceback."""
    findings: list[Finding] = []
    for check in CHECKS:
        area = check.__name__.lstrip("_")
        try:
            findings.extend(check())
        except Exception as exc:  # noqa: BLE001 - the doctor reports, it never dies
            findings.append(Finding(area, "broken", f"the {area} check failed: {exc}",
                                    "report this; `dojo services status` may say more"))
    return findings


def run_doctor(args: argparse.Namespace) -> int:
    findings = diagnose()
    if args.json:
        for finding in findings:
            print(json.dumps(asdict(finding)))
    else:
        mark = {"ok": "ok  ", "warn": "warn", "broken": "FIX "}
        for finding in findings:
            print(f"{mark[finding.level]} {finding.area:<13} {finding.what}")
            if finding.fix and finding.level != "ok":
                print(f"     {'':<13} -> {finding.fix}")
    broken = sum(f.level == "broken" for f in findings)
    print(f"{broken} broken, {sum(f.level == 'warn' for f in findings)} warning(s)",
          file=sys.stderr)
    return 1 if broken else 0

