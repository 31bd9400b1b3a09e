"""Whether an answer criticises the claim it states ("… is the classic mistake"): then a
misconception matched there is described, not made.
"""

from __future__ import annotations

from collections.abc import Sequence

from dojo.content.cues import CueMatch
from dojo.content.tokens import NOT, Token, stem

# A sentence that criticises a claim does not make it (misconceptions only).
_CRITIQUE = frozenset(stem(word) for word in """
mistake mistaken wrong bug buggy problem problems risk risky danger dangerous trap lose loses
losing lost stall stalls naive antipattern graveyard instead flaw flawed wrongly incorrect
incorrectly
""".split())


def criticised(tokens: Sequence[Token], match: CueMatch, strict: bool = False) -> bool:
    """Whether the sentence of `match` criticises what it says (see _CRITIQUE). `strict`: a
    denied critique word ("that is not a message problem") does not count."""
    sentences = {tokens[match.first].sentence, tokens[match.last].sentence}
    return any(token.norm in _CRITIQUE and not (strict and _negated_critique(tokens, index))
               for index, token in enumerate(tokens) if token.sentence in sentences)


def _negated_critique(tokens: Sequence[Token], index: int) -> bool:
    """"not a problem", "no risk", "isn't a real mistake": a critique word denied right
    before it (at most two words between) is no critique."""
    clause = tokens[index].clause
    return any(tokens[before].norm == NOT and tokens[before].clause == clause
               for before in range(max(0, index - 3), index))
