"""Whether an answer criticises the claim it states: then a claim matched there is described,
not made ("retrying forever **is the classic mistake**", "**the bug is that** the relay marks
first", "committing first **loses** the message").

A critique word protects only the claim it criticises, never the rest of its sentence: "I
started reading the code to find the **bug**" still makes the claim "start by reading the
code", and "nothing is **lost**" or "READ COMMITTED prevents **lost** updates" criticise
nothing. The shapes recognised, for a critique word W and a claim X in one sentence:

- X is / was / becomes … W: "X is the classic mistake", "X, which is a bug", "that's wrong",
  "X is a bad idea";
- W is / of / with / to / that … X: "the mistake is to X", "the problem with X", "the danger
  of X", and W followed by a colon, which covers the rest of its sentence ("Pitfalls: X, Y",
  "a bad idea: it scans far too much");
- X, then a consequence (lose, stall, risk) later in the sentence: "X loses messages", "X, so
  the partition stalls"; or the consequence first and X as its condition or cause: "we lose
  the message if X";
- an adverb before X in its clause: "people wrongly X";
- "instead" later in the sentence: "teams X; we park it instead";
- a next sentence that opens by criticising it: "X. That is a mistake."

A critique word that is denied ("not a problem", "no risk", "nothing is lost") or averted
("prevents lost updates", "avoids a stall"), or one in a clause opened by "otherwise" / "or
else" (what happens when the claim is not followed: "make it static, otherwise … loses its
processing"), criticises nothing, nor does one that something resolves ("once the bug is
fixed, we replay"), and one that is part of the claim's own words is the claim.
"""

from __future__ import annotations

from collections.abc import Sequence

from dojo.content.cues import CueMatch
from dojo.content.tokens import NOT, Token

# Things a claim can be called.
_JUDGEMENTS = frozenset("""
mistake mistakes mistaken wrong bug bugs buggy problem problems risky danger dangers dangerous
trap traps naive flaw flaws flawed incorrect antipattern antipatterns graveyard pitfall
pitfalls gotcha footgun
""".split())
# Said of a claim, never of a thing in it ("a bad goal", not "a bad payload").
_VERDICTS = frozenset("bad poor terrible harmful fragile misleading".split())
# What a claim leads to.
_CONSEQUENCES = frozenset("lose loses losing lost stall stalls stalled stalling risk risks".split())
_ADVERBS = frozenset("wrongly incorrectly mistakenly naively".split())
# Between a claim and what it is called: "X is the classic mistake", "X, which is a bug".
_PREDICATING = frozenset("""
is are was were be been being becomes become became seems seem looks look sounds sound causes
cause caused introduces creates leads means
""".split())
_POINTING = frozenset("that this it which what".split())
# Between what a claim is called and the claim: "the mistake is to X", "the problem with X".
_LEADING = frozenset("is are was were be to that of with in here".split())
_CONDITIONS = frozenset("if when whenever because since once as".split())
_AVERTING = frozenset("""
prevent prevents prevented preventing avoid avoids avoided avoiding stop stops protect protects
guard guards against save saves
""".split())
JUDGEMENT_REACH = 6  # words between a claim and what it is called
# What happens to a bug or a problem once it is handled: "once the bug is fixed".
_RESOLVED = frozenset("""
fixed found solved resolved patched gone understood identified located reproduced addressed
corrected repaired
""".split())


def criticised(tokens: Sequence[Token], match: CueMatch) -> bool:
    """Whether the answer criticises the claim `match` found (see the module docstring)."""
    used = frozenset().union(*(occ.used for occ in match.occurrences))
    first, last = match.first, match.last
    sentences = {tokens[first].sentence, tokens[last].sentence}
    for index, token in enumerate(tokens):
        if index in used or token.sentence not in sentences or not _critique(tokens, index):
            continue
        word = token.word
        if word in _JUDGEMENTS and (_called_after(tokens, used, index)
                                    or _called_before(tokens, index, first)
                                    or _qualifies(tokens, index, used)):
            return True
        if word in _VERDICTS and (_called_after(tokens, used, index)
                                  or (index < first and _colon_after(tokens, index))):
            return True
        if word in _CONSEQUENCES and (index > last or _consequence_of(tokens, index, first)):
            return True
        if word in _ADVERBS and first - 4 <= index < first \
                and token.clause == tokens[first].clause:
            return True
        if word == "instead" and index > last:
            return True
    return _next_sentence_criticises(tokens, last)


