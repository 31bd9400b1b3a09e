"""Turn an exception from a check into a short message that teaches, without pytest's noise.

A `CheckFailure` gives the check's own verdict, as text and as typed fields (what was
expected, what happened, the state); a plain failed assertion its message. A
NotImplementedError from the learner's code is a stub: `NotWritten`, naming the function.
Anything else names the exception and the line of the learner's code that raised it, because
that line is where the learner has to look; pytest internals are never shown.
"""

from __future__ import annotations

import errno
import os
import traceback
from dataclasses import dataclass
from pathlib import Path

from dojo.checks.failure import CheckFailure, FailureReport
from dojo.checks.learner import NotWritten
from dojo.runner.blame import infra_failure
from dojo.runner.limits import FILE_LIMIT_ENV, MEMORY_LIMIT_ENV

MAX_MESSAGE_CHARS = 4000
MAX_EXCEPTION_LINES = 12
# Lines libraries append that send the learner away from their own code.
_NOISE_PREFIXES = ("(Background on this error at:",)


@dataclass(frozen=True)
class Diagnosis:
    """How a check ended: `kind` is fail (wrong behaviour), error (the code crashed) or
    infra (a service broke under the check)."""

    kind: str
    message: str
    failure: FailureReport | None = None


def clip(text: str, limit: int = MAX_MESSAGE_CHARS) -> str:
    """At most `limit` characters, saying how much was cut."""
    text = text.rstrip()
    if len(text) <= limit:
        return text
    return text[:limit].rstrip() + f"\n… ({len(text) - limit} more characters cut)"


def assertion_text(exc: BaseException) -> str:
    """The check's message, without pytest's `assert …` introspection (kept when it is all
    there is: a bare assert still says what it compared)."""
    text = str(exc)
    head, sep, explanation = text.partition("\nassert ")
    if text.startswith("assert "):
        head, explanation, sep = "", text[len("assert "):], "x"
    # pytest indents every line of the message after the first by two spaces
    lines = head.split("\n")
    lines[1:] = [line[2:] if line.startswith("  ") else line for line in lines[1:]]
    message = "\n".join(lines).strip()
    if message:
        return message
    return f"assert {explanation.strip()}" if sep else "the check's assertion failed"


def _exception_text(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines()
             if not line.strip().startswith(_NOISE_PREFIXES)]
    if len(lines) > MAX_EXCEPTION_LINES:
        lines = lines[:MAX_EXCEPTION_LINES] + ["…"]
    text = "\n".join(lines).strip()
    name = type(exc).__name__
    return f"{name}: {text}" if text else name


def _relative(path: str, base: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(base))
    except ValueError:
        return Path(path).name


def _inside(path: str, base: Path | None) -> bool:
    if base is None:
        return False
    try:
        return Path(path).resolve().is_relative_to(base)
    except (OSError, ValueError):
        return False


def _innermost(exc: BaseException, base: Path | None) -> traceback.FrameSummary | None:
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if _inside(frame.filename, base):
            return frame
    return None


def _where(frame: traceback.FrameSummary, base: Path) -> str:
    place = f"{_relative(frame.filename, base)} line {frame.lineno}"
    if frame.name != "<module>":
        place += f", in {frame.name}"
    code = (frame.line or "").strip()
    return f"{place}: {code}" if code else place


def _syntax_error(exc: SyntaxError, impl: Path | None) -> str:
    where = _relative(exc.filename or "?", impl) if impl else (exc.filename or "?")
    text = f"SyntaxError in {where}, line {exc.lineno}: {exc.msg}"
    if exc.text:
        source = exc.text.rstrip("\n")
        stripped = source.lstrip()
        text += f"\n    {stripped}"
        if exc.offset:
            column = max(exc.offset - 1 - (len(source) - len(stripped)), 0)
            text += "\n    " + " " * column + "^"
    return text + "\nFix the syntax, save, and run the checks again."


