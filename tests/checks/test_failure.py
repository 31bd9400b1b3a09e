"""CheckFailure: the typed failure checks raise, as text and as data."""

from __future__ import annotations

import pickle

from dojo.checks import CheckFailure


def _failure() -> CheckFailure:
    return CheckFailure("Two relays claimed the same row.", expected="one claim per row",
                        actual="row 7 claimed twice", evidence="id  relay\n7   0\n7   1",
                        lesson="transactional-outbox#claiming")


def test_a_check_failure_is_an_assertion_error_so_pytest_counts_it_as_a_fail() -> None:
    assert isinstance(_failure(), AssertionError)


def test_its_text_shows_expected_actual_evidence_and_the_lesson() -> None:
    assert str(_failure()) == (
        "Two relays claimed the same row.\n"
        "  expected: one claim per row\n"
        "  actual:   row 7 claimed twice\n"
        "  evidence:\n"
        "    id  relay\n"
        "    7   0\n"
        "    7   1\n"
        "  read: lesson transactional-outbox#claiming")


def test_the_text_can_leave_the_lesson_to_a_ui_that_shows_the_link_itself() -> None:
    assert "read: lesson" not in _failure().render(lessons=False)


def test_several_lessons_and_a_fix_are_kept_in_order() -> None:
    failure = CheckFailure("w", "e", "a", lesson="a#x b#y", fix="use FOR UPDATE")
    assert failure.lessons == ("a#x", "b#y")
    assert failure.lesson == "a#x"
    assert str(failure).endswith("  fix: use FOR UPDATE\n  read: lesson a#x\n  read: lesson b#y")


def test_its_fields_survive_json_data_and_pickling() -> None:
    failure = _failure()
    data = failure.to_dict()
    assert data["lessons"] == ["transactional-outbox#claiming"]
    copy = pickle.loads(pickle.dumps(failure))
    assert isinstance(copy, CheckFailure)
    assert copy.to_dict() == data
