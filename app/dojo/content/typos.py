"""Typo repair: a misspelt word in an answer becomes the card's word it was meant to be."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from dojo.content.tokens import NOT, Token, stem

MIN_TYPO_LENGTH = 5  # shorter words are too easily another real word


@lru_cache(maxsize=512)
def _stems_of(words: frozenset[str]) -> frozenset[str]:
    return frozenset(stem(word) for word in words)


def repair_typos(tokens: Sequence[Token], words: frozenset[str]) -> list[Token]:
    """Each unknown word (not a form of a word the card uses) within one edit (two for 9+
    letters, a swap counts as one) of a word the card uses becomes that word. Known words
    are never changed."""
    from rapidfuzz.distance import OSA
    from rapidfuzz.process import extractOne

    choices = sorted(words)
    stems = _stems_of(words)
    out: list[Token] = []
    for token in tokens:
        word = token.word
        # A form of a word the card uses ("pausing" for "pause") is no typo of another one
        # ("parsing").
        if token.norm == NOT or len(word) < MIN_TYPO_LENGTH or word in words \
                or token.norm in stems or not word.isalpha():
            out.append(token)
            continue
        limit = 2 if len(word) >= 9 else 1
        best = extractOne(word, choices, scorer=OSA.distance, score_cutoff=limit)
        if best is None or stem(best[0]) == token.norm:
            out.append(token)
            continue
        out.append(Token(best[0], stem(best[0]), token.start, token.end, token.clause,
                         token.sentence))
    return out
