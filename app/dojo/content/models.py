"""Typed models of lessons and cards, as `dojo.content` loads them from `lessons/`.

Everything is frozen: the files on disk are the source of truth, the models are a read-only
view of them. Each model keeps the line it came from so later checks can point back at it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from dojo.content.cues import Cue, vocabulary
from dojo.content.problems import Problem

TRACKS = ("interview", "next", "craft")
CARD_KINDS = ("headline", "followup", "spot-the-mistake")
DEFAULT_WINDOW = 120


@dataclass(frozen=True)
class Pattern:
    """Recognises a key point: every regex matches inside one window of `within` characters.

    A plain regex string in cards.yaml becomes one regex with `within=None` (anywhere in the
    answer); `{all: [...], within: N}` becomes several regexes and a window.
    """

    regexes: tuple[str, ...]
    within: int | None
    line: int

    @cached_property
    def compiled(self) -> tuple[re.Pattern[str], ...]:
        return tuple(re.compile(regex, re.IGNORECASE) for regex in self.regexes)

    @property
    def source(self) -> str:
        """The pattern as a writer wrote it, for messages."""
        if self.within is None and len(self.regexes) == 1:
            return self.regexes[0]
        return f"all of {list(self.regexes)} within {self.within or DEFAULT_WINDOW}"


@dataclass(frozen=True)
class KeyPoint:
    """One thing a good answer says, and what recognises it in a typed answer: `says` cues
    (ideas, see dojo.content.cues) and/or regex `patterns`. `bonus` points are details that
    add a little; the others are the card's essentials."""

    id: str
    text: str
    patterns: tuple[Pattern, ...]
    line: int
    says: tuple[Cue, ...] = ()
    bonus: bool = False


@dataclass(frozen=True)
class Misconception:
    """A claim that is the opposite of key point `point`; saying it zeroes that point."""

    point: str
    text: str
    says: tuple[Cue, ...]
    patterns: tuple[Pattern, ...]
    line: int


@dataclass(frozen=True)
class Card:
    """A question to answer in 60 seconds, its model answer and its key points."""

    id: str
    kind: str
    question: str
    answer: str
    measuring: str
    key_points: tuple[KeyPoint, ...]
    lesson_id: str
    path: Path
    line: int
    misconceptions: tuple[Misconception, ...] = ()

    @property
    def is_headline(self) -> bool:
        return self.kind == "headline"

    @property
    def essentials(self) -> tuple[KeyPoint, ...]:
        return tuple(point for point in self.key_points if not point.bonus)

    @property
    def bonus_points(self) -> tuple[KeyPoint, ...]:
        return tuple(point for point in self.key_points if point.bonus)

    @property
    def has_cues(self) -> bool:
        """Format 2 (essentials/bonus/misconceptions) rather than regex-only key points."""
        return any(point.says for point in self.key_points) or bool(self.misconceptions)

    @cached_property
    def vocabulary(self) -> frozenset[str]:
        """The words this card uses, which a typo in an answer is repaired towards."""
        cues = [cue for point in self.key_points for cue in point.says]
        cues += [cue for mis in self.misconceptions for cue in mis.says]
        texts = [self.answer, *(point.text for point in self.key_points)]
        return vocabulary(cues, texts)


@dataclass(frozen=True)
class LabLink:
    """A lab stage that practises a lesson (`labs:` in the front matter)."""

    lab: str
    stage: str
    line: int


@dataclass(frozen=True)
class CodeBlock:
    """A fenced block in a lesson body; `info` is its language (`diagram` for ASCII art)."""

    info: str
    text: str
    line: int  # of the opening fence

    @property
    def is_diagram(self) -> bool:
        return self.info == "diagram"


@dataclass(frozen=True)
class Subsection:
    """An H3 inside a section: title, slug for links, body text."""

    title: str
    slug: str
    text: str
    line: int  # of the heading
    text_line: int  # of the first line of `text`


@dataclass(frozen=True)
class Section:
    """An H2 of the lesson body, with its own text (before any H3) and its H3 subsections."""

    title: str
    slug: str
    line: int  # of the heading
    intro: str  # the text before the first H3
    intro_line: int
    subsections: tuple[Subsection, ...]
    end_line: int

    @property
    def text(self) -> str:
        """The whole section as Markdown, H3 headings included."""
        parts = [self.intro] + [f"### {sub.title}\n\n{sub.text}" for sub in self.subsections]
        return "\n\n".join(part for part in parts if part).strip()


@dataclass(frozen=True)
class FollowUp:
    """A follow-up question and its answer, at interview depth `level` (1–3)."""

    level: int
    question: str
    answer: str
    line: int


