"""`score_answer(card, text)`: which points a typed answer makes, which it contradicts, and
where in the answer the evidence is.

Per point (dojo.content.cues): a `says` cue or a regex pattern recognising it in the answer
makes it ✓ with the span that did; a recognised claim governed by a negator, or one of the
card's misconceptions, makes it "said the opposite". The learner can then tick or untick
points (`Score.confirmed`); the grade suggestion follows the confirmed checklist.

Coverage: essentials count 1, bonus points `BONUS_WEIGHT` (total capped at 1). A keyword list
keeps at most `KEYWORD_LIST_CAP`; a contradicted essential caps the answer at
`CONTRADICTION_CAP`: an interviewer remembers the wrong claim, not the right ones around it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from enum import Enum
from functools import lru_cache

from dojo.content.critique import criticised
from dojo.content.cues import CueMatch, match_cue
from dojo.content.matching import fold_with_map
from dojo.content.models import Card, KeyPoint, Misconception, Pattern
from dojo.content.order import reversed_order
from dojo.content.polarity import (
    affirmed_matches,
    denied,
    fix_part,
    is_fix,
    negates_statement,
    states_it,
    swapped,
)
from dojo.content.synonyms import widened
from dojo.content.tokens import Token, tokenize
from dojo.content.typos import repair_typos
from dojo.quiz.answer_shape import FUNCTION_WORDS, AnswerShape, answer_shape

KEYWORD_LIST_FACTOR = 0.5
KEYWORD_LIST_CAP = 0.2
CONTRADICTION_CAP = 0.2
BONUS_WEIGHT = 0.25

Span = tuple[int, int]


class Verdict(Enum):
    MADE = "made"
    MISSED = "missed"
    CONTRADICTED = "contradicted"


@dataclass(frozen=True)
class PointResult:
    """One point's verdict, with the answer's characters that earned it."""

    point: KeyPoint
    verdict: Verdict
    spans: tuple[Span, ...] = ()
    because: str = ""  # for a contradiction: the misconception, or "negated"
    by_learner: bool = False  # the learner changed the machine's verdict

    @property
    def made(self) -> bool:
        return self.verdict is Verdict.MADE

    @property
    def contradicted(self) -> bool:
        return self.verdict is Verdict.CONTRADICTED


@dataclass(frozen=True)
class Score:
    """The result of scoring one answer against one card."""

    card_id: str
    results: tuple[PointResult, ...]  # essentials first, then bonus points, card order
    raw_coverage: float  # before the keyword-list and contradiction caps (0–1)
    coverage: float  # what counts (0–1)
    shape: AnswerShape
    text: str = ""
    confirmed: bool = False  # the learner has reviewed the checklist

    @property
    def matched(self) -> tuple[KeyPoint, ...]:
        return tuple(r.point for r in self.results if r.made)

    @property
    def missed(self) -> tuple[KeyPoint, ...]:
        return tuple(r.point for r in self.results if not r.made)

    @property
    def contradicted(self) -> tuple[PointResult, ...]:
        return tuple(r for r in self.results if r.contradicted)

    @property
    def essentials(self) -> tuple[PointResult, ...]:
        return tuple(r for r in self.results if not r.point.bonus)

    @property
    def bonus(self) -> tuple[PointResult, ...]:
        return tuple(r for r in self.results if r.point.bonus)

    @property
    def matched_ids(self) -> tuple[str, ...]:
        return tuple(point.id for point in self.matched)

    @property
    def keyword_list(self) -> bool:
        """True when the answer reads like a list of terms; `shape.reason` says why."""
        return self.shape.looks_like_keyword_list

    @property
    def empty(self) -> bool:
        return self.shape.words == 0

    @property
    def percent(self) -> int:
        return round(self.coverage * 100)

    def result(self, point_id: str) -> PointResult:
        return next(r for r in self.results if r.point.id == point_id)

    def with_checklist(self, made: Iterable[str]) -> Score:
        """The score after the learner's review: exactly the points in `made` are covered.
        Ticking a contradicted point dismisses the contradiction; unticking a ✓ makes it
        missed. Coverage is recomputed the same way."""
        wanted = set(made)
        results = []
        for r in self.results:
            if r.point.id in wanted and not r.made:
                results.append(replace(r, verdict=Verdict.MADE, by_learner=True))
            elif r.point.id not in wanted and r.made:
                results.append(replace(r, verdict=Verdict.MISSED, by_learner=True))
            else:
                results.append(r)
        raw, coverage = _coverage(results, self.shape)
        return replace(self, results=tuple(results), raw_coverage=raw, coverage=coverage,
                       confirmed=True)

    def toggled(self, point_id: str) -> Score:
        """The checklist with one point flipped (made ↔ not made)."""
        made = set(self.matched_ids) ^ {point_id}
        return self.with_checklist(made)


def _coverage(results: Sequence[PointResult], shape: AnswerShape) -> tuple[float, float]:
    essentials = [r for r in results if not r.point.bonus]
    if not essentials:
        return 0.0, 0.0
    credit = sum(1.0 for r in essentials if r.made)
    credit += BONUS_WEIGHT * sum(1 for r in results if r.point.bonus and r.made)
    raw = min(1.0, credit / len(essentials))
    coverage = raw
    if shape.looks_like_keyword_list:
        coverage = min(coverage * KEYWORD_LIST_FACTOR, KEYWORD_LIST_CAP)
    if any(r.contradicted for r in essentials):  # a contradicted detail only loses itself
        coverage = min(coverage, CONTRADICTION_CAP)
    return raw, coverage


class _Answer:
    """An answer prepared once for all of a card's points."""

    def __init__(self, card: Card, text: str) -> None:
        self.text = text
        tokens = repair_typos(tokenize(text), card.vocabulary)
        echoes = _echoes(tokens, _question_words(card.question))
        self.tokens: list[Token] = [replace(token, asks=True) if token.sentence in echoes
                                    else token for token in tokens]
        self.folded, self.offsets = fold_with_map(text)

    def span(self, first: int, last: int) -> Span:
        return self.tokens[first].start, self.tokens[last].end

    def pattern_span(self, pattern: Pattern) -> Span | None:
        """Where a regex pattern matches, in the answer's own characters (None if nowhere)."""
        from dojo.content.matching import pattern_match_span

        found = pattern_match_span(pattern, self.folded)
        if found is None:
            return None
        start, end = found
        return self.offsets[start], self.offsets[max(start, end - 1)] + 1

    def negated_span(self, span: Span) -> bool:
        """A regex match is negated like a cue: an odd number of negators before it in its
        clause that it does not contain itself."""
        from dojo.content.tokens import NEGATION_SCOPE, NOT

        inside = [i for i, t in enumerate(self.tokens) if t.start >= span[0] and t.end <= span[1]]
        if not inside:
            return False
        first = inside[0]
        count = 0
        for index in range(first - 1, max(-1, first - NEGATION_SCOPE - 1), -1):
            token = self.tokens[index]
            if token.clause != self.tokens[first].clause:
                break
            count += token.norm == NOT and first < token.reach
        return count % 2 == 1


