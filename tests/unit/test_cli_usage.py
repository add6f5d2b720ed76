"""Usage errors of the `factory` command line (click's, raised inside Typer): one line, exit 2, no traceback,
whichever copy of click the installed Typer uses."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from factory.cli import main


def run_main(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["factory", *argv])
    with pytest.raises(SystemExit) as exc:
        main()
    captured = capsys.readouterr()
    return int(exc.value.code or 0), captured.out + captured.err


@pytest.mark.parametrize(
    ("argv", "start", "end"),
    [
        (["plan"], "error: No such command 'plan'.", "(see factory --help)"),
        (["matrix", "--bogus"], "error: No such option: --bogus", "(see factory matrix --help)"),
        (["matrix", "--matrix"], "error: Option '--matrix' requires an argument.", ""),
        # click's and Typer's wording of the reason differ between versions
        (["serve", "--port", "abc"], "error: Invalid value for '--port': ", "(see factory serve --help)"),
        (["memory", "nope"], "error: No such command 'nope'.", "(see factory memory --help)"),
    ],
)
def test_usage_errors_are_one_line_with_exit_2(
    argv: list[str], start: str, end: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = run_main(argv, capsys, monkeypatch)
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(start) and lines[0].endswith(end)


@pytest.mark.parametrize("argv", [[], ["memory"]])
def test_a_group_alone_shows_its_help(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, output = run_main(argv, capsys, monkeypatch)
    assert code == 2
    assert "Usage: factory" in output and "Commands" in output
    assert "Traceback" not in output


def test_an_unexpected_exception_is_not_taken_for_a_usage_error() -> None:
    from factory.cli import usage_error

    assert usage_error(ValueError("boom")) is None


def test_the_console_script_says_a_bad_option_in_one_line(tmp_path: Path) -> None:
    factory = Path(sys.executable).with_name("factory")
    cmd = [str(factory)] if factory.exists() else [sys.executable, "-m", "factory.cli"]
    proc = subprocess.run(
        [*cmd, "build", "--jobs", "3"], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert proc.stderr.strip() == "error: No such option: --jobs (see factory build --help)"
