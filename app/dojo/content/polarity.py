"""When an answer says the opposite of a point, found from the point's own cues.

Two signs, each derived from a cue without anything written for it:

- a *direct denial*: a negator right before one of the cue's ideas, with only link words
  between ("the consumer does **not need to be** idempotent", "dead-letter them **instead of**
  pausing"), or a denial right after it ("the timeout is optional");
- an *antonym swap*: the cue matches with one of its words turned into its opposite ("slow
  calls **above** the timeout" for `@slow + below + @timeout`, "a **random** partition" for
  `same partition`).

Either one counts only in a sentence that states it as a claim: not one that criticises it
("… is the mistake"), not inside a condition ("if the consumer is not idempotent, …"), and not
when the same sentence also makes the point the right way round ("we don't retry validation
errors; transient ones get retries with backoff"). The scorer applies them even when another
cue made the point elsewhere: an answer that says both remembers as the wrong one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache

from dojo.content.critique import criticised
from dojo.content.cues import (
    Cue,
    CueMatch,
    Idea,
    Word,
    _phrase_at,
    combinations,
    match_cue,
    occurrences,
)
from dojo.content.negation import LINK_WORDS, _same_claim, denial_at, governing_negators
from dojo.content.tokens import NOT, Occurrence, Token, stem

_BUT_IT = frozenset("but it this that they which".split())
# A clause opened by one of these states a condition or a case, not a claim.
_CONDITIONS = frozenset("if unless when whether otherwise until".split())


def conditional(tokens: Sequence[Token], index: int) -> bool:
    """Whether the token at `index` sits in a clause that opens with a condition word."""
    clause = tokens[index].clause
    first = index
    while first > 0 and tokens[first - 1].clause == clause:
        first -= 1
    return tokens[first].word in _CONDITIONS


# Negators that reject a step outright, and words that make a plain "not" say a step is
# unneeded ("does not need to be", "no reason to"). A plain "not X" or "no X" is too often a
# fact about something else ("over Kafka there are no HTTP headers", "the module does not
# open the package", "so no proxy") to overrule a point made elsewhere.
_REJECTING = frozenset({"instead of", "rather than", "as opposed", "in place of", "without",
                        "never", "avoid", "avoids", "avoided", "avoiding"})
_UNNEEDED = frozenset(stem(word) for word in
                      "need needs needed have has must necessarily reason point idea worth "
                      "supposed".split())


def _direct_negator(tokens: Sequence[Token], occ: Occurrence, used: frozenset[int]) -> int | None:
    """A negator directly before `occ` (only link words between) that rejects it or calls it
    unneeded, or a denial directly after it; None if there is none."""
    index = occ.first - 1
    while index >= 0 and tokens[index].clause == tokens[occ.first].clause:
        token = tokens[index]
        if token.norm == NOT and index not in used:
            between = tokens[index + 1:occ.first]
            if (token.word in _REJECTING or any(t.norm in _UNNEEDED for t in between)) \
                    and not _negated_earlier(tokens, index) and not _repeated(tokens, occ.last):
                return index
            return None
        if token.word not in LINK_WORDS:
            break
        index -= 1
    index = occ.last + 1
    while index < len(tokens) and _same_claim(tokens, occ.last, index):
        if index not in used and denial_at(tokens, index) \
                and not _narrowed(tokens, index) and not _negated_earlier(tokens, occ.first):
            return index
        if tokens[index].word not in LINK_WORDS and tokens[index].word not in _BUT_IT:
            break
        index += 1
    return None


_REPEATING = frozenset("again twice second".split())


def _repeated(tokens: Sequence[Token], index: int) -> bool:
    """Whether the clause goes on, after `index`, to say the step is done again ("returns
    the saved result instead of moving the money a second time"): the denial is of the
    repetition, not of the step."""
    clause = tokens[index].clause
    return any(token.word in _REPEATING
               for token in tokens[index + 1:index + 6] if token.clause == clause)


# After a denial, these narrow it to a case ("does not help across sessions").
_NARROWING = frozenset("""
across beyond outside between after before for with without in on once when if unless except
during within past
""".split())


def _narrowed(tokens: Sequence[Token], index: int) -> bool:
    """Whether the denial starting at `index` is limited to a case by what follows it."""
    end = index + 1
    while end < len(tokens) and tokens[end].clause == tokens[index].clause \
            and (tokens[end].norm == NOT or tokens[end].norm in _UNNEEDED
                 or tokens[end].word in ("necessary", "necessarily", "required", "important",
                                         "critical", "essential", "matter", "help", "work")):
        end += 1
    return end < len(tokens) and tokens[end].clause == tokens[index].clause \
        and tokens[end].word in _NARROWING


def _negated_earlier(tokens: Sequence[Token], index: int) -> bool:
    """Whether a negator earlier in the clause, or in the clause an "or"/"nor" clause goes on
    from ("never change the count, or add partitions without draining"), already governs
    `index`: two denials make a requirement."""
    clause = tokens[index].clause
    position = index - 1
    while position >= 0:
        token = tokens[position]
        if token.clause != clause:
            following = tokens[position + 1]
            if following.word not in ("or", "nor") or token.sentence != tokens[index].sentence:
                return False
            clause = token.clause
        if token.norm == NOT:
            return True
        position -= 1
    return False


def denials(cue: Cue, tokens: Sequence[Token]) -> Iterator[tuple[CueMatch, Idea]]:
    """Matches of `cue` inside one sentence where one of its ideas is directly denied, with
    the alternative of the idea that was denied."""
    lists = [occurrences(idea, tokens) for idea in cue.ideas]
    if any(not found for found in lists):
        return
    single = Cue(cue.ideas, cue.ordered, cue.source, cue.line, cue.within, 1)
    for chosen in combinations(lists, single, tokens):
        used = frozenset().union(*(occ.used for occ in chosen))
        for idea, occ in zip(cue.ideas, chosen, strict=True):
            negator = _direct_negator(tokens, occ, used)
            if negator is not None:
                yield CueMatch(tuple(chosen), True, (negator,)), _phrase_of(idea, occ, tokens)
                break


def affirms(idea: Idea, statement: Sequence[Token]) -> bool:
    """Whether the point's own statement says `idea` the right way round (not negated): then
    a learner who denies it says the opposite. An idea the statement does not use ("loop",
    "crash" for "keeps a bad record from pinning the consumer") may be a consequence the
    point avoids, and denying it agrees with the point."""
    return any(not governing_negators([occ], statement) and not _averted(statement, occ.first)
               and not _justifying(statement, occ.first)
               for occ in occurrences(idea, statement))


def _justifying(statement: Sequence[Token], index: int) -> bool:
    """Whether `index` sits after a semicolon of the statement: "Only one layer retries;
    retries at every layer multiply the load" claims the first part and says after the
    semicolon what the other way costs, so "fail fast instead of multiplying load" agrees."""
    return any(token.semicolon for token in statement[1:index + 1])


_AVERTING = frozenset(stem(word) for word in
                      "prevent keep stop protect save guard shield spare".split())


def _averted(statement: Sequence[Token], index: int) -> bool:
    """"keeps a bad record from pinning", "prevents a retry storm", "protects against
    overload", "stops the failure cascading": the statement says the idea must not
    happen."""
    clause = statement[index].clause
    for before in range(index - 1, max(-1, index - 6), -1):
        token = statement[before]
        if token.clause != clause:
            break
        if token.norm == stem("prevent") or token.norm in _AVERTING and (
                statement[index - 1].word in ("from", "against")
                or statement[index].word.endswith("ing")):
            return True
    return False


def sentence_of(tokens: Sequence[Token], match: CueMatch) -> list[Token]:
    sentence = tokens[match.first].sentence
    return [token for token in tokens if token.sentence == sentence]


def states_it(tokens: Sequence[Token], match: CueMatch, at: int) -> bool:
    """Whether the sentence of `match` states it as a claim: it does not criticise it, it
    asks no question, and the word that turns it round (at `at`) is not inside a
    condition."""
    return not criticised(tokens, match) and not conditional(tokens, at) \
        and not tokens[at].asks and not tokens[match.first].asks


def affirmed_in(cues: Sequence[Cue], tokens: Sequence[Token]) -> bool:
    """Whether any of `cues` matches `tokens` affirmed."""
    for cue in cues:
        found = match_cue(cue, tokens)
        if found is not None and not found.negated:
            return True
    return False


def negates_statement(cue: Cue, match: CueMatch, tokens: Sequence[Token],
                      statement: Sequence[Token]) -> bool:
    """Whether a negated `match` of `cue` negates an idea the point's statement affirms (so
    "it can't be parsed", said of a permanent failure, does not contradict a point whose
    statement never mentions parsing)."""
    used = frozenset().union(*(occ.used for occ in match.occurrences))
    return any(len(governing_negators([occ], tokens, used)) % 2 == 1
               and affirms(_phrase_of(idea, occ, tokens), statement)
               and not _repeated(tokens, occ.last)
               for idea, occ in zip(cue.ideas, match.occurrences, strict=True))


def _phrase_of(idea: Idea, occ: Occurrence, tokens: Sequence[Token]) -> Idea:
    """The alternative of `idea` that matched at `occ`, as an idea of its own."""
    for phrase in idea.phrases:
        found = _phrase_at(phrase, tokens, occ.first)
        if found is not None and found.last == occ.last:
            return Idea((phrase,), idea.source)
    return idea


def denied(cues: Sequence[Cue], tokens: Sequence[Token],
           statement: Sequence[Token], start: int = 0) -> CueMatch | None:
    """The first direct denial of one of `cues` stated as a claim, of an idea the point's
    `statement` affirms, in a sentence where the same cue does not also match affirmed (and
    from token `start` on)."""
    for cue in cues:
        for match, idea in denials(cue, tokens):
            if match.first >= start and affirms(idea, statement) \
                    and states_it(tokens, match, match.negators[0]) \
                    and not _counterfactual(tokens, match.negators[0]) \
                    and not affirmed_in((cue,), sentence_of(tokens, match)):
                return match
    return None


_HYPOTHETICAL = frozenset("would could might".split())
# "a message parked without its origin cannot be investigated": a second negator after the
# "without" states what the absence costs, so the sentence requires the thing; so does a
# need after it ("libraries without metadata need hints")
_CONSEQUENCE = frozenset("""
n't cannot never unable impossible nobody nothing need needs require requires
""".split())


def _counterfactual(tokens: Sequence[Token], negator: int) -> bool:
    """"Without a proxy, Spring would fail at startup", "parked without its origin it cannot
    be investigated": a "without" followed in its sentence by would / could / might imagines
    the case, and one followed by a denied consequence requires the thing; neither claims
    the absence."""
    if tokens[negator].word != "without":
        return False
    sentence = tokens[negator].sentence
    return any(token.word in _HYPOTHETICAL or token.word in _CONSEQUENCE
               for token in tokens[negator + 1:] if token.sentence == sentence)


# --- antonyms: the opposite claim without a negator --------------------------------------

_ANTONYM_SETS = (
    ("before", "after"), ("inside|within", "outside"), ("open", "closed"),
    ("increase|raise", "decrease|lower|reduce"), ("more", "fewer|less"),
    ("longer", "shorter|short"), ("long", "short"),
    ("above|over|higher|greater|larger|bigger", "below|under|lower|smaller|less"),
    ("high", "low"),
    ("sync|synchronous|synchronously", "async|asynchronous|asynchronously"),
    ("outer|outermost", "inner|innermost"), ("same", "different|random|another"),
    ("early", "late"), ("earlier", "later"), ("safe", "unsafe|dangerous"),
    ("enable|enabled", "disable|disabled"),
    ("keep|keeps|kept|preserve|maintain|retain", "break|lose|lost"),
    ("transient|temporary", "permanent"), ("bounded|limited", "unbounded|unlimited|infinite"),
    ("required|mandatory", "optional"), ("explicit|explicitly", "implicit|implicitly"),
    ("accept", "reject"), ("stop|halt", "continue"),
    ("separate", "same"),
)


def _antonyms() -> dict[str, frozenset[str]]:
    out: dict[str, set[str]] = {}
    for left, right in _ANTONYM_SETS:
        lefts, rights = left.split("|"), right.split("|")
        for word in lefts:
            out.setdefault(stem(word), set()).update(stem(other) for other in rights)
        for word in rights:
            out.setdefault(stem(word), set()).update(stem(other) for other in lefts)
    return {word: frozenset(others) for word, others in out.items()}


ANTONYMS: dict[str, frozenset[str]] = _antonyms()


@lru_cache(maxsize=4096)
def flipped(cue: Cue) -> tuple[tuple[Cue, str, str], ...]:
    """Variants of `cue` that say it the other way round, each with the word it replaced
    and its replacement: one word turned into an antonym ("commit > after > write" →
    "commit > before > write"). Only cues of two or more ideas, or phrases of two or more
    words: the rest of the claim must be there for the opposite to be the same claim
    reversed; a one-word alternative only in a relational idea (`_relational`). A variant
    must sit in one sentence. (Dropping a wanted `not` was tried and measured: "retries
    stop once it opens" and "the breaker stops calls" read as the opposite of `not @retry`
    and `@breaker + not stop`, and no negated answer was caught by it.)"""
    out: list[tuple[Cue, str, str]] = []
    # A cue that names both sides ("@transient + @permanent") contrasts them: no flip.
    own = {word.norm for idea in cue.ideas for phrase in idea.phrases for word in phrase}

    def variant(index: int, idea: Idea, new_phrase: tuple[Word, ...]) -> Cue:
        ideas = (*cue.ideas[:index], Idea((new_phrase,), idea.source), *cue.ideas[index + 1:])
        return Cue(ideas, cue.ordered, cue.source, cue.line, cue.within, 1)

    for index, idea in enumerate(cue.ideas):
        relational = _relational(idea)
        for phrase in idea.phrases:
            if len(cue.ideas) < 2 and len(phrase) < 2 or len(phrase) < 2 and not relational:
                continue
            for position, word in enumerate(phrase):
                for opposite in sorted(ANTONYMS.get(word.norm, frozenset()) - own):
                    new_phrase = (*phrase[:position], Word(opposite, opposite, word.prefix),
                                  *phrase[position + 1:])
                    out.append((variant(index, idea, new_phrase), word.text, opposite))
    return tuple(out)


def _relational(idea: Idea) -> bool:
    """Whether an idea is a relation (below | under | less than …; lose | not | without):
    at least half of its alternatives hold a word with an antonym or a negator. A one-word
    alternative is only turned round in such an idea: "before" among "deposit | credit |
    before | depend" is no relation of its own."""
    with_antonym = sum(any(word.norm in ANTONYMS or word.norm == NOT for word in phrase)
                       for phrase in idea.phrases)
    return 2 * with_antonym >= len(idea.phrases)