ECHO_WORDS = 6  # content words a sentence needs before it can be an echo of the question
ECHO_SHARE = 0.85


@lru_cache(maxsize=512)
def _question_words(question: str) -> frozenset[str]:
    return frozenset(token.norm for token in tokenize(question))


def _echoes(tokens: Sequence[Token], question: frozenset[str]) -> set[int]:
    """Sentences that repeat the card's question ("Does it replace the marker table", the
    story a spot-the-mistake card shows): at least ECHO_WORDS content words, nearly all of
    them the question's. Like a question, such a sentence claims nothing."""
    by_sentence: dict[int, list[str]] = {}
    for token in tokens:
        if token.word not in FUNCTION_WORDS:
            by_sentence.setdefault(token.sentence, []).append(token.norm)
    return {sentence for sentence, words in by_sentence.items()
            if len(words) >= ECHO_WORDS
            and sum(word in question for word in words) >= ECHO_SHARE * len(words)}


@lru_cache(maxsize=2048)
def _statement(text: str) -> tuple[Token, ...]:
    """A point's own sentence, as cues see it: what it affirms is what a denial contradicts."""
    return tuple(tokenize(text))


def _judge(point: KeyPoint, answer: _Answer, polarity: int | None = 0) -> PointResult:
    """The point's verdict. `polarity`: from which answer token on a denial or an antonym
    swap of the point contradicts it (None: nowhere)."""
    made: PointResult | None = None
    negated: PointResult | None = None
    for cue in point.says:
        match = match_cue(cue, answer.tokens, by_clause=True)
        if match is None:
            continue
        spans = tuple(answer.span(occ.first, occ.last) for occ in match.occurrences)
        if not match.negated:
            made = PointResult(point, Verdict.MADE, spans)
            break
        if negated is None and negates_statement(cue, match, answer.tokens,
                                                 _statement(point.text)) \
                and _claims(answer.tokens, match):
            spans += tuple(answer.span(i, i) for i in match.negators)
            negated = PointResult(point, Verdict.CONTRADICTED, tuple(sorted(spans)), "negated")
    if made is None:
        for pattern in point.patterns:
            span = answer.pattern_span(pattern)
            if span is None:
                continue
            if not answer.negated_span(span):
                made = PointResult(point, Verdict.MADE, (span,))
                break
            if negated is None:
                negated = PointResult(point, Verdict.CONTRADICTED, (span,), "negated")
    if made is None and negated is not None:
        return negated
    if polarity is not None:
        # Said the other way round somewhere: it wins over a match elsewhere.
        statement = _statement(point.text)
        denial = denied(point.says, answer.tokens, statement, polarity)
        if denial is not None:
            spans = tuple(answer.span(occ.first, occ.last) for occ in denial.occurrences)
            spans += tuple(answer.span(i, i) for i in denial.negators)
            return PointResult(point, Verdict.CONTRADICTED, tuple(sorted(spans)), "negated")
        swap = swapped(point.says, answer.tokens, statement, polarity)
        if swap is not None:
            match, word, opposite = swap
            spans = tuple(answer.span(occ.first, occ.last) for occ in match.occurrences)
            return PointResult(point, Verdict.CONTRADICTED, spans,
                               f"“{opposite}” where the point says “{word}”")
        reverse = reversed_order(tuple(point.says), answer.tokens, statement, polarity)
        if reverse is not None and states_it(answer.tokens, reverse, reverse.first) \
                and states_it(answer.tokens, reverse, reverse.last):
            spans = tuple(answer.span(occ.first, occ.last) for occ in reverse.occurrences)
            return PointResult(point, Verdict.CONTRADICTED, spans,
                               "the steps in the opposite order")
    return made or PointResult(point, Verdict.MISSED)


