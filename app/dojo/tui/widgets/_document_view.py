"""`DocumentView`: a pager for lessons and lab instructions (line API, vim keys, search)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import on, work
from textual.binding import Binding, BindingType
from textual.events import Click, Key, Resize
from textual.geometry import Size
from textual.message import Message
from textual.reactive import var
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Input

from dojo.tui.document import Block, Palette, Prose, RenderedDocument, render_document
from dojo.tui.widgets._page_marks import Match, find_matches, mark_spans, pick_link, type_into

MATCH_STYLE = Style(reverse=True)
CURRENT_MATCH_STYLE = Style(reverse=True, bold=True, underline=True)
MORE_STYLE = Style(bold=True, dim=True)
LINK_SELECTED_STYLE = Style(reverse=True)


class DocumentView(ScrollView, can_focus=True):
    """Shows a document (`dojo.tui.document` blocks), re-laid out when the width changes.

    Prose wraps; fenced blocks keep their width and scroll sideways with ←/→ while the prose
    stays put. Search is case-insensitive, per line, highlighting every match. Links (lesson
    cross-references): Tab and Shift+Tab pick one, Enter or a click follows it
    (`DocumentView.LinkFollowed`); on a page without links Tab moves the focus as usual.
    """

    DEFAULT_CSS = """
    DocumentView {
        height: 1fr;
        padding: 0 1;
        scrollbar-size-vertical: 1;
        scrollbar-size-horizontal: 0;
        scrollbar-gutter: stable;
        background: $background;
    }
    DocumentView:focus { background-tint: $foreground 2%; }
    """

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j,down", "scroll_down", "Down", show=False),
        Binding("k,up", "scroll_up", "Up", show=False),
        Binding("g,home", "scroll_home", "Top", show=False),
        Binding("G,end", "scroll_end", "Bottom", show=False),
        Binding("ctrl+d", "half_page(1)", "Half page down", show=False),
        Binding("ctrl+u", "half_page(-1)", "Half page up", show=False),
        Binding("space,pagedown,ctrl+f", "page_down", "Page down", show=False),
        Binding("pageup,ctrl+b", "page_up", "Page up", show=False),
        Binding("left", "scroll_left", "Wide code left", show=False),
        Binding("right", "scroll_right", "Wide code right", show=False),
        Binding("n", "next_match(1)", "Next match", show=False),
        Binding("N", "next_match(-1)", "Previous match", show=False),
        Binding("tab", "next_link(1)", "Next link", show=False),
        Binding("shift+tab", "next_link(-1)", "Previous link", show=False),
        Binding("enter", "follow_link", "Follow the link", show=False),
        Binding("escape", "clear", "Clear search/link", show=False),
    ]

    @dataclass
    class SectionChanged(Message):
        """The heading at the top of the view changed (slug, "" above the first)."""

        view: DocumentView
        slug: str

        @property
        def control(self) -> DocumentView:
            return self.view

    @dataclass
    class ReachedEnd(Message):
        """The reader scrolled to the bottom."""

        view: DocumentView

        @property
        def control(self) -> DocumentView:
            return self.view

    @dataclass
    class SearchChanged(Message):
        """The search or the current match changed (`index` is 1-based, 0: no match)."""

        view: DocumentView
        query: str
        index: int
        total: int

        @property
        def control(self) -> DocumentView:
            return self.view

    @dataclass
    class LinkSelected(Message):
        """Tab moved to a link (`target` is "" when none is selected any more)."""

        view: DocumentView
        target: str

        @property
        def control(self) -> DocumentView:
            return self.view

    @dataclass
    class LinkFollowed(Message):
        """Enter or a click on a link: the screen goes there (`lesson:<id>[#section]`)."""

        view: DocumentView
        target: str

        @property
        def control(self) -> DocumentView:
            return self.view

    @dataclass
    class _Laid(Message):
        document: RenderedDocument
        width: int
        generation: int

    blocks: var[tuple[Block, ...]] = var((), always_update=True)
    """What to show; setting it lays the document out again."""

    def __init__(self, blocks: list[Block] | None = None, *, name: str | None = None,
                 id: str | None = None, classes: str | None = None) -> None:
        super().__init__(name=name, id=id, classes=classes)
        self._document: RenderedDocument | None = None
        self._laid_width = 0
        self._generation = 0
        self._laid_generation = 0
        self._stale = bool(blocks)  # blocks not laid out yet (e.g. set while hidden)
        self._pending: tuple[str, int | None] | None = None  # (anchor, line) after layout
        self._pending_relative = False  # the pending line counts from the anchor
        self._section = ""
        self._at_end = False
        self._query = ""
        self._matches: list[Match] = []
        self._by_line: dict[int, list[int]] = {}
        self._current = -1
        self._link = -1  # the selected link, an index into document.links
        self.opens_prompt: frozenset[str] = frozenset()  # keys whose binding opens a prompt
        self._prompt: Input | None = None  # the prompt open now (see on_key)
        self._pending_keys: list[Key] | None = None  # typed before the prompt had the focus
        if blocks:
            self.set_reactive(DocumentView.blocks, tuple(blocks))

    # --- content -------------------------------------------------------------------------

    @property
    def document(self) -> RenderedDocument | None:
        return self._document

    @property
    def laid_out(self) -> bool:
        """The document shown is the current one (no layout in flight)."""
        return (self._document is not None and not self._stale
                and self._laid_generation == self._generation)

    @property
    def top_line(self) -> int:
        return round(self.scroll_y)

    @property
    def section(self) -> str:
        return self._section

    def go_to(self, anchor: str = "", line: int | None = None) -> None:
        """Scroll to a heading's slug or a line, now or as soon as the document is laid out."""
        document = self._document
        if document is None or not self.laid_out:
            self._pending = (anchor, line)
            self._pending_relative = False
            return
        target = document.anchors.get(anchor, line if line is not None else 0) \
            if anchor else (line or 0)
        self._scroll_when_ready(target)

    def _scroll_when_ready(self, y: int, tries: int = 3) -> None:
        """Scroll to line `y`; right after a layout the scrollbars may not be counted yet,
        which clamps too early, so try again after the next refresh."""
        self.scroll_to(y=y, animate=False, immediate=True, force=True)
        if y > self.max_scroll_y and tries > 1:
            self.call_after_refresh(self._scroll_when_ready, y, tries - 1)

    def watch_blocks(self) -> None:
        self._query, self._matches, self._by_line, self._current = "", [], {}, -1
        self._link = -1
        self._stale = True
        self._layout(keep_place=False)

    def _palette(self) -> Palette:
        return Palette.from_variables(self.app.get_css_variables(), self.app.current_theme.dark)

    def _layout(self, keep_place: bool = True) -> None:
        width = self.scrollable_content_region.width
        if width <= 0 or not self.blocks:
            return
        self._stale = False
        if keep_place and self._document is not None and self._pending is None:
            anchor = self._document.section_at(self.top_line)
            offset = self.top_line - self._document.anchors.get(anchor, 0)
            self._pending = (anchor, offset) if anchor else ("", self.top_line)
            self._pending_relative = bool(anchor)
        self._generation += 1
        self._lay_out(list(self.blocks), width, self._palette(), self._generation)

    @work(thread=True, exclusive=True, group="layout")
    def _lay_out(self, blocks: list[Block], width: int, palette: Palette, generation: int
                 ) -> None:
        try:
            document = render_document(blocks, width, palette)
        except Exception as exc:  # show what failed instead of taking the app down
            document = render_document([Prose(f"This page could not be drawn: "
                                              f"{type(exc).__name__}: {exc}")], width, palette)
        self.post_message(self._Laid(document, width, generation))

    @on(_Laid)
    def _laid(self, message: _Laid) -> None:
        message.stop()
        if message.generation != self._generation:
            return
        selected = self.selected_link
        self._document = message.document
        self._link = next((n for n, link in enumerate(message.document.links)
                           if link.target == selected), -1) if selected else -1
        self._laid_width = message.width
        self._laid_generation = message.generation
        self.virtual_size = Size(message.document.width, len(message.document.lines))
        if self._query:
            self._find(self._query, keep_current=True)
        pending, self._pending = self._pending, None
        relative = self._pending_relative
        self._pending_relative = False
        self.refresh()
        if pending is not None:
            anchor, line = pending
            if relative and anchor:
                target = message.document.anchors.get(anchor, 0) + (line or 0)
                self.call_after_refresh(self._scroll_when_ready, target)
            else:
                self.call_after_refresh(self.go_to, anchor, line)
        self.call_after_refresh(self._report_place)

    def on_resize(self, event: Resize) -> None:
        if self._stale:
            self._layout(keep_place=False)
        elif self.scrollable_content_region.width != self._laid_width:
            self._layout()

    def refresh_theme(self) -> None:
        """Lay out again in the current theme's colours."""
        self._layout()

    # --- drawing -------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        base = self.rich_style
        index = scroll_y + y
        document = self._document
        if document is None or index >= len(document.lines):
            if document is None and y == 0 and self.blocks:
                return Strip([Segment("Loading…", base + Style(dim=True))]).extend_cell_length(
                    width, base)
            return Strip.blank(width, base)
        line = document.lines[index]
        strip = line.strip
        if index in self._by_line:
            strip = self._highlight(strip, index)
        if self._link >= 0:
            strip = self._highlight_link(strip, index)
        if not line.scrolls:
            return strip.crop_extend(0, width, base).apply_style(base)
        # wide code and diagrams: ‹ and › at the edges say there is more to the side (←/→)
        more_left, more_right = scroll_x > 0, strip.cell_length > scroll_x + width
        start, end = scroll_x + more_left, scroll_x + width - more_right
        pieces = [strip.crop_extend(start, end, base)]
        if more_left:
            pieces.insert(0, Strip([Segment("‹", base + MORE_STYLE)]))
        if more_right:
            pieces.append(Strip([Segment("›", base + MORE_STYLE)]))
        return Strip.join(pieces).apply_style(base)

    def _highlight(self, strip: Strip, index: int) -> Strip:
        return mark_spans(strip, [
            (self._matches[n].start, self._matches[n].end,
             CURRENT_MATCH_STYLE if n == self._current else MATCH_STYLE)
            for n in self._by_line[index]])

    def _highlight_link(self, strip: Strip, index: int) -> Strip:
        document = self._document
        if document is None or self._link >= len(document.links):
            return strip
        return mark_spans(strip, [(start, end, LINK_SELECTED_STYLE) for line, start, end
                                  in document.links[self._link].spans if line == index])

    # --- moving --------------------------------------------------------------------------

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._report_place()

    def _report_place(self) -> None:
        document = self._document
        if document is None:
            return
        slug = document.section_at(self.top_line + 1)
        if slug != self._section:
            self._section = slug
            self.post_message(self.SectionChanged(self, slug))
        at_end = self.scroll_y >= self.max_scroll_y and bool(document.lines)
        if at_end and not self._at_end:
            self.post_message(self.ReachedEnd(self))
        self._at_end = at_end

    def action_half_page(self, direction: int) -> None:
        step = max(1, self.scrollable_content_region.height // 2)
        self.scroll_to(y=self.scroll_y + direction * step, animate=False)

    def action_scroll_left(self) -> None:
        self.scroll_to(x=max(0, self.scroll_x - 8), animate=False)

    def action_scroll_right(self) -> None:
        self.scroll_to(x=self.scroll_x + 8, animate=False)

    # --- search --------------------------------------------------------------------------

    @property
    def search_query(self) -> str:
        return self._query

    @property
    def match_count(self) -> int:
        return len(self._matches)

    @property
    def current_match(self) -> int:
        """1-based number of the current match, 0 when there is none."""
        return self._current + 1 if self._matches else 0

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # When these have nothing to act on, the key falls through to the screen and the
        # app: Esc goes back, Tab moves the focus.
        if action == "clear":
            return bool(self._query) or self._link >= 0
        if action == "next_link":
            return bool(self._document and self._document.links)
        if action == "follow_link":
            return self._link >= 0
        return True

    def action_clear(self) -> None:
        """Esc: the selected link, then the search, is cleared."""
        if self._link >= 0:
            self._select_link(-1)
        else:
            self.clear_search()

    def attach_prompt(self, prompt: Input) -> None:
        """A prompt opened from this page (`/`): keys typed before it had the focus go to it,
        in order, and so does anything still queued here."""
        self._prompt = prompt
        pending, self._pending_keys = self._pending_keys, None
        for key in pending or []:
            type_into(prompt, key)

    def detach_prompt(self) -> None:
        self._prompt = None
        self._pending_keys = None

    def on_key(self, event: Key) -> None:
        """Keys arrive here in the order typed, but the screen's binding for `/` runs only
        after this page has handled the keys queued behind it: a fast typist's `/poison`
        would hit the page's own keys (`o` opens the lab). So after a key in `opens_prompt`,
        keys are held here until the prompt is attached, and then typed into it."""
        if self._prompt is not None or self._pending_keys is not None:
            event.stop()
            event.prevent_default()
            if self._prompt is not None:
                type_into(self._prompt, event)
            else:
                self._pending_keys.append(event)  # type: ignore[union-attr]
        elif event.key in self.opens_prompt:
            self._pending_keys = []  # the event itself goes on to the screen's binding

    # --- links ---------------------------------------------------------------------------

    @property
    def selected_link(self) -> str:
        """The target of the link Tab selected, "" when none is."""
        document = self._document
        if document is None or not 0 <= self._link < len(document.links):
            return ""
        return document.links[self._link].target

    def _visible(self, line: int) -> bool:
        return self.top_line <= line < self.top_line + self.scrollable_content_region.height

    def action_next_link(self, step: int) -> None:
        """Tab / Shift+Tab: the next (previous) link after the selected one, or the first
        (last) on screen when the selected one is not in view."""
        document = self._document
        if document is None or not document.links:
            return
        self._select_link(pick_link(document.links, self._link, self.top_line,
                                    self.scrollable_content_region.height, step))

    def _select_link(self, index: int) -> None:
        self._link = index
        document = self._document
        if index >= 0 and document is not None:
            line = document.links[index].line
            if not self._visible(line):
                height = self.scrollable_content_region.height
                self.scroll_to(y=max(0, line - height // 3), animate=False, immediate=True,
                               force=True)
        self.refresh()
        self.post_message(self.LinkSelected(self, self.selected_link))

    def action_follow_link(self) -> None:
        if self.selected_link:
            self.post_message(self.LinkFollowed(self, self.selected_link))

    def on_click(self, event: Click) -> None:
        """A click on a link follows it."""
        document = self._document
        if document is None:
            return
        region = self.scrollable_content_region
        line = self.top_line + event.y - (region.y - self.region.y)
        cell = round(self.scroll_x) + event.x - (region.x - self.region.x)
        for link in document.links:
            if link.covers(line, cell):
                event.stop()
                self.post_message(self.LinkFollowed(self, link.target))
                return

    def search(self, query: str, start: int | None = None) -> int:
        """Highlight every match of `query` and go to the first one at or below line `start`
        (default: the top line)."""
        self._query = query.strip()
        self._current = -1
        self._find(self._query, keep_current=False)
        if self._matches:
            top = self.top_line if start is None else start
            after = [n for n, match in enumerate(self._matches) if match.line >= top]
            self._current = after[0] if after else 0
            self._show_current()
        self.refresh()
        self._post_search()
        return len(self._matches)

    def clear_search(self) -> None:
        self._query, self._matches, self._by_line, self._current = "", [], {}, -1
        self.refresh()
        self._post_search()

    def action_next_match(self, step: int) -> None:
        if not self._matches:
            if self._query:
                self.notify(f"no match for “{self._query}”", severity="warning", timeout=3)
            return
        self._current = (self._current + step) % len(self._matches)
        self._show_current()
        self.refresh()
        self._post_search()

    def _find(self, query: str, keep_current: bool) -> None:
        document = self._document
        self._matches = find_matches(document.lines, query) if document is not None else []
        self._by_line = {}
        for number, match in enumerate(self._matches):
            self._by_line.setdefault(match.line, []).append(number)
        if keep_current and self._matches:
            self._current = min(max(self._current, 0), len(self._matches) - 1)

    def _show_current(self) -> None:
        match = self._matches[self._current]
        height = self.scrollable_content_region.height
        y = self.scroll_y
        if not (y <= match.line < y + height):
            y = max(0, match.line - height // 3)
        x = self.scroll_x
        document = self._document
        if document is not None and document.lines[match.line].scrolls:
            width = self.scrollable_content_region.width
            if not (x <= match.start and match.end <= x + width):
                x = max(0, match.end - width + 4)
        else:
            x = 0
        self.scroll_to(x=x, y=y, animate=False, immediate=True, force=True)

    def _post_search(self) -> None:
        self.post_message(self.SearchChanged(self, self._query, self.current_match,
                                             len(self._matches)))
