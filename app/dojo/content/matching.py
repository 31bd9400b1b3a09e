"""How a pattern recognises a key point in a typed answer (docs/content-format.md).

Lives in `dojo.content` because the linter needs it too: a card's own model answer must
recognise every one of its key points, or the quiz would mark the model answer as wrong.
"""

from __future__ import annotations

import re

from dojo.content.models import DEFAULT_WINDOW, KeyPoint, Pattern

_SPACE = re.compile(r"\s+")


def fold(text: str) -> str:
    """The answer as patterns see it: runs of whitespace folded into one space, trimmed.
    (Case is handled by the IGNORECASE flag every pattern is compiled with.)"""
    return _SPACE.sub(" ", text).strip()


def pattern_matches(pattern: Pattern, folded: str) -> bool:
    """Whether `pattern` recognises `folded` text (see `fold`).

    One regex without a window: it matches anywhere. Several regexes (or a window): there is
    one stretch of `within` characters holding a whole match of every regex. The stretch can
    always start where one of the matches starts, so only those starts are tried.
    """
    matches = [[(m.start(), m.end()) for m in regex.finditer(folded)]
               for regex in pattern.compiled]
    if any(not spans for spans in matches):
        return False
    if pattern.within is None and len(matches) == 1:
        return True
    window = pattern.within or DEFAULT_WINDOW
    starts = sorted({start for spans in matches for start, _ in spans})
    return any(
        all(any(start >= left and end <= left + window for start, end in spans)
            for spans in matches)
        for left in starts
    )


def key_point_matches(point: KeyPoint, folded: str) -> bool:
    """Any one of the key point's patterns recognising the text is enough."""
    return any(pattern_matches(pattern, folded) for pattern in point.patterns)


def fold_with_map(text: str) -> tuple[str, list[int]]:
    """`fold(text)` and, for each of its characters, the index of that character in `text`
    (so a match in the folded text can be shown in the learner's own answer)."""
    out: list[str] = []
    offsets: list[int] = []
    pending_space = False
    for index, char in enumerate(text):
        if char.isspace():
            pending_space = bool(out)
            continue
        if pending_space:
            out.append(" ")
            offsets.append(index - 1)
            pending_space = False
        out.append(char)
        offsets.append(index)
    return "".join(out), offsets


def pattern_match_span(pattern: Pattern, folded: str) -> tuple[int, int] | None:
    """Like `pattern_matches`, but where: the stretch of `folded` from the first to the last
    character of the matches that recognise the pattern."""
    matches = [[(m.start(), m.end()) for m in regex.finditer(folded)]
               for regex in pattern.compiled]
    if any(not spans for spans in matches):
        return None
    if pattern.within is None and len(matches) == 1:
        return matches[0][0]
    window = pattern.within or DEFAULT_WINDOW
    for left in sorted({start for spans in matches for start, _ in spans}):
        chosen = [next((s for s in spans if s[0] >= left and s[1] <= left + window), None)
                  for spans in matches]
        if all(span is not None for span in chosen):
            picked = [span for span in chosen if span is not None]
            return min(s for s, _ in picked), max(e for _, e in picked)
    return None
