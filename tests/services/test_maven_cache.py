"""Maven's download cache follows DOJO_CACHE_DIR instead of filling the user's ~/.m2."""

from __future__ import annotations

from pathlib import Path

import pytest

from dojo.services.apache_kafka import maven_command


def test_maven_repository_lives_in_the_dojo_cache_dir(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOJO_CACHE_DIR", str(tmp_path / "cache"))
    argv = maven_command("mvn", Path("pom.xml"), tmp_path / "lib")
    repo = [arg for arg in argv if arg.startswith("-Dmaven.repo.local=")]
    assert repo == [f"-Dmaven.repo.local={tmp_path / 'cache' / 'maven-repository'}"], argv
    assert not any(".m2" in arg for arg in argv)
