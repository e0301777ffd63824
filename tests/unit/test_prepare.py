"""``scripts/test``'s background preparation (tests/support/prepare.py): it reports what it made, and a step
that fails makes it exit non-zero with the reason while the other step still completes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import prepare


def test_both_steps_made_exits_zero_naming_what_was_made(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prepare.jvm, "class_archive", lambda *, wait: Path("/venv/archive.jsa"))
    monkeypatch.setattr(prepare, "install_azurite", lambda: Path("/venv/azurite/main.js"))

    assert prepare.main() == 0

    out = capsys.readouterr().out
    assert "the JVM class archive: /venv/archive.jsa" in out
    assert "Azurite: /venv/azurite/main.js" in out


def test_a_failed_step_exits_nonzero_with_its_reason_and_the_other_step_still_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(prepare.jvm, "class_archive", lambda *, wait: None)
    monkeypatch.setattr(prepare.jvm, "failure", lambda: "spark-submit exited 1: no java")
    monkeypatch.setattr(prepare, "install_azurite", lambda: Path("/venv/azurite/main.js"))

    assert prepare.main() == 1

    captured = capsys.readouterr()
    assert "no JVM class archive: spark-submit exited 1: no java" in captured.err
    assert "Azurite: /venv/azurite/main.js" in captured.out