@dataclass(frozen=True)
class MistakeRow:
    """One row of the common-mistakes table."""

    mistake: str
    consequence: str
    fix: str
    line: int


@dataclass(frozen=True)
class LessonLink:
    """A `lesson:<id>` or `lesson:<id>#<section>` link in a lesson body."""

    lesson_id: str
    section: str
    line: int


@dataclass(frozen=True)
class Lesson:
    """A lesson: its front matter, its parsed body and its cards."""

    id: str
    title: str
    track: str
    order: int
    question: str
    seconds: int
    labs: tuple[LabLink, ...]
    related: tuple[str, ...]
    sources: tuple[str, ...]
    dir: Path
    sections: tuple[Section, ...]
    follow_ups: tuple[FollowUp, ...]
    mistakes: tuple[MistakeRow, ...]
    code_blocks: tuple[CodeBlock, ...]
    links: tuple[LessonLink, ...]
    cards: tuple[Card, ...] = ()

    @property
    def path(self) -> Path:
        return self.dir / "lesson.md"

    @property
    def cards_path(self) -> Path:
        return self.dir / "cards.yaml"

    @property
    def diagrams(self) -> tuple[CodeBlock, ...]:
        return tuple(block for block in self.code_blocks if block.is_diagram)

    def section(self, title_or_slug: str) -> Section | None:
        """The H2 section with this exact title or slug, if the lesson has it."""
        for section in self.sections:
            if title_or_slug in (section.title, section.slug):
                return section
        return None

    @property
    def sixty_second_answer(self) -> str:
        """The text of `## The 60-second answer`, paragraphs kept."""
        section = self.section("The 60-second answer")
        return section.intro if section else ""

    @property
    def headline_card(self) -> Card | None:
        return next((card for card in self.cards if card.is_headline), None)

    def anchors(self) -> frozenset[str]:
        """Every slug a `lesson:<id>#<slug>` link may point at: H2 and H3 headings."""
        slugs = {section.slug for section in self.sections}
        slugs.update(sub.slug for section in self.sections for sub in section.subsections)
        return frozenset(slugs)


@dataclass(frozen=True)
class Catalog:
    """Every lesson under a content root, sorted by track and order, with lookups by id.

    `problems` are the ones found while loading (broken YAML, missing files, bad shapes);
    the linter adds the content rules on top.
    """

    root: Path
    lessons: tuple[Lesson, ...]
    problems: tuple[Problem, ...] = ()
    _by_id: dict[str, Lesson] = field(default_factory=dict, repr=False, compare=False)
    _cards: dict[str, Card] = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self) -> None:
        for lesson in self.lessons:
            self._by_id.setdefault(lesson.id, lesson)
            for card in lesson.cards:
                self._cards.setdefault(card.id, card)

    def lesson(self, lesson_id: str) -> Lesson:
        """The lesson called `lesson_id`; KeyError names the ones there are."""
        try:
            return self._by_id[lesson_id]
        except KeyError:
            known = ", ".join(self._by_id) or "none"
            raise KeyError(f"no lesson {lesson_id!r} (lessons: {known})") from None

    def has_lesson(self, lesson_id: str) -> bool:
        return lesson_id in self._by_id

    def find_lesson(self, ref: str) -> Lesson:
        """The lesson `ref` names: its id (`dead-letter-queue`), its number (`01` or `1`) or
        its folder (`01-dead-letter-queue`). KeyError lists the lessons there are."""
        ref = ref.strip()
        if ref in self._by_id:
            return self._by_id[ref]
        for lesson in self.lessons:
            number = lesson.dir.name[:2]
            if ref == lesson.dir.name or (ref.isdigit() and number.isdigit()
                                          and int(ref) == int(number)):
                return lesson
        known = ", ".join(f"{lesson.dir.name[:2]} {lesson.id}" for lesson in self.lessons)
        raise KeyError(f"no lesson {ref!r}; lessons: {known or 'none yet'}")

    def card(self, card_id: str) -> Card:
        """The card called `card_id`; KeyError when no lesson has it."""
        try:
            return self._cards[card_id]
        except KeyError:
            raise KeyError(f"no card {card_id!r}") from None

    def has_card(self, card_id: str) -> bool:
        return card_id in self._cards

    @property
    def cards(self) -> tuple[Card, ...]:
        """Every card, in lesson order."""
        return tuple(card for lesson in self.lessons for card in lesson.cards)

    def track(self, track: str) -> tuple[Lesson, ...]:
        """The lessons of one track, in order."""
        return tuple(lesson for lesson in self.lessons if lesson.track == track)

    def lesson_of(self, card: Card) -> Lesson:
        return self.lesson(card.lesson_id)