def _claims(tokens: Sequence[Token], match: CueMatch) -> bool:
    """Whether `match` is claimed: not criticised, not asked (a question, or an echo of the
    card's question), not supposed (wholly inside an "if" clause)."""
    return not criticised(tokens, match) and not tokens[match.first].asks \
        and not tokens[match.last].asks and not _supposed(tokens, match)


_SUPPOSING = frozenset("if unless whether suppose".split())


def _supposed(tokens: Sequence[Token], match: CueMatch) -> bool:
    """Whether `match` lies wholly in one clause opened by a supposing word: "if you lock
    them in the order of the request, opposite transfers deadlock" names the wrong way to
    show what it causes. A match that runs on into the main clause ("if a dependency is
    down, keep consuming") is still a claim, and so is one under "when", which as often
    describes what a team does ("when a message fails we retry it forever")."""
    first, last = match.first, match.last
    if tokens[first].clause != tokens[last].clause:
        return False
    start = first
    while start > 0 and tokens[start - 1].clause == tokens[first].clause:
        start -= 1
    return tokens[start].word in _SUPPOSING


CLAIM_CLAUSES = 4  # clause breaks a misconception's match may span


def _one_claim(tokens: Sequence[Token], match: CueMatch) -> bool:
    """Whether `match` lies in one claim: no semicolon inside it (it starts another claim:
    "the default scan would only cover boot; it should be in com.acme.wallet") and at most
    CLAIM_CLAUSES clause breaks ("@Transactional works through a proxy, and …, so …, and
    during @PostConstruct the proxy isn't there" is no claim that it works during it)."""
    first, last = match.first, match.last
    return not any(token.semicolon for token in tokens[first + 1:last + 1]) \
        and tokens[last].clause - tokens[first].clause <= CLAIM_CLAUSES


