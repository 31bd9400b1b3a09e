"""Progress at a glance: mastery and read state per lesson, lab stages, review history."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

from textual import on, work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.content import Content
from textual.message import Message
from textual.screen import Screen
from textual.widgets import Header, Static

from dojo.tui.overview import TRACK_TITLES, Overview, gather
from dojo.tui.widgets import KeyFooter
from dojo.tui.widgets._meter import fit, meter, percent, stage_marks

if TYPE_CHECKING:
    from dojo.store import StoredReview
    from dojo.tui.session import Session

HISTORY_ROWS = 15
DAYS = 14
GRADE_STYLES = {1: ("Again", "$text-error"), 2: ("Hard", "$text-warning"),
                3: ("Good", "$text-success"), 4: ("Easy", "$text-primary")}


def lessons_block(overview: Overview, width: int) -> Content:
    title_width = max(16, width - 36)
    parts: list[Content | str | tuple[str, str]] = [
        (f"{'':3}{'lesson':<{title_width}} {'read':<8}{'mastery':<16}lab", "$text-muted"),
        "\n"]
    track = ""
    for row in overview.lessons:
        if row.lesson.track != track:
            track = row.lesson.track
            parts += [(TRACK_TITLES.get(track, track), "bold $text-primary"), "\n"]
        read_style = {"read": "$text-success", "reading": "$text-accent"}.get(row.read,
                                                                          "$text-muted")
        lab = row.lab_label().replace("soon", "coming") or "—"
        parts += [(f"{row.lesson.dir.name[:2]} ", "$text-muted"), fit(row.lesson.title,
                                                                    title_width),
                  " ", (f"{row.read:<8}", read_style), meter(row.mastery, 10),
                  (f"{percent(row.mastery)}  ", "$text-muted"), (lab, "$text-muted"), "\n"]
    return Content.assemble(*parts).rstrip()


def labs_block(overview: Overview) -> Content:
    parts: list[Content | str | tuple[str, str]] = []
    width = max((len(lab.lab_id) for lab in overview.labs), default=6) + 1
    for lab in overview.labs:
        if not lab.ready:
            parts += [f"{lab.lab_id:<{width}} ", (lab.error and "cannot load" or "coming",
                                                  "$text-muted"), "\n"]
            continue
        total = len(lab.stage_ids)
        parts += [f"{lab.lab_id:<{width}} ", meter(lab.passed / total if total else 0, 12),
                  f" {lab.passed}/{total}  ", stage_marks(lab.stage_ids, lab.statuses), "\n"]
    parts.append(("✓ passed ✗ failed ! error · not checked\n"
                  "~ needs Apache Kafka or a PostgreSQL setting", "$text-muted"))
    return Content.assemble(*parts)


def history_block(session: Session, reviews: list[StoredReview]) -> Content:
    if not reviews:
        return Content.styled("No reviews yet: d on Home drills five cards.", "$text-muted")
    now = session.now().astimezone()
    today = now.date()
    per_day = Counter(review.reviewed_at.astimezone().date() for review in reviews)
    days = [today - timedelta(days=n) for n in range(DAYS - 1, -1, -1)]
    peak = max((per_day[day] for day in days), default=0) or 1
    bars = "".join(" ▁▂▃▄▅▆▇█"[round(8 * per_day[day] / peak)] if per_day[day] else "·"
                   for day in days)
    parts: list[Content | str | tuple[str, str]] = [
        ("last 14 days ", "$text-muted"), (bars, "$text-success"),
        (f"  {sum(per_day[d] for d in days)} reviews, {len(reviews)} in all", "$text-muted"),
        "\n"]
    catalog = session.catalog
    for review in reversed(reviews[-HISTORY_ROWS:]):
        label, style = GRADE_STYLES.get(int(review.rating), ("?", ""))
        lesson = catalog.lesson_of(catalog.card(review.card_id)).title \
            if catalog.has_card(review.card_id) else ""
        when = review.reviewed_at.astimezone()
        parts += [(f"{when:%d %b %H:%M}  ", "$text-muted"), (f"{label:<6}", style),
                  f"{review.card_id:<28.28} ", (lesson, "$text-muted"), "\n"]
    return Content.assemble(*parts).rstrip()


class ProgressScreen(Screen[None]):
    """Read-only; loads in a worker and scrolls with j/k."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q,escape", "back", "Back"),
        Binding("j", "scroll(1)", "Down", show=False),
        Binding("k", "scroll(-1)", "Up", show=False),
    ]

    @dataclass
    class _Loaded(Message):
        overview: Overview
        reviews: list[StoredReview]

    def __init__(self, session: Session) -> None:
        super().__init__()
        self.session = session

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="progress-body"):
            yield Static("Lessons", classes="section-title")
            yield Static("loading…", id="progress-lessons")
            yield Static("Labs", classes="section-title")
            yield Static("", id="progress-labs")
            yield Static("Review history", classes="section-title")
            yield Static("", id="progress-history")
        yield KeyFooter()

    def on_mount(self) -> None:
        self.title = "Progress"
        self.query_one("#progress-body").focus()
        self._gather()

    @work(thread=True, exclusive=True)
    def _gather(self) -> None:
        try:
            self.post_message(self._Loaded(gather(self.session), self.session.store.reviews()))
        except Exception as exc:
            self.post_message(self._Failed(f"{type(exc).__name__}: {exc}"))

    @dataclass
    class _Failed(Message):
        error: str

    @on(_Failed)
    def _failed(self, message: _Failed) -> None:
        self.query_one("#progress-lessons", Static).update(
            Content.styled(f"could not load: {message.error}", "$text-error"))

    @on(_Loaded)
    def _loaded(self, message: _Loaded) -> None:
        width = self.query_one("#progress-body").scrollable_content_region.width
        self.query_one("#progress-lessons", Static).update(
            lessons_block(message.overview, width))
        self.query_one("#progress-labs", Static).update(labs_block(message.overview))
        self.query_one("#progress-history", Static).update(
            history_block(self.session, message.reviews))

    def action_scroll(self, step: int) -> None:
        body = self.query_one("#progress-body")
        body.scroll_to(y=body.scroll_y + 2 * step, animate=False)

    def action_back(self) -> None:
        self.dismiss()
