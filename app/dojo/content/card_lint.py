"""The rules a lesson's cards must follow (docs/content-format.md, `cards.yaml`)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from difflib import SequenceMatcher

from dojo.content.cues import cue_is_single_word
from dojo.content.matching import fold, key_point_matches
from dojo.content.models import Card, Lesson, Pattern
from dojo.content.problems import Problem
from dojo.content.text_measures import content_words, plain, words

MIN_CARDS = 4
QUESTION_OVERLAP = 0.5  # share of the lesson question's words the headline question must use
ANSWER_SIMILARITY = 0.95  # the headline answer is the 60-second answer, give or take a word
# A regex with none of these can only match one word: it proves a term, not a relation.
_SEPARATOR = re.compile(r" |\\s|\\W|\.|\[[^\]]*[ \-][^\]]*\]")


def lint_cards(lesson: Lesson, cards_parsed: bool) -> Iterator[Problem]:
    """Every problem of one lesson's cards that can be seen without the other lessons.

    When cards.yaml could not be parsed at all, the loader's problem says so and counting
    its cards would only repeat it.
    """
    path = lesson.cards_path
    if not cards_parsed:
        return
    cards = lesson.cards
    if len(cards) < MIN_CARDS:
        yield Problem(path, 1, f"{len(cards)} cards; a lesson needs at least {MIN_CARDS} "
                               "(one headline, follow-ups, a spot-the-mistake)")
    headlines = [card for card in cards if card.kind == "headline"]
    if len(headlines) != 1:
        line = headlines[1].line if len(headlines) > 1 else 1
        yield Problem(path, line, f"{len(headlines)} headline cards; exactly one, asking the "
                                  "lesson's question")
    if not any(card.kind == "spot-the-mistake" for card in cards):
        yield Problem(path, 1, "no spot-the-mistake card; build one from the common-mistakes "
                               "table")
    if headlines:
        yield from _headline(lesson, headlines[0].question, headlines[0].answer,
                             headlines[0].line)
    for card in cards:
        if card.has_cues:
            yield from _cue_card(card)
            continue
        folded = fold(plain(card.answer))
        for point in card.key_points:
            for pattern in point.patterns:
                if _is_bare_word(pattern):
                    yield Problem(path, pattern.line,
                                  f"pattern {pattern.source!r} matches a bare word; "
                                  "recognise the relation (\"retry … with backoff\")")
            if point.patterns and not key_point_matches(point, folded):
                yield Problem(path, point.line,
                              f"key point {point.id!r} is not recognised in card {card.id!r}'s "
                              "own answer: fix the patterns or say it in the answer")


def _headline(lesson: Lesson, question: str, answer: str, line: int) -> Iterator[Problem]:
    path = lesson.cards_path
    wanted = content_words(lesson.question)
    if wanted and len(wanted & content_words(question)) / len(wanted) < QUESTION_OVERLAP:
        yield Problem(path, line, f"the headline question {question!r} does not ask the "
                                  f"lesson's question {lesson.question!r}")
    spoken = [word.lower() for word in words(plain(lesson.sixty_second_answer))]
    written = [word.lower() for word in words(plain(answer))]
    if spoken and SequenceMatcher(None, spoken, written, autojunk=False).ratio() \
            < ANSWER_SIMILARITY:
        yield Problem(path, line, "the headline answer must be the lesson's 60-second answer")


def _is_bare_word(pattern: Pattern) -> bool:
    if len(pattern.regexes) != 1:
        return False
    return _SEPARATOR.search(pattern.regexes[0]) is None


def _cue_card(card: Card) -> Iterator[Problem]:
    """Format 2: single-word cues prove a term only; the model answer must make every
    essential, contradict no point and trigger no misconception."""
    from dojo.quiz.scoring import score_answer

    path = card.path
    for point in card.key_points:
        for cue in point.says:
            if cue_is_single_word(cue):
                yield Problem(path, cue.line, f"cue {cue.source!r} can match a single word; "
                                              "recognise the relation (\"retry + backoff\")")
    score = score_answer(card, plain(card.answer))
    for result in score.results:
        if result.contradicted:
            yield Problem(path, result.point.line,
                          f"card {card.id!r}'s own answer contradicts point {result.point.id!r} "
                          f"({result.because}): fix the cues or misconceptions")
        elif not result.made and not result.point.bonus:
            yield Problem(path, result.point.line,
                          f"essential {result.point.id!r} is not recognised in card "
                          f"{card.id!r}'s own answer: fix the cues or say it in the answer")
