"""Evidence formatting: values as a learner reads them, small tables, one-line exceptions."""

from __future__ import annotations

from decimal import Decimal

from dojo.checks.report import first_line, fmt, indent, short, table


def test_money_shows_whole_cents_and_keeps_finer_digits() -> None:
    assert fmt(Decimal("90.0000")) == "90.00"
    assert fmt(Decimal("-0.5")) == "-0.50"
    assert fmt(Decimal("29.998765")) == "29.998765"
    assert fmt(0.1) == "0.1"
    assert fmt(None) == "None"


def test_short_cuts_long_values_and_shows_dicts_as_json() -> None:
    assert short("x" * 50, width=10) == "x" * 9 + "…"
    assert short({"a": 1}) == '{"a": 1}'
    assert short([Decimal("1.00")]) == '["1.00"]'


def test_indent_pads_every_line_and_drops_trailing_blank_lines() -> None:
    assert indent("a\nb\n\n", 2) == "  a\n  b"


def test_a_table_of_dicts_has_a_header_aligned_columns_and_a_count_past_the_limit() -> None:
    rows = [{"id": i, "state": "idle in transaction" if i == 1 else "active"} for i in range(4)]
    assert table(rows, ("id", "state"), limit=2) == (
        "id  state\n"
        "0   active\n"
        "1   idle in transaction\n"
        "… and 2 more rows")


def test_a_table_takes_sequences_too_and_shows_a_missing_key_as_none() -> None:
    assert table([("p0@3", 2)], ("record", "n")) == "record  n\np0@3    2"
    assert table([{"a": 1}], ("a", "b")) == "a  b\n1  None"


def test_an_empty_table_says_so() -> None:
    assert table([], ("a",)) == "(no rows)"
    assert table([], ("a",), empty="(none)") == "(none)"


def test_first_line_names_the_exception_and_the_database_text() -> None:
    class Wrapped(Exception):
        orig = ValueError("duplicate key value\nDETAIL: Key (id)=(1) already exists.")

    assert first_line(Wrapped("ignored")) == "Wrapped: duplicate key value"
    assert first_line(None) == "nothing (it returned)"
    assert len(first_line(RuntimeError("x" * 500), width=40)) == 40
