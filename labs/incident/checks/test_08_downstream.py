"""Stage downstream: the dependency that times out, from the shop's outbound-call metrics.

The live shop calls three dependencies through a client with a timeout and a circuit breaker
per dependency (_downstream.py). In the broken run one of them stops answering: its calls time
out, its breaker opens and then refuses every call (short-circuited calls are not sent, so
they show no errors), while another dependency is slower (a tail of slow answers, within its
timeout) and a burst of timeouts earlier in the window recovered. The shop's own bugs fail a
few requests all along, and from the onset on the fast dependency answers some calls with 503
(errors of a third kind: neither the failing dependency's nor the service's own). The healthy
run has the same slow dependency, the same burst and one stray timeout in its last minute. A
quiet window ends with a minute in which the first dependency called answers the few orders
with 503 at once, so the others are sent no call (and refuse none). The broken run's onset
minute has exactly a fifth of the failing dependency's calls timed out (2 of 10); the minute
before it one call timed out (under a fifth) and one was answered 503 (errors above a fifth: not
bad). The slow dependency's durations step on both sides of the 95th rank (its calls number
20 k + 15), so an interpolated percentile misses the nearest rank; the fast dependency's calls
number 20 k (0.95 n whole) and its durations step between the nearest rank and the next, so a
0-based int(0.95 n) misses it too. A window in
which three dependencies fail makes every rival rule (the most timeouts over the window or in
the last minutes, the earliest or latest onset, the most errors since the onset, the highest
rate, the longest p95, the open breaker, ...) name another than the README's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from _downstream import (
    DEPENDENCIES,
    DOWNSTREAM,
    DownstreamRun,
    Expected,
    SeveralRun,
    floor_rank,
    interpolated_p95s,
    p95,
    play,
    play_quiet,
    play_several,
    pre_onset_row,
    replayed,
    rules_naming,
    silent_in_last_minute,
)
from _support import PROVE, field_of, hm

from dojo.checks import CheckFailure, call

pytestmark = pytest.mark.stage("downstream")

RATE_TOLERANCE = 0.01
P95_TOLERANCE = 0.15       # of the check's own p95, plus P95_SLACK_MS
P95_SLACK_MS = 1.0


PLAYS = ("broken", "healthy", "several", "quiet")
# the rival rules a fix names when the learner's answer is the one they name
SEVERAL_TRAITS = ("the most timeouts over the whole window",
                  "the most timeouts in the last minute", "the earliest onset", "the latest onset",
                  "the most errors since its onset")


@pytest.fixture(scope="module")
def plays(seed: int) -> Iterator[Callable[[str], Any]]:
    """plays(name) → one of the stage's windows, played once per module. A window takes
    seconds to play (its timeouts are real), so on first use every window is played at once,
    each in a thread with its own shop (its own servers, clock and breakers); their servers stay
    up, so the breakers the learner reads are the live ones."""
    pool = ThreadPoolExecutor(max_workers=len(PLAYS), thread_name_prefix="downstream-play")
    started: dict[str, Future[Any]] = {}

    def get(name: str) -> Any:
        if not started:
            started["broken"] = pool.submit(replayed, play, seed, True)
            started["healthy"] = pool.submit(replayed, play, seed, False)
            started["several"] = pool.submit(replayed, play_several, seed)
            started["quiet"] = pool.submit(replayed, play_quiet, seed)
        return started[name].result()

    yield get
    for future in started.values():
        if future.exception() is None:
            future.result().shop.close()
    pool.shutdown()


@pytest.fixture(scope="module")
def runs(plays: Callable[[str], Any]) -> Callable[[bool], DownstreamRun]:
    """runs(broken) → the broken or the healthy window."""
    return lambda broken: plays("broken" if broken else "healthy")


@pytest.fixture(scope="module")
def several(plays: Callable[[str], Any]) -> Callable[[], SeveralRun]:
    """several() → the window in which three dependencies fail."""
    return lambda: plays("several")


def _want(run: DownstreamRun) -> Expected:
    """The broken run's answer (play() refused to hand out a run without one)."""
    if run.want is None:
        raise RuntimeError(f"run {run.plan.seed}: the broken shop shows no failing dependency")
    return run.want


def _finding(learner: Any, run: DownstreamRun) -> Any:
    return call(learner.module("triage").downstream, run.sources)


