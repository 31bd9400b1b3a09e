"""Export the cards as an Anki package (.apkg) with ids that stay the same between exports.

Anki recognises a note by its guid and a deck or note type by its id; deriving all three from
our stable card and lesson ids means re-importing an updated export updates the notes in
place and keeps the learner's Anki history, instead of adding duplicates.
"""

from __future__ import annotations

import html
from pathlib import Path

import genanki

from dojo.content.models import Card, Catalog, Lesson
from dojo.quiz.ids import stable_id

DECK_ROOT = "Interview Dojo"
MODEL_NAME = "Interview Dojo card"
MODEL_KEY = "interview-dojo:anki-model:v1"  # bump the version only if the fields change
FIELDS = ("Question", "Answer", "KeyPoints", "Measuring", "Lesson", "CardId")
_CSS = """
.card { font-family: -apple-system, "Segoe UI", sans-serif; font-size: 18px;
        max-width: 44em; margin: 0 auto; text-align: left; }
.lesson { color: #888; font-size: 14px; }
.points li { margin: .2em 0; }
.measuring { color: #555; font-style: italic; }
"""
_FRONT = '<div class="lesson">{{Lesson}}</div><h3>{{Question}}</h3>'
_BACK = ('{{FrontSide}}<hr id="answer"><div>{{Answer}}</div>'
         '<ul class="points">{{KeyPoints}}</ul>'
         '{{#Measuring}}<p class="measuring">{{Measuring}}</p>{{/Measuring}}')


def anki_model() -> genanki.Model:
    """The note type: one card per note, question on the front, answer and points behind."""
    return genanki.Model(
        stable_id(MODEL_KEY), MODEL_NAME,
        fields=[{"name": name} for name in FIELDS],
        templates=[{"name": "Answer in 60 seconds", "qfmt": _FRONT, "afmt": _BACK}],
        css=_CSS)


def deck_name(lesson: Lesson) -> str:
    return f"{DECK_ROOT}::{lesson.dir.name[:2]} {lesson.title}"


def _html(text: str) -> str:
    paragraphs = [" ".join(part.split()) for part in text.strip().split("\n\n")]
    return "<br><br>".join(html.escape(part) for part in paragraphs if part)


def anki_note(card: Card, lesson: Lesson, model: genanki.Model) -> genanki.Note:
    """The note for one card; its guid depends on the card id only."""
    points = "".join(f"<li>{html.escape(point.text)}</li>" for point in card.key_points)
    return genanki.Note(
        model=model,
        fields=[html.escape(card.question), _html(card.answer), points,
                html.escape(card.measuring), html.escape(lesson.title), card.id],
        guid=genanki.guid_for("interview-dojo", card.id),
        tags=[lesson.id, card.kind, lesson.track])


def build_anki_package(catalog: Catalog) -> tuple[genanki.Package, int]:
    """A package with one deck per lesson; returns it and the number of notes in it."""
    model = anki_model()
    decks = []
    notes = 0
    for lesson in catalog.lessons:
        if not lesson.cards:
            continue
        deck = genanki.Deck(stable_id(f"interview-dojo:deck:{lesson.id}"), deck_name(lesson))
        for card in lesson.cards:
            deck.add_note(anki_note(card, lesson, model))
            notes += 1
        decks.append(deck)
    return genanki.Package(decks), notes


def write_anki_package(catalog: Catalog, path: Path) -> int:
    """Write every card to `path` (.apkg); returns the number of notes written."""
    package, notes = build_anki_package(catalog)
    path.parent.mkdir(parents=True, exist_ok=True)
    package.write_to_file(str(path))
    return notes