def _misconception(mis: Misconception, answer: _Answer,
                   start: int = 0) -> tuple[Span, ...] | None:
    for cue in mis.says:
        # A cue that opens with the fix itself ("@fix > keep consuming") finds its own fix.
        begin = 0 if cue.ideas[0].source.strip() == "@fix" else start
        for match in affirmed_matches(widened(cue), answer.tokens):
            if match.first >= begin and _claims(answer.tokens, match) \
                    and _one_claim(answer.tokens, match):
                return tuple(answer.span(occ.first, occ.last) for occ in match.occurrences)
    for pattern in mis.patterns:
        span = answer.pattern_span(pattern)
        if span is not None and not answer.negated_span(span):
            return (span,)
    return None


def _polarity_from(card: Card, point: KeyPoint, answer: _Answer) -> int | None:
    """From which token a denial or antonym swap of `point` contradicts it. A
    spot-the-mistake answer restates the mistake ("the call is inside the transaction",
    "there is no retry") before the fix, so there only a "Fix: …" point can be said the
    other way round, and only once the answer turns to the fix."""
    if card.kind != "spot-the-mistake":
        return 0
    return fix_part(answer.tokens) if is_fix(point.text) else None


def _fix_from(card: Card, mis: Misconception, answer: _Answer) -> int:
    """From which token a misconception can fire. A spot-the-mistake card's "Fix: …"
    misconception is a wrong fix ("Fix: call the provider inside the same transaction"):
    the answer proposes it only once it turns to the fix ("The fix is …", "Instead, …"),
    while before that it restates the mistake in the same words ("they call the provider
    inside the same transaction"). A cue that opens with `@fix` finds its own fix ("@fix >
    keep consuming": "the right move is to keep consuming") anywhere. An answer with no fix
    sentence is read whole, as before: its wrong fix may stand anywhere, so a "Fix: …"
    misconception must still not match the mistake as the question states it."""
    if card.kind != "spot-the-mistake" or not is_fix(mis.text):
        return 0
    start = fix_part(answer.tokens)
    return 0 if start is None else start


def score_answer(card: Card, text: str) -> Score:
    """Score `text` against `card`. Deterministic: the same text always scores the same."""
    answer = _Answer(card, text)
    results = {point.id: _judge(point, answer, _polarity_from(card, point, answer))
               for point in card.key_points}
    for mis in card.misconceptions:
        if mis.point not in results:
            continue
        spans = _misconception(mis, answer, _fix_from(card, mis, answer))
        if spans is not None:
            results[mis.point] = PointResult(results[mis.point].point, Verdict.CONTRADICTED,
                                             spans, mis.text)
    ordered = [results[p.id] for p in card.essentials] + [results[p.id] for p in
                                                          card.bonus_points]
    shape = answer_shape(text)
    raw, coverage = _coverage(ordered, shape)
    return Score(card.id, tuple(ordered), raw, coverage, shape, text)
