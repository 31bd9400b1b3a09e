"""Does a typed answer read like sentences, or like a list of keywords?

Patterns look for relations, but a long enough keyword list can still hit some of them, and
in an interview a list of terms is not an answer. Two signals, both cheap and deterministic:

- function words (the, is, so, because, when, ve, için, …) make up 35–55 % of spoken
  English and Turkish prose and almost none of a keyword list;
- a keyword list is mostly fragments of one to three words, or telegraphic ones of four or
  five with at most one function word, separated by commas, newlines, semicolons, slashes or
  bullets.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIN_WORDS_TO_JUDGE = 5  # shorter answers score low anyway; too little text to judge the shape
MIN_FUNCTION_SHARE = 0.12
FRAGMENT_WORDS = 3
TELEGRAPHIC_WORDS = 5  # a fragment this long with at most one function word is telegraphic
MIN_FRAGMENTS = 4
MAX_FRAGMENT_SHARE = 0.6

FUNCTION_WORDS = frozenset("""
a an the this that these those it its they them their we our you your i my he she his her
is are was were be been being am do does did done has have had will would can could should
shall may might must not no nor and or but so if then than because since when while where
whereas until unless though although as at by for from in into of off on onto out over to
up with within without about after before between through during under again only also just
there here what which who whom whose why how all any each every some such both either neither
once twice more most less very too
ve veya ya ile için bir bu şu o da de ki ama fakat çünkü eğer gibi daha en mi mı mu mü ne
olarak sonra önce değil var yok her hem kadar göre
""".split())

_WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|\d+")
_FRAGMENT_SPLIT = re.compile(r"[,;/|\n•·]+|(?<=[.!?])\s+|\s[-–—*]\s")


@dataclass(frozen=True)
class AnswerShape:
    """Measures of an answer's form, and the verdict the scorer applies."""

    words: int
    function_word_share: float
    fragment_word_share: float  # share of words in fragments of 1–3 words or telegraphic ones
    looks_like_keyword_list: bool
    reason: str  # why, in words the learner can act on; empty when not a list


def _telegraphic(piece: list[str]) -> bool:
    """A fragment of one to three words, or of up to five with at most one function word
    ("outbox row same transaction", "relay polls then marks sent"): a note, not a sentence."""
    return len(piece) <= FRAGMENT_WORDS or (
        len(piece) <= TELEGRAPHIC_WORDS and sum(word in FUNCTION_WORDS for word in piece) <= 1)


def answer_shape(text: str) -> AnswerShape:
    """Judge the form of `text` (deterministic, no model)."""
    tokens = [word.lower() for word in _WORD.findall(text)]
    count = len(tokens)
    if count == 0:
        return AnswerShape(0, 0.0, 0.0, False, "")
    function_share = sum(word in FUNCTION_WORDS for word in tokens) / count
    pieces = [[word.lower() for word in _WORD.findall(part)]
              for part in _FRAGMENT_SPLIT.split(text)]
    pieces = [piece for piece in pieces if piece]
    fragments = [len(piece) for piece in pieces]
    short_words = sum(len(piece) for piece in pieces if _telegraphic(piece))
    fragment_share = short_words / count
    if count < MIN_WORDS_TO_JUDGE:
        return AnswerShape(count, function_share, fragment_share, False, "")
    reason = ""
    if len(fragments) >= MIN_FRAGMENTS and fragment_share >= MAX_FRAGMENT_SHARE:
        reason = (f"this reads like a keyword list: {len(fragments)} fragments of a few words "
                  "each. Say how the pieces relate, in sentences, as you would out loud.")
    elif function_share < MIN_FUNCTION_SHARE:
        reason = ("this reads like a keyword list: almost no words like \"so\", \"because\", "
                  "\"when\" that tie terms together. Say it in sentences, as you would out loud.")
    return AnswerShape(count, function_share, fragment_share, bool(reason), reason)
