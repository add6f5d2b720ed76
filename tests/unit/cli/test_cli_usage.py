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
    # click may suggest a near option ("Possible options: --json") between the two
    line = proc.stderr.strip()
    assert "\n" not in line
    assert line.startswith("error: No such option: --jobs ") and line.endswith("(see factory build --help)")


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


DEMO = Path(__file__).resolve().parents[3] / "examples" / "demo.yaml"


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
    assert output.strip() == "error: --index-url ftp://host/idx: not a URL of file:// or http:// or https://"


def _no_cgroup_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    from factory.container import cgroup

    unlimited = cgroup.CgroupInfo(
        version=0, memory_limit=None, memory_usage=None, memory_peak=None, cpus=None
    )
    monkeypatch.setattr(cgroup, "read_cgroup", lambda: unlimited)


def test_memory_plan_checks_the_recipe_before_the_cgroup(
    monkeypatch: pytest.MonkeyPatch, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    _no_cgroup_limit(monkeypatch)
    code, output = factory_cli(["memory", "plan", "--recipe", "nope"])
    assert code == 2
    (line,) = output.strip().splitlines()
    assert line.startswith("error: --recipe: unknown recipe 'nope' (built in: ")
    # a known recipe gets as far as the limit this host lacks
    code, output = factory_cli(["memory", "plan", "--recipe", "flash-attn"])
    assert (code, output.strip()) == (
        2,
        "error: --memory: no cgroup memory limit here; give one, e.g. --memory 16GiB",
    )


def test_memory_plan_leads_with_what_a_build_sets(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    argv = ["memory", "plan", "--memory", "64GiB", "--cpus", "16", "--archs", "4"]
    code, output = factory_cli(argv)
    assert code == 0, output
    code, as_json = factory_cli([*argv, "--json"])
    plan = json.loads(as_json)
    first, *rest = output.splitlines()
    # the build's MAX_JOBS is the wrapper's (admission bounds memory), not the plain-ninja number
    assert first.startswith(
        f"MAX_JOBS={plan['ninja_jobs']} NVCC_THREADS={plan['nvcc_threads']}: what a build sets"
    )
    assert plan["ninja_jobs"] != plan["max_jobs"]
    assert rest[-1].strip() == f"without the wrapper (a plain ninja build): MAX_JOBS={plan['max_jobs']}"
    assert list(plan)[:2] == ["ninja_jobs", "nvcc_threads"]


def test_build_dry_run_refuses_a_container_memory_too_small(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    code, output = factory_cli(["build", "--matrix", str(DEMO), "--dry-run", "--memory", "1KB"])
    assert (code, output.strip()) == (2, "error: --memory 1KB is below 1.0 GiB")


def test_build_dry_run_json_lists_the_jobs_matrix_json_does(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    code, output = factory_cli(["build", "--matrix", str(DEMO), "--dry-run", "--json"])
    assert code == 0, output
    code, matrix_json = factory_cli(["matrix", "--matrix", str(DEMO), "--json"])
    assert json.loads(output) == json.loads(matrix_json)["jobs"] != []
    code, output = factory_cli(["build", "--matrix", str(DEMO), "--json"])
    assert code == 2 and output.strip().startswith("error: --json applies to --dry-run")


def test_index_check_of_a_missing_directory_is_refused_and_not_made(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    missing = tmp_path / "no-index"
    for command in (["index", "check"], ["index", "repair"], ["index", "audit"]):
        code, output = factory_cli([*command, "--to", str(missing)])
        assert (code, output.strip()) == (2, f"error: --to {missing}: no such index directory")
    assert not missing.exists()


@pytest.mark.parametrize("to", ["s3:/bucket", "s3:bucket/x", "S3:/bucket"])
@pytest.mark.parametrize(
    "command", [["index", "check"], ["index", "repair"], ["index", "audit"], ["publish", "."]]
)
def test_an_s3_url_a_slash_short_is_not_a_directory(
    to: str, command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x-1.0-py3-none-any.whl").write_bytes(b"")
    code, output = factory_cli([*command, "--to", to])
    assert code == 2
    (line,) = output.strip().splitlines()
    assert line == f"error: --to {to!r}: an S3 index is s3://bucket/prefix (a directory: ./{to})"
    assert not (tmp_path / to.split("/")[0]).exists()


@pytest.mark.parametrize("option", ["--index-url", "-i", "--index"])
def test_which_takes_the_index_as_pip_and_uv_spell_it(
    option: str, tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["which", option, str(tmp_path / "none")])
    assert (code, output.strip()) == (2, f"error: --index-url {tmp_path / 'none'}: no such directory")


def test_recipes_json_and_an_unbroken_table_without_a_terminal(
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    from factory.spec.recipes import BUILTIN_RECIPES

    code, output = factory_cli(["recipes", "--json"])
    assert code == 0, output
    recipes = json.loads(output)
    assert [r["name"] for r in recipes] == list(BUILTIN_RECIPES)
    assert all(Path(p).is_file() for r in recipes for p in r["patches"])
    code, table = factory_cli(["recipes"])
    assert code == 0
    for recipe in BUILTIN_RECIPES.values():
        (row,) = [
            line
            for line in table.splitlines()
            if f" {recipe.name} " in line.split("│")[1 if "│" in line else 0]
        ]
        assert all(p.name in row for p in recipe.patches)
        assert all(f"{k}={v}" in row for k, v in recipe.env.items())


def test_images_list_without_a_terminal_keeps_each_image_on_one_line(
    monkeypatch: pytest.MonkeyPatch, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    from factory.build import engine, images

    tag = "factory-builder:cuda13.0-py3.11-pypi-with-a-long-name-0123456789abcdef0123456789abcdef"
    labels = {
        images.LABEL_PYTHON: "3.11 3.12 3.13",
        images.LABEL_BASE: "factory-base:bookworm-long-base-name",
    }
    found = [
        images.ImageInfo(tags=(tag,), id="sha256:1", kind="builder", labels=labels, size=2**30, created="")
    ]
    monkeypatch.setattr(engine, "connect", lambda: None)
    monkeypatch.setattr(images, "list_images", lambda _client: found)
    code, output = factory_cli(["images", "list"])
    assert code == 0, output
    (row,) = [line for line in output.splitlines() if tag in line]
    assert "3.11,3.12,3.13" in row and "factory-base:bookworm-long-base-name" in row
    code, output = factory_cli(["images", "list", "--json"])
    assert json.loads(output)[0]["tags"] == [tag]


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (
            "s3:/bucket",
            "error: --from 's3:/bucket': an S3 index is s3://bucket/prefix (a directory: ./s3:/bucket)",
        ),
        ("http://host/idx", "error: --from 'http://host/idx': use a directory or s3://bucket/prefix"),
        ("{tmp}", "error: {tmp}: not a published index (no simple/ inside); run factory publish"),
    ],
)
def test_serve_from_names_a_directory_or_an_s3_prefix(
    source: str, said: str, tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["serve", "--from", source.format(tmp=tmp_path), "--port", "0"])
    assert (code, output.strip()) == (2, said.format(tmp=tmp_path))


@pytest.mark.parametrize("flag", ["--check-cache", "--verify-cache"])
def test_checking_the_cache_has_its_own_word_and_keeps_its_older_spelling(
    flag: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    demo = Path(__file__).resolve().parents[3] / "examples" / "demo.yaml"
    code, output = factory_cli(["build", "--matrix", str(demo), flag, "2", "--cache", "off", "--dry-run"])
    assert code == 2, output
    assert output.strip() == "error: --check-cache checks the compile cache's hits, and the cache is off"