def affirmed_matches(cue: Cue, tokens: Sequence[Token]) -> Iterator[CueMatch]:
    """Every match of `cue` that no negator governs."""
    lists = [occurrences(idea, tokens) for idea in cue.ideas]
    if any(not found for found in lists):
        return
    for chosen in combinations(lists, cue, tokens):
        used = frozenset().union(*(occ.used for occ in chosen))
        if not any(len(governing_negators([occ], tokens, used)) % 2 for occ in chosen):
            yield CueMatch(tuple(chosen), False, ())


def swapped(cues: Sequence[Cue], tokens: Sequence[Token],
            statement: Sequence[Token], start: int = 0) -> tuple[CueMatch, str, str] | None:
    """The first variant (see `flipped`) of one of `cues` that turns round something the
    point's `statement` says, stated as a claim, next to the rest of the claim, in a sentence
    that does not use the word it replaced, by a cue the answer does not also match affirmed
    in that sentence or a neighbouring one (a plain listener runs "inside" the transaction,
    "@Async … outside" it is a contrast, not a contradiction; farther apart the answer says
    it both ways and the opposite wins): with the cue's word and the learner's word that
    turned it round."""
    for cue in cues:
        affirmed = list(affirmed_matches(cue, tokens))
        for variant, word, opposite in flipped(cue):
            if not _statement_says(statement, opposite):
                continue
            for match in affirmed_matches(variant, tokens):
                if match.first < start or _contrasted(tokens, match, affirmed):
                    continue
                at = _swap_is_a_claim(tokens, match, variant, cue)
                if at is None or not states_it(tokens, match, at):
                    continue
                sentence = sentence_of(tokens, match)
                if any(token.norm == stem(word) or token.word == word for token in sentence):
                    continue
                return match, word, tokens[at].word
    return None


