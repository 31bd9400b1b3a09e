"""Load `cards.yaml`: the quiz cards of one lesson, checked for shape as they are read.

Every problem names its line in cards.yaml. A card that is too broken to quiz on (no id, no
question) is left out; a pattern that does not compile is left out of its key point, so the
scorer never meets a regex it cannot run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dojo.content.models import CARD_KINDS, DEFAULT_WINDOW, Card, KeyPoint, Pattern
from dojo.content.problems import Problem
from dojo.content.yaml_lines import YamlDoc, YamlPath, YamlSyntaxError, parse_yaml

CARD_KEYS = ("id", "kind", "question", "answer", "measuring", "key_points")
KEY_POINT_KEYS = ("id", "text", "patterns")
SLUG = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*")


@dataclass(frozen=True)
class CardsFile:
    """What reading one cards.yaml produced. `parsed` is False when the file is missing,
    unreadable or not YAML: then there is nothing to count or judge."""

    cards: tuple[Card, ...]
    problems: tuple[Problem, ...]
    parsed: bool


def read_cards(path: Path, lesson_id: str) -> CardsFile:
    """The cards in `path` and the problems found reading them; never raises on content."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return CardsFile((), (Problem(path, 1, "missing: every lesson needs a cards.yaml "
                                               "next to it"),), parsed=False)
    except (OSError, UnicodeDecodeError) as exc:
        return CardsFile((), (Problem(path, 1, f"cannot read: {exc}"),), parsed=False)
    try:
        doc = parse_yaml(text, path)
    except YamlSyntaxError as exc:
        return CardsFile((), (Problem(path, exc.line, exc.message),), parsed=False)
    reader = _CardsReader(doc, lesson_id)
    cards = reader.cards()
    return CardsFile(cards, tuple(reader.problems), parsed=isinstance(doc.data, dict))


