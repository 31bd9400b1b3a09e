"""Stage find-the-trace: `find_trace(logs_dir, trace_id)` returns exactly the lines of every
service that carry the trace id, in true time order; `span_tree` and `slowest_span` show where
the request's time went (self time, not duration)."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from _support import (
    READ,
    Logs,
    Spans,
    lines_table,
    order_body,
    span_id_hex,
    trace_id_hex,
    traceparent,
)
from opentelemetry import trace as otel_trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags

from dojo.checks import CheckFailure, call, short, table

pytestmark = pytest.mark.stage("find-the-trace")
SEE = READ["find-the-trace"]
START = datetime(2025, 3, 14, 14, 3, 7, 412_000, tzinfo=UTC)
ZONES = {"orders-api": UTC, "shipping": timezone(timedelta(hours=3)),
         "inventory": timezone(timedelta(hours=-5))}


def stamp(service: str, ms: int) -> str:
    return (START + timedelta(milliseconds=ms)).astimezone(ZONES[service]).isoformat(
        timespec="milliseconds")


def line(service: str, ms: int, trace: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"timestamp": stamp(service, ms), "level": "INFO", "service": service,
            "trace_id": trace, "span_id": span_id_hex() if trace else "", "message": message,
            **extra}


def write_logs(folder: Path, trace: str) -> list[dict[str, Any]]:
    """Three services' logs around one request; returns its lines in true time order."""
    other = trace_id_hex()
    ours = [
        line("orders-api", 0, trace, "order received"),
        line("inventory", 31, trace, "stock reserved"),
        line("orders-api", 58, trace, "order placed", order_id="ord-4711"),
        line("orders-api", 58, trace, "confirmation sent", order_id="ord-4711"),
        line("shipping", 905, trace, "attempt 1 of 3 failed"),
        line("shipping", 2417, trace, "dead-lettering the record after 3 attempts"),
        line("inventory", 2988, trace, "reservation released"),
    ]
    noise = [
        line("orders-api", 12, other, f"retrying: the earlier request {trace} failed"),
        line("orders-api", 40, "", "pool resized"),
        line("shipping", 300, other, "order shipped", caused_by=trace),
        line("inventory", 1500, other, "stock reserved"),
    ]
    files: dict[str, list[str]] = {s: [] for s in ZONES}
    for item in sorted(ours + noise, key=lambda x: datetime.fromisoformat(x["timestamp"])):
        files[item["service"]].append(json.dumps(item))
    files["shipping"].insert(1, "Traceback (most recent call last):")
    # JSON, but not a line of the request: an object with no trace_id, and values that are
    # not objects at all (one of them holds the id as text).
    files["inventory"].insert(0, json.dumps({"timestamp": stamp("inventory", -3600_000),
                                             "level": "INFO", "message": "listening on :8081"}))
    files["inventory"].insert(2, json.dumps(f"{trace} reserve timed out"))
    files["shipping"].insert(3, "[1713, 42]")
    files["orders-api"].append('{"timestamp": "2025-03-14T14:03:09.1Z", "trace_id": "' + trace)
    for service, rows in files.items():
        (folder / f"{service}.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (folder / "README.txt").write_text(json.dumps(line("orders-api", 1, trace, "not a log")))
    return ours


def describe(lines: Any) -> list[dict[str, Any]]:
    if not isinstance(lines, list):
        return [{"service": "?", "message": f"not a list: {lines!r}"[:80]}]
    return [{"timestamp": ln.get("timestamp"), "service": ln.get("service"),
             "trace_id": ln.get("trace_id"), "message": ln.get("message")}
            if isinstance(ln, dict) else {"message": repr(ln)[:80]} for ln in lines]


def test_find_trace_returns_exactly_the_requests_lines_in_time_order(learner, logs_dir):
    find = learner.module("find")
    trace = trace_id_hex()
    wanted = write_logs(logs_dir, trace)
    got = call(find.find_trace, logs_dir, trace)
    if got != wanted:
        got_rows = describe(got)
        extra = [g for g in got_rows if g.get("trace_id") != trace]
        in_text = sorted(got_rows, key=lambda g: str(g.get("timestamp"))) == got_rows
        note = []
        if extra:
            note.append(f"{len(extra)} line(s) of other requests (the id only appears in "
                        "their text: match the trace_id field)")
        if isinstance(got, list) and len(got) == len(wanted) and not extra and in_text:
            note.append("ordered by the timestamp text, not by the instant (different UTC "
                        "offsets do not sort as text)")
        raise CheckFailure(
            "find_trace must return every line whose trace_id is the one asked for, from "
            "every service's *.jsonl file, in the order things happened (timestamps in "
            "different UTC offsets compared as instants), and skip lines that are not JSON.",
            expected=f"the request's {len(wanted)} lines, in time order",
            actual=f"{len(got) if isinstance(got, list) else 'no list of'} lines"
                   + (": " + "; ".join(note) if note else ", not those or not in that order"),
            evidence="expected:\n" + table(describe(wanted), ("timestamp", "service",
                                                              "message"), width=50)
            + "\n\nreturned:\n" + table(got_rows, ("timestamp", "service", "trace_id",
                                                    "message"), width=50),
            lesson=SEE)


# File names in the order find_trace must follow, and the order the check creates them in:
# neither sorted nor reversed, so no directory listing order (creation order, its reverse on
# tmpfs, hash order) passes for name order except by a 1-in-5040 accident of hashing.
TIE_FILES = ["billing", "inventory", "notifier", "orders-api", "payments", "search",
             "shipping"]
TIE_CREATION = [3, 0, 6, 2, 5, 1, 4]
# the `service` field of each file's lines: names in another order than the files' (a log
# shipper's file name need not be the service's), so that a tie broken by it shows
TIE_SERVICES = ["shop-z", "shop-c", "shop-x", "shop-a", "shop-m", "shop-b", "shop-k"]


def test_lines_at_the_same_instant_keep_file_name_then_line_order(learner, logs_dir):
    find = learner.module("find")
    trace = trace_id_hex()
    zones = [timedelta(hours=h) for h in (0, 3, -5, 5, -3, 9, 1)]
    wanted: list[dict[str, Any]] = []
    content: dict[str, list[dict[str, Any]]] = {}
    for n, name in enumerate(TIE_FILES):
        zone = timezone(zones[n])

        def at(ms: int, message: str, service: str = TIE_SERVICES[n], zone: timezone = zone
               ) -> dict[str, Any]:
            when = (START + timedelta(milliseconds=ms)).astimezone(zone)
            return {"timestamp": when.isoformat(timespec="milliseconds"), "level": "INFO",
                    "service": service, "trace_id": trace, "span_id": span_id_hex(),
                    "message": message}

        # every file: a line 7 ms in, two lines at the same instant 58 ms in (the same
        # instant written in its own offset), and a later one
        content[name] = [at(7 + n, f"{name} starts"), at(58, f"{name} tie 1"),
                         at(58, f"{name} tie 2"), at(900 - n, f"{name} ends")]
    for n in range(len(TIE_FILES)):
        wanted.append(content[TIE_FILES[n]][0])
    for name in TIE_FILES:
        wanted.extend(content[name][1:3])
    wanted.extend(content[name][3] for name in reversed(TIE_FILES))
    for index in TIE_CREATION:
        name = TIE_FILES[index]
        (logs_dir / f"{name}.jsonl").write_text(
            "".join(json.dumps(row) + "\n" for row in content[name]), encoding="utf-8")
    got = call(find.find_trace, logs_dir, trace)
    if got != wanted:
        raise CheckFailure(
            "Lines at the same instant keep the order of their file names, then of their "
            "position in the file: sort by (instant, file name, line number), whatever order "
            "the directory lists its files in.",
            expected=f"{len(wanted)} lines; the 14 at the same instant by file name, then line",
            actual=f"{len(got) if isinstance(got, list) else 'no list of'} lines, not in "
                   "that order",
            evidence="files created in the order "
            + ", ".join(f"{TIE_FILES[i]}.jsonl" for i in TIE_CREATION)
            + "\n\nexpected:\n" + table(describe(wanted), ("timestamp", "service",
                                                             "message"), width=50, limit=30)
            + "\n\nreturned:\n" + table(describe(got), ("timestamp", "service", "message"),
                                          width=50, limit=30),
            lesson=SEE)


def test_find_trace_reads_only_the_files_directly_in_logs_dir(learner, logs_dir):
    find = learner.module("find")
    trace = trace_id_hex()
    wanted = write_logs(logs_dir, trace)
    # Below logs_dir, not in it: a rotated copy of a service's log (the same lines again, and
    # an older one of the trace) and another environment's log, one level further down.
    archive = logs_dir / "archive"
    archive.mkdir()
    rotated = (logs_dir / "orders-api.jsonl").read_text(encoding="utf-8")
    older = json.dumps(line("orders-api", -2750, trace, "order received (first try)"))
    (archive / "orders-api.jsonl").write_text(older + "\n" + rotated, encoding="utf-8")
    elsewhere = logs_dir / "staging" / "eu-2"
    elsewhere.mkdir(parents=True)
    (elsewhere / "shipping.jsonl").write_text(
        json.dumps(line("shipping", 1337, trace, "order shipped")) + "\n", encoding="utf-8")
    below_lines = [json.loads(raw) for path in (archive / "orders-api.jsonl",
                                                elsewhere / "shipping.jsonl")
                   for raw in path.read_text(encoding="utf-8").splitlines()
                   if raw.startswith("{") and raw.endswith("}") and trace in raw]
    got = call(find.find_trace, logs_dir, trace)
    if got != wanted:
        extra = list(got) if isinstance(got, list) else []
        for item in wanted:
            if item in extra:
                extra.remove(item)
        from_below = bool(extra) and all(item in below_lines for item in extra)
        below = len(extra) if from_below else 0
        raise CheckFailure(
            "find_trace reads the *.jsonl files directly in logs_dir, one per service: a "
            "folder below it holds rotated copies or another environment's logs, whose "
            "lines would come twice or from the wrong place. List the folder itself "
            "(glob, iterdir), not the tree under it (rglob, os.walk).",
            expected=f"the request's {len(wanted)} lines from the files directly in logs_dir",
            actual=f"{len(got) if isinstance(got, list) else 'no list of'} lines"
                   + (f": {below} more, from archive/ and staging/eu-2/" if below > 0
                      else ", not those or not in that order"),
            evidence="logs_dir: orders-api.jsonl, shipping.jsonl, inventory.jsonl, README.txt; "
            "below it: archive/orders-api.jsonl, staging/eu-2/shipping.jsonl\n\nexpected:\n"
            + table(describe(wanted), ("timestamp", "service", "message"), width=50)
            + "\n\nreturned:\n" + table(describe(got), ("timestamp", "service", "trace_id",
                                                        "message"), width=50),
            lesson=SEE)


def test_find_trace_on_the_logs_of_a_real_request(shop, learner, logs_dir):
    files = Logs(learner, logs_dir).install()
    try:
        trace = trace_id_hex()
        shop.server.post(order_body(), {"traceparent": traceparent(trace)})
        shop.consume(1)
        shop.drain_executor()
    finally:
        files.uninstall()
    written = []
    for n, path in enumerate(sorted(logs_dir.glob("*.jsonl"))):
        for i, raw in enumerate(path.read_text(encoding="utf-8").splitlines()):
            parsed = json.loads(raw)
            if parsed.get("trace_id") == trace:
                written.append((datetime.fromisoformat(parsed["timestamp"]), n, i, parsed))
    wanted = [item[-1] for item in sorted(written, key=lambda x: x[:3])]
    got = call(learner.module("find").find_trace, logs_dir, trace)
    services = {ln.get("service") for ln in wanted}
    if got != wanted or len(services) < 2:
        raise CheckFailure(
            "Given the trace id of one real request, find_trace must return every line your "
            "services wrote for it, API and consumer, in time order.",
            expected=f"{len(wanted)} lines from {sorted(services)}",
            actual=f"{len(got) if isinstance(got, list) else 'no list of'} lines",
            evidence="written:\n" + lines_table(wanted) + "\n\nreturned:\n"
            + (lines_table(got) if isinstance(got, list) else repr(got)[:200]),
            lesson=SEE)


# -- where the time went --------------------------------------------------------------------

T0 = 1_741_960_987_123_456_789  # ns; no round numbers
MS = 1_000_000


def build_trace(spans: Spans) -> tuple[str, list[Any]]:
    """A request's spans with known times (see the table in the failure), plus a slower span
    of another trace; returns (trace id, the finished spans, shuffled)."""
    tracer = spans.tracer
    trace, caller = trace_id_hex(), span_id_hex()
    remote = otel_trace.set_span_in_context(NonRecordingSpan(SpanContext(
        int(trace, 16), int(caller, 16), is_remote=True, trace_flags=TraceFlags(1))))

    def span(name: str, start: int, end: int, parent: Any, kind: SpanKind = SpanKind.INTERNAL
             ) -> Any:
        made = tracer.start_span(name, context=parent, kind=kind, start_time=T0 + start * MS)
        made.end(end_time=T0 + end * MS)
        return otel_trace.set_span_in_context(made)

    root = span("POST /orders", 0, 900, remote, SpanKind.SERVER)
    span("INSERT orders", 20, 60, root)
    reserve = span("reserve stock", 70, 720, root, SpanKind.CLIENT)
    # the inventory's clock runs 16 ms behind: its span starts 6 ms before its parent's,
    # time that is not "reserve stock"'s (a clip at the parent's end alone counts it)
    span("inventory: POST /reservations", 64, 200, reserve, SpanKind.SERVER)
    span("inventory: read stock", 90, 210, reserve)
    publish = span("publish order", 730, 760, root, SpanKind.PRODUCER)
    process = span("process order", 950, 1400, publish, SpanKind.CONSUMER)
    span("INSERT shipments", 960, 980, process)
    span("read shipping rate", 963, 977, process)  # inside its sibling: covered already
    # begins inside the first sibling after the one nested in it has ended, and outlasts it:
    # covered time is 960-982, 22 ms (a union that forgets the first sibling's reach counts
    # 25); short, so that subtracting the children's summed durations still makes "process
    # order" the slowest span (412 ms against "reserve stock"'s 410)
    span("write label", 978, 982, process)
    span("send confirmation", 880, 1000, root)
    other = span("POST /orders", 0, 2100, None, SpanKind.SERVER)
    span("slow report query", 10, 2050, other)
    finished = spans.finished()
    random.shuffle(finished)
    return trace, finished


TREE = [(0, "POST /orders", 900, 160), (1, "INSERT orders", 40, 40),
        (1, "reserve stock", 650, 510), (2, "inventory: POST /reservations", 136, 136),
        (2, "inventory: read stock", 120, 120), (1, "publish order", 30, 30),
        (2, "process order", 450, 428), (3, "INSERT shipments", 20, 20),
        (3, "read shipping rate", 14, 14), (3, "write label", 4, 4),
        (1, "send confirmation", 120, 120)]
TREE_COLUMNS = ("depth", "name", "duration ms", "self ms")


def test_the_slowest_span_is_the_one_with_the_most_self_time(learner):
    spans = Spans()
    trace, finished = build_trace(spans)
    got = call(learner.module("find").slowest_span, finished, trace)
    if got != "reserve stock":
        why = {"POST /orders": "the longest span: its duration is mostly its children's",
               "process order": "its children's time was counted twice where two children "
                                "overlap (count covered time once)",
               "slow report query": "a span of another trace"}.get(str(got), "")
        raise CheckFailure(
            "slowest_span names the span where the time went: the one with the most self "
            "time (its duration minus the time its children cover), in the trace asked for.",
            expected="'reserve stock' (self time 510 ms)",
            actual=repr(got) + (f": {why}" if why else ""),
            evidence=table(TREE, TREE_COLUMNS, width=34), lesson=SEE)
    nobody = trace_id_hex()
    try:
        none = call(learner.module("find").slowest_span, finished, nobody)
    except CheckFailure:
        raise
    except Exception as exc:  # noqa: BLE001 (the learner's: reported, with its line)
        raise CheckFailure(
            "slowest_span of a trace with none of the spans given returns None (README); "
            "it raised instead.", expected="None",
            actual=f"{type(exc).__name__}: {short(str(exc), 120)}",
            fix="return None when no span of the trace is among those given", lesson=SEE
        ) from exc
    if none is not None:
        raise CheckFailure(
            "slowest_span of a trace with none of the spans given returns None (README): "
            "there is no span to name.", expected="None", actual=repr(none), lesson=SEE)


def test_span_tree_lists_the_spans_depth_first_with_their_self_time(learner):
    spans = Spans()
    trace, finished = build_trace(spans)
    got = call(learner.module("find").span_tree, finished, trace)
    rows = [tuple(row) for row in got] if isinstance(got, list) else []

    def same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
        try:
            return (len(a) == 4 and a[0] == b[0] and a[1] == b[1]
                    and abs(float(a[2]) - b[2]) < 0.01 and abs(float(a[3]) - b[3]) < 0.01)
        except (TypeError, ValueError):
            return False

    differs = next((n for n, (r, w) in enumerate(zip(rows, TREE, strict=False))
                    if not same(r, w)), None)
    if len(rows) != len(TREE) or differs is not None:
        if differs is None:
            what = f"{len(rows)} rows"
        else:
            got_row, want = rows[differs], TREE[differs]
            what = (f"row {differs + 1} is {tuple(got_row)!r}, expected "
                    f"(depth {want[0]}, {want[1]!r}, {want[2]} ms, self {want[3]} ms)")
        raise CheckFailure(
            "span_tree lists the trace's spans depth first (children under their parent, "
            "siblings by start time) as (depth, name, duration ms, self ms). Self time counts "
            "time covered by overlapping children once, and a child's time outside its "
            "parent (work that outlived the response, or a remote child whose clock starts "
            "it before its parent) is not the parent's.",
            expected=f"{len(TREE)} rows as in the evidence's first table",
            actual=what,
            evidence="expected:\n" + table(TREE, TREE_COLUMNS, width=34) + "\n\nreturned:\n"
            + table([tuple(r) + ("",) * (4 - len(r)) for r in rows], TREE_COLUMNS, width=34,
                    limit=15),
            lesson=SEE)
