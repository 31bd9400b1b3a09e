"""Typo repair: a misspelt word in an answer becomes the card's word it was meant to be.

Only a word that is no English word can be a typo: "trade" is not a misspelt "trace", nor
"broker" a misspelt "broken", nor "block" a misspelt "lock". English words are those of the
frequency list that pyspellchecker ships (English, about 160,000 words from subtitles and
Wiktionary); the card's technical words (idempotency, upsert, backoff) are mostly not in it, so
a slip in them is still repaired. A misspelt negator ("nevver", "withot") is repaired on every
card: it turns the claim round.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import replace
from functools import lru_cache
from importlib.resources import files

from dojo.content.tokens import NOT, Token, mark_reach, stem

MIN_TYPO_LENGTH = 5  # shorter words are too easily another real word
# Negators are repaired too, whatever the card's words: a misspelt "never" turns the claim.
_NEGATORS = frozenset("never without cannot nothing nobody neither nowhere".split())


@lru_cache(maxsize=1)
def english_words() -> frozenset[str]:
    """Lower-case English words (pyspellchecker's English frequency list), loaded once."""
    resource = files("spellchecker") / "resources" / "en.json.gz"
    with resource.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        return frozenset(json.load(text))


@lru_cache(maxsize=512)
def _stems_of(words: frozenset[str]) -> frozenset[str]:
    return frozenset(stem(word) for word in words)


@lru_cache(maxsize=512)
def _by_s_spelling(words: frozenset[str]) -> dict[str, str]:
    return {word.replace("z", "s"): word for word in words if "z" in word or "s" in word}


def _spelling_variant(word: str, words: frozenset[str]) -> str | None:
    """The card's spelling of `word` when they differ only by s/z (initialization,
    initialisation)."""
    candidate = _by_s_spelling(words).get(word.replace("z", "s"))
    return candidate if candidate is not None and candidate != word else None


def _only_a_prefix_apart(word: str, candidate: str) -> bool:
    """"deduplicate" and "duplicate", "impossible" and "possible", "grows" and "rows": the
    letters that differ are all at the start, which a prefix does (de-, im-, un-), not a slip
    of the fingers."""
    return word.endswith(candidate) or candidate.endswith(word)


def repair_typos(tokens: Sequence[Token], words: frozenset[str]) -> list[Token]:
    """Each word that is neither English (`english_words`) nor a form of a word the card uses,
    within one edit (two for 9+ letters, a swap counts as one) of a word the card uses,
    becomes that word; not when the two differ only at the start (`_only_a_prefix_apart`).
    Known words are never changed, except an s/z spelling variant of a card word."""
    from rapidfuzz.distance import OSA
    from rapidfuzz.process import extract

    choices = sorted(words | _NEGATORS)
    stems = _stems_of(words)
    english = english_words()
    out: list[Token] = []
    for token in tokens:
        word = token.word
        # A form of a word the card uses ("pausing" for "pause") is no typo of another one
        # ("parsing").
        if token.norm == NOT or len(word) < MIN_TYPO_LENGTH or word in words \
                or token.norm in stems or not word.isalpha():
            out.append(token)
            continue
        best_word = _spelling_variant(word, words)
        if best_word is None and word not in english:
            limit = 2 if len(word) >= 9 else 1
            best_word = next((candidate for candidate, _, _ in extract(
                word, choices, scorer=OSA.distance, score_cutoff=limit, limit=4)
                if stem(candidate) != token.norm
                and not _only_a_prefix_apart(word, candidate)), None)
        if best_word is None:
            out.append(token)
            continue
        norm = NOT if best_word in _NEGATORS else stem(best_word)
        out.append(replace(token, word=best_word, norm=norm))
    return mark_reach(out) if any(new is not old and new.norm == NOT
                                  for new, old in zip(out, tokens, strict=True)) else out