class _CardsReader:
    def __init__(self, doc: YamlDoc, lesson_id: str) -> None:
        self.doc = doc
        self.path = doc.path
        self.lesson_id = lesson_id
        self.problems: list[Problem] = []

    def problem(self, message: str, *keys: str | int) -> None:
        self.problems.append(Problem(self.path, self.doc.line(*keys), message))

    def cards(self) -> tuple[Card, ...]:
        for key_path, line in self.doc.duplicate_keys:
            self.problems.append(Problem(self.path, line, f"`{key_path[-1]}` appears twice"))
        data = self.doc.data
        if not isinstance(data, dict):
            self.problem("cards.yaml must be a mapping with `lesson` and `cards`")
            return ()
        for key in data:
            if key not in ("lesson", "cards"):
                self.problem(f"unknown key `{key}` (cards.yaml has `lesson` and `cards`)",
                             str(key))
        lesson = data.get("lesson")
        if lesson != self.lesson_id:
            self.problem(f"`lesson` is {lesson!r}; it must be this lesson's id "
                         f"{self.lesson_id!r}", "lesson")
        raw_cards = data.get("cards")
        if not isinstance(raw_cards, list):
            self.problem("`cards` must be a list of cards", "cards")
            return ()
        cards = (self.card(raw, index) for index, raw in enumerate(raw_cards))
        return tuple(card for card in cards if card is not None)

    def text(self, raw: dict[str, Any], key: str, where: YamlPath,
             required: bool = True) -> str:
        value = raw.get(key)
        if value is None:
            if required:
                self.problem(f"card is missing `{key}`", *where)
            return ""
        if not isinstance(value, str) or not value.strip():
            self.problem(f"`{key}` must be non-empty text", *where, key)
            return ""
        return value.strip()

    def card(self, raw: Any, index: int) -> Card | None:
        where: YamlPath = ("cards", index)
        if not isinstance(raw, dict):
            self.problem("each card must be a mapping (id, kind, question, answer, …)", *where)
            return None
        for key in raw:
            if key not in CARD_KEYS:
                self.problem(f"unknown card key `{key}` (known: {', '.join(CARD_KEYS)})",
                             *where, str(key))
        card_id = self.text(raw, "id", where)
        if card_id and not SLUG.fullmatch(card_id):
            self.problem(f"card id {card_id!r} must be a slug (a-z, 0-9, hyphens)", *where, "id")
        kind = self.text(raw, "kind", where)
        if kind and kind not in CARD_KINDS:
            self.problem(f"kind {kind!r} must be one of {', '.join(CARD_KINDS)}", *where, "kind")
        question = self.text(raw, "question", where)
        answer = self.text(raw, "answer", where)
        measuring = self.text(raw, "measuring", where, required=kind == "headline")
        key_points = self.key_points(raw.get("key_points"), where)
        if not card_id or not question or kind not in CARD_KINDS:
            return None
        return Card(card_id, kind, question, answer, measuring, key_points, self.lesson_id,
                    self.path, self.doc.line(*where))

    def key_points(self, raw: Any, where: YamlPath) -> tuple[KeyPoint, ...]:
        if raw is None:
            self.problem("card is missing `key_points` (4 to 8)", *where)
            return ()
        if not isinstance(raw, list):
            self.problem("`key_points` must be a list", *where, "key_points")
            return ()
        if not 4 <= len(raw) <= 8:
            self.problem(f"a card has 4 to 8 key points, this one has {len(raw)}",
                         *where, "key_points")
        points: list[KeyPoint] = []
        seen: set[str] = set()
        for index, item in enumerate(raw):
            point_where: YamlPath = (*where, "key_points", index)
            if not isinstance(item, dict):
                self.problem("each key point must be a mapping (id, text, patterns)",
                             *point_where)
                continue
            for key in item:
                if key not in KEY_POINT_KEYS:
                    self.problem(f"unknown key point key `{key}` "
                                 f"(known: {', '.join(KEY_POINT_KEYS)})", *point_where, str(key))
            point_id = self.text(item, "id", point_where)
            if point_id in seen:
                self.problem(f"key point id {point_id!r} appears twice in this card",
                             *point_where, "id")
            seen.add(point_id)
            text = self.text(item, "text", point_where)
            patterns = self.patterns(item.get("patterns"), point_where)
            if point_id and text:
                points.append(KeyPoint(point_id, text, patterns, self.doc.line(*point_where)))
        return tuple(points)

    def patterns(self, raw: Any, where: YamlPath) -> tuple[Pattern, ...]:
        if not isinstance(raw, list) or not raw:
            self.problem("a key point needs `patterns`: a list of at least one pattern",
                         *where, "patterns")
            return ()
        out: list[Pattern] = []
        for index, item in enumerate(raw):
            pattern = self.pattern(item, (*where, "patterns", index))
            if pattern is not None:
                out.append(pattern)
        return tuple(out)

    def pattern(self, raw: Any, where: YamlPath) -> Pattern | None:
        line = self.doc.line(*where)
        regexes: Any
        within: Any
        if isinstance(raw, str):
            regexes, within = [raw], None
        elif isinstance(raw, dict):
            unknown = set(raw) - {"all", "within"}
            if unknown:
                self.problem(f"a pattern mapping has `all` and `within`, not "
                             f"{', '.join(sorted(map(str, unknown)))}", *where)
            regexes = raw.get("all")
            within = raw.get("within", DEFAULT_WINDOW)
            if (not isinstance(regexes, list) or not regexes
                    or not all(isinstance(regex, str) for regex in regexes)):
                self.problem("`all` must be a list of regular expressions", *where)
                return None
            if isinstance(within, bool) or not isinstance(within, int) or within < 1:
                self.problem(f"`within` must be a positive number of characters, not {within!r}",
                             *where, "within")
                return None
        else:
            self.problem("a pattern is a regex string or {all: [regex, …], within: N}", *where)
            return None
        valid = True
        for regex in regexes:
            try:
                compiled = re.compile(regex, re.IGNORECASE)
            except re.error as exc:
                self.problem(f"pattern {regex!r} does not compile: {exc}", *where)
                valid = False
                continue
            if compiled.search("") is not None:
                self.problem(f"pattern {regex!r} matches empty text, so it recognises anything",
                             *where)
                valid = False
        return Pattern(tuple(regexes), within, line) if valid else None
