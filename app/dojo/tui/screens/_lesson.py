"""The lesson reader: table of contents, the page, search, links to the lab and the cards."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Header, Static

from dojo.tui.navigation import OpenLab, OpenLesson, StartDrill
from dojo.tui.pages import TitleOf, lesson_page, link_titles
from dojo.tui.widgets import DocumentView, KeyFooter, SearchBar, TableOfContents

if TYPE_CHECKING:
    from dojo.content import Lesson
    from dojo.tui.session import Session

SAVE_AFTER_SECONDS = 0.5  # after the reader stops scrolling, the place is written
WIDE_ENOUGH_FOR_CONTENTS = 100


class LessonScreen(Screen[None]):
    """Reads one lesson and records where the learner is as they scroll."""

    AUTO_FOCUS = "#lesson-view"  # the page, never the contents (t goes there)

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "back", "Back"),
        Binding("slash", "search", "Search"),
        Binding("t", "toggle_contents", "Contents", tooltip="into the contents and back"),
        Binding("o", "open_lab", "Lab"),
        Binding("d", "drill", "Drill cards"),
        Binding("right_square_bracket", "section(1)", "Next section", show=False),
        Binding("left_square_bracket", "section(-1)", "Previous section", show=False),
    ]

    def __init__(self, session: Session, lesson: Lesson, *, section: str = "",
                 position: int | None = None) -> None:
        super().__init__()
        self.session = session
        self.lesson = lesson
        self._start = (section, position)
        self._save_timer: Timer | None = None
        self._finished = False
        self._search_from = 0  # the top line when `/` was pressed: Esc goes back there
        self._title_of: TitleOf = link_titles(session.catalog, lesson.id)

    # --- layout ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal(id="lesson-main"):
            yield TableOfContents(self.lesson, id="lesson-contents")
            with Vertical(id="lesson-page"):
                yield DocumentView(lesson_page(self.lesson, self._links(), self._title_of),
                                   id="lesson-view")
                yield Static("", id="lesson-status")
                yield SearchBar(id="lesson-search")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = self.lesson.title
        self.sub_title = f"lesson {self.lesson.dir.name[:2]}"
        self.query_one(TableOfContents).display = self._wide
        view = self.query_one(DocumentView)
        section, position = self._start
        if position is not None:
            view.go_to(line=position)
        elif section:
            view.go_to(section)
        view.focus()
        view.opens_prompt = frozenset({"slash"})
        self.watch(view, "scroll_y", self._scrolled, init=False)
        self.session.store.set_last_place("lesson", self.lesson.id, section)
        self._draw_status()

    def _scrolled(self) -> None:
        self._draw_status()
        self._save_soon()

    def _links(self) -> tuple[str, ...]:
        """What the lesson leads to, with the keys that go there."""
        from dojo.content import lab_availability
        from dojo.content.lab_links import LabAvailability

        labs, ready = [], False
        for lab in dict.fromkeys(link.lab for link in self.lesson.labs):
            stages = [link.stage for link in self.lesson.labs if link.lab == lab]
            if lab_availability(self.session.content_root, lab) is LabAvailability.READY:
                ready = True
                passed = self.session.store.passed_stages(lab) & set(stages)
                labs.append(f"{lab} [b]ready[/b] {len(passed)}/{len(stages)} stages")
            else:
                labs.append(f"{lab} [dim]coming[/dim]")
        lines = []
        if labs:
            lines.append("[b]Lab[/b]   " + " · ".join(labs)
                         + (" — [b]o[/b] opens it" if ready else ""))
        if self.lesson.cards:
            lines.append(f"[b]Cards[/b] {len(self.lesson.cards)} — [b]d[/b] answers them "
                         "against the clock")
        return tuple(lines)

    # --- recording the place -------------------------------------------------------------

    def on_document_view_section_changed(self, message: DocumentView.SectionChanged) -> None:
        self.query_one(TableOfContents).mark(message.slug)
        self._draw_status()
        self._save()  # a new section is written at once; positions within it after a pause

    def on_document_view_reached_end(self, message: DocumentView.ReachedEnd) -> None:
        self._finished = True
        self._save()

    def on_document_view_search_changed(self, message: DocumentView.SearchChanged) -> None:
        self._draw_status()

    def on_document_view_link_selected(self, message: DocumentView.LinkSelected) -> None:
        self._draw_status()

    def on_document_view_link_followed(self, message: DocumentView.LinkFollowed) -> None:
        """A cross-reference: a section of this lesson scrolls there; another lesson opens
        on top (Esc comes back here)."""
        lesson_id, _, section = message.target.removeprefix("lesson:").partition("#")
        if lesson_id == self.lesson.id:
            self.query_one(DocumentView).go_to(section)
            self.query_one(DocumentView).action_clear()
        else:
            self.post_message(OpenLesson(lesson_id, section))

    def _save_soon(self) -> None:
        if self._save_timer is not None:
            self._save_timer.stop()
        self._save_timer = self.set_timer(SAVE_AFTER_SECONDS, self._save)

    def _save(self) -> None:
        view = self.query_one(DocumentView)
        if view.document is None:
            return
        section = view.section
        self.session.store.record_lesson_read(self.lesson.id, section, view.top_line,
                                              finished=self._finished)
        self.session.store.set_last_place("lesson", self.lesson.id, section)

    def on_unmount(self) -> None:
        if self._save_timer is not None:
            self._save_timer.stop()

    def _draw_status(self) -> None:
        view = self.query_one(DocumentView)
        title = self.lesson.title
        for section in self.lesson.sections:
            if section.slug == view.section:
                title = section.title
            for sub in section.subsections:
                if sub.slug == view.section:
                    title = f"{section.title} › {sub.title}"
        lines = len(view.document.lines) if view.document else 0
        shown = min(100, round(100 * (view.top_line + view.size.height) / lines)) if lines else 0
        place: list[str | tuple[str, str]] = [("§ ", "$text-primary"), title,
                                              (f"  {shown}%", "$text-muted")]
        parts: list[str | tuple[str, str]] = place
        # what the reader is doing comes first, so a narrow line cuts the section title
        if view.selected_link:
            lesson_id, _, slug = view.selected_link.removeprefix("lesson:").partition("#")
            parts = [("→ ", "$text-accent"),
                     (self._title_of(lesson_id, slug) or view.selected_link, "bold"),
                     ("  Enter opens · Tab next · Esc", "$text-muted")]
        elif view.search_query:
            found = (f"/{view.search_query}  {view.current_match} of {view.match_count}"
                     if view.match_count else f"/{view.search_query}  no match")
            parts = [(found, "$text-accent"),
                     ("  n next · N previous · Esc clears  " if view.match_count
                      else "  Esc clears  ", "$text-muted"), *place]
        self.query_one("#lesson-status", Static).update(Content.assemble(*parts))

    # --- actions ---------------------------------------------------------------------------

    def action_back(self) -> None:
        """Esc or q: from the contents back to the page; from the page back to where the
        lesson was opened."""
        if self.query_one(TableOfContents).has_focus:
            self._back_to_page()
            return
        if self.query_one(DocumentView).document is not None:
            self._save()
        self.dismiss()

    def action_search(self) -> None:
        """/: a prompt in place of the status line; matches light up as they are typed."""
        view = self.query_one(DocumentView)
        self._search_from = view.top_line
        self.query_one("#lesson-status").display = False
        bar = self.query_one(SearchBar)
        bar.open()
        view.attach_prompt(bar)

    def _close_search(self) -> None:
        self.query_one(DocumentView).detach_prompt()
        self.query_one(SearchBar).close()
        self.query_one("#lesson-status").display = True
        self.query_one(DocumentView).focus()

    def on_search_bar_typed(self, message: SearchBar.Typed) -> None:
        view = self.query_one(DocumentView)
        if message.query.strip():
            view.search(message.query, start=self._search_from)
        else:
            view.clear_search()
            view.go_to(line=self._search_from)

    def on_search_bar_search(self, message: SearchBar.Search) -> None:
        view = self.query_one(DocumentView)
        self._close_search()
        if not message.query.strip():
            view.clear_search()
            return
        if view.search_query != message.query.strip():
            view.search(message.query, start=self._search_from)
        if not view.match_count:
            self.notify(f"no match for “{message.query.strip()}”", severity="warning",
                        timeout=3)

    def on_search_bar_cancelled(self, message: SearchBar.Cancelled) -> None:
        """Esc in the prompt: no search, and the page where it was before `/`."""
        view = self.query_one(DocumentView)
        self._close_search()
        view.clear_search()
        view.go_to(line=self._search_from)

    @property
    def _wide(self) -> bool:
        return self.app.size.width >= WIDE_ENOUGH_FOR_CONTENTS

    def _fit_contents(self) -> None:
        """The contents stay beside the page when there is room; below 100 columns they show
        only while in use (t)."""
        contents = self.query_one(TableOfContents)
        contents.display = self._wide or self.focused is contents

    def on_resize(self) -> None:
        self._fit_contents()

    def action_toggle_contents(self) -> None:
        """t: into the contents (shown if hidden), or from them back to the page."""
        contents = self.query_one(TableOfContents)
        if contents.has_focus:
            self._back_to_page()
            return
        contents.display = True
        contents.mark(self.query_one(DocumentView).section)
        contents.focus()

    def _back_to_page(self) -> None:
        self.query_one(DocumentView).focus()
        self.query_one(TableOfContents).display = self._wide

    def on_table_of_contents_selected(self, message: TableOfContents.Selected) -> None:
        self.query_one(DocumentView).go_to(message.slug)
        self._back_to_page()

    def action_section(self, step: int) -> None:
        view = self.query_one(DocumentView)
        if view.document is None:
            return
        anchors = list(view.document.anchors.values())
        top = view.top_line
        targets = [line for line in anchors if (line > top + 1 if step > 0 else line < top)]
        if targets:
            view.go_to(line=targets[0] if step > 0 else targets[-1])

    def action_open_lab(self) -> None:
        from dojo.content import lab_availability
        from dojo.content.lab_links import LabAvailability

        labs = list(dict.fromkeys(link.lab for link in self.lesson.labs))
        if not labs:
            self.notify("This lesson has no lab; practise it with its cards (d).", timeout=4)
            return
        ready = [lab for lab in labs
                 if lab_availability(self.session.content_root, lab) is LabAvailability.READY]
        if not ready:
            self.notify(f"The {labs[0]} lab is coming; it is not built yet.",
                        severity="warning", timeout=4)
            return
        if len(ready) == 1:
            self.post_message(OpenLab(ready[0]))
            return
        from dojo.tui.screens._pick import PickScreen

        def chosen(lab: str | None) -> None:
            if lab:
                self.post_message(OpenLab(lab))

        self.app.push_screen(PickScreen("Open which lab?", tuple(ready)), chosen)

    def action_drill(self) -> None:
        cards = self.lesson.cards
        if not cards:
            self.notify("This lesson has no cards yet.", severity="warning")
            return
        chosen = self.session.scheduler.next_cards(cards, len(cards), self.session.now())
        self.post_message(StartDrill(tuple(card.id for card in chosen or cards),
                                     f"Drill: {self.lesson.title}"))
