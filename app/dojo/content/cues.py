"""`says` cues: how a key point is recognised by its ideas, and when it is said the other way.

A cue is a line of a tiny language (docs/content-format.md, "says cues"):
`idea + idea` (any order) or `idea > idea` (this order), each idea `phrase | phrase`, each
phrase words (`idempot*` a prefix, `not` any negator, `@name` a synonym set).

The answer is cut into tokens: lower-cased words, stemmed (Snowball English), negators folded
into one token `not` ("don't", "never", "without", "instead of" …), with the clause and the
sentence each token sits in. A cue matches when every idea occurs inside one window of words;
the match is *negated* when an odd number of negators that the cue did not ask for govern it
(a negator earlier in the same clause, or a denial such as "is not needed" later in it).

Lives in `dojo.content` because the linter needs it: a card's model answer must make every
essential point and contradict none.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import snowballstemmer

DEFAULT_WITHIN = 30  # words: one or two spoken sentences
PHRASE_GAP = 2  # other words allowed between the words of a phrase
MAX_SENTENCES = 2  # a cue's ideas sit in one sentence or two neighbouring ones
NEGATION_SCOPE = 8  # a negator governs at most this many words after it, inside its clause
NOT = "not"

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
}

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
# A sentence that criticises a claim does not make it (misconceptions only).
_CRITIQUE = frozenset(_STEMMER.stemWord(word) for word in """
mistake mistaken wrong bug buggy problem problems risk risky danger dangerous trap lose loses
losing lost stall stalls naive antipattern graveyard instead flaw flawed wrongly incorrect
incorrectly
""".split())

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


# --- the cue language ---------------------------------------------------------------------

@dataclass(frozen=True)
class Word:
    text: str  # as written (lower-case, without `*`)
    norm: str  # stem, or `not`
    prefix: bool

    def matches(self, token: Token) -> bool:
        if self.norm == NOT:
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


def parse_phrase(text: str) -> Phrase:
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
class Occurrence:
    first: int  # token indexes
    last: int
    used: frozenset[int]  # tokens the phrase consumed (its own `not`s among them)


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


def _phrase_at(phrase: Phrase, tokens: Sequence[Token], start: int) -> Occurrence | None:
    if not phrase[0].matches(tokens[start]):
        return None
    used = [start]
    position = start
    for word in phrase[1:]:
        for step in range(1, PHRASE_GAP + 2):
            candidate = position + step
            if candidate < len(tokens) and word.matches(tokens[candidate]):
                position = candidate
                used.append(candidate)
                break
        else:
            return None
    return Occurrence(start, position, frozenset(used))


def occurrences(idea: Idea, tokens: Sequence[Token]) -> list[Occurrence]:
    found: dict[int, Occurrence] = {}
    for start in range(len(tokens)):
        for phrase in idea.phrases:
            occ = _phrase_at(phrase, tokens, start)
            if occ is not None and (start not in found or occ.last < found[start].last):
                found[start] = occ
    return sorted(found.values(), key=lambda occ: occ.first)


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
            if token.norm == NOT and index not in used:
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
    one-word denial after a negator is no denial ("not optional")."""
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


def match_cue(cue: Cue, tokens: Sequence[Token]) -> CueMatch | None:
    """The best match of `cue` in `tokens`: an affirmed one if there is any, else a negated
    one, else None."""
    lists = [occurrences(idea, tokens) for idea in cue.ideas]
    if any(not found for found in lists):
        return None
    negated: CueMatch | None = None
    for chosen in combinations(lists, cue, tokens):
        # Each idea on its own: "never X … not Y" negates both, it does not cancel out.
        used = frozenset().union(*(occ.used for occ in chosen))
        per_idea = [governing_negators([occ], tokens, used) for occ in chosen]
        negators = sorted({index for found in per_idea for index in found})
        flipped = any(len(found) % 2 == 1 for found in per_idea)
        match = CueMatch(tuple(chosen), flipped, tuple(negators))
        if not match.negated:
            return match
        if negated is None:
            negated = match
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


# --- typos --------------------------------------------------------------------------------

MIN_TYPO_LENGTH = 5  # shorter words are too easily another real word


def vocabulary(cues: Sequence[Cue], texts: Sequence[str] = ()) -> frozenset[str]:
    """The words a card uses: its cues' words and the words of its own texts."""
    words = {word.text for cue in cues for idea in cue.ideas for phrase in idea.phrases
             for word in phrase if word.norm != NOT and not word.prefix}
    for text in texts:
        words.update(token.word for token in tokenize(text) if token.norm != NOT)
    return frozenset(word for word in words if word.isalpha())


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