CONTRAST_SENTENCES = 1  # an affirmed match this many sentences away makes a contrast


def _contrasted(tokens: Sequence[Token], match: CueMatch,
                affirmed: Sequence[CueMatch]) -> bool:
    """Whether the cue is also affirmed next to the swapped match (in its sentence or a
    neighbouring one): "a plain listener runs inside the transaction; @Async runs outside"
    contrasts two cases. Farther away, the answer says the point both ways, and the opposite
    wins, as for a direct denial."""
    sentence = tokens[match.first].sentence
    return any(abs(tokens[other.first].sentence - sentence) <= CONTRAST_SENTENCES
               or abs(tokens[other.last].sentence - sentence) <= CONTRAST_SENTENCES
               for other in affirmed)


def _statement_says(statement: Sequence[Token], opposite: str) -> bool:
    """Whether the point's own sentence uses a word that `opposite` is the antonym of ("just
    below the timeout" for a learner's "higher than the timeout"; not "give one an explicit
    name" for a learner's "the same name", which turns round "different", a word of the cue
    the statement does not use)."""
    return any(opposite in ANTONYMS.get(token.norm, ()) for token in statement)


SWAP_REACH = 4  # words between the swapped word and another idea of the cue, at most


def _swap_is_a_claim(tokens: Sequence[Token], match: CueMatch, variant: Cue,
                     cue: Cue) -> int | None:
    """Where the turned-round idea is, if it sits next to the rest of the claim, in its
    clause: another idea of the cue or the other words of its phrase ("slow calls above the
    timeout", "a random partition"; not "innermost is the timeout: every attempt …" nor
    "attempts … must fit inside the caller's timeout"), and is not asked about ("how long it
    takes")."""
    changed = next(i for i, (a, b) in enumerate(zip(variant.ideas, cue.ideas, strict=True))
                   if a != b)
    occ = match.occurrences[changed]
    index = occ.first
    if index > 0 and tokens[index - 1].word == "how":
        return None
    clause = tokens[index].clause
    near = [i for other in match.occurrences if other is not occ for i in other.used]
    near += [i for i in occ.used if i != index] if len(occ.used) > 1 else []
    if any(abs(i - j) <= SWAP_REACH and tokens[i].clause == clause
           for i in near for j in occ.used):
        return index
    return None


