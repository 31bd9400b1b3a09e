"""Stage dead-letter-record: the DLT record is the original record (bytes, key, partition,
headers) plus Spring Kafka's `kafka_dlt-*` headers and the lab's `x-dlt-*` headers, in
encodings a Java tool reads; the DLT is named explicitly and has the source's partitions."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from _support import (
    READ,
    SERVICE,
    EndOfSecondClock,
    dlt_table,
    match_dlt,
    require_done,
)
from _tools import (
    DEEP_CHAIN_LINKS,
    Item,
    ScriptedDownstream,
    business_rule,
    healthy,
    invalid,
    undecodable,
    with_label,
)

from dojo.checks import CheckFailure, call, machine_time_zone, raised, table
from dojo.checks.observers import ProducerTap, headers_table, java_int, show_bytes

pytestmark = pytest.mark.stage("dead-letter-record")
SEE = READ["dead-letter-record"]

ORIGIN = ("kafka_dlt-original-topic", "kafka_dlt-original-partition",
          "kafka_dlt-original-offset", "kafka_dlt-original-timestamp",
          "kafka_dlt-original-timestamp-type", "kafka_dlt-original-consumer-group")
FAILURE_PREFIXES = ("kafka_dlt-", "x-dlt-")
REPLAY_COUNT = "x-replay-count"
MESSAGE_CHARS = 1000  # kafka_dlt-exception-message: at most this many characters
KEPT_CHARS = 900  # of a longer message, at least this many kept (an ending "…" is fine)
# The failure headers an earlier trip through a DLT left on a replayed record (one written by
# a Java service: a stack trace, and a header of its own this lab does not write).
OLD_TRIP = (("kafka_dlt-exception-fqcn",
             b"org.springframework.kafka.listener.ListenerExecutionFailedException"),
            ("kafka_dlt-exception-stacktrace",
             b"java.net.SocketTimeoutException: Read timed out\n\tat java.base/sun.nio.ch."
             b"NioSocketImpl.timedRead(NioSocketImpl.java:278)\n"),
            ("x-dlt-attempts", b"17"), ("x-dlt-service", b"payments-legacy"),
            ("x-dlt-origin-host", b"pay-legacy-7f9c"))
# The second attempt of the "transient-cut" record: after it 150.03 to 150.19 s have passed
# since its first attempt began (a first wait of 0.4 s ± 20%), past half of the 300 s poll
# interval whatever the draw, so no third attempt is made.
CUT_ATTEMPT_SECONDS = 149.71
# The attempts each label's record gets in dead_letter_some(transient=True) (4 = max_attempts)
ATTEMPTS = {"transient-exhausted": 4, "transient-deep": 4, "declined-late": 3,
            "transient-cut": 2}
FAILURE = ("kafka_dlt-exception-fqcn", "kafka_dlt-exception-cause-fqcn",
           "kafka_dlt-exception-message", "x-dlt-attempts", "x-dlt-first-failure-at",
           "x-dlt-last-failure-at", "x-dlt-service")


# The checks of this stage run as on a host far from UTC (POSIX TZ: India, five and a half
# hours east, no tzdata needed): a time formatted in local time and labelled Z is then
# visibly off, as it is on every such server.
HOST_TZ = "IST-5:30"
HOST_OFFSET_SECONDS = 5.5 * 3600


@pytest.fixture(autouse=True)
def _host_far_from_utc() -> Iterator[None]:
    with machine_time_zone(HOST_TZ):
        yield


def dead_letter_some(lab, engine, clock, *, transient=False):
    """Run the consumer over poison in every partition; return what the checks look at."""
    topics = lab.topics()
    settings = lab.settings(topics)
    items = [undecodable("poison-u1", partition=0), healthy("acc-1", partition=0),
             invalid("poison-i1", partition=1), undecodable(None, partition=2),
             business_rule("poison-b1", partition=2), healthy("acc-2", partition=1)]
    scripts = {}
    if transient:
        stuck = with_label(healthy("poison-t1", 300, partition=1), "transient-exhausted")
        declined = with_label(healthy("poison-d1", 900, partition=0), "declined")
        # a replayed copy (x-replay-count 2) of a payment the gateway still declines, with a
        # reason longer than the message header may carry
        again = healthy("poison-r1", 1234, partition=2)
        # reason longer than the message header may carry; it still carries the failure
        # headers of its earlier trip, some of which this writer may not write itself
        again = Item("declined", again.key, again.value,
                     again.headers + OLD_TRIP + ((REPLAY_COUNT, b"2"),), again.event_id,
                     again.account, again.cents, again.partition)
        # a 503 at the top of a chain of 41 links
        deep = with_label(healthy("poison-t2", 700, partition=2), "transient-deep")
        # declined on its third attempt, after a timeout and a 503: the exception that made
        # the consumer give up is the decline (the last failure), and it tried three times
        late = with_label(healthy("poison-d2", 1187, partition=1), "declined-late")
        # fails every time, but its second attempt takes so long that no retry fits in half
        # of max.poll.interval.ms (150 s here): dead-lettered after 2 attempts, not 4
        cut = with_label(healthy("poison-t3", 2213, partition=0), "transient-cut")
        items += [stuck, declined, again, deep, late, cut]
        scripts = {stuck.event_id: ["unavailable"] * 20, declined.event_id: ["declined"] * 5,
                   again.event_id: ["declined-long"] * 5, deep.event_id: ["unavailable-deep"] * 20,
                   late.event_id: ["timeout", "unavailable", "declined"],
                   cut.event_id: ["timeout"] * 20}
    slow = {(cut.event_id, 1): CUT_ATTEMPT_SECONDS} if transient else {}
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock, scripts,
                                    latency_of=lambda event_id, n: slow.get((event_id, n)))
    began = clock.now()
    run = lab.run(engine, topics, settings, downstream, clock)
    ended = clock.now()
    require_done(run, inputs, downstream, read=READ["classify"])
    poison = [i for i in inputs if i.label != "healthy"]
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt, by_key=True)
    missing = [i for n, i in enumerate(inputs) if i.label != "healthy" and n not in found]
    if missing:
        raise CheckFailure(
            "Some poison never reached the DLT (the check matches DLT records to inputs by their "
            "value, or by key and partition).",
            expected=f"{len(poison)} DLT records, one per poison input",
            actual="not found: " + ", ".join(i.describe() for i in missing),
            evidence="DLT:\n" + dlt_table(dlt, inputs) + "\nvalues in the DLT:\n" +
                     "\n".join(show_bytes(r.value) for r in dlt[:8]), lesson=SEE)
    pairs = [(i, found[n][0]) for n, i in enumerate(inputs) if n in found]
    return topics, settings, pairs, (began, ended), downstream


def test_dead_letter_keeps_bytes_key_and_partition(lab, ledger_db, clock):
    topics, _, pairs, _, _ = dead_letter_some(lab, ledger_db, clock)
    rows, bad = [], []
    for i, r in pairs:
        same = (r.value == i.item.value, r.key == i.item.key, r.partition == i.partition)
        rows.append((i.describe(), f"p{r.partition}@{r.offset}",
                     "ok" if same[0] else "CHANGED", "ok" if same[1] else
                     f"{show_bytes(r.key, 20)} (was {show_bytes(i.item.key, 20)})",
                     "ok" if same[2] else f"p{r.partition} (was p{i.partition})"))
        if not all(same):
            bad.append((i, r))
    detail = "\n".join(f"{i.at} sent:   {show_bytes(i.item.value, 90)}\n"
                       f"{' ' * len(i.at)} in DLT: {show_bytes(r.value, 90)}"
                       for i, r in bad if r.value != i.item.value)
    if bad:
        raise CheckFailure(
            "A DLT record carries the original record unchanged: the value byte for byte (also "
            "when it cannot be parsed: never a parsed-and-re-serialised copy), the original key, "
            "and the same partition number as the source (Spring Kafka's default destination).",
            expected="value, key and partition identical for every DLT record",
            actual=f"{len(bad)} of {len(pairs)} records differ",
            evidence=table(rows, ("input", "DLT record", "value", "key", "partition")) +
                     (("\n" + detail) if detail else ""), lesson=SEE)
    counts = lab.partition_counts([topics.source, topics.dead_letter])
    if counts[topics.dead_letter] < counts[topics.source]:
        raise CheckFailure(
            "The DLT has fewer partitions than the source: a DLT record keeps its partition "
            "number, so records from the high partitions have nowhere to go.",
            expected=f"at least {counts[topics.source]} partitions",
            actual=f"{counts[topics.dead_letter]}", lesson=READ["dlt-topic"])


def test_dead_letter_headers_say_where_it_came_from(lab, ledger_db, clock):
    topics, settings, pairs, _, _ = dead_letter_some(lab, ledger_db, clock)
    problems = []
    for i, r in pairs:
        want = {
            "kafka_dlt-original-topic": (r.text("kafka_dlt-original-topic"), topics.source),
            "kafka_dlt-original-partition": (
                java_int(r.header("kafka_dlt-original-partition"), 4), i.partition),
            "kafka_dlt-original-offset": (
                java_int(r.header("kafka_dlt-original-offset"), 8), i.offset),
            "kafka_dlt-original-timestamp": (
                java_int(r.header("kafka_dlt-original-timestamp"), 8), i.timestamp_ms),
            "kafka_dlt-original-timestamp-type": (
                r.text("kafka_dlt-original-timestamp-type"), "CreateTime"),
            "kafka_dlt-original-consumer-group": (
                r.text("kafka_dlt-original-consumer-group"), settings.group_id),
        }
        wrong = [name for name, (got, expected) in want.items() if got != expected]
        if wrong:
            problems.append((i, r, wrong, want))
    if problems:
        i, r, wrong, want = problems[0]
        raise CheckFailure(
            "Each DLT record says where it came from, in Spring Kafka's headers and encodings "
            "so a Java tool reads it: topic, timestamp type and group as UTF-8 text; "
            "partition as a 4-byte big-endian int; offset and timestamp (epoch ms) as 8-byte "
            "big-endian longs (struct.pack('>i', …) / struct.pack('>q', …)).",
            expected="; ".join(f"{n} = {want[n][1]!r}" for n in wrong),
            actual=f"{len(problems)} of {len(pairs)} records wrong; first, {i.describe()}: "
                   + "; ".join(f"{n} decodes to {want[n][0]!r}" for n in wrong),
            evidence=headers_table(r.headers, ORIGIN), lesson=SEE)


# The producer's timestamp of the record on a LogAppendTime topic: the broker replaces it
CREATE_TIME_MS = 1_611_234_567_891


@pytest.mark.needs_kafka()  # LogAppendTime: Tansu keeps the producer's timestamp
def test_dead_letter_keeps_a_log_append_timestamp(lab, ledger_db, clock):
    from dojo.checks.plugin import NeedsBackend

    if lab.kafka.backend == "tansu":  # measured: it keeps the producer's timestamp
        raise NeedsBackend(("log_append_time",), lab.kafka.backend)
    topics = lab.topics(1, hint="appendtime",
                        config={"message.timestamp.type": "LogAppendTime"})
    settings = lab.settings(topics)
    inputs = lab.produce(topics.source, [invalid("poison-i7", partition=0)],
                         timestamp_ms=CREATE_TIME_MS)
    if inputs[0].timestamp_ms == CREATE_TIME_MS:  # the broker kept the producer's time
        raise NeedsBackend(("log_append_time",), lab.kafka.backend)
    downstream = ScriptedDownstream(lab.payments, clock)
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    require_done(run, inputs, downstream, read=READ["classify"])
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    if not dlt:
        raise CheckFailure("The poison of a LogAppendTime topic never reached the DLT.",
                           expected="1 DLT record", actual="none", lesson=SEE)
    r = dlt[0]
    kind = r.text("kafka_dlt-original-timestamp-type")
    stamp = java_int(r.header("kafka_dlt-original-timestamp"), 8)
    if kind != "LogAppendTime" or stamp != inputs[0].timestamp_ms:
        raise CheckFailure(
            "The source topic stamps records with the broker's time "
            "(message.timestamp.type=LogAppendTime): the original record's timestamp is the "
            "time it was appended, and msg.timestamp() says so: (TIMESTAMP_LOG_APPEND_TIME, "
            "ms). The DLT record says which kind of time it carries: a LogAppendTime stamp "
            "labelled CreateTime tells a reader the producer set it.",
            expected=f"kafka_dlt-original-timestamp-type = 'LogAppendTime', "
                     f"kafka_dlt-original-timestamp = {inputs[0].timestamp_ms}",
            actual=f"{kind!r}, {stamp!r} (the producer's own was {CREATE_TIME_MS})",
            evidence=headers_table(r.headers, ORIGIN), lesson=SEE)


def expected_message(lab, i, scripts):
    """str() of the exception that sent input `i` to the DLT."""
    outcome = scripts.get(i.item.event_id, [""])[-1] if i.item.event_id else ""
    if outcome:
        return ScriptedDownstream.message(outcome, i.item.event_id)
    try:
        lab.payments.parse_event(i.item.value)
    except Exception as exc:  # the given parser's own verdict on these bytes
        return str(exc)
    return ""


def message_problem(raw, expected):
    """What is wrong with a kafka_dlt-exception-message header, or None."""
    if raw is None or raw == b"":
        return "kafka_dlt-exception-message is missing or empty"
    try:
        got = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return (f"kafka_dlt-exception-message is not valid UTF-8 ({exc.reason} at byte "
                f"{exc.start} of {len(raw)}): the message was cut in bytes, splitting a "
                "character; cut str(exception) to 1000 characters, then encode")
    kept = got[:-1] if got.endswith("…") else got[:-3] if got.endswith("...") else got
    if len(expected) <= MESSAGE_CHARS:
        if got != expected:
            at = next((n for n, (a, b) in enumerate(zip(got, expected, strict=False))
                       if a != b),
                      min(len(got), len(expected)))
            where = max(0, at - 12)
            return (f"kafka_dlt-exception-message should be str(exception), "
                    f"{_quoted(expected)}, not {_quoted(got)}"
                    + (f"; from character {at} on: {expected[where:where + 28]!r} became "
                       f"{got[where:where + 28]!r}" if at > 50 else ""))
        return None
    if len(got) > MESSAGE_CHARS or not expected.startswith(kept) or len(kept) < KEPT_CHARS:
        return (f"kafka_dlt-exception-message should be the first {MESSAGE_CHARS} characters "
                f"of str(exception) ({len(expected)} characters long), not "
                f"{len(got)} characters ({len(raw)} bytes)"
                + ("" if expected.startswith(kept) else " that are not its beginning"))
    return None


def _quoted(text):
    return repr(text if len(text) <= 70 else text[:69] + "…")


def test_dead_letter_headers_say_why_and_how_hard(lab, ledger_db, clock):
    topics, settings, pairs, (began, ended), downstream = dead_letter_some(
        lab, ledger_db, clock, transient=True)
    expect_class = {"undecodable": ("UndecodableEvent", "UnicodeDecodeError"),
                    "invalid": ("InvalidEvent", "InvalidEvent"),
                    "business-rule": ("BusinessRuleViolation", "BusinessRuleViolation"),
                    "declined": ("PaymentDeclined", "PaymentDeclined"),
                    "declined-late": ("PaymentDeclined", "PaymentDeclined"),
                    "transient-cut": ("DownstreamTimeout", "DownstreamTimeout"),
                    "transient-exhausted": ("DownstreamUnavailable", "ConnectionResetError"),
                    "transient-deep": ("DownstreamUnavailable", "ConnectionAbortedError")}
    attempts = settings.retry.max_attempts
    problems: list[tuple[Any, Any, list[str]]] = []
    for i, r in pairs:
        wrong = []
        cls, cause = expect_class[i.label]
        fq = r.text("kafka_dlt-exception-fqcn") or ""
        # the declined-late record dead-lettered with an earlier attempt's exception
        first = (i.label == "declined-late" and
                 fq.rsplit(".", 1)[-1] in ("DownstreamTimeout", "DownstreamUnavailable"))
        if "." not in fq or fq.rsplit(".", 1)[1] != cls:
            wrong.append(f"kafka_dlt-exception-fqcn should be module.{cls}" + (
                f", not {fq}: the gateway timed out, answered 503, then declined the "
                "payment; the exception that made you give up is the last one, the decline, "
                "not an earlier attempt's" if first else ""))
        cq = r.text("kafka_dlt-exception-cause-fqcn") or ""
        if ("." not in cq or cq.rsplit(".", 1)[1] != cause) and not first:
            chain = (" (DownstreamUnavailable from TimeoutError, raised while handling "
                     "ConnectionResetError: its __context__; the DownstreamUnavailable was "
                     "raised while handling a BrokenPipeError, its __context__, not its "
                     "__cause__)"
                     if i.label == "transient-exhausted" else
                     f" (a chain of {DEEP_CHAIN_LINKS} links, explicit and implicit in turn: "
                     "follow it however deep it goes)" if i.label == "transient-deep" else "")
            wrong.append(f"kafka_dlt-exception-cause-fqcn should be the root cause, "
                         f"….{cause}{chain}, not {cq or 'missing'}: follow __cause__, else "
                         "__context__, to the end of the chain")
        problem = message_problem(r.header("kafka_dlt-exception-message"),
                                  expected_message(lab, i, downstream.scripts))
        if problem:
            wrong.append(problem)
        want_attempts = str(ATTEMPTS.get(i.label, 1))
        if r.text("x-dlt-attempts") != want_attempts:
            made = len(downstream.authorizations(i.item.event_id))
            wrong.append(f"x-dlt-attempts should be {want_attempts} (decimal text), not "
                         f"{r.text('x-dlt-attempts')!r}" + (
                             f": authorize() was called {made} times; the header counts the "
                             "attempts made, not max_attempts "
                             f"({attempts}): the retries ended early, when the next wait "
                             "would not fit in half of max_poll_interval_ms"
                             if i.label == "transient-cut" and
                             r.text("x-dlt-attempts") == str(attempts) else ""))
        times = []
        for name in ("x-dlt-first-failure-at", "x-dlt-last-failure-at"):
            raw = r.text(name)
            try:
                parsed = datetime.fromisoformat(raw or "")
                if parsed.tzinfo is None:  # no offset written: read as UTC, as the README says
                    parsed = parsed.replace(tzinfo=UTC)
                moment = parsed.timestamp()
                if moment < began - 2 or moment > ended + 2:
                    local = began - 2 <= moment - HOST_OFFSET_SECONDS <= ended + 2
                    wrong.append(f"{name} should be the clock's time of that failure "
                                 "(clock.now()) in UTC" + (
                                     f", not {raw}: that is the host's local time (the check "
                                     "runs at UTC+05:30) labelled as UTC; format "
                                     "datetime.fromtimestamp(t, UTC)" if local else ""))
                times.append(moment)
            except ValueError:
                wrong.append(f"{name} should be ISO-8601 UTC, like 2025-01-16T11:33:00.752Z")
        if len(times) == 2:
            spread = times[1] - times[0]
            if i.label in ("transient-exhausted", "transient-deep") and \
                    not 1.8 <= spread <= 4.5:
                wrong.append(f"first and last failure should be ~2.8 s apart (three "
                             f"backoffs), not {spread:.2f} s")
            if i.label == "declined-late" and not 0.7 <= spread <= 2.2:
                wrong.append(f"first and last failure should be ~1.2 s apart (two "
                             f"backoffs), not {spread:.2f} s")
            if i.label not in ATTEMPTS and abs(spread) > 0.25:
                wrong.append("one attempt: first and last failure should be the same moment")
        if r.text("x-dlt-service") != SERVICE:
            wrong.append(f"x-dlt-service should be settings.service ({SERVICE!r})")
        if wrong:
            problems.append((i, r, wrong))
    if problems:
        i, r, wrong = problems[0]
        raise CheckFailure(
            "Each DLT record says why it failed and how hard the consumer tried, so someone "
            "can act on it without the logs: the exception's class (module.ClassName), its "
            "root cause's class, its message, the attempt count, first and last failure "
            "time, and the service.",
            expected="the headers of the README's table, in its encodings",
            actual=f"{len(problems)} of {len(pairs)} records wrong; first, {i.describe()}:\n"
                   + "\n".join("    - " + w for w in wrong),
            evidence=headers_table(r.headers, FAILURE), lesson=SEE)


class RefusesFirst(ProducerTap):
    """A DLT producer whose first `n` produce() calls raise BufferError (a full local queue):
    failed writes the consumer backs off from and tries again."""

    def __init__(self, producer: Any, clock: Any, n: int) -> None:
        super().__init__(producer, clock)
        self.refusals_left = n

    def produce(self, *args: Any, **kwargs: Any) -> Any:
        if self.refusals_left > 0:
            self.refusals_left -= 1
            raise BufferError("Local: Queue full")
        return super().produce(*args, **kwargs)


PING_SECONDS = 6.3  # what each ping() takes on the clock (a health check behind a slow LB)
# What a payment's later attempts take on the clock before they fail (a gateway that answers
# slowly): the last attempt fails that long after it began, not when it began.
SLOW_ATTEMPT_SECONDS = {"transient-exhausted": 2.73, "declined-slowly": 1.37}


def _iso(raw: str | None) -> float | None:
    try:
        parsed = datetime.fromisoformat(raw or "")
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="milliseconds").replace(
        "+00:00", "Z")


def test_last_failure_time_is_when_the_last_attempt_failed(lab, ledger_db, clock):
    """A payment times out on all three attempts, the second and third taking 2.73 s each
    before they fail; then ping() takes 6.3 s to answer (the gateway is up: it is this
    payment's failure), and the DLT refuses the first two writes (backoff on the clock).
    Another is declined on its second attempt, which takes 1.37 s. x-dlt-last-failure-at is
    when the last attempt failed: not when it began, not when the record was written."""
    topics = lab.topics()
    settings = lab.settings(topics, attempts=3)
    stuck = with_label(healthy("poison-t4", 3_119, partition=1), "transient-exhausted")
    slow_decline = with_label(healthy("poison-d4", 2_207, partition=2), "declined-slowly")
    inputs = lab.produce(topics.source, [stuck, healthy("acc-5", 517, partition=1),
                                         slow_decline])
    slow = {stuck.event_id: SLOW_ATTEMPT_SECONDS["transient-exhausted"],
            slow_decline.event_id: SLOW_ATTEMPT_SECONDS["declined-slowly"]}
    # event id -> (began, failed) on clock.now() of each of its authorize() calls
    attempts: dict[str | None, list[tuple[float, float]]] = {k: [] for k in slow}

    def latency_of(event_id: str | None, n: int) -> float | None:
        return slow[event_id] if event_id in slow and n >= 1 else None

    def on_call(call):
        if call.what == "authorize" and call.event_id in attempts:
            began = clock.now()
            took = latency_of(call.event_id, len(attempts[call.event_id])) or 0.0
            attempts[call.event_id].append((began, began + took))
        if call.what == "ping":
            clock.advance(PING_SECONDS)

    downstream = ScriptedDownstream(lab.payments, clock,
                                    {stuck.event_id: ["timeout"] * 9,
                                     slow_decline.event_id: ["timeout", "declined"]},
                                    on_call=on_call, latency_of=latency_of)
    producer = RefusesFirst(lab.dlt_producer(), clock, 2)
    run = lab.run(ledger_db, topics, settings, downstream, clock, producer=producer)
    require_done(run, inputs, downstream, read=SEE)
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    found = match_dlt(inputs, dlt)
    for n, item in ((0, stuck), (2, slow_decline)):
        if n not in found or not attempts[item.event_id]:
            raise CheckFailure(
                f"{inputs[n].describe()} must reach the DLT (it "
                + ("timed out on every attempt)." if n == 0 else "was declined)."),
                expected="it in the DLT", actual="it is not", lesson=SEE)
    for n, item in ((0, stuck), (2, slow_decline)):
        r = found[n][0]
        raw = r.text("x-dlt-last-failure-at")
        last = _iso(raw)
        began, failed = attempts[item.event_id][-1]
        if last is not None and failed - 0.05 <= last <= failed + 1.0:
            continue
        later = f"{last - failed:+.2f} s" if last is not None else "unreadable"
        at_start = last is not None and abs(last - began) <= 0.05
        story = (f"timed out on all {len(attempts[item.event_id])} attempts, the last one "
                 f"{slow[item.event_id]} s after it began; then ping() took {PING_SECONDS} s "
                 "(it answered: the failure is this payment's) and the DLT refused the first "
                 "two writes, with a backoff on the clock between them"
                 if n == 0 else
                 f"was declined on its second attempt, {slow[item.event_id]} s after that "
                 "attempt began")
        raise CheckFailure(
            f"{inputs[n].describe()} {story}. x-dlt-last-failure-at is when the last attempt "
            f"failed; it read {raw!r}, {later} from that moment"
            + (", which is when that attempt began. " if at_start else ". ")
            + "Stamped when an attempt begins, or when the record is written, it is off by "
            "however long the gateway took, every ping and every failed write, and whoever "
            "reads the DLT times the failure wrongly.",
            expected="the clock's time when the last authorize() failed, " + _stamp(failed)
                     + " (within a second after it)",
            actual=f"{raw!r}",
            evidence=headers_table(r.headers, ("x-dlt-first-failure-at",
                                               "x-dlt-last-failure-at", "x-dlt-attempts"))
                     + "\nthe last attempt: began " + _stamp(began) + ", failed "
                     + _stamp(failed),
            fix="take clock.now() after the attempt raised, not before it began"
                if at_start else None,
            lesson=SEE)


def test_failure_times_stay_exact_at_the_end_of_a_second(lab, ledger_db):
    """Every clock.now() of this run falls in the last half millisecond of a second."""
    clock = EndOfSecondClock()
    topics = lab.topics()
    settings = lab.settings(topics)
    items = [undecodable("poison-u7", partition=0), invalid("poison-i7", partition=1),
             business_rule("poison-b7", partition=2)]
    inputs = lab.produce(topics.source, items)
    downstream = ScriptedDownstream(lab.payments, clock)
    began = clock.now()
    run = lab.run(ledger_db, topics, settings, downstream, clock)
    ended = clock.now()
    require_done(run, inputs, downstream, read=READ["classify"])
    dlt = lab.read(topics.dead_letter, topics.partitions, fence=True)
    wrong = []
    for r in dlt:
        for name in ("x-dlt-first-failure-at", "x-dlt-last-failure-at"):
            raw = r.text(name) or ""
            try:
                parsed = datetime.fromisoformat(raw)
                moment = parsed.replace(tzinfo=parsed.tzinfo or UTC).timestamp()
            except ValueError:
                moment = None
            # truncated to the millisecond: x.999; rounded and carried: the next second's .000.
            # Every reading is at the end of a second, so a time that is neither is wrong
            # however long the run took (x.100 of a later second lies inside a long run).
            edge = moment is not None and (moment % 1 >= 0.9985 or moment % 1 <= 0.0006)
            if moment is None or not edge or not began - 0.0011 <= moment <= ended + 0.0011:
                wrong.append((r.at, name, raw, "unreadable" if moment is None else
                              f"{moment - began:+.4f} s from the run's first clock.now()"))
    if wrong:
        four = any(re.search(r"\.\d{4,}Z?$", raw) for _, _, raw, _ in wrong)
        first = wrong[0]
        raise CheckFailure(
            "The failure times must be the clock's time of the failure, to the millisecond. "
            "Here every clock.now() reads in the last half millisecond of a second "
            f"(the run began at {iso_seconds(began)}): truncated, the milliseconds read .999; "
            "rounded, 999.6 ms becomes 1000, which must carry into the seconds.",
            expected=f"times between {iso_seconds(began)} and {iso_seconds(ended)}, like "
                     "2025-01-16T11:33:00.999Z",
            actual=f"{len(wrong)} wrong; first, {first[0]} {first[1]} = {first[2]!r} "
                   f"({first[3]})",
            evidence=table(wrong, ("record", "header", "value", "")), lesson=SEE,
            fix="take the milliseconds with datetime.fromtimestamp(t, UTC).microsecond // "
                "1000: round() gives 1000 at the end of a second" if four else None)


def iso_seconds(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%H:%M:%S.%f")[:-2]


def _subsequence(wanted, found):
    """True when `wanted` appears in `found` in the same order (other items may sit between)."""
    rest = iter(found)
    return all(any(item == seen for seen in rest) for item in wanted)


def test_dead_letter_keeps_the_trace_and_business_headers(lab, ledger_db, clock):
    _, _, pairs, _, _ = dead_letter_some(lab, ledger_db, clock, transient=True)
    bad, shown = [], None
    stale = []
    for i, r in pairs:
        sent = [(k, v) for k, v in i.item.headers if not k.startswith(FAILURE_PREFIXES)]
        kept = [(k, v) for k, v in r.headers if not k.startswith(FAILURE_PREFIXES)]
        old = [(k, v) for k, v in i.item.headers if k.startswith(FAILURE_PREFIXES)]
        stale += [(i, r, k, v) for k, v in r.headers if (k, v) in old]
        if _subsequence(sent, kept):
            continue
        shown = shown or (i, r)
        for name in dict.fromkeys(k for k, _ in sent):
            was = [v for k, v in sent if k == name]
            now = [v for k, v in kept if k == name]
            if was == now:
                continue
            if name == REPLAY_COUNT and not now:
                why = ("dropped: replay reads this count to stop after max_replays; without "
                       "it the record goes round DLT → replay → DLT for ever")
            elif len(was) > 1 and now and set(now) <= set(was) and len(now) < len(was):
                why = (f"sent {len(was)} times, kept {len(now)}: headers are a list in which "
                       "a name may repeat, not a map (a dict keeps one value per name)")
            else:
                why = "missing or changed"
            bad.append((i.describe(), name, ", ".join(show_bytes(v, 24) for v in was),
                        ", ".join(show_bytes(v, 24) for v in now) or "—", why))
    if bad and shown is not None:
        i, r = shown
        raise CheckFailure(
            "The original headers travel with the record into the DLT, every one, in their "
            "order, repeated names included: traceparent links the DLT alert to every log "
            "line of the request, business headers are what a replay must keep, and "
            "x-replay-count is how replay counts a record's trips.",
            expected="every header of the original record on its DLT record, values and "
                     "repeats unchanged",
            actual=f"{len(bad)} header(s) wrong on {len({row[0] for row in bad})} record(s):\n"
                   + "\n".join(f"    - {row[0]}: {row[1]} {row[4]}" for row in bad[:4]),
            evidence=table(bad, ("input", "header", "sent", "in DLT", ""), limit=6) +
                     f"\nheaders of {r.at} in the DLT:\n" + headers_table(r.headers),
            lesson=SEE)
    if stale:
        i, r = stale[0][0], stale[0][1]
        names = list(dict.fromkeys(k for _, _, k, _ in stale))
        raise CheckFailure(
            "A replayed record came back with the failure headers of its earlier trip "
            "(kafka_dlt-*, x-dlt-*: an exception class, a stack trace, an attempt count, a "
            "service, and a header another writer added). They describe the old failure: "
            "every header with those prefixes is replaced by this trip's, including names "
            "this writer does not set itself.",
            expected="no kafka_dlt-* or x-dlt-* value of the earlier trip on the DLT record",
            actual=f"{i.describe()} still carries " + ", ".join(
                f"{k}={show_bytes(v, 40)}" for _, _, k, v in stale[:4]),
            evidence=headers_table(r.headers, tuple(names)), lesson=SEE,
            fix="drop every header whose name starts with kafka_dlt- or x-dlt- before adding "
                "the new ones" if any(k not in FAILURE + ORIGIN for k in names) else None)


def test_dead_letter_topic_is_named_and_sized_explicitly(lab):
    deadletter = lab.module("deadletter")
    source = lab.kafka.topic(5, hint="wide")
    first, second = call(deadletter.topic_names, source), call(deadletter.topic_names, source)
    if first != second:
        raise CheckFailure(
            "topic_names(source) is the naming scheme: the same answer every time, never a "
            "random or time-based name (every instance and every alert must find the same DLT).",
            expected=repr(first), actual=repr(second), lesson=READ["dlt-topic"])
    lab.kafka.created.extend([first.dead_letter, first.parking_lot])
    admin = lab.kafka.admin()
    call(deadletter.create_topics, admin, source)
    call(deadletter.create_topics, admin, source)  # a second start of the service
    lab._wait_for(admin, [first.dead_letter, first.parking_lot])
    counts = lab.partition_counts([source, first.dead_letter, first.parking_lot])
    small = {n: c for n, c in counts.items() if n != source and c < counts[source]}
    if small:
        raise CheckFailure(
            "A DLT record keeps its partition number, so the DLT (and the parking lot) need at "
            "least as many partitions as the source, or records from the high partitions have "
            "nowhere to go. Read the source's partition count; do not assume one.",
            expected=f"at least {counts[source]} partitions each (the source has {counts[source]})",
            actual=", ".join(f"{n}: {c}" for n, c in small.items()), lesson=READ["dlt-topic"])

    # The DLT of another source exists already, with one partition (an auto-created topic, or
    # an earlier deploy when the source was smaller): starting the service must not carry on
    # with it. Raising is one answer, adding partitions (create_partitions) the other. Then the
    # same for a parking lot that exists with one partition next to a DLT of the right size
    # (replay parks a record in its own partition number too).
    for small_one in ("the DLT", "the parking lot"):
        _existing_topic_too_small(lab, deadletter, admin, small_one)


def _existing_topic_too_small(lab, deadletter, admin, small_one: str) -> None:
    grown = lab.kafka.topic(3, hint="grown")
    names = call(deadletter.topic_names, grown)
    if small_one == "the DLT":
        lab.kafka.topic(1, name=names.dead_letter)
        lab.kafka.created.append(names.parking_lot)
        present: tuple[str, ...] = (grown, names.dead_letter)
    else:
        lab.kafka.topic(3, name=names.dead_letter)
        lab.kafka.topic(1, name=names.parking_lot)
        present = (grown, names.dead_letter, names.parking_lot)
    # the precondition, settled: the topics visible in the broker's metadata before the
    # learner's create_topics reads it (on Apache Kafka a just-created topic can be missing
    # from a metadata answer for a moment, and then "exists already" looks like "absent")
    settle_until = time.monotonic() + 10
    while time.monotonic() < settle_until:
        meta = admin.list_topics(timeout=5).topics
        if all(n in meta and meta[n].error is None and meta[n].partitions for n in present):
            break
        time.sleep(0.05)
    refusal = raised(deadletter.create_topics, admin, grown)
    if refusal is None:
        lab._wait_for(admin, [names.dead_letter, names.parking_lot])
        counts = lab.partition_counts([grown, names.dead_letter, names.parking_lot])
        small = {n: c for n, c in counts.items() if n != grown and c < counts[grown]}
        if small:
            raise CheckFailure(
                f"{small_one[0].upper()}{small_one[1:]} existed already with 1 partition and "
                "the source has 3, and create_topics() returned as if all were well. The "
                "first record of partition 2 to go there "
                + ("(its poison) " if small_one == "the DLT" else "(a record replay parks) ")
                + "then has no partition to go to: its write fails for ever"
                + (" and partition 2 stops" if small_one == "the DLT" else "")
                + ". An existing DLT or parking lot with fewer partitions than the source is "
                "an error: raise, or add the partitions it lacks (create_partitions).",
                expected="create_topics raises, or afterwards both have at least 3 partitions",
                actual="it returned; " + ", ".join(
                    f"{'the DLT' if n == names.dead_letter else 'the parking lot'} has {c} "
                    "partition(s)" for n, c in small.items()),
                lesson=READ["dlt-topic"])
