"""An answer as cues see it: lower-cased words, stemmed (Snowball English), negators folded
into one token `not` ("don't", "never", "without", "instead of" …), each with the clause and
the sentence it sits in.

Clauses end at `. , ; : ! ? ( )`, at a line break, at " - ", and before a clause word ("but",
"because", "which", …); sentences end at `. ! ?` followed by a space or the end, and at a line
break. A dotted name (spring.factories), a name's leading dot (.DLT) or a decimal (0.5) ends
nothing.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

import snowballstemmer

NOT = "not"
NEGATION_SCOPE = 8  # a negator governs at most this many words after it, inside its clause

_STEMMER = snowballstemmer.stemmer("english")

# Words that say "not"; each becomes the token `not`.
_NEGATOR_WORDS = frozenset("""
not no never without cannot nor neither none nothing nobody nowhere lack lacks lacking lacked
avoid avoids avoided avoiding dont doesnt didnt isnt arent wasnt werent cant wont wouldnt
shouldnt couldnt mustnt havent hasnt hadnt neednt
""".split())
_NEGATOR_PHRASES = (("instead", "of"), ("rather", "than"), ("no", "longer"), ("as", "opposed"),
                    ("in", "place", "of"))
_NEGATOR_PHRASE_STARTS = frozenset(phrase[0] for phrase in _NEGATOR_PHRASES)
# Words after which a new clause starts (they are tokens themselves, in the new clause).
_CLAUSE_WORDS = frozenset("""
but because since so which while whereas although though otherwise unless until then if when
where however yet whether
""".split())
_DROPPED = frozenset({"the", "a", "an"})
# A dotted name (spring.factories, com.acme.fx, max.poll.interval.ms) or a decimal (0.5) is one
# match: a dot with no space after it ends no sentence.
_TOKEN = re.compile(r"[a-z0-9]+(?:\.[a-z0-9]+)*(?:['’][a-z]+)?|[.!?;:,()\n]|\s[-–—]\s")
_DECIMAL = re.compile(r"\d+(?:\.\d+)+")
# "e.g." and "i.e." end no sentence and say nothing.
_ABBREVIATIONS = frozenset({"e.g", "i.e"})
_SENTENCE_END = frozenset(".!?\n")


# Irregular verb forms the stemmer leaves alone ("broke" is no form of "break" to Snowball):
# each stems like its base form. Only forms with no other common meaning (not left, found,
# saw, lay, led).
_IRREGULAR = {form: base for base, forms in (
    ("break", "broke broken"), ("lose", "lost"), ("send", "sent"), ("keep", "kept"),
    ("hold", "held"), ("write", "wrote written"), ("overwrite", "overwrote overwritten"),
    ("rewrite", "rewrote rewritten"), ("run", "ran"), ("take", "took taken"),
    ("give", "gave given"), ("make", "made"), ("build", "built"), ("rebuild", "rebuilt"),
    ("catch", "caught"), ("throw", "threw thrown"), ("choose", "chose chosen"),
    ("begin", "began begun"), ("fall", "fell fallen"), ("forget", "forgot forgotten"),
    ("hide", "hid hidden"), ("go", "went gone"), ("know", "knew known"),
    ("drive", "drove driven"), ("spend", "spent"), ("stick", "stuck"), ("buy", "bought"),
    ("bring", "brought"), ("think", "thought"), ("get", "got gotten"),
    ("freeze", "froze frozen"), ("show", "shown"), ("undo", "undid undone"),
    ("withdraw", "withdrew withdrawn"), ("mean", "meant"), ("deal", "dealt"),
    ("understand", "understood"), ("seek", "sought"), ("teach", "taught"))
    for form in forms.split()}


@lru_cache(maxsize=50_000)
def stem(word: str) -> str:
    return _STEMMER.stemWord(_IRREGULAR.get(word, word))


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
    # A negator governs the tokens after it up to (not including) this index; see
    # `_mark_reach`. Unused for other tokens.
    reach: int = 0
    colon: bool = False  # the token follows a colon ("The mistake: …")
    semicolon: bool = False  # the token follows a semicolon: a new claim begins
    # A setting's value that turns it off ("open-in-view=false"): denies the name before it.
    switched_off: bool = False
    asks: bool = False  # the token's sentence is a question (see `_mark_questions`)


def tokenize(text: str) -> list[Token]:
    """The answer as cues see it (see the module docstring)."""
    raw: list[tuple[str, int, int]] = []
    clause = sentence = 0
    tokens: list[Token] = []
    lowered = text.lower()
    skip_dot = -1
    colon = semicolon = False
    questions: set[int] = set()
    for match in _TOKEN.finditer(lowered):
        piece = match.group()
        if match.start() == skip_dot:
            continue
        if piece == "." and lowered[match.end():match.end() + 1].isalnum():
            continue  # a leading dot of a name (".DLT", ".class") ends nothing
        if piece == "\n" and _wrapped(lowered, match.start()):
            continue  # a hard-wrapped line goes on: the break is a space
        if not piece[0].isalnum():
            clause += 1
            if piece.strip() in _SENTENCE_END or piece == "\n":
                if piece == "?":
                    questions.add(sentence)
                sentence += 1
            colon = piece == ":"
            semicolon = piece == ";"
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
                tokens.append(Token(part, stemmed, offset, offset + len(part), clause, sentence,
                                    colon=colon, semicolon=semicolon))
                colon = semicolon = False
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
            off = word in _OFF_VALUES and lowered[:w_start].rstrip().endswith(("=", ":="))
            tokens.append(Token(word, norm, w_start, w_end, clause, sentence, colon=colon,
                                semicolon=semicolon, switched_off=off))
            colon = semicolon = False
        raw.clear()
    return _mark_questions(_mark_reach(_mark_stops(_merge_negator_phrases(tokens))), questions)


# A line that ends in one of these ends its sentence (or clause) itself; one that does not,
# followed by a line that opens with a word, is a hard-wrapped sentence going on.
_LINE_ENDS = frozenset(".!?:;,")
_BULLET = re.compile(r"[ \t]*(?:[-*•–]|\d+[.)])\s")


def _wrapped(text: str, index: int) -> bool:
    """Whether the line break at `index` is a wrap inside a sentence: the line before it has
    words and ends without punctuation, and the line after it goes on with words (not a
    blank line, not a list item)."""
    before = text[:index].rstrip(" \t")
    if not before or before[-1] == "\n" or before[-1] in _LINE_ENDS:
        return False
    after = text[index + 1:]
    following = after.lstrip(" \t")
    if not following or following[0] == "\n" or _BULLET.match(after):
        return False
    return True


_OFF_VALUES = frozenset("false off disabled no none 0".split())
_YES = frozenset("yes yeah yep yup absolutely".split())


def _mark_questions(tokens: list[Token], questions: set[int]) -> list[Token]:
    """Mark the tokens of each sentence that ends with "?" (`asks`): it asks, it claims
    nothing ("Does it replace the marker table? No."), unless the next sentence opens with
    "yes", which makes the question the claim."""
    if not questions:
        return tokens
    firsts: dict[int, Token] = {}
    for token in tokens:
        firsts.setdefault(token.sentence, token)
    asking = {sentence for sentence in questions
              if not any(first.word in _YES for later, first in firsts.items()
                         if later == min((s for s in firsts if s > sentence), default=-1))}
    return [replace(token, asks=True) if token.sentence in asking else token
            for token in tokens]


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
        if tokens[index].word not in _NEGATOR_PHRASE_STARTS:  # the common case, cheaply
            out.append(tokens[index])
            index += 1
            continue
        for phrase in _NEGATOR_PHRASES:
            window = tokens[index:index + len(phrase)]
            if len(window) == len(phrase) and all(t.word == w for t, w in zip(window, phrase,
                                                                                 strict=True)):
                first, last = window[0], window[-1]
                out.append(Token(" ".join(phrase), NOT, first.start, last.end, first.clause,
                                 first.sentence, colon=first.colon,
                                 semicolon=first.semicolon))
                index += len(phrase)
                break
        else:
            out.append(tokens[index])
            index += 1
    return out


@dataclass(frozen=True)
class Occurrence:
    """Where a phrase matched: from token `first` to `last`."""

    first: int  # token indexes
    last: int
    used: frozenset[int]  # tokens the phrase consumed (its own `not`s among them)


# --- what a negator governs ---------------------------------------------------------------

_AUXILIARIES = frozenset("""
is are was were be been being am do does did has have had will would can could shall should
may might must
""".split())
_SUBJECTS = frozenset("i we you he she it they there".split())
# Negators that deny a noun phrase ("without an outbox", "no retries"), not a verb phrase.
_NOUN_NEGATORS = frozenset({"without", "no", "instead of", "rather than", "as opposed",
                            "in place of", "lack", "lacks", "lacking", "lacked"})
# Small words that may open that noun phrase before its first real word.
_DETERMINERS = frozenset("any all some its their our his her my your this that these those "
                         "such single".split())


# After a negated verb and its object, a preposition's object is a referent, not what is
# denied: "does not open the package to the unnamed module" says nothing against the unnamed
# module (the preposition itself stays denied: "don't call it inside the transaction").
_PREPOSITIONS = frozenset("""
to into onto for from with by at on in inside within outside across between through via per
about against toward towards
""".split())
_OBJECT_PRONOUNS = frozenset("it them this that these those me us him her one".split())


def mark_reach(tokens: list[Token]) -> list[Token]:
    """`_mark_reach` again, after typo repair turned a word into a negator ("nevver")."""
    return _mark_reach([replace(token, reach=0) for token in tokens])


def _mark_reach(tokens: list[Token]) -> list[Token]:
    """Set `reach` on every negator. A negator governs the rest of its clause, at most
    NEGATION_SCOPE words, but each conjunct carries its own polarity:

    - another negator starts its own scope ("isn't enlisted and doesn't un-send");
    - "and" / "or" / "nor" followed by a subject, an auxiliary or a negator starts a new
      predicate ("doesn't block and it retries", "isn't lost or is replayed");
    - a negator of a noun phrase ("without idempotence", "no retries", "instead of the
      outbox") governs that phrase only: it ends at an auxiliary or a relative pronoun
      ("retries without idempotence can reorder"), unless a gerund opens it ("without
      waiting for the commit", which is a verb phrase).

    A negator whose clause closes with "yet" ("we neither credit nor refund it yet") or goes
    on with "until" ("we don't commit the offset until the write is done") says when, not
    whether: it governs nothing. Two negators that state a requirement govern
    nothing either: "you can't publish without the
    outbox", "without an alert, nobody notices" (a negated "without" phrase, in its clause or
    the next one of its sentence, says the phrase is needed).
    """
    negators = [index for index, token in enumerate(tokens) if token.norm == NOT]
    reach = {index: _scope_end(tokens, index) for index in negators}
    for index in negators:
        token = tokens[index]
        pair = None
        if reach[index] < len(tokens) and tokens[reach[index]].word == "without" \
                and tokens[reach[index]].clause == token.clause and token.word != "without":
            pair = reach[index]
        elif token.word == "without":
            pair = _negator_in_next_clause(tokens, index)
        if pair is not None:
            reach[index] = index + 1
            reach[pair] = pair + 1
        elif _yet_closes(tokens, _clause_end(tokens, index)) \
                or _until_follows(tokens, _clause_end(tokens, index), token.sentence):
            reach[index] = index + 1
    return [replace(token, reach=reach[index]) if index in reach else token
            for index, token in enumerate(tokens)]


def _scope_end(tokens: Sequence[Token], index: int) -> int:
    token = tokens[index]
    noun_phrase = token.word in _NOUN_NEGATORS and not _gerund_after(tokens, index) \
        and not _need_after(tokens, index)
    end = index + 1
    content = 0
    while end < len(tokens) and end - index <= NEGATION_SCOPE \
            and tokens[end].clause == token.clause:
        current = tokens[end]
        if current.norm == NOT:
            break
        following = tokens[end + 1] if end + 1 < len(tokens) else None
        if current.word in ("and", "or", "nor") and following is not None \
                and (following.norm == NOT or following.word in _SUBJECTS
                     or following.word in _AUXILIARIES):
            break
        if noun_phrase and end > index + 1 \
                and (current.word in _AUXILIARIES or current.word in ("that", "who")):
            break
        if not noun_phrase and current.word in _PREPOSITIONS and content >= 2:
            return end + 1
        content += current.word not in _AUXILIARIES and current.word not in _DETERMINERS \
            and current.word not in _OBJECT_PRONOUNS
        end += 1
    return end


def _clause_end(tokens: Sequence[Token], index: int) -> int:
    end = index
    while end < len(tokens) and tokens[end].clause == tokens[index].clause:
        end += 1
    return end


def _yet_closes(tokens: Sequence[Token], end: int) -> bool:
    """Whether the token at `end` is a "yet" that stands alone in its clause (the adverb
    closing "… not … yet", not the conjunction "…, yet it works")."""
    if end >= len(tokens) or tokens[end].word != "yet":
        return False
    return end + 1 == len(tokens) or tokens[end + 1].clause != tokens[end].clause


def _until_follows(tokens: Sequence[Token], end: int, sentence: int) -> bool:
    return end < len(tokens) and tokens[end].word == "until" and tokens[end].sentence == sentence


def _gerund_after(tokens: Sequence[Token], index: int) -> bool:
    after = index + 1
    while after < len(tokens) and tokens[after].word in _DETERMINERS:
        after += 1
    return after < len(tokens) and tokens[after].word.endswith("ing") \
        and tokens[after].clause == tokens[index].clause


_NEED_NOUNS = frozenset("need reason point sense use".split())


def _need_after(tokens: Sequence[Token], index: int) -> bool:
    """"no need to configure a DLQ", "no reason to retry", "no point in waiting": the noun
    carries a verb phrase, which the negator denies."""
    after = index + 1
    return after < len(tokens) and tokens[after].word in _NEED_NOUNS \
        and tokens[after].clause == tokens[index].clause


def _negator_in_next_clause(tokens: Sequence[Token], index: int) -> int | None:
    """The first negator of the clause right after the one of `index`, in its sentence."""
    clause = tokens[index].clause
    following = next((i for i in range(index + 1, len(tokens))
                      if tokens[i].clause != clause), None)
    if following is None or tokens[following].sentence != tokens[index].sentence:
        return None
    return next((i for i in range(following, len(tokens))
                 if tokens[i].clause == tokens[following].clause
                 and tokens[i].norm == NOT), None)
