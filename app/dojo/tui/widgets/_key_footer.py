"""`KeyFooter`: the footer every screen uses. `?` (the keys of this screen) and the way out
(`q`, Esc) come first, so a narrow terminal cuts the least useful keys, never those two."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.events import Resize
from textual.widgets import Footer

COMPACT_BELOW = 100  # columns; below this the keys sit closer together
FIRST_ACTIONS = ("help", "app.help")
THEN_ACTIONS = ("back", "app.quit", "quit", "close", "leave", "end", "cancel")


def footer_rank(action: str) -> int:
    """0 for help, 1 for the way out, 2 for everything else (kept in binding order)."""
    if action in FIRST_ACTIONS:
        return 0
    return 1 if action in THEN_ACTIONS else 2


class KeyFooter(Footer):
    """Textual's footer with help and the way out first, compact when the terminal is narrow."""

    def compose(self) -> ComposeResult:
        keys = list(super().compose())
        # sorted() is stable: the other keys keep the order the screen declares them in
        yield from sorted(keys, key=lambda key: footer_rank(getattr(key, "action", "")))

    def on_resize(self, event: Resize) -> None:
        self.compact = self.app.size.width < COMPACT_BELOW
