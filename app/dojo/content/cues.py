"""`says` cues: how a key point is recognised by its ideas, and when it is said the other way.

A cue is a line of a tiny language (docs/content-format.md, "says cues"):
`idea + idea` (any order) or `idea > idea` (this order), each idea `phrase | phrase`, each
phrase words (`idempot*` a prefix, `not` any negator, `@name` a synonym set).

The answer is cut into tokens (`dojo.content.tokens`). A cue matches when every idea occurs
inside one window of words; the match is *negated* when a negator that the cue did not ask for
governs one of its ideas (`dojo.content.negation`).

Lives in `dojo.content` because the linter needs it: a card's model answer must make every
essential point and contradict none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

from dojo.content.negation import directly_negated, governing_negators
from dojo.content.tokens import NOT, Occurrence, Token, tokenize

DEFAULT_WITHIN = 30  # words: one or two spoken sentences
PHRASE_GAP = 2  # other words allowed between the words of a phrase
MAX_SENTENCES = 2  # a cue's ideas sit in one sentence or two neighbouring ones

# General synonym sets every card can use; a lesson's or card's `terms` override them.
BUILTIN_TERMS: dict[str, tuple[str, ...]] = {
    "now": ("immediately", "at once", "right away", "straight", "directly", "first failure",
            "first attempt", "first time", "instantly", "on the spot"),
    "before": ("before", "first", "prior to", "ahead of", "earlier than"),
    "after": ("after", "once", "only when", "only after", "then", "afterwards", "following"),
    "db": ("database", "db", "postgres", "postgresql", "table", "row", "rows", "sql"),
    "must": ("must", "need", "needs", "has to", "have to", "require", "should", "always"),
    "retry": ("retry", "retries", "try again", "re-try", "reattempt", "redeliver", "attempt again"),
    "tx": ("transaction", "tx", "transactional", "atomic", "atomically", "same commit"),
    # What opens the fix of a spot-the-mistake answer: "@fix > keep the consumer running"
    # is a fix that restates the mistake, where the bare phrase may be the mistake described.
    "fix": ("fix", "fixes", "fixed", "instead", "better", "should", "solution", "remedy",
            "right move", "right thing", "right way", "right approach", "right order",
            "correct way", "correct approach", "correct design", "correct order",
            "proper way", "i would", "we would", "i will", "we will", "the answer is",
            "the way to", "what you want", "recommend", "my advice", "the plan is"),
    # Rival claims that wave a risk away or over-claim (round 6): a negated answer rarely says
    # "not X"; it says the danger is "fine", the step "not needed", the feature works "on its
    # own". For misconceptions: "@scan + com + @fine", "@unneeded > @hint", "@hint + @auto".
    "fine": ("fine", "ok", "okay", "harmless", "reasonable", "good enough", "not a concern",
             "not a problem", "no problem", "not an issue", "no issue", "no risk", "no harm",
             "the right use", "the right choice", "the right strategy", "a good value",
             "the standard", "is standard", "precise enough", "accurate enough",
             "nothing is really lost", "nothing is lost", "not really affected",
             "does not really suffer", "doesn't really suffer", "not really suffer",
             "just as well", "just as reliably", "costs little", "costs very little", "cheap"),
    "unneeded": ("no need", "not needed", "not necessary", "unnecessary", "not required",
                 "need not", "needs no", "need no", "don't need", "do not need",
                 "doesn't need", "does not need", "no code needed", "nothing special",
                 "nothing to do", "no change", "no changes"),
    "auto": ("automatically", "automatic", "on its own", "on their own", "by itself",
             "by themselves", "out of the box", "for free", "transparently"),
}

# --- the cue language ---------------------------------------------------------------------

# Negators that say more than "not": in a cue each stands for itself ("nobody" is someone
# missing, "nothing" something), while `not`, `no`, `never`, `without` … stand for any negator.
SPECIFIC_NEGATORS = frozenset("nobody nothing none nowhere neither".split())


@dataclass(frozen=True)
class Word:
    text: str  # as written (lower-case, without `*`)
    norm: str  # stem, or `not`
    prefix: bool

    def matches(self, token: Token) -> bool:
        if self.norm == NOT:
            if self.text in SPECIFIC_NEGATORS:
                return token.word == self.text
            return token.norm == NOT or token.stops
        if self.prefix:
            return token.word.startswith(self.text) or token.norm.startswith(self.norm)
        return token.norm == self.norm or token.word == self.text


Phrase = tuple[Word, ...]


@dataclass(frozen=True)
class Idea:
    phrases: tuple[Phrase, ...]
    source: str


@dataclass(frozen=True)
class Cue:
    """One `says` line: ideas that must all occur within `within` words."""

    ideas: tuple[Idea, ...]
    ordered: tuple[bool, ...]  # ordered[i]: idea i+1 must come after idea i
    source: str
    line: int
    within: int = DEFAULT_WITHIN
    sentences: int = MAX_SENTENCES  # how many neighbouring sentences the ideas may span


class CueError(ValueError):
    """A cue that cannot be parsed; the message says why."""


@lru_cache(maxsize=32768)
def parse_phrase(text: str) -> Phrase:
    """A cue phrase as words (a pure function of the text; cached: the cards repeat about 13
    thousand distinct phrases some 50 thousand times, through shared @terms)."""
    words: list[Word] = []
    for token in tokenize(text.replace("*", " STAR ")):
        if token.word == "star" and words:
            last = words[-1]
            words[-1] = Word(last.text, last.norm, True)
            continue
        words.append(Word(token.word, token.norm, False))
    return tuple(words)


def parse_cue(source: str, terms: Mapping[str, Sequence[str]], line: int = 0,
              within: int = DEFAULT_WITHIN, sentences: int = MAX_SENTENCES) -> Cue:
    """Parse `source`; `terms` are the synonym sets `@name` may use. Raises CueError."""
    parts = re.split(r"\s*([+>])\s*", source.strip())
    texts, operators = parts[0::2], parts[1::2]
    ideas: list[Idea] = []
    for text in texts:
        phrases: list[Phrase] = []
        for alternative in (alt.strip() for alt in text.split("|")):
            if not alternative:
                raise CueError(f"empty alternative in {text!r}")
            if alternative.startswith("@"):
                name = alternative[1:]
                known = terms.get(name) or BUILTIN_TERMS.get(name)
                if not known:
                    raise CueError(f"unknown term @{name}")
                phrases.extend(parse_phrase(item) for item in known)
            else:
                phrases.append(parse_phrase(alternative))
        phrases = [phrase for phrase in phrases if phrase]
        if not phrases:
            raise CueError(f"idea {text!r} has no words")
        ideas.append(Idea(tuple(phrases), text))
    return Cue(tuple(ideas), tuple(op == ">" for op in operators), source, line, within,
               sentences)


SPECIFIC_WORD = 10  # a single word this long is an identifier (failIfSendResultIsError)


def cue_is_single_word(cue: Cue) -> bool:
    """A cue of one idea with a short single-word alternative proves a term only; a long
    identifier (ErrorHandlingDeserializer) is specific enough on its own."""
    return len(cue.ideas) == 1 and any(
        len(phrase) == 1 and len(phrase[0].text) < SPECIFIC_WORD
        for phrase in cue.ideas[0].phrases)


# --- matching -----------------------------------------------------------------------------

@dataclass(frozen=True)
class CueMatch:
    """Where a cue matched: the tokens it used, and whether the claim was negated."""

    occurrences: tuple[Occurrence, ...]
    negated: bool
    negators: tuple[int, ...]  # token indexes of the governing negators

    @property
    def first(self) -> int:
        return min(occ.first for occ in self.occurrences)

    @property
    def last(self) -> int:
        return max(occ.last for occ in self.occurrences)


# A word in a phrase's gap that narrows or changes what the phrase says: "all unchecked
# exceptions roll back" does not say "all exceptions roll back". (A negator may sit in the gap:
# it negates the phrase, see `governing_negators`.)
QUALIFIERS = frozenset("""
unchecked checked some only certain few non partial partially rarely sometimes occasionally
except most several
""".split())


def _phrase_at(phrase: Phrase, tokens: Sequence[Token], start: int) -> Occurrence | None:
    if not phrase[0].matches(tokens[start]):
        return None
    used = [start]
    position = start
    for word in phrase[1:]:
        for step in range(1, PHRASE_GAP + 2):
            candidate = position + step
            if candidate >= len(tokens) or step > 1 and tokens[candidate - 1].word in QUALIFIERS \
                    or step > 1 and _broken(tokens, position, candidate):
                return None
            if word.matches(tokens[candidate]):
                position = candidate
                used.append(candidate)
                break
        else:
            return None
    return Occurrence(start, position, frozenset(used))


def _broken(tokens: Sequence[Token], position: int, candidate: int) -> bool:
    """Whether a sentence end, a colon or a semicolon lies between two words of a phrase:
    "the DLQ is broken: events for …" is no "is for"."""
    return tokens[candidate].sentence != tokens[position].sentence or any(
        token.colon or token.semicolon for token in tokens[position + 1:candidate + 1])


def occurrences(idea: Idea, tokens: Sequence[Token]) -> list[Occurrence]:
    found: dict[int, Occurrence] = {}
    for start in range(len(tokens)):
        for phrase in idea.phrases:
            occ = _phrase_at(phrase, tokens, start)
            if occ is not None and (start not in found or occ.last < found[start].last):
                found[start] = occ
    return sorted(found.values(), key=lambda occ: occ.first)


def match_cue(cue: Cue, tokens: Sequence[Token], by_clause: bool = False) -> CueMatch | None:
    """The best match of `cue` in `tokens`: an affirmed one if there is any, else a negated
    one, else None. A match is negated when a negator governs one of its ideas; with
    `by_clause` (a point's cue, not a misconception's), a match whose ideas sit in several
    clauses takes the polarity of the clause holding most of them, the later one on a tie:
    "don't call the provider inside the transaction, because it holds a connection" says the
    provider holds a connection, and "never retry a permanent error: it goes to the DLQ at
    once" sends it to the DLQ at once."""
    lists = [occurrences(idea, tokens) for idea in cue.ideas]
    if any(not found for found in lists):
        return None
    negated: CueMatch | None = None
    for chosen in combinations(lists, cue, tokens):
        # Each idea on its own: "never X … not Y" negates both, it does not cancel out.
        used = frozenset().union(*(occ.used for occ in chosen))
        per_idea = [governing_negators([occ], tokens, used) for occ in chosen]
        odd = [len(found) % 2 == 1 for found in per_idea]
        flipped = _claim_negated(chosen, per_idea, tokens) if by_clause else any(odd)
        negators = sorted({index for found in per_idea for index in found})
        match = CueMatch(tuple(chosen), flipped, tuple(negators))
        if not match.negated:
            return match
        if negated is None:
            negated = match
    return negated


