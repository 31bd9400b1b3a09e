"""The command line as a whole: version, help, the app only on a terminal, one error style,
and a parser that loads no engine code (what keeps `dojo --help` fast; bench/startup.py
measures the time itself)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dojo import __version__
from tests.quiz.cli_helpers import run_dojo

ENGINE_PACKAGES = ("dojo.content", "dojo.store", "dojo.quiz", "dojo.runner", "dojo.services",
                   "sqlalchemy", "textual", "yaml", "fsrs")


def test_version_prints_the_package_version(tmp_path: Path) -> None:
    done = run_dojo(["--version"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"dojo {__version__}"


def test_bare_dojo_on_a_pipe_prints_the_help_instead_of_opening_the_app(tmp_path: Path
                                                                        ) -> None:
    done = run_dojo([], tmp_path)  # stdin and stdout are pipes here
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: dojo"), done.stdout[:200]
    assert "\x1b[" not in done.stdout, "a full-screen app wrote escape codes to a pipe"


def test_building_the_parser_imports_no_engine_code() -> None:
    code = ("import sys, dojo.cli\n"
            "parser = dojo.cli.build_parser()\n"
            "for args in (['lab', 'check', 'x'], ['quiz', 'cards'], ['lessons', '--json'],"
            " ['services', 'up'], ['dev', 'golden', 'x'], ['lint'], ['doctor']):\n"
            "    parser.parse_args(args)\n"
            f"print(sorted(m for m in sys.modules if m.startswith({ENGINE_PACKAGES!r})))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", (
        f"building the parser imported {done.stdout.strip()}: move that import into the "
        "command's module (dojo.cli.lazy), so `dojo --help` stays fast")


@pytest.mark.parametrize("args", [
    ["frobnicate"],
    ["lab", "check", "no-such-lab"],
    ["quiz", "cards", "--lesson", "99"],
    ["quiz", "--count", "0"],
    ["lab", "check", "dlq", "--stage", "no-such-stage"],
], ids=["unknown command", "unknown lab", "unknown lesson", "bad count", "unknown stage"])
def test_usage_errors_are_one_line_in_one_style_with_exit_code_2(tmp_path: Path,
                                                                 args: list[str]) -> None:
    done = run_dojo(args, tmp_path)
    assert done.returncode == 2, (done.returncode, done.stderr)
    first = done.stderr.splitlines()[0]
    assert first.startswith("error: "), done.stderr
    assert "Traceback" not in done.stderr and not done.stderr.startswith("usage:")


def test_the_kafka_backends_the_parser_offers_are_the_managers() -> None:
    from dojo.cli.services import KAFKA_BACKENDS
    from dojo.services.manager import KAFKA_BACKENDS as MANAGER_BACKENDS

    assert KAFKA_BACKENDS == MANAGER_BACKENDS


def test_lab_list_json_has_every_lab_with_its_stages(tmp_path: Path) -> None:
    done = run_dojo(["lab", "list", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    labs = {lab["id"]: lab for lab in json.loads(done.stdout)}
    assert set(labs) == {"dlq", "outbox"}
    dlq = labs["dlq"]
    assert dlq["started"] is False and dlq["passed"] == 0
    assert [stage["id"] for stage in dlq["stages"]] == ["classify", "replay"]
    assert all(stage["status"] == "" for stage in dlq["stages"])


@pytest.mark.parametrize("ref", ["01", "1", "dead-letter-queue", "01-dead-letter-queue"])
def test_a_lesson_is_named_by_number_id_or_folder(tmp_path: Path, ref: str) -> None:
    done = run_dojo(["quiz", "cards", "--json", "--lesson", ref], tmp_path)
    assert done.returncode == 0, done.stderr
    assert {card["lesson"] for card in json.loads(done.stdout)} == {"dead-letter-queue"}
