"""Golden messages: normalised so run-to-run noise is not a difference, merged across runs
with <…> where they differ, and matched line by line."""

from __future__ import annotations

from dojo.runner.golden import EVIDENCE_ELIDED, matches, merge, normalise


def test_ids_times_durations_pids_and_ports_are_normalised() -> None:
    message = ("claim waited 1.52 s behind pid 14761 on 127.0.0.1:51949 for row "
               "52c4f1eb-c788-4c8e-9f62-fadf20a11887 at 2026-12-02 18:55:33.137615+00 in "
               "topic dojo.outbox.3fa9c1e2 (transaction 802)")
    assert normalise(message) == (
        "claim waited <duration> behind pid <pid> on 127.0.0.1:<port> for row <uuid> at "
        "<time> in topic dojo.outbox.<hex> (transaction <n>)\n")


def test_the_evidence_block_is_not_compared_but_later_lines_are() -> None:
    message = ("Two relays claimed one row.\n  expected: one\n  actual:   two\n  evidence:\n"
               "    id  relay\n    7   0\n    7   1\n  read: lesson outbox#claim")
    assert normalise(message) == ("Two relays claimed one row.\n  expected: one\n"
                                  f"  actual:   two\n  {EVIDENCE_ELIDED}\n"
                                  "  read: lesson outbox#claim\n")
    flush_left = message.replace("\n  ", "\n")  # the same failure with its indent stripped
    assert normalise(flush_left) == ("Two relays claimed one row.\nexpected: one\n"
                                     f"actual:   two\n{EVIDENCE_ELIDED}\n"
                                     "read: lesson outbox#claim\n")


def test_merging_two_runs_wildcards_only_the_line_that_differs() -> None:
    a = "Deadlock.\n  actual:   8 deadlock(s), in worker 1, worker 11\n  read: lesson l#s\n"
    b = "Deadlock.\n  actual:   6 deadlock(s), in worker 2, worker 11\n  read: lesson l#s\n"
    merged = merge(a, b)
    assert merged == "Deadlock.\n  actual:   <…>\n  read: lesson l#s\n"
    assert matches(merged, a) and matches(merged, b)
    assert not matches(merged, a.replace("l#s", "other#section"))


def test_a_wildcard_line_spans_any_number_of_lines() -> None:
    golden = "head\n<…>\ntail\n"
    assert matches(golden, "head\ntail\n")
    assert matches(golden, "head\none\ntwo\ntail\n")
    assert not matches(golden, "head\none\n")


def test_a_message_for_another_mistake_does_not_match() -> None:
    golden = "deposit(0.10) returned the wrong balance.\n  fix: never call float()\n"
    assert not matches(golden, "deposit(0.10) returned the wrong balance.\n"
                               "  fix: lock the row first\n")


def test_a_number_both_runs_began_alike_is_not_kept_half() -> None:
    assert merge("  actual:   p50 110.4 ms-ish\n", "  actual:   p50 110.9 ms-ish\n") == (
        "  actual:   p50 <…> ms-ish\n")
