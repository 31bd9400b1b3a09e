"""Stage lag: the consumer group stuck behind a poison record, from its committed offsets.

Every record is real, written to a topic of 3 partitions on the broker; the shop's notifier
group reads them and commits after each one it handled, step by step, and every look the
learner takes sees a settled broker (a barrier on the committed and end offsets). The stuck
run has one partition whose committed offset stays on a poison record while events keep
arriving behind it, a partition with more lag whose committed offset moves between the two
looks, and a caught-up one whose committed offset moves too, with nothing left to read. The
other runs: only the slow partition, moving; all caught up.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from _lag import LAG, LagRun, lag_run, look, two_looks
from _support import PROVE, field_of

from dojo.checks import CheckFailure

pytestmark = pytest.mark.stage("lag")


def _moving_fix(run: LagRun, got: Any) -> str | None:
    """The fix line when the partition named is the slow one that moves."""
    if got != run.roles.moving:
        return None
    before, after = run.first.committed[got], run.second.committed[got]
    return (f"partition {got}'s committed offset moved from {before} to {after} between the "
            "two looks: the group is slow there but moving, however large its lag. A "
            "partition is stuck when its committed offset stays the same while records wait.")


def _idle_fix(run: LagRun, got: Any) -> str | None:
    """The fix line when the partition named has nothing waiting."""
    if not isinstance(got, int) or run.second.lag().get(got) != 0:
        return None
    return (f"partition {got} has nothing waiting (lag 0): its committed offset stays put "
            "because there is nothing to read. Idle is not stuck: a partition is stuck when "
            "records wait (lag above 0) and its committed offset does not move.")


def test_the_stuck_partition_is_named(learner, kafka, seed):
    with lag_run(kafka, seed, poison=True) as run:
        found = two_looks(learner, run)
    got = {name: field_of(found, name) for name in ("partition", "offset", "key", "headers")
           } if found is not None else None
    want = {"partition": run.roles.stuck, "offset": run.poison_offset, "key": run.poison_key,
            "headers": run.poison_headers}
    if got == want:
        return
    fix = _moving_fix(run, got["partition"]) if got else None
    if got and got["partition"] == run.roles.stuck and got["offset"] == run.poison_offset - 1:
        fix = (f"offset {run.poison_offset - 1} is the last record the group finished. A "
               f"committed offset is the next record to read: {run.poison_offset}, the record "
               "the group cannot get past.")
    if got and got["partition"] == run.roles.stuck and got["offset"] == run.poison_offset + 1:
        fix = (f"offset {run.poison_offset + 1} is one past the committed offset: a consumer's "
               "position after it read the record. The group resumes from its committed "
               f"offset, {run.poison_offset}: that record is the one it cannot get past.")
    raise CheckFailure(
        "consumer_lag() did not name the partition stuck behind the poison record.",
        expected=", ".join(f"{k} {v!r}" for k, v in want.items()),
        actual="None" if got is None else ", ".join(f"{k} {v!r}" for k, v in got.items()),
        evidence=run.evidence(),
        lesson=LAG,
        fix=fix,
    )


def test_of_several_stuck_partitions_the_one_with_most_waiting(learner, kafka, seed):
    with lag_run(kafka, seed, poison=True, several=True) as run:
        found = two_looks(learner, run)
    got = (field_of(found, "partition"), field_of(found, "offset")) if found is not None else None
    want = (run.roles.stuck, run.poison_offset)
    key = field_of(found, "key") if found is not None else None
    if got == want and key == run.poison_key:
        return
    if got == want:
        raise CheckFailure(
            "consumer_lag() named the stuck record but not its key.",
            expected=f"key {run.poison_key!r} (the record's key is empty: b'', decoded '')",
            actual=f"key {key!r}",
            evidence=run.evidence(),
            lesson=LAG,
            fix=("An empty key is a key: b'' decodes to ''. Only a record without one has "
                 "None: test `key is None`, not `if key`.") if key is None else None,
        )
    lag = run.second.lag()
    fix = None
    if got is not None and got[0] in lag and got[0] != want[0]:
        fix = (f"partition {got[0]} is stuck too, but {lag[got[0]]} records wait there and "
               f"{lag[want[0]]} on partition {want[0]}, where no new record arrived between "
               "the looks: a partition is stuck when records wait and its committed offset "
               "stays put, new records or not; of several stuck partitions, report the one "
               "with the largest lag.")
    raise CheckFailure(
        "consumer_lag() did not name the stuck partition with the most records waiting.",
        expected=f"partition {want[0]}, offset {want[1]}",
        actual="None" if got is None else f"partition {got[0]!r}, offset {got[1]!r}",
        evidence=run.evidence(),
        lesson=LAG,
        fix=fix,
    )


def test_lag_is_counted_per_partition(learner, kafka, seed):
    with lag_run(kafka, seed, poison=True) as run:
        found = two_looks(learner, run)
    lag = field_of(found, "lag") if found is not None else None
    moving = field_of(found, "moving") if found is not None else None
    want = run.second.lag()
    moving_ok = isinstance(moving, list | tuple | set) and set(moving) == {run.roles.moving}
    if isinstance(lag, dict) and lag == want and moving_ok:
        return
    if isinstance(lag, dict) and lag == want:
        caught_up = run.roles.caught_up
        fix = None
        if (isinstance(moving, list | tuple | set) and caught_up in moving
                and set(moving) - {caught_up} == {run.roles.moving}):
            fix = ("Slow but moving is a lag above 0 with a committed offset that advanced; a "
                   "caught-up partition's advanced too, with nothing left to read (partition "
                   f"{caught_up}: committed {run.first.committed[caught_up]} to "
                   f"{run.second.committed[caught_up]}, lag 0).")
        raise CheckFailure(
            "consumer_lag() counted the lag right but not the partitions that are slow but "
            "moving.",
            expected=f"moving [{run.roles.moving}] (lag above 0, committed offset advanced)",
            actual=f"moving {moving!r}",
            evidence=run.evidence(),
            lesson=LAG,
            fix=fix,
        )
    fix = None
    if isinstance(lag, dict) and set(lag) == set(want) and all(
            isinstance(n, int) and n == want[p] - (1 if want[p] else 0) for p, n in lag.items()):
        fix = ("Every lagging partition is one short: that is end minus a position, where a "
               "consumer got after reading a record. Lag is the end offset minus the group's "
               "committed offset, which no reading of yours moves.")
    elif isinstance(lag, dict) and lag == run.second.end and any(want.values()):
        fix = ("Every lag equals the partition's end offset: the committed offsets read were "
               "none. committed() answers for the group.id of the consumer that asks: create "
               "it with group.id = sources.group (and enable.auto.commit False).")
    elif isinstance(lag, dict) and lag == run.first.lag():
        fix = "These are the lags of the first look: the finding reports the second."
    raise CheckFailure(
        "consumer_lag() reported a wrong lag per partition.",
        expected=f"lag {want} (end offset minus the group's committed offset, at the second "
                 "look)",
        actual=f"lag {lag!r}",
        evidence=run.evidence(),
        lesson=LAG,
        fix=fix,
    )


def test_slow_but_moving_is_not_stuck(learner, kafka, seed):
    with lag_run(kafka, seed, poison=False, moving=True) as run:
        found = two_looks(learner, run)
    if found is None:
        return
    got = field_of(found, "partition")
    raise CheckFailure(
        "consumer_lag() reported a stuck partition although the group moves on every "
        "partition.",
        expected="None (a lag whose committed offset advances between the looks is slow, not "
                 "stuck)",
        actual=f"partition {got!r}, offset {field_of(found, 'offset')!r}",
        evidence=run.evidence(),
        lesson=LAG,
        fix=_moving_fix(run, got) or _idle_fix(run, got),
    )


def test_a_healthy_group_raises_nothing(learner, kafka, seed):
    with lag_run(kafka, seed, poison=False, moving=False) as run:
        found = two_looks(learner, run)
    if found is None:
        return
    got = field_of(found, "partition")
    raise CheckFailure(
        "consumer_lag() reported a stuck partition although the group is caught up.",
        expected="None (no lag on any partition)",
        actual=f"partition {got!r}, offset {field_of(found, 'offset')!r}",
        evidence=run.evidence(),
        lesson=LAG,
        fix=_idle_fix(run, got),
    )


def test_triage_leaves_the_group_where_it_was(learner, kafka, seed):
    with lag_run(kafka, seed, poison=True) as run:
        two_looks(learner, run)
        after = look(kafka, run.sources.topic, run.sources.group)
    if after.committed == run.second.committed:
        return
    moved = {p: (run.second.committed[p], o) for p, o in after.committed.items()
             if o != run.second.committed[p]}
    raise CheckFailure(
        "Looking at the group moved its committed offsets.",
        expected=f"committed offsets unchanged: {run.second.committed}",
        actual="; ".join(f"partition {p}: {a} -> {b}" for p, (a, b) in sorted(moved.items())),
        evidence=run.evidence(after),
        lesson=LAG,
        fix=("A consumer with the group's id commits what it read when enable.auto.commit is "
             "on (the default), at the latest when it closes: the group then skips the "
             "records it read, the poison record first. Read with enable.auto.commit set to "
             "False, and never commit for the group you diagnose."),
    )


def test_the_stuck_finding_carries_its_evidence(learner, kafka, seed):
    with lag_run(kafka, seed, poison=True) as run:
        found = two_looks(learner, run)
    listed = field_of(found, "evidence") if found is not None else None
    offset = re.compile(rf"\b{run.poison_offset}\b")
    if (isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed)
            and any(run.poison_key in e for e in listed)
            and any(offset.search(e) for e in listed)):
        return
    raise CheckFailure(
        "consumer_lag() returned a finding without the evidence that supports it.",
        expected=f"evidence: a non-empty list of str, naming the stuck offset "
                 f"({run.poison_offset}) and the record's key ({run.poison_key!r})",
        actual=f"evidence {listed!r}"[:200],
        evidence=run.evidence(),
        lesson=PROVE,
    )