def describe(exc: BaseException, impl: Path | None, checks: Path | None,
             when: str = "call") -> Diagnosis:
    """Explain how a check ended with `exc`, pointing into the learner's code (`impl`) first,
    then into the check (`checks`), never into pytest or dojo. `when` is pytest's phase: an
    exception raised by the check's own code while it was being prepared ("setup"), with no
    line of the learner's in its traceback, is not blamed on the learner."""
    impl = impl.resolve() if impl else None
    checks = checks.resolve() if checks else None
    infra = infra_failure(exc)
    if infra:
        return Diagnosis("infra", infra)
    if isinstance(exc, CheckFailure):
        return Diagnosis("fail", clip(exc.render()), exc.report)
    if isinstance(exc, AssertionError):
        return Diagnosis("fail", clip(assertion_text(exc)))
    if type(exc).__name__ == "Failed":  # pytest.fail(...): the check's own verdict
        return Diagnosis("fail", clip(str(exc) or "the check failed"))
    if isinstance(exc, SyntaxError) and exc.filename and _inside(exc.filename, impl):
        return Diagnosis("error", clip(_syntax_error(exc, impl)))
    if isinstance(exc, SystemExit):
        return Diagnosis("error", f"your code called sys.exit({exc.code!r}) during the check; "
                                  "library code should raise an exception instead")
    learner_frame = _innermost(exc, impl)
    if isinstance(exc, NotImplementedError) and learner_frame is not None and impl:
        place = f"{_relative(learner_frame.filename, impl)} line {learner_frame.lineno}"
        stub = NotWritten(f"{Path(learner_frame.filename).stem}.{learner_frame.name}()",
                          " ".join(str(exc).split()), place)
        return Diagnosis("fail", clip(stub.render()), stub.report)
    if isinstance(exc, MemoryError) and os.environ.get(MEMORY_LIMIT_ENV):
        where = f" at {_where(learner_frame, impl)}" if learner_frame is not None and impl else ""
        return Diagnosis("error", clip(
            f"your code used more than {os.environ[MEMORY_LIMIT_ENV]} of memory{where} "
            "(the limit of every check; a lab can raise it with `limits: memory_mb` in "
            "lab.yaml)"))
    if isinstance(exc, OSError) and exc.errno == errno.EFBIG and os.environ.get(FILE_LIMIT_ENV):
        where = f" at {_where(learner_frame, impl)}" if learner_frame is not None and impl else ""
        return Diagnosis("error", clip(
            f"your code wrote a file larger than {os.environ[FILE_LIMIT_ENV]}{where} (the "
            "file-size limit of every check; a lab can raise it with `limits: file_mb`)"))
    if learner_frame is not None and impl:
        # the first learner frame in the chain says whether it broke at import or in a call
        first = next(f for f in traceback.extract_tb(exc.__traceback__)
                     if _inside(f.filename, impl))
        if first.name == "<module>":
            module = _relative(first.filename, impl)
            return Diagnosis("error", clip(
                f"importing {module} raised {_exception_text(exc)}\n"
                f"  at {_where(learner_frame, impl)}"))
        return Diagnosis("error", clip(
            f"your code raised {_exception_text(exc)}\n  at {_where(learner_frame, impl)}"))
    check_frame = _innermost(exc, checks)
    if check_frame is not None and checks and when == "setup":
        return Diagnosis("error", clip(
            f"its own code raised {_exception_text(exc)}\n"
            f"  at {_where(check_frame, checks)}\n"
            "No line of your code is in the traceback: this is most likely a problem of the lab "
            "or of the services (`dojo doctor` checks them), not of your code. If it happens "
            "again, report it with the output of `dojo lab check --json`."))
    if check_frame is not None and checks:
        return Diagnosis("error", clip(
            f"the check raised {_exception_text(exc)}\n  at {_where(check_frame, checks)}\n"
            "No line of your code is in the traceback. A value of another shape than the lab "
            "README describes (a type, a field name) makes a check fail like this: compare "
            "what your code returned with the README. If it matches, the check is at fault: "
            "report it with the output of `dojo lab check --json`."))
    return Diagnosis("error", clip(_exception_text(exc)))
