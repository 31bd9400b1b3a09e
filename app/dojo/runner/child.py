"""The child process that runs a lab's checks: `python -m dojo.runner.child …`.

Learner code runs here, never in the TUI or CLI process. The parent (`dojo.runner.execute`)
reads the JSON lines `dojo.runner.report` writes to `--results`, enforces the time limits,
and on a hang sends SIGUSR1 first so faulthandler writes where the code was stuck to
`--trace-file` before the process group is killed.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def pytest_args(args: argparse.Namespace, ini: Path) -> list[str]:
    """pytest's command line: only dojo's plugins, a private ini so that no project's
    pyproject/addopts applies, and the checks (or the given node ids) of one lab."""
    checks = Path(args.lab).resolve() / "checks"
    argv = [
        "-c", str(ini), "--rootdir", str(checks), "--confcutdir", str(checks),
        # faulthandler: pytest's plugin would take over the dump file this process set up;
        # unraisableexception: its gc.collect() rounds at exit cost time and report nothing
        # a check reads
        "-p", "no:cacheprovider", "-p", "no:faulthandler", "-p", "no:unraisableexception",
        "-p", "dojo.checks.plugin", "-p", "dojo.runner.report",
        "--dojo-impl", str(Path(args.impl).resolve()), "--dojo-lab", str(args.lab),
        "--dojo-results", args.results, "--continue-on-collection-errors",
        "-q", "--no-header", "-rN", "--tb=no",
    ]
    for stage in args.stage:
        argv += ["--dojo-stage", stage]
    for check in args.check:
        argv += ["--dojo-check", check]
    if args.stop_at_failing_stage:
        argv.append("--dojo-stop-at-failing-stage")
    if args.first_stage:
        argv += ["--dojo-first-stage", args.first_stage]
    if args.thorough:
        argv.append("--dojo-thorough")
    # node ids are relative to the checks folder; pytest resolves arguments against cwd
    argv += [str(checks / nodeid) for nodeid in args.nodeids] or [str(checks)]
    return argv


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m dojo.runner.child")
    parser.add_argument("--lab", required=True, help="labs/<slug>/ folder")
    parser.add_argument("--impl", required=True, help="the learner code under test")
    parser.add_argument("--results", required=True, help="fd:N or a path for the JSON lines")
    parser.add_argument("--trace-file", required=True, help="faulthandler writes here")
    parser.add_argument("--stage", action="append", default=[])
    parser.add_argument("--check", action="append", default=[])
    parser.add_argument("--stop-at-failing-stage", action="store_true")
    parser.add_argument("--first-stage", default="", help="run this stage's checks first")
    parser.add_argument("--thorough", action="store_true", help="also the slow thorough checks")
    parser.add_argument("nodeids", nargs="*", help="run only these checks (after a restart)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the checks; exits with pytest's code, without waiting for stray learner threads."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    # the file stays open for the life of the process: faulthandler writes to its descriptor,
    # which pytest's output capturing does not redirect (it does redirect fd 2)
    trace = open(args.trace_file, "a", encoding="utf-8")  # noqa: SIM115
    faulthandler.enable(file=trace, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=trace, all_threads=True)
    from dojo.runner.limits import die_with_descendants

    die_with_descendants()
    from dojo.runner.ledger import LEDGER_ENV
    from dojo.runner.sandbox import enter

    # before pytest imports the checks, so that no learner code runs outside the sandbox
    print(enter(Path(args.lab).resolve(), Path(args.impl).resolve(),
                os.environ.get(LEDGER_ENV)), flush=True)

    # Only dojo's plugins: pytest plugins that happen to be installed (a snapshot plugin that
    # imports textual, syrupy, anyio ...) cost seconds per child and could change how the
    # checks run on one machine and not another.
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    import pytest

    with tempfile.TemporaryDirectory(prefix="dojo-child-") as scratch:
        ini = Path(scratch) / "pytest.ini"
        ini.write_text("[pytest]\n", encoding="utf-8")
        code = int(pytest.main(pytest_args(args, ini)))
    sys.stdout.flush()
    sys.stderr.flush()
    trace.flush()
    # a non-daemon thread the learner started would keep the interpreter alive at exit
    os._exit(code)


if __name__ == "__main__":
    main()