def _minute(at: Any) -> datetime | None:
    if isinstance(at, datetime) and at.tzinfo is not None:
        return at.astimezone(UTC).replace(second=0, microsecond=0)
    return None


def _close(got: Any, want: float, tolerance: float) -> bool:
    return (isinstance(got, (int, float)) and not isinstance(got, bool)
            and math.isfinite(got) and abs(got - want) <= tolerance)


def test_the_failing_dependency_is_named(learner, runs):
    run = runs(True)
    want = _want(run)
    found = _finding(learner, run)
    got = field_of(found, "dependency") if found is not None else None
    since = _minute(field_of(found, "since")) if found is not None else None
    rate = field_of(found, "timeout_rate") if found is not None else None
    breaker = field_of(found, "breaker") if found is not None else None
    if (got == want.dependency and since == want.since
            and _close(rate, want.timeout_rate, RATE_TOLERANCE) and breaker == want.breaker):
        return
    fix = None
    plan = run.plan
    if found is None:
        fix = ("The failing dependency's breaker is open: it refuses every call, and a call "
               "that is not sent shows no error and no timeout. A minute in which the breaker "
               "refused calls (short_circuited) is bad: read the breaker, not only the errors.")
    elif got == plan.slow:
        fix = ("That is the slowest dependency, but its calls end within its timeout and none "
               "failed. Name the one whose calls time out or whose breaker refuses them.")
    elif (got == want.dependency and since == want.since - timedelta(minutes=1)
          and (before := pre_onset_row(run.served, plan)) is not None
          and before["timeouts"] * 5 < before["calls"] <= before["errors"] * 5):
        fix = (f"The minute {since:%H:%M} had {before['timeouts']} timeout(s) in "
               f"{before['calls']} calls, under a fifth, and {before['errors']} errors: its 503 "
               "answers are errors, not timeouts. A minute is bad when timeouts / calls >= 0.2 "
               "(or its breaker refused calls), whatever its error rate: the incident began "
               "the minute after.")
    elif (got == want.dependency and since == want.since + timedelta(minutes=1)
          and _onset_row(run)["timeouts"] * 5 == _onset_row(run)["calls"]):
        row = _onset_row(run)
        fix = (f"The minute {want.since:%H:%M} had {row['timeouts']} timeouts in "
               f"{row['calls']} calls: exactly a fifth. A minute is bad from 20 % on "
               "(timeouts / calls >= 0.2), not only above it: the incident began there.")
        if since == want.first_refused:
            # the minute after the onset is also the one its breaker first refused a call in:
            # both mistakes give this answer, so the fix says both facts
            fix += (f" {since:%H:%M}, the minute after it, is where its breaker first refused "
                    "a call: the first minute of the run of bad minutes comes before that.")
    elif got == want.dependency and since == want.first_timeout:
        fix = ("That minute was a burst of timeouts that recovered: good minutes followed. "
               "The incident began with the run of bad minutes that lasts to now.")
    elif got == want.dependency and since == want.first_refused:
        fix = ("That is the minute its breaker first refused a call. The incident began "
               "earlier, when its calls started to time out: the first minute of the run of "
               "bad minutes, whatever made each of them bad.")
    elif got == want.dependency and since == want.since and _close(
            rate, _error_rate_since(run), RATE_TOLERANCE):
        fix = ("That is its error rate: calls answered 503 count there too. The timeout rate "
               "counts only the calls that timed out, of the calls sent.")
    elif got == want.dependency and since == want.since and _close(
            rate, _timeouts_since(run) / (_sent_since(run) + want.refused_since),
            RATE_TOLERANCE):
        fix = ("The calls its breaker refused were never sent: they are not calls that timed "
               "out, nor calls that could have. The timeout rate is timeouts / calls sent.")
    elif got == want.dependency and since == want.since and breaker != want.breaker:
        fix = "Its breaker's state now is in the metrics' dependencies list."
    raise CheckFailure(
        "downstream() did not name the dependency that times out, since when and how badly.",
        expected=(f"dependency {want.dependency!r}, since {hm(want.since)}, timeout rate "
                  f"{want.timeout_rate:.3f} (±{RATE_TOLERANCE}), breaker {want.breaker!r}"),
        actual="None" if found is None else (
            f"dependency {got!r}, since {hm(field_of(found, 'since'))}, timeout rate "
            f"{rate!r}, breaker {breaker!r}"),
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )


