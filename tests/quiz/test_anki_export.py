"""`dojo export anki`: an .apkg (a zip holding a SQLite collection) with stable ids."""

from __future__ import annotations

import json
import sqlite3
import zipfile
from pathlib import Path

from dojo.content import load_catalog
from dojo.quiz.anki import MODEL_KEY
from dojo.quiz.ids import stable_id
from tests.quiz.cli_helpers import FIXTURES, run_dojo


def collection(apkg: Path, into: Path) -> sqlite3.Connection:
    with zipfile.ZipFile(apkg) as archive:
        archive.extract("collection.anki2", into)
    return sqlite3.connect(into / "collection.anki2")


def export(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    done = run_dojo(["export", "anki", "-o", str(out)], tmp_path / "data")
    assert done.returncode == 0, done.stderr
    assert f"wrote 8 notes from 2 lessons to {out}" in done.stdout
    return out


def test_every_card_becomes_a_note_with_its_question_and_answer(tmp_path: Path) -> None:
    conn = collection(export(tmp_path, "dojo.apkg"), tmp_path / "a")
    notes = {fields.split("\x1f")[-1]: fields.split("\x1f")
             for (fields,) in conn.execute("select flds from notes")}
    catalog = load_catalog(FIXTURES)
    assert set(notes) == {card.id for card in catalog.cards}
    question, answer, points = notes["fx-dlq-spot"][:3]
    assert question == "A consumer catches every exception, logs it and commits the offset. " \
                       "What is wrong?"
    assert answer.startswith("Logging and committing loses the message for good")
    assert "<li>The committed offset moves past it</li>" in points


def test_ids_are_the_same_on_every_export(tmp_path: Path) -> None:
    first = collection(export(tmp_path, "one.apkg"), tmp_path / "one")
    second = collection(export(tmp_path, "two.apkg"), tmp_path / "two")
    query = "select guid, mid from notes order by guid"
    assert first.execute(query).fetchall() == second.execute(query).fetchall()
    (models,) = first.execute("select models from col").fetchone()
    assert str(stable_id(MODEL_KEY)) in json.loads(models)


def test_each_lesson_has_its_own_deck_under_one_root(tmp_path: Path) -> None:
    conn = collection(export(tmp_path, "dojo.apkg"), tmp_path / "a")
    (decks,) = conn.execute("select decks from col").fetchone()
    names = {deck["name"]: int(deck_id) for deck_id, deck in json.loads(decks).items()}
    assert names["Interview Dojo::01 Dead letter queues"] == \
        stable_id("interview-dojo:deck:dead-letter-queue")
    assert "Interview Dojo::02 Idempotent consumers" in names


def test_notes_are_tagged_with_lesson_and_kind(tmp_path: Path) -> None:
    conn = collection(export(tmp_path, "dojo.apkg"), tmp_path / "a")
    tags = {row[0].strip() for row in conn.execute("select tags from notes")}
    assert "dead-letter-queue spot-the-mistake interview" in tags
