"""A real terminal: `dojo` (the console script) in tmux at 80×24, driven with send-keys and
read back with capture-pane."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.tui.conftest import REPO

TMUX = shutil.which("tmux")
pytestmark = pytest.mark.skipif(TMUX is None, reason="tmux is not installed")


def dojo_command() -> list[str]:
    script = REPO / ".venv" / "bin" / "dojo"
    if script.exists():
        return [str(script)]
    found = shutil.which("dojo")
    return [found] if found else [sys.executable, "-m", "dojo"]


class Terminal:
    def __init__(self, name: str) -> None:
        self.name = name
        self.pid_file = Path()

    def tmux(self, *args: str) -> str:
        assert TMUX is not None
        done = subprocess.run([TMUX, *args], capture_output=True, text=True, timeout=10)
        return done.stdout

    def keys(self, *keys: str) -> None:
        for key in keys:
            self.tmux("send-keys", "-t", self.name, key)
            time.sleep(0.05)

    def screen(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.name)

    def wait_for(self, text: str, timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        screen = ""
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} did not appear within {timeout} s; the screen:\n"
                             f"{screen}")


@pytest.fixture
def start_dojo(content_root: Path, data_dir: Path, tmp_path: Path
               ) -> Iterator[Callable[[], Terminal]]:
    """Start `dojo` in a new tmux session (80×24); each call is a fresh process, its pid
    in `terminal.pid_file`. Every session is killed at the end, by name."""
    started: list[Terminal] = []
    env = {"DOJO_DATA_DIR": str(data_dir), "DOJO_CONTENT_ROOT": str(content_root),
           "TERM": "xterm-256color"}
    exports = " ".join(f"{key}={value}" for key, value in env.items())

    def start() -> Terminal:
        terminal = Terminal(f"dojo-test-{uuid.uuid4().hex[:8]}")
        terminal.pid_file = tmp_path / f"{terminal.name}.pid"
        command = " ".join(shlex.quote(part) for part in dojo_command())
        script = (f"env {exports} sh -c 'echo $$ > {terminal.pid_file}; exec {command}'; "
                  "echo dojo-exited-$?; sleep 30")
        assert TMUX is not None
        subprocess.run([TMUX, "new-session", "-d", "-s", terminal.name, "-x", "80", "-y", "24",
                        script], check=True, timeout=10)
        started.append(terminal)
        return terminal

    yield start
    for terminal in started:
        subprocess.run([TMUX, "kill-session", "-t", terminal.name], capture_output=True,
                       timeout=10)


def test_dojo_opens_home_reads_a_lesson_searches_and_quits(
        start_dojo: Callable[[], Terminal]) -> None:
    terminal = start_dojo()
    home = terminal.wait_for("Dead letter queues")
    assert "Lessons" in home and "Services" in home and "Continue" in home
    assert "wordcount" in home, "the labs are listed on Home"
    terminal.keys("Enter")
    lesson = terminal.wait_for("The 60-second answer")
    assert "What is a dead letter queue?" in lesson
    assert "Search" in lesson and "Contents" in lesson, "the footer shows the lesson's keys"
    terminal.keys("/", "poison", "Enter")
    assert "/poison  1 of" in terminal.wait_for("/poison")
    terminal.keys("Escape")  # the first Esc clears the search, the second leaves
    deadline = time.monotonic() + 15
    while "/poison" in terminal.screen() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "/poison" not in terminal.screen(), "Esc clears the search from the status line"
    terminal.keys("Escape")
    terminal.wait_for("Lesson · Dead letter")  # Home: continue where you left off
    terminal.keys("?")
    terminal.wait_for("Everywhere")
    terminal.keys("Escape")
    time.sleep(0.3)
    terminal.keys("q")
    terminal.wait_for("dojo-exited-0")


def test_kill_9_loses_nothing_and_the_restart_resumes_there(
        start_dojo: Callable[[], Terminal]) -> None:
    first = start_dojo()
    first.wait_for("Dead letter queues")
    first.keys("Enter")
    first.wait_for("The 60-second answer")
    first.keys("]", "]", "]")  # three sections down: each new section is written at once
    first.wait_for("§ Deep dive")
    os.kill(int(first.pid_file.read_text()), signal.SIGKILL)  # the process this test started
    first.wait_for("dojo-exited-137")
    second = start_dojo()
    home = second.wait_for("Lesson · Dead letter")
    assert "§ Deep dive" in home, f"Home names the section the reader was in:\n{home}"
    second.keys("c")
    second.wait_for("§ Deep dive")