def _claim_negated(chosen: Sequence[Occurrence], negators: Sequence[Sequence[int]],
                   tokens: Sequence[Token]) -> bool:
    """Per sentence, the clause holding most of the match's ideas decides. On a tie, a
    directly negated idea ("we don't need the marker table") decides; else the later clause
    does ("never retry a permanent error: it goes to the DLQ at once"). A match over two
    sentences is negated when the one holding most of its ideas is (either, on a tie): "no
    notion of a failed delivery for consumer groups. It stores the offset you commit" does
    not deny that the consumer commits its offset."""
    negated = False
    held: dict[int, int] = {}
    for occ in chosen:
        held[tokens[occ.first].sentence] = held.get(tokens[occ.first].sentence, 0) + 1
    for sentence in held:
        if held[sentence] < max(held.values()):
            continue  # the sentence holding most of the claim decides its polarity
        here = [(tokens[occ.first].clause, occ, found)
                for occ, found in zip(chosen, negators, strict=True)
                if tokens[occ.first].sentence == sentence]
        counts: dict[int, int] = {}
        for clause, _, _ in here:
            counts[clause] = counts.get(clause, 0) + 1
        most = max(counts.values())
        tied = [clause for clause, count in counts.items() if count == most]
        if len(tied) > 1 and any(
                clause in tied and len(found) % 2 == 1 and directly_negated(tokens, occ, found)
                for clause, occ, found in here):
            negated = True
            continue
        deciding = max(tied)
        negated |= any(len(found) % 2 == 1 for clause, _, found in here if clause == deciding)
    return negated


