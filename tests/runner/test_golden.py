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


def test_counts_in_the_headline_and_actual_line_are_observations() -> None:
    run_a = ("12 transfers deadlocked (round 1 of 2).\n  expected: no deadlock among 12\n"
             "  actual:   13 records dead-lettered\n  fix: lock ids in order, 2 at a time\n")
    run_b = run_a.replace("round 1", "round 2").replace("13 records", "9 records")
    assert normalise(run_a) == normalise(run_b) == (
        "<n> transfers deadlocked (round <n> of <n>).\n  expected: no deadlock among 12\n"
        "  actual:   <n> records dead-lettered\n  fix: lock ids in order, 2 at a time\n")


def test_numbers_inside_words_and_names_are_kept() -> None:
    assert normalise("  actual:   committed {p0: 3, p1: 1} in v2 of acc-42, sum -300.00") == (
        "  actual:   committed {p0: <n>, p1: <n>} in v2 of acc-42, sum <n>\n")


def test_a_golden_recorded_before_a_rule_still_matches() -> None:
    old = "Outage.\n  expected: nothing\n  actual:   13 records dead-lettered\n"
    assert matches(old, normalise(old.replace("13", "9")))
    assert not matches(old, normalise(old.replace("dead-lettered", "retried")))


def test_normalising_twice_changes_nothing() -> None:
    # a time with an offset: after the first pass '+03' follows '<n>', not a digit
    message = "find_trace put 17:03+03:00 before 14:04Z\n  actual: 3 lines, -2 at 0.5s\n"
    once = normalise(message)
    assert normalise(once) == once


def test_a_short_id_of_digits_only_still_matches_its_golden() -> None:
    # the id's eight hex characters are digits only in about one run in forty: "<n>", not "<hex>"
    golden = normalise("actual:   row 3fa9c1e2: 0.21 s before statement 2 ran")
    assert matches(golden, normalise("actual:   row 40312877: 0.23 s before statement 2 ran"))
    assert matches(golden, normalise("actual:   row 9e01ab77: 0.23 s before statement 2 ran"))
    assert not matches(golden, normalise("actual:   row 9e01ab77: 0.23 s after statement 2 ran"))
