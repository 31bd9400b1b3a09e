"""Claim synonyms: a misconception's cue also matches the same claim said with another verb
or judgement word of the same meaning.

A misconception names a rival claim ("Spring Boot **allows** overriding by default", "Spring
**picks** one of the two classes"); an answer that makes it says it in words of its own ("Boot
**lets** the later one override by default", "Spring quietly **keeps** the last one"). Round 5
measured that hand-written misconceptions caught the phrasings their writer read and almost
nothing else, so each word of a misconception's cue stands for its small synonym group below.

The groups are tight on purpose: only words that say the same thing in a claim about a
system's behaviour ("allow / let / permit / enable", "fine / acceptable / harmless"). A word
with other common senses stays out ("make", "use", "get"). Only misconceptions are widened:
a point's cue that matched more would give credit, and polarity (denials, antonym swaps) reads
the point's cues as written.
"""

from __future__ import annotations

from functools import lru_cache

from dojo.content.cues import Cue, Idea, Phrase, Word, parse_phrase
from dojo.content.tokens import NOT, stem

CLAIM_SYNONYMS: tuple[tuple[str, ...], ...] = (
    ("allow", "let", "enable"),
    ("pick", "choose", "select", "keep", "take"),
    ("guarantee", "ensure", "preserve", "maintain", "keep"),
    ("create", "instantiate", "construct", "build"),
    ("fine", "ok", "okay", "harmless", "reasonable", "good enough"),
    ("need", "require"),
    ("skip", "ignore"),
    ("cheap", "inexpensive", "lightweight", "costs little", "costs very little"),
    ("automatically", "on its own", "by itself", "out of the box", "for free"),
    ("send", "publish", "emit"),
    ("replace", "override", "substitute"),
    ("whole", "entire"),
    ("fast", "quick"),
    ("big", "large", "huge"),
    ("increase", "raise", "bump", "grow"),
    ("decrease", "lower", "reduce", "shrink"),
)


def _index() -> dict[str, tuple[Phrase, ...]]:
    out: dict[str, list[Phrase]] = {}
    for group in CLAIM_SYNONYMS:
        phrases = [tuple(Word(w.text, w.norm, False) for w in parse_phrase(item))
                   for item in group]
        for item, phrase in zip(group, phrases, strict=True):
            if len(phrase) != 1:
                continue  # a multi-word member is matched, never looked up
            key = stem(item)
            known = out.setdefault(key, [])
            known.extend(other for other in phrases if other != phrase and other not in known)
    return {key: tuple(value) for key, value in out.items()}


_SYNONYMS = _index()
MAX_VARIANTS = 64  # phrases per idea after widening, at most


def synonyms_of(word: Word) -> tuple[Phrase, ...]:
    """The other members of `word`'s synonym groups (none for a negator)."""
    if word.norm == NOT:
        return ()
    return _SYNONYMS.get(stem(word.text), ())


@lru_cache(maxsize=8192)
def widened(cue: Cue) -> Cue:
    """`cue` with each phrase also said with one of its words replaced by a claim synonym
    (one word at a time: "boot > allow* > overrid*" also reads "boot > lets > overrid*")."""
    ideas: list[Idea] = []
    for idea in cue.ideas:
        phrases = list(idea.phrases)
        for phrase in idea.phrases:
            for position, word in enumerate(phrase):
                for other in synonyms_of(word):
                    variant = (*phrase[:position], *other, *phrase[position + 1:])
                    if variant not in phrases and len(phrases) < MAX_VARIANTS:
                        phrases.append(variant)
        ideas.append(Idea(tuple(phrases), idea.source))
    return Cue(tuple(ideas), cue.ordered, cue.source, cue.line, cue.within, cue.sentences)