def combinations(lists: Sequence[Sequence[Occurrence]], cue: Cue, tokens: Sequence[Token],
                  limit: int = 4000) -> Iterator[list[Occurrence]]:
    """One occurrence per idea, all inside the window, in order where `>` asks for it."""
    chosen: list[Occurrence] = []
    budget = [limit]

    def walk(depth: int) -> Iterator[list[Occurrence]]:
        if budget[0] <= 0:
            return
        if depth == len(lists):
            yield list(chosen)
            return
        for occ in lists[depth]:
            budget[0] -= 1
            if depth and cue.ordered[depth - 1] and occ.first <= chosen[-1].last:
                continue
            if any(occ.used & other.used for other in chosen):
                continue
            low = min([occ.first, *(o.first for o in chosen)])
            high = max([occ.last, *(o.last for o in chosen)])
            if high - low >= cue.within or \
                    tokens[high].sentence - tokens[low].sentence > cue.sentences - 1:
                continue
            chosen.append(occ)
            yield from walk(depth + 1)
            chosen.pop()

    yield from walk(0)


def vocabulary(cues: Sequence[Cue], texts: Sequence[str] = ()) -> frozenset[str]:
    """The words a card uses: its cues' words and the words of its own texts."""
    words = {word.text for cue in cues for idea in cue.ideas for phrase in idea.phrases
             for word in phrase if word.norm != NOT and not word.prefix}
    for text in texts:
        words.update(token.word for token in tokenize(text) if token.norm != NOT)
    return frozenset(word for word in words if word.isalpha())
