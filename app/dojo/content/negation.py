"""Which negators govern a matched idea: the scope of "not", "never", "without" … in an answer.

A negator in the same clause before an idea flips it ("**never** use SKIP LOCKED"), and so does
a denial after it ("SKIP LOCKED is **not needed**").
"""

from __future__ import annotations

from collections.abc import Sequence

from dojo.content.tokens import NEGATION_SCOPE, NOT, Occurrence, Token

# Said after a matched idea, in its clause: the idea is denied ("SKIP LOCKED is not needed").
_DENIALS = (("not", "need"), ("not", "necessari"), ("not", "requir"), ("unnecessari",),
            ("myth",), ("overkil",), ("pointless",), ("useless",), ("not", "matter"),
            ("not", "help"), ("not", "work"), ("irrelev",),
            ("unimport",), ("=optional",), ("not", "import"), ("not", "critic"),
            ("not", "essenti"))
# Between a negator and what it denies, or between an idea and its denial, only these words
# keep the denial *direct* ("is not needed", "does not need to be idempotent").
LINK_WORDS = frozenset("""
be is are was were been being do does did need needs needed to have has had get gets got
really even actually necessarily ever at all must should will would can could may might it
that this they them there its their our your we you i also strictly any as reason point
good idea worth supposed
""".split())
# "X, but it is optional": the denial reaches across "but" + a pronoun.
_PRONOUNS = frozenset("it this that they these those which".split())


def governing_negators(chosen: Sequence[Occurrence], tokens: Sequence[Token],
                       used: frozenset[int] | None = None) -> list[int]:
    """Negators (and denials) that the cue did not consume (`used`, by default the tokens of
    `chosen`) and that govern one of `chosen`."""
    if used is None:
        used = frozenset().union(*(occ.used for occ in chosen))
    found: set[int] = set()
    for occ in chosen:
        # A negator in the gap of a phrase ("lag is not a problem" for "lag is problem").
        found.update(index for index in range(occ.first + 1, occ.last)
                     if tokens[index].norm == NOT and index not in used)
        head = tokens[occ.first]
        for index in range(occ.first - 1, max(-1, occ.first - NEGATION_SCOPE - 1), -1):
            token = tokens[index]
            if token.clause != head.clause:
                break
            if token.norm == NOT and index not in used and occ.first < token.reach:
                found.add(index)
        index = occ.last + 1
        while index < len(tokens) and _same_claim(tokens, occ.last, index) \
                and index - occ.last <= NEGATION_SCOPE:
            if index not in used and denial_at(tokens, index):
                found.add(index)
            index += 1
    # A negator that only governs another negator's denial is counted once.
    return sorted(found)


def denial_at(tokens: Sequence[Token], index: int) -> bool:
    """Whether a denial ("not needed", "unnecessary", "optional") starts at `index`. A
    one-word denial after a negator is no denial ("not optional"); a setting's value that
    turns it off denies the name ("open-in-view=false")."""
    if tokens[index].switched_off:
        return True
    for denial in _DENIALS:
        window = tokens[index:index + len(denial)]
        if len(window) != len(denial) or not all(
                _denial_part(token, part) for token, part in zip(window, denial, strict=True)):
            continue
        if denial[0] != NOT and _negated_before(tokens, index):
            continue
        return True
    return False


def _denial_part(token: Token, part: str) -> bool:
    if part == NOT:
        return token.norm == NOT
    if part.startswith("="):
        return token.word == part[1:]
    return token.norm.startswith(part)


def _negated_before(tokens: Sequence[Token], index: int) -> bool:
    before = index - 1
    while before >= 0 and tokens[before].word in LINK_WORDS \
            and tokens[before].clause == tokens[index].clause:
        before -= 1
    return before >= 0 and tokens[before].norm == NOT \
        and tokens[before].clause == tokens[index].clause


def _same_claim(tokens: Sequence[Token], last: int, index: int) -> bool:
    """Whether `index` is still in the clause of `last`, or in a "but it …" clause right
    after it that goes on about the same thing."""
    clause = tokens[last].clause
    if tokens[index].clause == clause:
        return True
    if tokens[index].sentence != tokens[last].sentence:
        return False
    first = next(i for i in range(last + 1, index + 1) if tokens[i].clause != clause)
    return tokens[index].clause == tokens[first].clause and tokens[first].word == "but" \
        and first + 1 < len(tokens) and tokens[first + 1].word in _PRONOUNS


def directly_negated(tokens: Sequence[Token], occ: Occurrence, negators: Sequence[int]) -> bool:
    """Whether one of `negators` denies `occ` directly: a denial after it, or a negator before
    it with only link words between ("we don't need the table"), not one that negates a verb
    whose object it is ("never retry a permanent error")."""
    for index in negators:
        if index > occ.first or all(token.word in LINK_WORDS or token.word in _DETERMINERS
                                    for token in tokens[index + 1:occ.first]):
            return True
    return False


_DETERMINERS = frozenset("any all some its their our his her my your this that these those "
                         "such single".split())
