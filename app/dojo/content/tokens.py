"""An answer as cues see it: lower-cased words, stemmed (Snowball English), negators folded
into one token `not` ("don't", "never", "without", "instead of" …), each with the clause and
the sentence it sits in.

Clauses end at `. , ; : ! ? ( )`, at a line break, at " - ", and before a clause word ("but",
"because", "which", …); sentences end at `. ! ?` followed by a space or the end, and at a line
break. A dotted name (spring.factories) or a decimal (0.5) ends nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from functools import lru_cache

import snowballstemmer

NOT = "not"

_STEMMER = snowballstemmer.stemmer("english")

# Words that say "not"; each becomes the token `not`.
_NEGATOR_WORDS = frozenset("""
not no never without cannot nor neither none nothing nobody nowhere lack lacks lacking lacked
avoid avoids avoided avoiding dont doesnt didnt isnt arent wasnt werent cant wont wouldnt
shouldnt couldnt mustnt havent hasnt hadnt neednt
""".split())
_NEGATOR_PHRASES = (("instead", "of"), ("rather", "than"), ("no", "longer"), ("as", "opposed"),
                    ("in", "place", "of"))
# Words after which a new clause starts (they are tokens themselves, in the new clause).
_CLAUSE_WORDS = frozenset("""
but because since so which while whereas although though otherwise unless until then if when
where however yet whether
""".split())
_DROPPED = frozenset({"the", "a", "an"})
# A dotted name (spring.factories, com.acme.fx, max.poll.interval.ms) or a decimal (0.5) is one
# match: a dot with no space after it ends no sentence.
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*(?:['’][a-z]+)?|[.!?;:,()\n]|\s[-–—]\s")
_DECIMAL = re.compile(r"\d+(?:\.\d+)+")
# "e.g." and "i.e." end no sentence and say nothing.
_ABBREVIATIONS = frozenset({"e.g", "i.e"})
_SENTENCE_END = frozenset(".!?\n")


@lru_cache(maxsize=50_000)
def stem(word: str) -> str:
    return _STEMMER.stemWord(word)


@dataclass(frozen=True)
class Token:
    word: str  # lower-case, as typed (after typo repair: the card's word)
    norm: str  # stem, or `not` for a negator
    start: int  # character offsets into the answer
    end: int
    clause: int
    sentence: int
    # "stop" before a gerund ("stop blocking"): a cue's `not` matches it, but it does not
    # govern other ideas the way a negator does ("stop consuming" is not "not consuming" of
    # every idea after it).
    stops: bool = False


def tokenize(text: str) -> list[Token]:
    """The answer as cues see it (see the module docstring)."""
    raw: list[tuple[str, int, int]] = []
    clause = sentence = 0
    tokens: list[Token] = []
    lowered = text.lower()
    skip_dot = -1
    for match in _TOKEN.finditer(lowered):
        piece = match.group()
        if match.start() == skip_dot:
            continue
        if not piece[0].isalnum():
            clause += 1
            if piece.strip() in _SENTENCE_END or piece == "\n":
                sentence += 1
            continue
        piece = piece.replace("’", "'")
        start, end = match.start(), match.end()
        if piece in _ABBREVIATIONS:
            skip_dot = end
            continue
        if "." in piece and not _DECIMAL.fullmatch(piece.split("'")[0]):
            # A dotted name: its parts are plain words of one phrase ("max poll interval"),
            # never a negator or a clause word.
            offset = start
            for part in piece.split("'")[0].split("."):
                stemmed = stem(part)
                tokens.append(Token(part, stemmed, offset, offset + len(part), clause, sentence))
                offset += len(part) + 1
            continue
        if piece.endswith("n't"):
            base = {"can't": "can", "won't": "will", "shan't": "shall"}.get(piece, piece[:-3])
            raw.append((base, start, end - 3))
            raw.append(("n't", end - 3, end))
        elif "'" in piece:
            raw.append((piece.split("'")[0], start, end))
        else:
            raw.append((piece, start, end))
        for word, w_start, w_end in raw:
            if word in _DROPPED:
                continue
            if word in _CLAUSE_WORDS:
                clause += 1
            norm = NOT if word == "n't" or word in _NEGATOR_WORDS else stem(word)
            tokens.append(Token(word, norm, w_start, w_end, clause, sentence))
        raw.clear()
    return _mark_stops(_merge_negator_phrases(tokens))


_STOP_WORDS = frozenset("stop stops stopped stopping cease ceases ceased quit quits".split())


def _mark_stops(tokens: list[Token]) -> list[Token]:
    for index, token in enumerate(tokens[:-1]):
        following = tokens[index + 1]
        if token.word in _STOP_WORDS and following.word.endswith("ing") \
                and following.clause == token.clause:
            tokens[index] = replace(token, stops=True)
    return tokens


def _merge_negator_phrases(tokens: list[Token]) -> list[Token]:
    out: list[Token] = []
    index = 0
    while index < len(tokens):
        for phrase in _NEGATOR_PHRASES:
            window = tokens[index:index + len(phrase)]
            if len(window) == len(phrase) and all(t.word == w for t, w in zip(window, phrase,
                                                                                 strict=True)):
                first, last = window[0], window[-1]
                out.append(Token(" ".join(phrase), NOT, first.start, last.end, first.clause,
                                 first.sentence))
                index += len(phrase)
                break
        else:
            out.append(tokens[index])
            index += 1
    return out


@dataclass(frozen=True)
class Occurrence:
    """Where a phrase matched: from token `first` to `last`."""

    first: int  # token indexes
    last: int
    used: frozenset[int]  # tokens the phrase consumed (its own `not`s among them)