def test_of_several_failing_the_one_with_most_timeouts_since_its_onset_is_named(learner,
                                                                               several):
    run = several()
    want = run.want
    found = call(learner.module("triage").downstream, run.sources)
    got = field_of(found, "dependency") if found is not None else None
    since = _minute(field_of(found, "since")) if found is not None else None
    if got == want.dependency and since == want.since:
        return
    fix = None
    named = run.failing[want.dependency]
    if isinstance(got, str) and got in run.failing and got != want.dependency:
        other = run.failing[got]
        leads = rules_naming(run.rivals, got)
        traits = [rule for rule in SEVERAL_TRAITS if rule in leads]
        has = f"{got} has {' and '.join(traits)}, but" if traits else f"{got} has"
        why = ["a burst that recovered is not part of it" if other.in_window > other.since_onset
               else "count every minute of each one's run of bad minutes, not only the last"]
        if "the most errors since its onset" in traits:
            why.append("its errors count its 503 answers too, which are not timeouts")
        fix = (f"Name the one with the most timeouts since its own onset: {want.dependency}, "
               f"{named.since_onset} since {named.onset:%H:%M}. {has} only "
               f"{other.since_onset} timeouts since its onset ({other.onset:%H:%M}); "
               f"{'; '.join(why)}.")
    raise CheckFailure(
        "downstream() did not name, of three failing dependencies, the one the README names.",
        expected=(f"dependency {want.dependency!r}, since {hm(want.since)} (the most timeouts "
                  f"since its onset: {named.since_onset})"),
        actual="None" if found is None else (
            f"dependency {got!r}, since {hm(field_of(found, 'since'))}"),
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )


def _onset_row(run: DownstreamRun) -> dict[str, Any]:
    """The failing dependency's outbound row of the onset minute."""
    onset = _want(run).since
    return next(r for r in run.served["outbound"] if r["dependency"] == run.plan.failing
                and datetime.fromisoformat(r["minute"].replace("Z", "+00:00")) == onset)


def _since_onset(run: DownstreamRun) -> list[dict[str, Any]]:
    """The failing dependency's outbound rows from the onset on."""
    want = _want(run)
    return [r for r in run.served["outbound"] if r["dependency"] == want.dependency
            and datetime.fromisoformat(r["minute"].replace("Z", "+00:00")) >= want.since]


def _sent_since(run: DownstreamRun) -> int:
    return sum(r["calls"] for r in _since_onset(run))


def _timeouts_since(run: DownstreamRun) -> int:
    return sum(r["timeouts"] for r in _since_onset(run))


def _error_rate_since(run: DownstreamRun) -> float:
    """The failing dependency's errors (timeouts and 503s) per call sent since the onset."""
    sent = _sent_since(run)
    return sum(r["errors"] for r in _since_onset(run)) / sent if sent else 0.0