# --- spot-the-mistake answers: the mistake first, then the fix ---------------------------

_FIX_MARKERS = frozenset(stem(word) for word in
                         "fix fixes instead better solution remedy".split())
FIX_MARKER_REACH = 3  # the fix word opens its sentence ("The fix is", "A better way:")
# A sentence that opens by rejecting the mistake turns to the fix: "Instead of calling it
# inside the transaction, use two", "Rather than a bigger pool, find the holder".
_FIX_NEGATORS = frozenset({"instead of", "rather than"})


def is_fix(statement_text: str) -> bool:
    """A spot-the-mistake point about the fix: its statement starts with "Fix:"."""
    return statement_text.lstrip().lower().startswith("fix")


def fix_part(tokens: Sequence[Token]) -> int | None:
    """Where a spot-the-mistake answer starts saying the fix: the first token of the first
    sentence that opens with a fix word ("The fix is …", "Better: …", "Instead, …",
    "Instead of …, …"), or None. Before it the answer restates the mistake, so a denial of
    the fix there ("the call runs without an idempotency key") is the mistake described,
    not claimed."""
    starts: dict[int, int] = {}
    for index, token in enumerate(tokens):
        first = starts.setdefault(token.sentence, index)
        if token.norm in _FIX_MARKERS and index - first < FIX_MARKER_REACH \
                or index == first and token.word in _FIX_NEGATORS:
            return first
    return None