def _critique(tokens: Sequence[Token], index: int) -> bool:
    word = tokens[index].word
    if word not in _JUDGEMENTS and word not in _CONSEQUENCES and word not in _ADVERBS \
            and word not in _VERDICTS and word != "instead":
        return False
    return not _negated_critique(tokens, index) and not _otherwise(tokens, index)


def _otherwise(tokens: Sequence[Token], index: int) -> bool:
    """"make it static, otherwise the configuration class … loses its processing", "commit
    after the write, or else you lose it": a consequence in a clause that opens with
    "otherwise" / "or else" is what happens when the claim is NOT followed; it argues for the
    claim, it does not criticise it."""
    clause = tokens[index].clause
    opening = index
    while opening > 0 and tokens[opening - 1].clause == clause:
        opening -= 1
    word = tokens[opening].word
    return word == "otherwise" or (word == "else" and opening > 0
                                   and tokens[opening - 1].word == "or") \
        or (word == "or" and opening + 1 < len(tokens) and tokens[opening + 1].word == "else")


def _called_after(tokens: Sequence[Token], used: frozenset[int], index: int) -> bool:
    """"X is the classic mistake", "X, which is a bug": a predicating word between the
    claim (its last word before the judgement) and the judgement."""
    before = [i for i in used if i < index]
    if not before or index - max(before) > JUDGEMENT_REACH:
        return False
    between = tokens[max(before) + 1:index]
    return any(t.word in _PREDICATING or t.word in _POINTING for t in between)


def _qualifies(tokens: Sequence[Token], index: int, used: frozenset[int]) -> bool:
    """"a wrong number", "the naive retry loop": a judgement right before a word of the
    claim, in its clause."""
    return any(following in used and tokens[following].clause == tokens[index].clause
               for following in (index + 1, index + 2))


def _called_before(tokens: Sequence[Token], index: int, first: int) -> bool:
    """"the mistake is to X", "the problem with X", "Pitfalls: X, Y" (a colon right after
    covers the rest of the sentence)."""
    if index >= first:
        return False
    if _colon_after(tokens, index):
        return True
    if first - index > JUDGEMENT_REACH:
        return False
    # "the mistake is to", "the problem with", "the mistake here is": the link comes first.
    # "Once the bug is fixed, we replay": a judgement word that something resolved is the
    # thing dealt with, a time or a condition, not a verdict on the claim after it.
    link = tokens[index + 1:min(first, index + 3)]
    if any(t.word in _RESOLVED for t in link):
        return False
    return any(t.word in _LEADING for t in link) or tokens[first].colon


def _colon_after(tokens: Sequence[Token], index: int) -> bool:
    """"Pitfalls: X", "a bad idea: X", "the classic mistake here: X": a colon within two
    words after the critique word, in its sentence."""
    return any(tokens[i].colon and tokens[i].sentence == tokens[index].sentence
               for i in range(index + 1, min(len(tokens), index + 4)))


def _consequence_of(tokens: Sequence[Token], index: int, first: int) -> bool:
    """"we lose the message if we commit first": the consequence, then the claim in a clause
    that states its condition or cause."""
    if index >= first:
        return False
    opening = first
    while opening > 0 and tokens[opening - 1].clause == tokens[first].clause:
        opening -= 1
    return tokens[opening].word in _CONDITIONS and opening > index


def _next_sentence_criticises(tokens: Sequence[Token], last: int) -> bool:
    """"X. That is a mistake.": the next sentence opens by calling the previous one
    something."""
    following = next((i for i in range(last + 1, len(tokens))
                      if tokens[i].sentence != tokens[last].sentence), None)
    if following is None or tokens[following].word not in _POINTING:
        return False
    opening = [i for i in range(following, min(len(tokens), following + 4))
               if tokens[i].sentence == tokens[following].sentence]
    return any(tokens[i].word in _JUDGEMENTS and _critique(tokens, i) for i in opening)


# Between a negator and the critique word it denies: "nothing is lost", "isn't a real
# mistake", "no big risk".
_DENIAL_LINKS = frozenset("""
is are was were be been being get gets got getting really real actual actually big any ever
truly serious major much
""".split())


def _negated_critique(tokens: Sequence[Token], index: int) -> bool:
    """"not a problem", "no risk", "isn't a real mistake", "nothing is lost", "prevents lost
    updates": a critique word denied or averted right before it (only link words between) is
    no critique; "instead of the raw record loses information" still criticises."""
    before = index - 1
    while before >= 0 and tokens[before].word in _DENIAL_LINKS \
            and tokens[before].clause == tokens[index].clause:
        before -= 1
    return before >= 0 and tokens[before].clause == tokens[index].clause \
        and (tokens[before].norm == NOT or tokens[before].word in _AVERTING)