def test_outbound_calls_are_measured_per_dependency(learner, runs):
    run = runs(True)
    want = _want(run)
    found = _finding(learner, run)
    stats = field_of(found, "by_dependency") if found is not None else None
    wrong = []
    for dep, expect in sorted(want.by_dependency.items()):
        have = stats.get(dep) if isinstance(stats, dict) else None
        have = have if isinstance(have, dict) else {}
        rate, p95_ms, breaker = (have.get("error_rate"), have.get("p95_ms"),
                                 have.get("breaker"))
        if not (_close(rate, expect["error_rate"], RATE_TOLERANCE)
                and _close(p95_ms, expect["p95_ms"],
                           P95_TOLERANCE * expect["p95_ms"] + P95_SLACK_MS)
                and breaker == expect["breaker"]):
            wrong.append((dep, expect, have))
    if not wrong:
        return
    fix = None
    # a p95 mistake (a mean, an interpolation) leaves the error rate right: only then does a
    # p95 that happens to lie near such a reading name it (an answer read from the inbound
    # requests can too, by chance, near a timeout where every reading is close)
    rate_right = {dep for dep, expect, have in wrong
                  if _close(have.get("error_rate"), expect["error_rate"], RATE_TOLERANCE)}
    means = [dep for dep, _e, have in wrong if dep in rate_right
             and _close(have.get("p95_ms"), want.mean_ms[dep], 0.05 * want.mean_ms[dep] + 0.5)]
    inbound = [dep for dep, expect, have in wrong if want.inbound_rate[dep] != expect[
        "error_rate"] and _close(have.get("error_rate"), want.inbound_rate[dep], RATE_TOLERANCE)]
    between = [dep for dep, _e, have in wrong if dep in rate_right
               and _between(have.get("p95_ms"), [d for r in run.served["outbound"]
                                                if r["dependency"] == dep
                                                for d in r["durations_ms"]])]
    last = {r["dependency"]: r for r in run.served["outbound"]}     # each one's last minute
    floor = [dep for dep, expect, have in wrong
             if dep in rate_right and _floor_rank_read(have.get("p95_ms"), expect["p95_ms"],
                                 [d for r in run.served["outbound"] if r["dependency"] == dep
                                  for d in r["durations_ms"]])]
    guessed = [dep for dep, expect, have in wrong if have.get("breaker") != expect["breaker"]
               and have.get("breaker") == (
                   "open" if last[dep]["short_circuited"] > 0 else "closed")]
    if guessed:
        fix = (f"The breaker of {guessed[0]} opened after its last minute's calls: that minute "
               "refused none, and it is open now. Its state now is in the metrics' "
               "dependencies list (breaker, breaker_since); a minute's refused calls say what "
               "it did then.")
    elif floor:
        dep = floor[0]
        ordered = sorted(d for r in run.served["outbound"] if r["dependency"] == dep
                         for d in r["durations_ms"])
        rank = math.ceil(0.95 * len(ordered))
        fix = ("When 0.95 n is a whole number, the nearest rank is that rank itself: "
               "sorted(d)[ceil(0.95 n) - 1]. A 0-based int(0.95 n) or round(0.95 n) is that "
               "index only when 0.95 n is not whole; otherwise it takes the next rank. "
               f"{dep} made {len(ordered)} calls: 0.95 x {len(ordered)} = {rank}, so its p95 is "
               f"sorted(d)[{rank - 1}] = {ordered[rank - 1]} ms, not sorted(d)[{rank}] = "
               f"{ordered[rank]} ms.")
    elif between:
        dep = between[0]
        ordered = sorted(d for r in run.served["outbound"] if r["dependency"] == dep
                         for d in r["durations_ms"])
        rank = math.ceil(0.95 * len(ordered))
        fix = (f"The p95 of {dep} lies between two ranks: an interpolated percentile "
               f"(statistics.quantiles, numpy.percentile). The README's p95 is the "
               f"nearest rank: ceil(0.95 x {len(ordered)}) = {rank} (1-based) of its sorted "
               f"durations, sorted(d)[{rank - 1}] = {ordered[rank - 1]} ms.")
    elif means:
        fix = ("That p95 is the mean of the calls' durations: a few slow calls hide in an "
               "average. p95 is the ceil(0.95 × n)-th smallest duration.")
    elif inbound:
        fix = ("That error rate was read from the inbound requests (the shop's errors the "
               "dependency caused, per POST /orders). Read the outbound calls: errors / calls "
               "sent to that dependency.")
    raise CheckFailure(
        "downstream() measured the outbound calls of a dependency wrongly.",
        expected="; ".join(f"{dep} error rate {e['error_rate']:.3f}, p95 {e['p95_ms']:.1f} ms, "
                           f"breaker {e['breaker']}" for dep, e, _h in wrong),
        actual="by_dependency None" if found is None or stats is None else "; ".join(
            f"{dep} error rate {h.get('error_rate')!r}, p95 {h.get('p95_ms')!r}, breaker "
            f"{h.get('breaker')!r}" for dep, _e, h in wrong),
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )


def _floor_rank_read(got: Any, want: float, durations: list[float]) -> bool:
    """Whether `got` is sorted(durations)[int(0.95 n)], the rank after the nearest one when
    0.95 n is whole (then it is not the README's p95)."""
    after = floor_rank(durations)
    return (isinstance(got, int | float) and not isinstance(got, bool) and after is not None
            and after != want and abs(got - after) <= 0.5)


def _between(got: Any, durations: list[float]) -> bool:
    """Whether `got` is a percentile interpolated between two ranks of `durations`
    (statistics.quantiles, either method; numpy.percentile's linear is the inclusive one)."""
    if not isinstance(got, int | float) or isinstance(got, bool) or not durations:
        return False
    ordered = sorted(durations)
    return got != p95(ordered) and any(
        abs(got - value) <= 0.5 for name, value in interpolated_p95s(ordered).items()
        if name.startswith("statistics"))


