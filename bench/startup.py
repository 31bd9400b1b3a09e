"""Start-up benchmark: from launching `dojo` to its first rendered frame, median of N runs;
then the command line's own start-up (`dojo --help`, `dojo --version`).

    python bench/startup.py [--runs 7] [--size 80x24] [--cli-only]

Each run starts the console script in a pseudo-terminal with DOJO_TUI_FIRST_FRAME set: the
app writes the wall-clock time of its first frame, then the time Home shows the lessons
(catalog, progress and FSRS loaded in a worker), and exits. Services are not started. The
progress database lives in a private data dir, created by one warm-up run first (as for a
learner who has run dojo before). The CLI commands run with their output to a pipe, as in a
script. Prints numbers against the targets; asserts nothing.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import termios
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_FIRST_FRAME = 0.5
TARGET_CLI_HELP = 0.5  # a --help that takes seconds feels broken
CLI_COMMANDS = (("--help",), ("--version",))


def dojo_command() -> list[str]:
    script = REPO / ".venv" / "bin" / "dojo"
    if script.exists():
        return [str(script)]
    found = shutil.which("dojo")
    return [found] if found else [sys.executable, "-m", "dojo"]


def one_run(size: tuple[int, int], data_dir: Path) -> dict[str, float]:
    """Seconds from spawn to each mark the app wrote."""
    with tempfile.TemporaryDirectory(prefix="dojo-startup-") as tmp:
        marks = Path(tmp) / "marks"
        main, child = pty.openpty()
        columns, rows = size
        fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        env = {**os.environ, "DOJO_TUI_FIRST_FRAME": str(marks), "DOJO_DATA_DIR": str(data_dir),
               "TERM": os.environ.get("TERM", "xterm-256color")}
        started = time.time()
        proc = subprocess.Popen(dojo_command(), stdin=child, stdout=child, stderr=child,
                                env=env, close_fds=True)
        os.close(child)
        try:
            while proc.poll() is None:  # drain the terminal so the app never blocks writing
                try:
                    if not os.read(main, 65536):
                        break
                except OSError:
                    break
            proc.wait(timeout=30)
        finally:
            os.close(main)
            if proc.poll() is None:
                proc.kill()
        found = {}
        for line in marks.read_text(encoding="utf-8").splitlines():
            name, stamp = line.split()
            found[name] = float(stamp) - started
        return found


def cli_seconds(arguments: tuple[str, ...]) -> float:
    """Wall-clock seconds for one `dojo ARGUMENTS` run, output to a pipe."""
    started = time.perf_counter()
    subprocess.run([*dojo_command(), *arguments], stdout=subprocess.PIPE,
                   stderr=subprocess.PIPE, check=True, timeout=60)
    return time.perf_counter() - started


def report_cli(runs: int) -> None:
    print(f"dojo command line, {runs} runs each, output to a pipe")
    print(f"{'':<28}{'median':>8}{'min':>8}{'max':>8}{'target':>9}")
    for arguments in CLI_COMMANDS:
        cli_seconds(arguments)  # warm-up: byte-code caches
        values = [cli_seconds(arguments) for _ in range(runs)]
        median = statistics.median(values)
        verdict = " ok" if median <= TARGET_CLI_HELP else " SLOW"
        print(f"{'dojo ' + ' '.join(arguments):<28}{median:>7.3f}s{min(values):>7.3f}s"
              f"{max(values):>7.3f}s{TARGET_CLI_HELP:>7.2f} s{verdict}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--size", default="80x24", help="terminal size, COLSxROWS")
    parser.add_argument("--cli-only", action="store_true", help="only the command line")
    args = parser.parse_args()
    if args.cli_only:
        report_cli(args.runs)
        return 0
    columns, rows = (int(part) for part in args.size.split("x"))
    with tempfile.TemporaryDirectory(prefix="dojo-startup-data-") as data:
        data_dir = Path(data)
        one_run((columns, rows), data_dir)  # warm-up: creates the progress database
        runs = [one_run((columns, rows), data_dir) for _ in range(args.runs)]
    print(f"dojo start-up, {args.runs} runs in a {columns}×{rows} pty, services not started")
    print(f"{'':<28}{'median':>8}{'min':>8}{'max':>8}{'target':>9}")
    for name, label, target in (("frame", "first frame", TARGET_FIRST_FRAME),
                                ("ready", "Home with lessons loaded", None)):
        values = [run[name] for run in runs if name in run]
        if not values:
            print(f"{label:<28}{'(no mark)':>8}")
            continue
        median = statistics.median(values)
        verdict = "" if target is None else (" ok" if median <= target else " SLOW")
        goal = f"{target:.2f} s" if target else ""
        print(f"{label:<28}{median:>7.3f}s{min(values):>7.3f}s{max(values):>7.3f}s"
              f"{goal:>9}{verdict}")
    print()
    report_cli(args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
