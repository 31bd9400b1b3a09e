"""Order relations: a point whose statement puts one step before another is contradicted by
an answer that puts the same two steps the other way round.

"The right order: send, wait for the acknowledgement, then mark the row" orders the ideas
of the cue `@send > @ack > @mark`: send before mark, ack before mark. An answer saying "mark
it published, then send" puts mark before send: the opposite, without a negator or an antonym
of any cue word. The relation is read, in the statement and in the answer alike, only from an
explicit order word between two ideas of one cue in one sentence:

- "A, then B", "A before B", "A, followed by B", "A prior to B": A comes first;
- "A after B", "A only after B", "A following B": B comes first;
  (the order word leads B: in B's clause, at most ORDER_LEAD words and no conjunction
  between them; in "detects it after deadlock_timeout and aborts one" or "after
  deadlock_timeout, one second" the "after" orders the timeout, not the abort)
- "after A, B" (the clause opens with it): A comes first; "before A, B": B comes first.

Nothing is read from a sentence that imagines a case ("if the relay crashes after the ack",
"when …"), nor from the mere order of words ("mark the row; the send …" orders nothing), a
sentence with order words both ways is ambiguous and ignored, and an idea that is itself an
order word (`@after`, `first | then`) is no step. The same answer stating the statement's
order anywhere is a contrast ("marking first loses it; send, then mark"), not a contradiction.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import permutations

from dojo.content.cues import Cue, CueMatch, Idea, occurrences
from dojo.content.negation import governing_negators
from dojo.content.tokens import Occurrence, Token

# Between A and B: A first ("A, then B") or B first ("A after B").
_A_FIRST = frozenset("then before followed prior ahead".split())
_B_FIRST = frozenset("after following".split())
# Words that make a "then"/"before"/"after" something other than an order of two steps.
_NOT_ORDER = frozenset("if when since than".split())  # "if A, then B", "more than before"
ORDER_REACH = 12  # words between the two steps, at most
_ORDER_WORDS = _A_FIRST | _B_FIRST | {"first", "once", "until", "afterwards", "later",
                                      "earlier", "prior", "when"}


@dataclass(frozen=True)
class Relation:
    """`earlier` (an idea index of `cue`) comes before `later` according to the statement."""

    cue: Cue
    earlier: int
    later: int


def _step(idea: Idea) -> bool:
    """Whether an idea names a step, not an order: no alternative holds an order word."""
    return not any(word.text in _ORDER_WORDS for phrase in idea.phrases for word in phrase)


def sequence(tokens: Sequence[Token], a: Occurrence, b: Occurrence) -> int:
    """How one sentence orders the steps at `a` and `b` (a before b in the text): 1 when a
    comes first, -1 when b does, 0 when it says neither (or both)."""
    if a.last >= b.first or tokens[a.last].sentence != tokens[b.first].sentence \
            or b.first - a.last - 1 > ORDER_REACH:
        return 0
    if _supposed(tokens, b.first):
        return 0
    between = [t.word for t in tokens[a.last + 1:b.first]]
    if any(word in _NOT_ORDER for word in between):
        return 0
    # The order word leads B ("…, then mark", "only after the broker acknowledged"); one far
    # before it orders something else ("detects it after deadlock_timeout and aborts").
    lead = _lead(tokens, a, b)
    a_first = lead in _A_FIRST
    b_first = lead in _B_FIRST
    opener = _clause_opener(tokens, a.first)
    if opener is not None and tokens[b.first].clause != tokens[a.first].clause:
        a_first = a_first or opener in _B_FIRST  # "after A, B"
        b_first = b_first or opener == "before"  # "before A, B"
    if a_first == b_first:
        return 0
    return 1 if a_first else -1


ORDER_LEAD = 4  # words between the order word and the step it leads, at most
# A conjunction between them: the order word belongs to an earlier conjunct ("detects it
# after deadlock_timeout and aborts one").
_CONJUNCTIONS = frozenset("and or but so nor".split())


def _lead(tokens: Sequence[Token], a: Occurrence, b: Occurrence) -> str | None:
    """The order word that leads the step at `b` ("then mark", "then write to the database",
    "only after the broker acknowledged"): in b's clause, among the last ORDER_LEAD words
    before it, with no conjunction in between; None if there is none."""
    for index in range(b.first - 1, max(a.last, b.first - ORDER_LEAD - 2), -1):
        token = tokens[index]
        if token.clause != tokens[b.first].clause:
            return None
        if token.word in _A_FIRST or token.word in _B_FIRST:
            return token.word
        if token.word in _CONJUNCTIONS:
            return None
    return None


_SUPPOSING = frozenset("if unless whether when whenever suppose imagine say".split())


def _supposed(tokens: Sequence[Token], index: int) -> bool:
    """Whether the sentence of `index` imagines a case before it ("if the relay crashes after
    the ack but before the mark", "if the send moves after the commit"): no order claimed."""
    sentence = tokens[index].sentence
    position = index - 1
    while position >= 0 and tokens[position].sentence == sentence:
        if tokens[position].word in _SUPPOSING:
            return True
        position -= 1
    return False


def _clause_opener(tokens: Sequence[Token], index: int) -> str | None:
    """The order word opening the clause of `index` ("after the commit, …"), if any."""
    first = index
    while first > 0 and tokens[first - 1].clause == tokens[index].clause:
        first -= 1
    word = tokens[first].word
    return word if first < index and word in (_B_FIRST | {"before"}) else None


def _ordered_pairs(cue: Cue, i: int, j: int,
                   tokens: Sequence[Token]) -> Iterator[tuple[int, CueMatch]]:
    """For ideas i and j of `cue`, each affirmed occurrence pair in one sentence that an
    order word relates: 1 if i comes first, -1 if j does, with the two as a match."""
    for a in occurrences(cue.ideas[i], tokens):
        if governing_negators([a], tokens):
            continue
        for b in occurrences(cue.ideas[j], tokens):
            if a.used & b.used or governing_negators([b], tokens):
                continue
            first, second = (a, b) if a.first < b.first else (b, a)
            order = sequence(tokens, first, second)
            if order == 0:
                continue
            if first is b:
                order = -order
            yield order, CueMatch((first, second), False, ())


@lru_cache(maxsize=2048)
def relations(cues: tuple[Cue, ...], statement: tuple[Token, ...]) -> tuple[Relation, ...]:
    """The order relations the point's statement states between two step ideas of a cue."""
    out: list[Relation] = []
    for cue in cues:
        steps = [index for index, idea in enumerate(cue.ideas) if _step(idea)]
        for i, j in permutations(steps, 2):
            if any(order == 1 for order, _ in _ordered_pairs(cue, i, j, statement)) \
                    and not any(order == -1 for order, _ in _ordered_pairs(cue, i, j, statement)):
                out.append(Relation(cue, i, j))
    return tuple(out)


def reversed_order(cues: tuple[Cue, ...], tokens: Sequence[Token],
                   statement: tuple[Token, ...], start: int = 0) -> CueMatch | None:
    """The first place (from token `start` on) where the answer puts two steps of a point the
    other way round from its statement, when it states the statement's order nowhere."""
    for relation in relations(cues, statement):
        found = list(_ordered_pairs(relation.cue, relation.earlier, relation.later, tokens))
        if any(order == 1 for order, _ in found):
            continue
        for order, match in found:
            if order == -1 and match.first >= start:
                return match
    return None
