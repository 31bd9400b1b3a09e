"""What Home and Progress show, gathered from the engine in one worker call.

Nothing is decided here: read state, mastery, due cards and passed stages all come from the
store, the scheduler and the lab manifests; this only puts them side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dojo.content import Lesson
    from dojo.content.labs import Lab
    from dojo.interview_path import InterviewPath
    from dojo.store import Place
    from dojo.tui.session import Session

TRACK_TITLES = {"interview": "The interview", "next": "What they ask next",
                "craft": "Interview craft"}


@dataclass(frozen=True)
class LessonRow:
    lesson: Lesson
    read: str  # unread | reading | read
    mastery: float  # 0–1, FSRS retrievability averaged over the lesson's cards
    reviewed: int  # cards reviewed at least once
    lab_passed: int  # stages of the paired labs passed
    lab_total: int  # stages the lesson pairs with, in labs that are ready
    labs_coming: tuple[str, ...]  # paired labs not built yet
    lab_ids: tuple[str, ...] = ()  # the paired labs that are ready, in the lesson's order

    def lab_label(self, short: bool = False) -> str:
        """The stages the lesson pairs with and whose lab they are (`dlq 3/9`,
        `dlq+money 0/2`; `short`: `2 labs 0/2`), `soon` when its lab is not built yet, ""
        when it has none."""
        if self.lab_total:
            names = f"{len(self.lab_ids)} labs" if short and len(self.lab_ids) > 1 else \
                "+".join(self.lab_ids)
            return f"{names} {self.lab_passed}/{self.lab_total}"
        return "soon" if self.labs_coming else ""


@dataclass(frozen=True)
class LabRow:
    lab_id: str
    title: str
    ready: bool
    stage_ids: tuple[str, ...]
    statuses: dict[str, str]  # stage -> latest status (pass | fail | error | needs-backend)
    error: str = ""  # the manifest could not be loaded

    @property
    def passed(self) -> int:
        return sum(1 for stage in self.stage_ids if self.statuses.get(stage) == "pass")


@dataclass(frozen=True)
class Continue:
    """Where the learner was last, in words, and what opening it means."""

    kind: str  # lesson | lab | quiz
    target: str
    detail: str
    label: str
    where: str


@dataclass(frozen=True)
class Overview:
    lessons: tuple[LessonRow, ...]
    labs: tuple[LabRow, ...]
    due_now: int
    due_today: int
    new_cards: int
    next_due: datetime | None
    last: Continue | None
    problems: int
    path: InterviewPath | None = None


def _read_state(progress: object | None) -> str:
    if progress is None:
        return "unread"
    return "read" if getattr(progress, "finished", False) else "reading"


def load_labs(session: Session) -> dict[str, Lab | str]:
    """Every lab a lesson names or the labs folder holds: the loaded Lab, or why it failed."""
    from dojo.content.lab_links import known_labs
    from dojo.content.labs import LabError, load_lab

    labs: dict[str, Lab | str] = {}
    root = session.content_root
    for lab_id in known_labs(root):
        folder = root / "labs" / lab_id
        if not (folder / "lab.yaml").is_file():
            continue
        try:
            labs[lab_id] = load_lab(folder, root)
        except LabError as exc:
            labs[lab_id] = str(exc)
    return labs


def _continue(session: Session, place: Place | None) -> Continue | None:
    if place is None:
        return None
    catalog = session.catalog
    if place.kind == "lesson" and catalog.has_lesson(place.target):
        lesson = catalog.lesson(place.target)
        titles = {section.slug: section.title for section in lesson.sections}
        titles.update({sub.slug: sub.title for section in lesson.sections
                       for sub in section.subsections})
        where = titles.get(place.detail)
        return Continue("lesson", place.target, place.detail, f"Lesson · {lesson.title}",
                        f"§ {where}" if where else "from the top")
    if place.kind == "lab":
        return Continue("lab", place.target, place.detail, f"Lab · {place.target}",
                        f"stage {place.detail}" if place.detail else "")
    if place.kind == "quiz" and catalog.has_card(place.target):
        lesson = catalog.lesson_of(catalog.card(place.target))
        return Continue("quiz", place.target, lesson.id, f"Drill · {lesson.title}",
                        "the cards of this lesson")
    return None


def gather(session: Session) -> Overview:
    """Everything Home shows (blocking: a worker calls it)."""
    from dojo.content import lab_availability
    from dojo.content.lab_links import LabAvailability, known_labs

    session.load()
    catalog, store, scheduler = session.catalog, session.store, session.scheduler
    now = session.now()
    progress = store.lesson_progress()
    root = session.content_root
    labs = load_labs(session)
    statuses: dict[str, dict[str, str]] = {}
    for lab_id in labs:
        records = store.stage_results(lab_id)
        statuses[lab_id] = {stage: record.status for (_, stage), record in records.items()}
    rows = []
    for lesson in catalog.lessons:
        passed = total = 0
        coming: list[str] = []
        ready: list[str] = []
        for link in lesson.labs:
            if lab_availability(root, link.lab) is LabAvailability.COMING:
                if link.lab not in coming:
                    coming.append(link.lab)
                continue
            if link.lab not in ready:
                ready.append(link.lab)
            total += 1
            passed += statuses.get(link.lab, {}).get(link.stage) == "pass"
        reviewed = sum(scheduler.state(card.id) is not None for card in lesson.cards)
        rows.append(LessonRow(lesson, _read_state(progress.get(lesson.id)),
                              scheduler.lesson_mastery(lesson, now), reviewed, passed, total,
                              tuple(coming), tuple(ready)))
    lab_rows = []
    for lab_id in known_labs(root):
        loaded = labs.get(lab_id)
        if loaded is None:
            lab_rows.append(LabRow(lab_id, "", False, (), {}))
        elif isinstance(loaded, str):
            lab_rows.append(LabRow(lab_id, "", False, (), {}, error=loaded))
        else:
            lab_rows.append(LabRow(lab_id, loaded.title, True, loaded.stage_ids,
                                   statuses.get(lab_id, {})))
    from dojo.interview_path import interview_path

    cards = catalog.cards
    path = interview_path(
        catalog, {lesson_id: _read_state(record) for lesson_id, record in progress.items()},
        {card.id for card in cards if scheduler.state(card.id) is not None},
        {lab_id: {stage for stage, status in by_stage.items() if status == "pass"}
         for lab_id, by_stage in statuses.items()},
        {lab_id for lab_id, lab in labs.items() if not isinstance(lab, str)})
    local = now.astimezone()
    end_of_day = (local.replace(hour=0, minute=0, second=0, microsecond=0)
                  + timedelta(days=1))
    return Overview(
        lessons=tuple(rows),
        labs=tuple(lab_rows),
        due_now=len(scheduler.due(cards, now)),
        due_today=len(scheduler.due(cards, end_of_day)),
        new_cards=len(scheduler.new(cards)),
        next_due=scheduler.next_due_at(cards),
        last=_continue(session, store.last_place()),
        problems=len(catalog.problems),
        path=path,
    )


def when(moment: datetime, now: datetime) -> str:
    """`in 10 min (14:05)`, `now`, `in 3 days (Fri 12 Jun)`: a time a person can plan with."""
    seconds = (moment - now).total_seconds()
    local = moment.astimezone()
    if seconds <= 0:
        return "now"
    if seconds < 3600:
        return f"in {max(1, round(seconds / 60))} min ({local:%H:%M})"
    if seconds < 86400:
        return f"in {round(seconds / 3600)} h ({local:%H:%M})"
    return f"in {round(seconds / 86400)} days ({local:%a %d %b})"
