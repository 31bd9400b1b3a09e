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

from dojo.content.cues import DEFAULT_WITHIN, Cue, CueError, parse_cue
from dojo.content.models import (
    CARD_KINDS,
    DEFAULT_WINDOW,
    Card,
    KeyPoint,
    Misconception,
    Pattern,
)
from dojo.content.problems import Problem
from dojo.content.yaml_lines import YamlDoc, YamlPath, YamlSyntaxError, parse_yaml

CARD_KEYS = ("id", "kind", "question", "answer", "measuring", "key_points", "essentials",
             "bonus", "misconceptions", "terms")
KEY_POINT_KEYS = ("id", "text", "patterns", "says", "within")
MISCONCEPTION_KEYS = ("point", "text", "says", "patterns")
ESSENTIALS = (4, 6)
MAX_BONUS = 4
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
        self.lesson_terms: dict[str, tuple[str, ...]] = {}
        self.card_terms: dict[str, tuple[str, ...]] = {}

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
            if key not in ("lesson", "cards", "terms"):
                self.problem(f"unknown key `{key}` (cards.yaml has `lesson`, `terms` and "
                             "`cards`)", str(key))
        self.lesson_terms = self.terms(data.get("terms"), ())
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
        self.card_terms = {**self.lesson_terms, **self.terms(raw.get("terms"), (*where,))}
        misconceptions: tuple[Misconception, ...] = ()
        if "essentials" in raw or "key_points" not in raw:
            if "key_points" in raw:
                self.problem("a card has `essentials` (+ `bonus`) or the old `key_points`, "
                             "not both", *where, "key_points")
            essentials = self.points(raw.get("essentials"), (*where, "essentials"),
                                     bonus=False, sizes=ESSENTIALS)
            bonus = self.points(raw.get("bonus", []), (*where, "bonus"), bonus=True,
                                sizes=(0, MAX_BONUS))
            key_points = essentials + bonus
            self.unique_ids(key_points, where)
            misconceptions = self.misconceptions(raw.get("misconceptions"), where,
                                                 {point.id for point in key_points})
        else:
            key_points = self.key_points(raw.get("key_points"), where)
        if not card_id or not question or kind not in CARD_KINDS:
            return None
        return Card(card_id, kind, question, answer, measuring, key_points, self.lesson_id,
                    self.path, self.doc.line(*where), misconceptions)

    def terms(self, raw: Any, where: YamlPath) -> dict[str, tuple[str, ...]]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            self.problem("`terms` maps a name to a list of phrases", *where, "terms")
            return {}
        out: dict[str, tuple[str, ...]] = {}
        for name, phrases in raw.items():
            if isinstance(phrases, list):  # 503 in a flow list is a number to YAML
                phrases = [str(item) if isinstance(item, int | float) and not
                           isinstance(item, bool) else item for item in phrases]
            if not isinstance(phrases, list) or not phrases or not all(
                    isinstance(item, str) and item.strip() for item in phrases):
                self.problem(f"term `{name}` must be a list of phrases", *where, "terms",
                             str(name))
                continue
            out[str(name)] = tuple(phrases)
        return out

    def points(self, raw: Any, where: YamlPath, *, bonus: bool,
               sizes: tuple[int, int]) -> tuple[KeyPoint, ...]:
        key = where[-1]
        low, high = sizes
        if raw is None:
            self.problem(f"card is missing `{key}` ({low} to {high})", *where[:-1])
            return ()
        if not isinstance(raw, list):
            self.problem(f"`{key}` must be a list", *where)
            return ()
        if not low <= len(raw) <= high:
            self.problem(f"a card has {low} to {high} {key}, this one has {len(raw)}", *where)
        points: list[KeyPoint] = []
        for index, item in enumerate(raw):
            point_where: YamlPath = (*where, index)
            if not isinstance(item, dict):
                self.problem("each point must be a mapping (id, text, says)", *point_where)
                continue
            for item_key in item:
                if item_key not in KEY_POINT_KEYS:
                    self.problem(f"unknown point key `{item_key}` "
                                 f"(known: {', '.join(KEY_POINT_KEYS)})", *point_where,
                                 str(item_key))
            point_id = self.text(item, "id", point_where)
            text = self.text(item, "text", point_where)
            within = item.get("within", DEFAULT_WITHIN)
            if isinstance(within, bool) or not isinstance(within, int) or within < 2:
                self.problem(f"`within` must be a number of words, not {within!r}",
                             *point_where, "within")
                within = DEFAULT_WITHIN
            says = self.cues(item.get("says"), point_where, within)
            patterns = self.patterns(item["patterns"], point_where) if "patterns" in item \
                else ()
            if not says and not patterns:
                self.problem("a point needs `says` (cues) or `patterns`", *point_where)
            if point_id and text:
                points.append(KeyPoint(point_id, text, patterns, self.doc.line(*point_where),
                                       says, bonus))
        return tuple(points)

    def unique_ids(self, points: tuple[KeyPoint, ...], where: YamlPath) -> None:
        seen: set[str] = set()
        for point in points:
            if point.id in seen:
                self.problems.append(Problem(self.path, point.line, f"point id {point.id!r} "
                                             "appears twice in this card"))
            seen.add(point.id)

    def cues(self, raw: Any, where: YamlPath, within: int = DEFAULT_WITHIN,
             sentences: int | None = None) -> tuple[Cue, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list) or not all(isinstance(item, str) for item in raw):
            self.problem("`says` must be a list of cue strings", *where, "says")
            return ()
        out: list[Cue] = []
        for index, source in enumerate(raw):
            line = self.doc.line(*where, "says", index)
            try:
                out.append(parse_cue(source, self.card_terms, line, within) if sentences is None
                           else parse_cue(source, self.card_terms, line, within, sentences))
            except CueError as exc:
                self.problems.append(Problem(self.path, line, f"cue {source!r}: {exc}"))
        return tuple(out)

    def misconceptions(self, raw: Any, where: YamlPath,
                       point_ids: set[str]) -> tuple[Misconception, ...]:
        if raw is None:
            return ()
        if not isinstance(raw, list):
            self.problem("`misconceptions` must be a list", *where, "misconceptions")
            return ()
        out: list[Misconception] = []
        for index, item in enumerate(raw):
            item_where: YamlPath = (*where, "misconceptions", index)
            if not isinstance(item, dict):
                self.problem("each misconception is a mapping (point, text, says)", *item_where)
                continue
            for key in item:
                if key not in MISCONCEPTION_KEYS:
                    self.problem(f"unknown misconception key `{key}` "
                                 f"(known: {', '.join(MISCONCEPTION_KEYS)})", *item_where,
                                 str(key))
            point = self.text(item, "point", item_where)
            if point and point not in point_ids:
                self.problem(f"misconception names point {point!r}, which this card does not "
                             "have", *item_where, "point")
            text = self.text(item, "text", item_where)
            # A wrong claim is made in one sentence; across two, it is usually a contrast.
            says = self.cues(item.get("says"), item_where, sentences=1)
            patterns = self.patterns(item["patterns"], item_where) if "patterns" in item \
                else ()
            if not says and not patterns:
                self.problem("a misconception needs `says` (cues) or `patterns`", *item_where)
            if point and text:
                out.append(Misconception(point, text, says, patterns,
                                         self.doc.line(*item_where)))
        return tuple(out)

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
