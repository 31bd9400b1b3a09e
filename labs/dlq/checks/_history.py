"""The verdict of a crash run, Jepsen-style: from the recorded history (what was produced,
what each consumer life polled, acknowledged and committed, the ledger, the DLT) name every
anomaly — lost, duplicated, reordered — with the offsets that prove it.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from _support import Input, LedgerRow, match_dlt

from dojo.checks.observers import Record, offsets_text


@dataclass
class Life:
    number: int
    kill: str  # the kill point aimed at
    ended: str  # how it really ended
    polled: int = 0
    acks: int = 0
    commits: int = 0
    committed_after: dict[int, int] = field(default_factory=dict)


@dataclass
class Verdict:
    inputs: Sequence[Input]
    applied: dict[str, list[int]]  # event id -> ledger ids
    dead_lettered: dict[int, list[Record]]  # input index -> DLT records
    lost: list[tuple[Input, str]] = field(default_factory=list)
    duplicated: list[tuple[Input, str]] = field(default_factory=list)
    reordered: list[tuple[Input, Input]] = field(default_factory=list)
    misrouted: list[Input] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.lost and not self.duplicated

    def counts(self) -> str:
        healthy = sum(1 for i in self.inputs if i.item.event_id and i.label in
                      ("healthy", "transient"))
        once = sum(1 for i in self.inputs if i.item.event_id and
                   len(self.applied.get(i.item.event_id, [])) == 1)
        return (f"inputs {len(self.inputs)} ({healthy} healthy, "
                f"{len(self.inputs) - healthy} poison) · applied once {once} · "
                f"dead-lettered {len(self.dead_lettered)} · LOST {len(self.lost)} · "
                f"DUPLICATED {len(self.duplicated)} · reordered {len(self.reordered)}")


def judge(inputs: Sequence[Input], ledger_rows: Sequence[LedgerRow],
          dlt: Sequence[Record], lives: Sequence[Life]) -> Verdict:
    applied: dict[str, list[int]] = {}
    for row in ledger_rows:
        applied.setdefault(row.event_id, []).append(row.id)
    found = match_dlt(inputs, dlt)
    verdict = Verdict(inputs, applied, found)
    for n, i in enumerate(inputs):
        rows = applied.get(i.item.event_id or "", []) if i.item.event_id else []
        in_dlt = n in found
        if len(rows) > 1:
            verdict.duplicated.append((i, f"{len(rows)} ledger rows (ids "
                                          f"{', '.join(map(str, rows))})"))
        elif rows and in_dlt:
            verdict.duplicated.append((i, "booked AND dead-lettered (ledger id "
                                          f"{rows[0]}, DLT p{found[n][0].partition}@"
                                          f"{found[n][0].offset})"))
        elif not rows and not in_dlt:
            verdict.lost.append((i, _who_committed_past(i, lives)))
        if in_dlt and i.label in ("healthy", "transient") and not rows:
            verdict.misrouted.append(i)
    by_account: dict[str, list[tuple[int, Input]]] = {}
    for i in inputs:
        rows = applied.get(i.item.event_id or "", [])
        if rows and i.item.account:
            by_account.setdefault(i.item.account, []).append((rows[0], i))
    for entries in by_account.values():
        entries.sort(key=lambda e: e[0])
        for (_, a), (_, b) in zip(entries, entries[1:], strict=False):
            if (a.partition, a.offset) > (b.partition, b.offset):
                verdict.reordered.append((b, a))
    return verdict


def _who_committed_past(i: Input, lives: Sequence[Life]) -> str:
    for life in lives:
        if life.committed_after.get(i.partition, -1) > i.offset:
            return (f"life {life.number} ({life.ended}) left p{i.partition} committed at "
                    f"{life.committed_after[i.partition]}, past it; it is not in "
                    "ledger_entries and not in the DLT")
    return "its offset was committed past, yet it is not in ledger_entries and not in the DLT"


def report(verdict: Verdict, lives: Sequence[Life], seed: int) -> str:
    lines = [f"the history (seed {seed}): {len(verdict.inputs)} inputs, {len(lives)} consumer "
             "lives; each but the last aimed at one kill point:"]
    for life in lives:
        how = life.ended if life.ended.startswith("SIGKILL") else \
            f"aimed at {life.kill}; {life.ended}"
        lines.append(f"  life {life.number}: {how}")
        lines.append(f"          polled {life.polled} · DLT acks {life.acks} · commits "
                     f"{life.commits} · committed after: {offsets_text(life.committed_after)}")
    lines.append("verdict: " + verdict.counts())
    for i, why in verdict.lost[:6]:
        lines.append(f"  LOST        {i.describe()}: {why}")
    for i, why in verdict.duplicated[:6]:
        lines.append(f"  DUPLICATED  {i.describe()}: {why}")
    for later, earlier in verdict.reordered[:3]:
        lines.append(f"  reordered   {later.describe()} was booked before {earlier.describe()}")
    for i in verdict.misrouted[:3]:
        lines.append(f"  note        {i.describe()} is healthy but was dead-lettered")
    return "\n".join(lines)


def describe_life(entries: Sequence[dict[str, Any]], outcome: dict[str, Any]
                  ) -> tuple[str, int, int, int]:
    """(how it ended, records polled, DLT acks, commits) from a life's log and the outcome
    `_crash.consumer_lives` reported for it."""
    kills = [e["why"] for e in entries if e.get("ev") == "kill"]
    polled = sum(1 for e in entries if e.get("ev") == "poll")
    acks = sum(1 for e in entries if e.get("ev") == "ack")
    commits = sum(1 for e in entries if e.get("ev") in ("commit", "store_offsets"))
    if kills:
        ended = "SIGKILL " + kills[0]
    elif outcome.get("timed_out"):
        ended = f"still running after {outcome['duration']:.0f} s: stopped"
    elif outcome.get("signal") == signal.SIGKILL:
        ended = "SIGKILL (outside the kill points)"
    elif outcome.get("error"):
        last = outcome["error"].strip().splitlines()[-1]
        ended = f"raised {last}"
    else:
        ended = "returned (nothing left to do)"
    return ended, polled, acks, commits


def committed_at_start(entries: Sequence[dict[str, Any]]) -> dict[int, int] | None:
    """The group's committed offsets a life saw when it started (None: it logged none)."""
    for entry in entries:
        if entry.get("ev") == "committed":
            return {int(p): o for p, o in entry["at_start"].items()}
    return None
