"""Usage errors of the `factory` command line, click's (raised inside Typer, whichever copy of click it uses)
and the commands' own checks of their values: one line, exit 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.cli import usage_error


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
    argv: list[str], start: str, end: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(argv)
    assert code == 2
    lines = output.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(start) and lines[0].endswith(end)


@pytest.mark.parametrize("argv", [[], ["memory"]])
def test_a_group_alone_shows_its_help(
    argv: list[str], factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(argv)
    assert code == 2
    assert "Usage: factory" in output and "Commands" in output
    assert "Traceback" not in output


def test_an_unexpected_exception_is_not_taken_for_a_usage_error() -> None:
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


def test_memory_plan(factory_cli: Callable[[list[str]], tuple[int, str]]) -> None:
    code, output = factory_cli(
        ["memory", "plan", "--memory", "64GiB", "--cpus", "16", "--archs", "4", "--json"]
    )
    assert code == 0, output
    plan = json.loads(output)
    # flash-attn's 6.6 GiB per arch: four archs at four threads, 26.6 GiB a compile, fit twice in 62 GiB
    assert (plan["max_jobs"], plan["nvcc_threads"]) == (2, 4)
    assert plan["ninja_jobs"] >= plan["max_jobs"]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--cpus", "0"], "error: --cpus must be a positive number of CPUs, not 0"),
        (["--cpus", "-3"], "error: --cpus must be a positive number of CPUs, not -3"),
        (["--cpus", "nan"], "error: --cpus must be a positive number of CPUs, not nan"),
        (["--cpus", "inf"], "error: --cpus must be a positive number of CPUs, not inf"),
        (["--nvcc-threads", "0"], "error: --nvcc-threads must be at least 1, not 0"),
        (["--archs", "0"], "error: --archs must be at least 1, not 0"),
        (["--memory", "abc"], "error: --memory: size 'abc' is not a size like 16GiB, 512MiB or a byte count"),
    ],
)
def test_memory_plan_rejects_bad_values(
    argv: list[str], line: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["memory", "plan", "--memory", "16GiB", *argv])
    assert code == 2
    assert output.strip() == line


DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_build_rejects_cpus_that_are_not_a_positive_number(
    value: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["build", "--matrix", str(DEMO), "--dry-run", "--cpus", value])
    assert code == 2
    assert output.strip() == f"error: --cpus must be a positive number of CPUs, not {float(value):g}"


@pytest.mark.parametrize("port", ["65536", "-1"])
def test_serve_rejects_a_port_out_of_range(
    port: str, tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    (tmp_path / "simple").mkdir()
    code, output = factory_cli(["serve", str(tmp_path), "--port", port])
    assert code == 2
    assert output.strip() == f"error: --port must be 0-65535, not {port}"


def test_which_rejects_an_index_url_it_cannot_read(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    code, output = factory_cli(["which", "--index", "ftp://user:secret@host/idx"])
    assert code == 2
    # the password is not repeated
    assert output.strip() == "error: --index ftp://host/idx: not a URL of file:// or http:// or https://"