def test_errors_it_caused_are_told_from_the_services_own(learner, runs):
    run = runs(True)
    want = _want(run)
    found = _finding(learner, run)
    caused = field_of(found, "caused_errors") if found is not None else None
    own = field_of(found, "own_errors") if found is not None else None
    if caused == want.caused_errors and own == want.own_errors:
        return
    fix = None
    if caused == want.all_errors or caused == want.caused_errors + want.own_errors:
        fix = ("Some of those errors are the service's own (errors_by_cause 'own'): the "
               "dependency did not cause them. Count only the errors labelled with its name.")
    elif caused == want.caused_errors and own == want.all_errors - want.caused_errors:
        fix = ("Another dependency caused some of the errors counted as the service's own "
               f"({want.other_errors} of {own}: {run.plan.fast} answered 503). The service's "
               "own are those errors_by_cause labels 'own', not every error the failing "
               "dependency did not cause.")
    raise CheckFailure(
        "downstream() did not tell the inbound errors the dependency caused from the "
        "service's own.",
        expected=f"caused_errors {want.caused_errors}, own_errors {want.own_errors} (inbound, "
                 f"since {hm(want.since)})",
        actual="None" if found is None else f"caused_errors {caused!r}, own_errors {own!r}",
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )


def test_a_healthy_run_raises_nothing(learner, runs):
    run = runs(False)
    found = _finding(learner, run)
    if found is None:
        return
    got = field_of(found, "dependency")
    fix = None
    if got == run.plan.slow:
        fix = ("That dependency is slow now and then, but its calls end within its timeout: "
               "slow is not failing.")
    elif got == run.plan.failing:
        fix = ("That dependency's last minute has one timeout of its calls, under a fifth, "
               "and its earlier burst recovered. A minute is bad when a fifth of its calls "
               "timed out, or when its breaker refused calls.")
    elif got == run.plan.fast:
        fix = ("That dependency answers some calls with 503, at once: errors, but none of its "
               "calls timed out and its breaker refused none. A minute is bad when a fifth of "
               "the calls sent timed out (timeouts / calls), or when its breaker refused "
               "calls; errors / calls is its error rate, not a timeout rate.")
    raise CheckFailure(
        "downstream() reported a failing dependency although none fails.",
        expected="None (a slow tail within the timeout, a burst that recovered, a stray "
                 "timeout and quick 503 answers are not an incident)",
        actual=f"dependency {got!r}, since {hm(field_of(found, 'since'))}",
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )


def test_the_downstream_finding_carries_its_evidence(learner, runs):
    run = runs(True)
    found = _finding(learner, run)
    listed = field_of(found, "evidence") if found is not None else None
    if (isinstance(listed, list) and listed and all(isinstance(e, str) for e in listed)
            and any(run.plan.failing in e for e in listed)):
        return
    raise CheckFailure(
        "downstream() returned a finding without the evidence that supports it.",
        expected="evidence: a non-empty list of str, one naming the failing dependency",
        actual=f"evidence {listed!r}"[:200],
        evidence=run.evidence((run.plan.failing,)),
        lesson=PROVE,
    )


def test_a_minute_without_calls_is_not_bad(learner, plays):
    # a quiet window: in its last minute the first dependency called answers each of the few
    # orders with 503 at once, so the shop calls the next ones never; no breaker refuses
    run: DownstreamRun = plays("quiet")
    found = _finding(learner, run)
    if found is None:
        return
    got = field_of(found, "dependency")
    silent = silent_in_last_minute(run.served)
    fix = None
    if got in silent:
        fix = (f"In its last minute {got} was sent no call and its breaker refused none "
               f"({DEPENDENCIES[0]}, called first, answered the minute's orders with 503 at "
               "once, so the shop never called it): nothing timed out and nothing was refused. "
               "A minute is bad when short_circuited > 0, or when timeouts / calls >= 0.2 with "
               "calls > 0; a minute without calls is neither.")
    raise CheckFailure(
        "downstream() reported a failing dependency in a window where none fails.",
        expected=f"None (in the last minute {', '.join(silent)} got no call and refused none; "
                 f"{DEPENDENCIES[0]} answered 503 in time)",
        actual=f"dependency {got!r}, since {hm(field_of(found, 'since'))}",
        evidence=run.evidence(),
        lesson=DOWNSTREAM,
        fix=fix,
    )
