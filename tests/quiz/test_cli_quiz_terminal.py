"""`dojo quiz` on a real terminal (a pty): the countdown ticks and a time-out keeps the text."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from tests.quiz.cli_helpers import dojo_env


class Terminal:
    """`dojo` running on the slave side of a pty; the test types on the master side."""

    def __init__(self, args: list[str], data_dir: Path) -> None:
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.master = master
        self.process = subprocess.Popen([sys.executable, "-m", "dojo.cli", *args],
                                        stdin=slave, stdout=slave, stderr=slave,
                                        env=dojo_env(data_dir), start_new_session=True)
        os.close(slave)
        self.output = ""

    def read_until(self, text: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; the screen had:\n{self.output[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.1))
            if ready:
                try:
                    self.output += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    continue
        return self.output

    def type(self, text: str) -> None:
        os.write(self.master, text.encode())

    def close(self) -> int:
        try:
            return self.process.wait(timeout=15)
        finally:
            os.close(self.master)


def test_the_countdown_ticks_and_a_time_out_keeps_the_half_typed_line(tmp_path: Path) -> None:
    terminal = Terminal(["quiz", "-n", "1", "--seconds", "3"], tmp_path)
    try:
        terminal.read_until("⏱ 3s")
        terminal.type("When the database is down we pause consumption")  # no Enter
        terminal.read_until("⏱ 1s")  # the timer line was redrawn as time passed
        terminal.read_until("Time is up.")
        terminal.read_until("Enter keeps them: ")  # the checklist: keep the scorer's ticks
        terminal.type("\r")
        terminal.read_until("[Enter = ")
        terminal.type("3")
        screen = terminal.read_until("1 answered")
    finally:
        code = terminal.close()
    assert code == 0
    assert "✓ When a dependency is down, pause consumption" in screen
    assert "→ 3 Good" in screen


def test_an_empty_line_sends_the_answer_and_backspace_edits_it(tmp_path: Path) -> None:
    terminal = Terminal(["quiz", "-n", "1", "--seconds", "60"], tmp_path)
    try:
        terminal.read_until("⏱ 60s")
        terminal.type("We retry with exponential backoffXX\x7f\x7f\r")
        terminal.type("\r")
        terminal.read_until("Enter keeps them: ")
        terminal.type("\r")
        screen = terminal.read_until("[Enter = ")
        terminal.type("\r")
        screen = terminal.read_until("1 answered")
    finally:
        code = terminal.close()
    assert code == 0
    assert "Time is up" not in screen
    assert "✓ Transient failures are retried a few times with backoff" in screen
