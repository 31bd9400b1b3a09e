"""What `DocumentView` marks on a laid-out page, as plain functions: search matches, styled
spans of a line, which link Tab picks next, and keys typed into a prompt."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from textual.events import Key
from textual.strip import Strip
from textual.widgets import Input

from dojo.tui.document import DocLine, Link


@dataclass(frozen=True)
class Match:
    line: int
    start: int  # cells
    end: int


def find_matches(lines: list[DocLine], query: str) -> list[Match]:
    """Every case-insensitive occurrence of `query`, in reading order, in cells."""
    found: list[Match] = []
    if not query:
        return found
    needle = query.lower()
    for index, line in enumerate(lines):
        haystack = line.text.lower()
        start = haystack.find(needle)
        while start != -1:
            begin = cell_len(line.text[:start])
            found.append(Match(index, begin, begin + cell_len(line.text[start:start
                                                                          + len(needle)])))
            start = haystack.find(needle, start + max(1, len(needle)))
    return found


def mark_spans(strip: Strip, spans: list[tuple[int, int, Style]]) -> Strip:
    """`strip` with each (start cell, end cell, style) span restyled; overlapping spans after
    the first are skipped."""
    cuts: list[int] = []
    styles: list[Style | None] = []
    position = 0
    for start, end, style in sorted(spans, key=lambda span: span[0]):
        if start < position:
            continue
        cuts += [start, end]
        styles += [None, style]
        position = end
    if not cuts:
        return strip
    cuts.append(strip.cell_length)
    styles.append(None)
    out = [piece if style is None else Strip(list(Segment.apply_style(list(piece), None, style)))
           for piece, style in zip(strip.divide(cuts), styles, strict=False)]
    return Strip.join(out)


def pick_link(links: list[Link], current: int, top: int, height: int, step: int) -> int:
    """The link Tab (step 1) or Shift+Tab (-1) selects: the one after (before) the selected
    link when that is in view, else the first (last) in view, else the first (last)."""
    if 0 <= current < len(links) and top <= links[current].line < top + height:
        return (current + step) % len(links)
    if step > 0:
        return next((n for n, link in enumerate(links) if link.line >= top), 0)
    return next((n for n in range(len(links) - 1, -1, -1) if links[n].line < top + height),
                len(links) - 1)


def type_into(prompt: Input, event: Key) -> None:
    """Type one key into `prompt` as if it had had the focus (Enter submits, Esc cancels)."""
    if event.is_printable and event.character:
        prompt.insert_text_at_cursor(event.character)
    elif event.key == "backspace":
        prompt.action_delete_left()
    elif event.key in ("enter", "escape"):
        action = "submit" if event.key == "enter" else "cancel"
        prompt.call_later(prompt.app.run_action, action, prompt)
