"""Small measures of prose used by the linter: words, Markdown stripped, display width."""

from __future__ import annotations

import re
import unicodedata

_WORD = re.compile(r"\w+(?:['’\-.]\w+)*")
_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
# Emphasis, code ticks, headings and quote marks — but not `_` inside a word (published_at)
# nor `>` inside a sentence (balance >= 0): a learner types those, so patterns see them too.
_MARKUP = re.compile(r"`+|\*+|(?<!\w)_+|_+(?!\w)|^[ \t]*(?:#+|>+)[ \t]?", re.MULTILINE)
STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from how i if in into is it its of on or "
    "so than that the their then there they this to was we what when where which while who "
    "why will with would you your".split()
)


def words(text: str) -> list[str]:
    """The words of `text`; `60-second` and `Kafka's` count as one word each."""
    return _WORD.findall(text)


def plain(markdown: str) -> str:
    """Markdown reduced to its words: link targets, emphasis and code ticks dropped."""
    return _MARKUP.sub("", _LINK.sub(r"\1", markdown))


def content_words(text: str) -> set[str]:
    """Lower-cased words of `text` that carry meaning (no stop words)."""
    return {word.lower() for word in words(plain(text))} - STOPWORDS


def display_width(line: str) -> int:
    """Terminal columns `line` takes: wide (East Asian) characters take two, combining none."""
    width = 0
    for char in line:
        if unicodedata.combining(char):
            continue
        width += 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1
    return width
