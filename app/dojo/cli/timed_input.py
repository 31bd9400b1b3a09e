"""Read a typed answer on a terminal while a countdown ticks on the line above it.

The terminal is put in non-canonical mode with echo off, and this module echoes and edits
the text itself. That is what makes the ticking possible: it always knows how many screen
rows the answer takes, so it can jump up to the timer line, rewrite it and jump back without
disturbing what is being typed. It also means a time-out keeps the half-typed last line,
which canonical mode would keep hidden in the kernel's line buffer.

Keys: Enter ends a line (an empty line sends the answer), Backspace, Ctrl-U (erase line),
Ctrl-W (erase word), Ctrl-D (send now). Ctrl-C still interrupts (signals stay on).
"""

from __future__ import annotations

import codecs
import os
import select
import shutil
import sys
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

from dojo.content.text_measures import display_width
from dojo.quiz.timer import Countdown

TICK_SECONDS = 0.2
_ESC = "\x1b"


@dataclass(frozen=True)
class TypedAnswer:
    """What the learner typed, and how the answer ended."""

    text: str
    timed_out: bool
    seconds_used: float


def _rows(width_used: int, columns: int) -> int:
    """Screen rows below the first one that a line of `width_used` columns reaches. A line of
    exactly `columns` characters leaves the cursor on its own row (pending wrap)."""
    return max(0, width_used - 1) // columns if width_used else 0


class _Editor:
    def __init__(self, out: TextIO, countdown: Countdown, header: Callable[[Countdown], str]):
        self.out = out
        self.countdown = countdown
        self.header = header
        self.lines: list[str] = []
        self.line = ""
        self.rows_above = 0  # screen rows the committed lines take, header excluded
        self.shown_header = ""

    def columns(self) -> int:
        return max(20, shutil.get_terminal_size((80, 24)).columns)

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def cursor_row(self) -> int:
        """Rows between the first answer row and the cursor."""
        return self.rows_above + _rows(display_width(self.line), self.columns())

    def tick(self) -> None:
        header = self.header(self.countdown)
        if header == self.shown_header:
            return
        up = self.cursor_row() + 1
        if up >= shutil.get_terminal_size((80, 24)).lines:
            return  # the timer line has scrolled off the screen; nothing to redraw
        self.shown_header = header
        # Save the cursor, go up to the timer line, rewrite it, come back.
        self.write(f"\x1b7\x1b[{up}A\r{header}\x1b[K\x1b8")

    def redraw_line(self, before: str) -> None:
        up = _rows(display_width(before), self.columns())
        self.write((f"\x1b[{up}A" if up else "") + "\r\x1b[J" + self.line)

    def key(self, char: str) -> bool:
        """Handle one character; True when the answer is complete."""
        if char in ("\r", "\n"):
            if not self.line:
                return True
            self.rows_above += _rows(display_width(self.line), self.columns()) + 1
            self.lines.append(self.line)
            self.line = ""
            self.write("\r\n")
        elif char == "\x04":  # Ctrl-D
            return True
        elif char in ("\x7f", "\x08"):
            before, self.line = self.line, self.line[:-1]
            self.redraw_line(before)
        elif char == "\x15":  # Ctrl-U
            before, self.line = self.line, ""
            self.redraw_line(before)
        elif char == "\x17":  # Ctrl-W
            before = self.line
            self.line = self.line.rstrip()
            self.line = self.line[: len(self.line) - len(self.line.split(" ")[-1])]
            self.redraw_line(before)
        elif char == "\t":
            self.line += " "
            self.write(" ")
        elif char.isprintable():
            self.line += char
            self.write(char)
        return False

    def text(self) -> str:
        return "\n".join([*self.lines, self.line]).strip()


def _strip_escapes(text: str) -> str:
    """Drop terminal escape sequences (arrow keys, function keys): this editor has no cursor
    movement, and the bytes must not end up in the answer."""
    out, index = [], 0
    while index < len(text):
        if text[index] == _ESC:
            index += 1
            if index < len(text) and text[index] in "[O":
                index += 1
                while index < len(text) and not "\x40" <= text[index] <= "\x7e":
                    index += 1
            index += 1
            continue
        out.append(text[index])
        index += 1
    return "".join(out)


def read_timed_answer(countdown: Countdown, header: Callable[[Countdown], str],
                      out: TextIO | None = None, fd: int | None = None) -> TypedAnswer:
    """Read an answer from the terminal on `fd` until an empty line, Ctrl-D or time-out,
    showing `header(countdown)` on the line above and refreshing it as time passes."""
    out = out or sys.stdout
    fd = sys.stdin.fileno() if fd is None else fd
    editor = _Editor(out, countdown, header)
    editor.shown_header = header(countdown)
    editor.write(editor.shown_header + "\r\n")
    saved = termios.tcgetattr(fd)
    changed = termios.tcgetattr(fd)
    changed[3] &= ~(termios.ICANON | termios.ECHO)  # lflags; ISIG stays so Ctrl-C works
    changed[6][termios.VMIN] = 1
    changed[6][termios.VTIME] = 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    timed_out = False
    try:
        termios.tcsetattr(fd, termios.TCSANOW, changed)
        done = False
        while not done:
            remaining = countdown.remaining()
            if remaining <= 0:
                timed_out = True
                break
            readable, _, _ = select.select([fd], [], [], min(TICK_SECONDS, remaining))
            if readable:
                data = os.read(fd, 4096)
                if not data:
                    break
                for char in _strip_escapes(decoder.decode(data)):
                    if editor.key(char):
                        done = True
                        break
            editor.tick()
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    editor.write("\r\n")
    return TypedAnswer(editor.text(), timed_out, min(countdown.elapsed(), countdown.seconds))


def read_key(fd: int | None = None) -> str:
    """One key press from the terminal, without waiting for Enter ("" at end of input)."""
    fd = sys.stdin.fileno() if fd is None else fd
    saved = termios.tcgetattr(fd)
    changed = termios.tcgetattr(fd)
    changed[3] &= ~(termios.ICANON | termios.ECHO)
    changed[6][termios.VMIN] = 1
    changed[6][termios.VTIME] = 0
    try:
        termios.tcsetattr(fd, termios.TCSANOW, changed)
        data = os.read(fd, 32)
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
    text = _strip_escapes(data.decode("utf-8", errors="replace"))
    return text[:1] if text else ("" if not data else "\x1b")
