"""Calling learner code: a stub becomes a typed "not written yet" failure naming the function
and its to-do, wherever it ran (the check's thread, a background thread, a race, a child
process), and the runner reports it with its fields."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from dojo.checks import CheckFailure, NotWritten, call, in_thread, raised
from dojo.checks.faults import run_concurrently, run_in_subprocess
from dojo.runner.failure_message import describe

STUB = '''
def claim_batch(engine, batch_size):
    raise NotImplementedError("Claim up to batch_size rows (README, stage 3)")


def refuse(amount):
    raise ValueError(f"{amount} is negative")


def double(n):
    return 2 * n
'''


@pytest.fixture
def relay(tmp_path: Path, learner_dir: Path):
    import importlib
    import sys

    sys.path.insert(0, str(learner_dir))
    try:
        sys.modules.pop("relay", None)
        yield importlib.import_module("relay")
    finally:
        sys.path.remove(str(learner_dir))
        sys.modules.pop("relay", None)


@pytest.fixture
def learner_dir(tmp_path: Path) -> Path:
    (tmp_path / "relay.py").write_text(STUB, encoding="utf-8")
    return tmp_path


def test_a_stub_called_through_call_is_not_written_with_its_function_and_todo(relay) -> None:
    with pytest.raises(NotWritten) as caught:
        call(relay.claim_batch, None, batch_size=4)
    failure = caught.value
    assert isinstance(failure, CheckFailure)
    assert failure.what == "relay.claim_batch() is not written yet."
    assert failure.actual == ("it raises NotImplementedError at relay.py line 3: Claim up to "
                              "batch_size rows (README, stage 3)")
    assert pickle.loads(pickle.dumps(failure)).to_dict() == failure.to_dict()


def test_call_returns_values_and_lets_other_errors_through(relay) -> None:
    assert call(relay.double, 21) == 42
    with pytest.raises(ValueError):
        call(relay.refuse, -1)


def test_raised_returns_the_refusal_but_never_hides_a_stub(relay) -> None:
    assert isinstance(raised(relay.refuse, -1), ValueError)
    assert raised(relay.double, 1) is None
    with pytest.raises(NotWritten):
        raised(relay.claim_batch, None, 1)


def test_raised_lets_a_checks_own_verdict_from_a_callback_through() -> None:
    def learner_code(callback):
        callback()

    def callback():
        raise CheckFailure("the audit failed", expected="x", actual="y")

    with pytest.raises(CheckFailure, match="the audit failed"):
        raised(learner_code, callback)


def test_in_thread_hands_back_the_value_or_the_error(relay) -> None:
    job = in_thread(relay.double, 4)
    assert job.result(5) == 8 and not job.alive
    stub = in_thread(relay.claim_batch, None, 1)
    assert stub.join(5)
    assert isinstance(stub.error, NotWritten)
    with pytest.raises(NotWritten):
        stub.result(0)


def test_in_thread_says_when_the_code_is_still_running() -> None:
    import threading

    release = threading.Event()
    job = in_thread(release.wait, 10)
    assert not job.join(0.05) and job.alive
    with pytest.raises(TimeoutError):
        job.result(0)
    release.set()
    assert job.result(5) is True


def test_a_race_whose_workers_reach_a_stub_fails_as_not_written(relay) -> None:
    with pytest.raises(NotWritten, match="claim_batch"):
        run_concurrently(lambda i: relay.claim_batch(None, i), 3, timeout=5)


def test_a_child_process_that_reaches_a_stub_fails_as_not_written(learner_dir: Path) -> None:
    with pytest.raises(NotWritten) as caught:
        run_in_subprocess("relay:claim_batch", None, 2, path=[learner_dir], timeout=30)
    assert caught.value.function == "relay.claim_batch()"
    assert "README, stage 3" in caught.value.todo


def test_the_runner_turns_a_stub_that_escaped_the_check_into_not_written(relay,
                                                                          learner_dir: Path
                                                                          ) -> None:
    try:
        relay.claim_batch(None, 1)
    except NotImplementedError as exc:
        diagnosis = describe(exc, learner_dir, None)
    assert diagnosis.kind == "fail"
    assert diagnosis.failure is not None
    assert diagnosis.failure.what == "relay.claim_batch() is not written yet."
    assert diagnosis.message.startswith("relay.claim_batch() is not written yet.\n")


def test_the_runner_carries_a_check_failure_as_text_and_fields() -> None:
    failure = CheckFailure("w", expected="e", actual="a", evidence="x  y\n1  2",
                           lesson="lesson#part")
    diagnosis = describe(failure, None, None)
    assert (diagnosis.kind, diagnosis.message) == ("fail", str(failure))
    assert diagnosis.failure == failure.report


def test_purge_forgets_the_directorys_modules_so_an_edit_is_read_again(tmp_path: Path) -> None:
    import sys

    from dojo.checks.learner import Learner

    (tmp_path / "edited.py").write_text("VALUE = 1\n")
    learner = Learner(tmp_path)
    assert learner.module("edited").VALUE == 1
    learner.purge()
    assert "edited" not in sys.modules and "pytest" in sys.modules
    (tmp_path / "edited.py").write_text("VALUE = 2  # a longer file: a new size\n")
    assert learner.module("edited").VALUE == 2
    learner.purge()
