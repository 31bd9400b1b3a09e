"""Golden failure messages: what a mutant's check must say, kept in `mutants/<name>/expected.txt`.

Like CodeCrafters' tester fixtures, the message is compared as text, after normalising what
changes from run to run or broker to broker: UUIDs, timestamps, durations, pids, transaction
ids, ports, hex suffixes of generated names. The `evidence:` block of a message is state (rows,
lock holders, statement traces) that differs with every race, so it is not compared; the
headline, `expected:`, `actual:`, `fix:` and `read:` lines are — those are what tell a
learner which mistake they made and what to do, and a check that answers one mistake with the
fix for another is caught here.

Counts are observations too: how many of 12 racing transfers deadlocked, in which round a race
showed, how many records an outage dead-lettered before the breaker opened. So every number in
the headline and the `actual:` lines becomes `<n>`; the words around it still name the mistake.
Numbers in `expected:` and `fix:` lines are the contract and the remedy, so they are kept.
`<…>` in expected.txt matches any text within a line; a line holding only `<…>`
matches any number of lines. `dojo dev golden` records each mutant more than once and puts
`<…>` where the runs disagreed, and `--merge` folds a run on another broker into the file.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from functools import cache

from dojo.runner.results import CheckResult

WILDCARD = "<…>"
EVIDENCE_ELIDED = "evidence: <not compared>"

# Order matters: UUIDs and timestamps before the plain numbers inside them.
_NORMALISE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement) for pattern, replacement in (
        (r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
         "<uuid>"),
        (r"\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?(?:Z|[+-]\d{2}(?::?\d{2})?)?",
         "<time>"),
        (r"\b\d{2}:\d{2}:\d{2}(?:\.\d+)?\b", "<time>"),
        (r"(?<![\w.])[+-]?\d+(?:\.\d+)?\s?(?:ms|µs|us|ns|s|sec|seconds?)\b", "<duration>"),
        (r"\b(pid|process|Process|PID|backend)(\s*[=:]?\s*)\d+\b", r"\1\2<pid>"),
        (r"\b(pids|blocked_by|blocked by)(\s*[=:]?\s*)\[[\d, ]*\]", r"\1\2[<pid>]"),
        (r"\b(transaction|xid|txid)(\s+)\d+\b", r"\1\2<n>"),
        (r"\btuple \(\d+,\d+\)", "tuple (<n>,<n>)"),
        (r"\b((?:127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\])):\d+\b", r"\1:<port>"),
        (r"\bport (\d+)\b", "port <port>"),
        (r"\b(dojo[._][\w.]*?[._])[0-9a-f]{6,}\b", r"\1<hex>"),
        (r"\b0x[0-9a-fA-F]+\b", "<hex>"),
        (r"\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b", "<hex>"),
    ))
_EVIDENCE = re.compile(r"^ *evidence:\s*$")
# a number that stands alone (a sign included): not inside a word or a name ("p0", "UTF-8",
# "acc-42", "N+1"), a placeholder ("<n>"), an address or a version ("127.0.0.1", "4.1.1")
_NUMBER = re.compile(r"(?<![\w<>.+-])[-+]?\d+(?:[.,]\d+)?(?![\w>]|[.,]\d)")
_FIELD = re.compile(r"^ *(expected|actual|evidence|fix|read|hint):")
# lines whose numbers are the contract or the remedy, not an observation
_KEEP_NUMBERS = frozenset({"expected", "fix", "read", "hint"})


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def normalise(message: str) -> str:
    """`message` without what differs run to run: ids, times, durations, ports, evidence.
    The evidence block is the `evidence:` line and every line indented deeper than it."""
    lines: list[str] = []
    evidence_indent: int | None = None
    field = ""  # the field the line belongs to; "" for the headline
    for line in message.replace("\r\n", "\n").split("\n"):
        if evidence_indent is not None:
            if not line.strip() or _indent(line) > evidence_indent:
                continue
            evidence_indent = None
        if _EVIDENCE.match(line):
            evidence_indent = _indent(line)
            lines.append(" " * evidence_indent + EVIDENCE_ELIDED)
            continue
        starts = _FIELD.match(line)
        if starts:
            field = starts.group(1)
        for pattern, replacement in _NORMALISE:
            line = pattern.sub(replacement, line)
        if field not in _KEEP_NUMBERS:
            line = _NUMBER.sub("<n>", line)
        lines.append(line.rstrip())
    return "\n".join(lines).strip("\n") + "\n"


def rejecting(results: Iterable[CheckResult], check: str) -> list[CheckResult]:
    """The results of `check` that rejected the code (fail or error)."""
    return [r for r in results if r.check_id == check and r.status in ("fail", "error")]


def golden_text(results: Sequence[CheckResult]) -> str:
    """The normalised messages of `results`, one block each, as expected.txt holds them."""
    return "\n".join(normalise(r.message) for r in results)


# -- merging runs -------------------------------------------------------------------------

_TOKEN = re.compile(r"\s+|\w+|[^\w\s]")


def _merge_line(a: str, b: str) -> str:
    """`a` and `b`'s common start (whole tokens), `<…>`, and their common end when that is
    plain words: one wildcard per line, so a third run that differs anywhere in the span
    still fits."""
    if a == b:
        return a
    ta, tb = _TOKEN.findall(a), _TOKEN.findall(b)
    start = 0
    while start < min(len(ta), len(tb)) and ta[start] == tb[start]:
        start += 1
    end = 0
    while (end < min(len(ta), len(tb)) - start
           and ta[len(ta) - 1 - end] == tb[len(tb) - 1 - end]):
        end += 1
    head = ta[:start]
    # a number cut in half is no anchor: "110.4" and "110.9" share "110." only by luck
    while head and (head[-1].isdigit() or (head[-1] in ".," and len(head) > 1
                                           and head[-2].isdigit())):
        head.pop()
    tail = ta[len(ta) - end:] if end else []
    # a common end is kept only when it is words: in a list of racing workers or counts
    # ("worker 1, worker 11") the next run's end differs too
    if any(ch.isdigit() for token in tail for ch in token) or sum(
            token[:1].isalpha() for token in tail) < 2:
        tail = []
    return "".join(head) + WILDCARD + "".join(tail)


def merge(a: str, b: str) -> str:
    """One golden that matches both `a` and `b`: `<…>` where they differ."""
    la, lb = a.rstrip("\n").split("\n"), b.rstrip("\n").split("\n")
    out: list[str] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, la, lb, autojunk=False
                                                       ).get_opcodes():
        if tag == "equal":
            out.extend(la[i1:i2])
        elif tag == "replace" and i2 - i1 == j2 - j1:
            out.extend(_merge_line(x, y) for x, y in zip(la[i1:i2], lb[j1:j2], strict=True))
        elif not out or out[-1] != WILDCARD:
            out.append(WILDCARD)
    return "\n".join(out) + "\n"


# -- matching -----------------------------------------------------------------------------

# A short hex id ("row 3fa9c1e2") is "<hex>" when it has a letter and a digit, "<n>" when
# its eight characters happen to be digits only (about one id in forty): either placeholder
# in a golden matches either in a message.
_ID_PLACEHOLDER = re.compile(re.escape("<hex>") + "|" + re.escape("<n>"))
_EITHER_ID = "(?:<hex>|<n>)"


@cache
def _line_pattern(line: str) -> re.Pattern[str]:
    return re.compile(".*?".join(
        _EITHER_ID.join(re.escape(piece) for piece in _ID_PLACEHOLDER.split(part))
        for part in line.split(WILDCARD)))


def matches(golden: str, actual: str) -> bool:
    """Whether the normalised `actual` fits `golden` (`<…>` within a line; a `<…>` line
    for any number of lines). `golden` is normalised again first, so a file recorded before
    a normalisation rule existed still compares like a new one."""
    golden = normalise(golden)
    want = golden.rstrip("\n").split("\n")
    got = actual.rstrip("\n").split("\n")
    memo: dict[tuple[int, int], bool] = {}

    def fit(i: int, j: int) -> bool:
        if (i, j) in memo:
            return memo[(i, j)]
        if i == len(want):
            result = j == len(got)
        elif want[i].strip() == WILDCARD:
            result = any(fit(i + 1, k) for k in range(j, len(got) + 1))
        else:
            result = (j < len(got) and _line_pattern(want[i]).fullmatch(got[j]) is not None
                      and fit(i + 1, j + 1))
        memo[(i, j)] = result
        return result

    return fit(0, 0)


def drift(golden: str, actual: str, golden_label: str) -> str:
    """A readable diff from expected.txt to the normalised message, for a failing test."""
    return "".join(difflib.unified_diff(
        golden.splitlines(keepends=True), actual.splitlines(keepends=True),
        fromfile=f"{golden_label} (<…> matches anything)", tofile="the check's message now",
        n=2))
