"""Hostile matrix files and options: bounded work, one line naming the file or value, exit 2, no traceback.

The loader's contract is checked two ways: crafted files (an alias bomb, deep nesting, a device as the file,
paths leading out of the matrix file's directory) through the real CLI, and arbitrary YAML-ish text through
`load_matrix_file`, which may only return or raise ConfigError.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factory.build.wheelhouse import pip_download_args
from factory.core.errors import ConfigError
from factory.core.validate import requirement_problem
from factory.spec.config import MAX_PLANNED_JOBS, load_matrix_file
from factory.spec.yamlload import MAX_BYTES, MAX_NODES

Cli = Callable[[list[str]], tuple[int, str]]

GOOD = """\
package: {name: flash-attn, version: "2.8.3"}
matrix:
  cuda: ["13.0"]
  torch: ["2.10"]
  python: ["3.11"]
  cxx11_abi: [true]
  arch: ["8.0;9.0"]
"""
# Every case must be refused within this, on a shared, slow machine; unbounded, the slowest took minutes.
SECONDS = 10


def one_error_line(code: int, output: str, *, seconds: float) -> str:
    assert code == 2, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert seconds < SECONDS
    return lines[0]


def check(cli: Cli, path: Path | str, *options: str) -> tuple[int, str, float]:
    start = time.monotonic()
    code, output = cli(["matrix", "--matrix", str(path), "--check", *options])
    return code, output, time.monotonic() - start


def test_a_device_is_read_no_further_than_the_bound(factory_cli: Cli) -> None:
    code, output, seconds = check(factory_cli, "/dev/zero")
    line = one_error_line(code, output, seconds=seconds)
    assert line == f"error: /dev/zero: larger than {MAX_BYTES // 1024} KiB, too large for a matrix file"


def test_a_large_file_is_refused_unparsed(tmp_path: Path, factory_cli: Cli) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "# padding\n" * (20 * 2**20 // 10))
    code, output, seconds = check(factory_cli, path)
    assert "larger than 256 KiB" in one_error_line(code, output, seconds=seconds)


@pytest.mark.parametrize(
    "nested",
    [
        "a: " + "[" * 3000 + "]" * 3000 + "\n",  # flow: the scanner is quadratic in it
        "a:\n  " + "- " * 3000 + "x\n",  # block: a RecursionError in the composer
        "".join(" " * i + f"k{i}:\n" for i in range(40)),  # within every parser limit, past ours
    ],
    ids=["flow", "block-sequence", "block-mapping"],
)
def test_deep_nesting_is_refused(nested: str, tmp_path: Path, factory_cli: Cli) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + nested)
    code, output, seconds = check(factory_cli, path)
    line = one_error_line(code, output, seconds=seconds)
    assert line.startswith(f"error: {path}"), line
    assert "nested more than 32 levels deep" in line


def test_an_alias_bomb_in_an_include_entry_is_refused(tmp_path: Path, factory_cli: Cli) -> None:
    # nine levels of nine aliases each: 9**9 values once expanded, from ten short lines
    levels = ["      l0: &l0 [x, x, x, x, x, x, x, x, x]\n"]
    for i in range(1, 10):
        levels.append(f"      l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n")
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "  include:\n    - payload:\n" + "".join(levels))
    code, output, seconds = check(factory_cli, path)
    line = one_error_line(code, output, seconds=seconds)
    assert line.startswith(f"error: {path}:"), line
    assert f"more than {MAX_NODES} values once YAML aliases are expanded" in line


def test_few_aliases_are_fine(tmp_path: Path, factory_cli: Cli) -> None:
    path = tmp_path / "m.yaml"
    text = GOOD.replace('  python: ["3.11"]', '  python: &py ["3.11", "3.12"]')
    path.write_text(text + '  exclude:\n    - {python: "3.12"}\n')
    code, output, _ = check(factory_cli, path)
    assert code == 0, output


def test_the_job_bound_is_checked_before_expanding(tmp_path: Path, factory_cli: Cli) -> None:
    # one past the bound: a matrix of exactly MAX_PLANNED_JOBS is accepted, so the bound is the one the
    # message says
    torches = ", ".join(f'"2.{i}"' for i in range(MAX_PLANNED_JOBS // 2))
    text = GOOD.replace('["2.10"]', f"[{torches}]").replace('["3.11"]', '["3.11", "3.12"]')
    path = tmp_path / "m.yaml"
    path.write_text(text)
    assert load_matrix_file(path).matrix.axes["torch"][-1] == f"2.{MAX_PLANNED_JOBS // 2 - 1}"
    path.write_text(text.replace('["3.11", "3.12"]', '["3.11", "3.12", "3.13"]'))
    with pytest.raises(
        ConfigError, match=f"make {MAX_PLANNED_JOBS * 3 // 2} jobs; at most {MAX_PLANNED_JOBS}"
    ):
        load_matrix_file(path)


def test_a_symlink_out_of_the_directory_is_refused(tmp_path: Path, factory_cli: Cli) -> None:
    (tmp_path / "outside.diff").write_text("--- a\n+++ b\n")
    here = tmp_path / "here"
    here.mkdir()
    (here / "link.diff").symlink_to(tmp_path / "outside.diff")
    path = here / "m.yaml"
    path.write_text(GOOD + "recipe:\n  name: r\n  patches: [link.diff]\n")
    code, output, seconds = check(factory_cli, path)
    line = one_error_line(code, output, seconds=seconds)
    assert line == (
        f"error: {path}:10: recipe.patches item 'link.diff' is outside the matrix file's directory {here} "
        "(pass --trust-paths to allow it)"
    )
    code, output, _ = check(factory_cli, path, "--trust-paths", "--no-source")
    assert code == 0, output
    trusted = load_matrix_file(path, trust_paths=True)
    assert trusted.recipe.patches == (tmp_path / "outside.diff",)


def test_trust_paths_allows_a_source_elsewhere(tmp_path: Path, factory_cli: Cli) -> None:
    (tmp_path / "src").mkdir()
    here = tmp_path / "here"
    here.mkdir()
    path = here / "m.yaml"
    path.write_text(GOOD.replace('version: "2.8.3"}', 'version: "2.8.3", source: {path: ../src}}'))
    with pytest.raises(ConfigError, match=r"package\.source\.path '\.\./src' is outside"):
        load_matrix_file(path)
    assert load_matrix_file(path, trust_paths=True).package.source.path == tmp_path / "src"
    # inside the directory, no option is needed
    (here / "src").mkdir()
    path.write_text(GOOD.replace('version: "2.8.3"}', 'version: "2.8.3", source: {path: ./src/../src}}'))
    assert load_matrix_file(path).package.source.path == here / "src"


@pytest.mark.parametrize(
    ("requirement", "problem"),
    [
        ("ninja>=1.11", None),
        ("torch==2.10.*", None),
        ("einops; python_version >= '3.9'", None),
        ("--index-url=http://evil/", "is not a requirement like 'ninja>=1.11' (no pip options)"),
        ("-r /etc/passwd", "is not a requirement like 'ninja>=1.11' (no pip options)"),
        ("--pre", "is not a requirement like 'ninja>=1.11' (no pip options)"),
        ("x @ https://evil/x.whl", "is a direct URL; name a requirement that an index serves"),
        ("./local/dir", "is not a requirement like 'ninja>=1.11' (no pip options)"),
    ],
)
def test_requirements_for_the_hosts_pip(requirement: str, problem: str | None) -> None:
    assert requirement_problem(requirement) == problem
    if problem is None:
        assert pip_download_args([requirement], Path("/w"), python="3.11")[-1] == requirement
    else:
        with pytest.raises(ConfigError, match=r"^requirement "):
            pip_download_args(["ninja", requirement], Path("/w"), python="3.11")


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--cpus", "1e308"], "error: --cpus must be at most 4096, not 1e+308"),
        (["--memory", "100TiB"], "error: --memory 100TiB is above 64.0 TiB"),
        (["--memory", "9" * 400 + "G"], "is not a finite size"),
        (["--per-arch", "65TiB"], "error: --per-arch 65TiB is above 64.0 TiB"),
        (["--archs", "5000"], "error: --archs must be at most 1024, not 5000"),
        (["--nvcc-threads", "5000"], "error: --nvcc-threads must be at most 1024, not 5000"),
    ],
)
def test_memory_plan_bounds_its_numbers(argv: list[str], line: str, factory_cli: Cli) -> None:
    base = ["memory", "plan", "--cpus", "8", "--memory", "16GiB"]
    code, output = factory_cli([*base, *argv])
    assert code == 2, output
    assert len(output.strip().splitlines()) == 1, output
    assert line in output.strip(), output


# Pieces of matrix files and of YAML, put together at random: a loader that trusts any shape (an alias to a
# scalar where a list was, a tag, a date, a complex key, a tab) shows up here as another exception.
TOKENS = [
    "package:", "matrix:", "recipe:", "build:", "publish:", "compat:", "include:", "exclude:", "env:",
    "name: x", 'version: "1.0"', "source:", "path:", "git:", "ref:", "patches:", "memory:", "concurrency:",
    "cuda:", "torch:", "python:", "cxx11_abi:", "arch:", "to:", "min_arch:", "recipes:", "archs:",
    "extra_build_requires:", "images:", "torch_index:", "cuda_versions:", "cxx_std:",
    '"13.0"', '"12.8"', '"2.10"', '"3.11"', '"8.0;9.0"', "2.10", "13", "true", "null", "~", "1e30", ".nan",
    "-1", "0", "2020-01-01", "1GiB", "s3://", "/etc", "..", "--x",
    "[", "]", "{", "}", ",", ":", "- ", "? ", "&a ", "*a", "&b ", "*b", "!!str ", "!!python/name:os.system ",
    "!x ", "|", ">", "'", '"', "#", "---", "...", "%YAML 1.2", "<<: *a", "\n", "\n  ", "\n    ", " ", "\t",
]  # fmt: skip


def _load_text(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            load_matrix_file(path)
        except ConfigError as exc:
            assert "\n" not in str(exc), str(exc)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(TOKENS), max_size=60).map("".join))
def test_yaml_ish_text_is_loaded_or_refused_in_one_line(text: str) -> None:
    _load_text(text)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.integers(min_value=0, max_value=len(GOOD)),
    st.lists(st.sampled_from(TOKENS), min_size=1, max_size=6).map("".join),
)
def test_a_good_file_with_pieces_spliced_in_is_loaded_or_refused(position: int, piece: str) -> None:
    _load_text(GOOD[:position] + piece + GOOD[position:])


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_text_is_loaded_or_refused_in_one_line(text: str) -> None:
    _load_text(text.replace("\x00", ""))


def test_a_memory_for_a_larger_machine_passes_the_check(tmp_path: Path) -> None:
    # memory x concurrency beyond this host is the build's to refuse, on the host it runs on
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + "build:\n  memory: 64GiB\n  concurrency: 64\n")
    build = load_matrix_file(path).build
    assert (build.memory, build.concurrency) == (64 * 2**30, 64)


RECIPE = "recipe:\n  name: r\n  base: flash-attn\n"


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("build:\n  memory: 100TiB\n", "build.memory 100TiB is above 64.0 TiB"),
        (
            "build:\n  memory_budget: " + "9" * 30 + "\n",
            "build.memory_budget " + "9" * 30 + " is above 64.0 TiB",
        ),
        ("build:\n  cache_max: 65TiB\n", "build.cache_max 65TiB is above 64.0 TiB"),
        ("build:\n  cpus: 1e308\n", "build.cpus must be at most 4096, not 1e+308"),
        ("build:\n  cpus: 1e-12\n", "build.cpus must be at least 0.01, not 1e-12"),
        ("build:\n  cpus: .nan\n", "build.cpus must be a finite number, not nan"),
        ("build:\n  pids_limit: 99999999999\n", "build.pids_limit must be 64 to 4194304, not 99999999999"),
        ("build:\n  pids_limit: 8\n", "build.pids_limit must be 64 to 4194304, not 8"),
        ("build:\n  max_attempts: 1000\n", "build.max_attempts must be 1 to 20, not 1000"),
        (
            "build:\n  max_attempts: " + "9" * 400 + "\n",
            "build.max_attempts must be 1 to 20, not 999999999999... (400 digits)",
        ),
        (RECIPE + "  compile_gib_per_arch: 1e308\n", "recipe.compile_gib_per_arch must be at most 1024"),
        (
            RECIPE + "  compile_gib_per_arch: " + "9" * 400 + "\n",
            "compile_gib_per_arch must be a finite number",
        ),
        (
            RECIPE + "  compile_gib_by_file: {'*.cu': 2000}\n",
            "recipe.compile_gib_by_file['*.cu'] must be at most",
        ),
        (
            RECIPE + "  compile_seconds_by_file: {'*.cu': 1e300}\n",
            "compile_seconds_by_file['*.cu'] must be at most",
        ),
        (RECIPE + '  env: {"FOO\\n": x}\n', "recipe.env: 'FOO\\n' is not an environment variable name"),
        (RECIPE + '  arch_env: "FOO\\n"\n', "recipe.arch_env 'FOO\\n' is not an environment variable name"),
        (RECIPE + '  local_version_env: "V\\n"\n', "recipe.local_version_env 'V\\n' is not an environment"),
        (RECIPE + '  env: {FOO: "a\\0b"}\n', "recipe.env.FOO must not contain a NUL character"),
        (RECIPE + '  patches: ["x\\0y"]\n', "recipe.patches item must not contain a NUL character"),
        ('publish:\n  to: "/tmp/x\\0y"\n', "publish.to must not contain a NUL character"),
    ],
)
def test_numbers_and_names_out_of_bounds_are_refused(
    section: str, message: str, tmp_path: Path, factory_cli: Cli
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + section)
    code, output, seconds = check(factory_cli, path)
    assert message in one_error_line(code, output, seconds=seconds)


def test_a_nul_in_a_source_path_is_refused(tmp_path: Path, factory_cli: Cli) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD.replace('version: "2.8.3"}', 'version: "2.8.3", source: {path: "a\\0b"}}'))
    code, output, seconds = check(factory_cli, path)
    assert "package.source.path must not contain a NUL character" in one_error_line(
        code, output, seconds=seconds
    )


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--cpus", "1e-12"], "error: --cpus must be at least 0.01, not 1e-12"),
        (["--memory", "100TiB"], "error: --memory 100TiB is above 64.0 TiB"),
        (["--memory", "1MiB"], "error: --memory 1MiB is below 1.0 GiB"),
    ],
)
def test_build_options_out_of_bounds_are_refused(
    argv: list[str], line: str, tmp_path: Path, factory_cli: Cli
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD)
    code, output = factory_cli(["build", "--matrix", str(path), "--dry-run", *argv])
    assert code == 2, output
    assert output.strip() == line


def test_a_recipe_too_large_to_plan_is_refused_before_planning(tmp_path: Path, factory_cli: Cli) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(GOOD + RECIPE + "  compile_gib_per_arch: 1e308\n")
    code, output = factory_cli(["memory", "plan", "--cpus", "8", "--memory", "16GiB", "--matrix", str(path)])
    assert code == 2 and "Traceback" not in output, output
    assert "recipe.compile_gib_per_arch must be at most 1024, not 1e+308" in output


@pytest.mark.parametrize("cpus", [0.0, 1e-12, 0.009, 4097.0, float("inf"), float("nan")])
def test_docker_never_gets_a_cpu_limit_it_reads_as_none(cpus: float) -> None:
    from factory.build.engine import nano_cpus

    with pytest.raises(ConfigError, match=r"^a container's CPU limit must be 0.01 to 4096"):
        nano_cpus(cpus)
    assert nano_cpus(0.01) == 10**7 and nano_cpus(2.5) == 2_500_000_000


def test_a_trailing_newline_passes_no_pattern() -> None:
    """`$` matches before a final newline: every pattern that must match a whole value is matched whole."""
    from factory.core.tags import parse_manylinux
    from factory.core.variants import VariantKey
    from factory.publish.stores import tmp_writer
    from factory.spec.imageref import is_image_reference
    from factory.spec.toolchains import base_suite_of

    assert is_image_reference("ubuntu:22.04") and not is_image_reference("ubuntu:22.04\n")
    assert base_suite_of("factory-base:bookworm") == "bookworm"
    assert base_suite_of("factory-base:bookworm\n") is None
    assert parse_manylinux("manylinux_2_28_x86_64") is not None
    assert parse_manylinux("manylinux_2_28_x86_64\n") is None
    assert tmp_writer(".x.whl.host.12.abc.tmp") is not None and tmp_writer(".x.whl.host.12.abc.tmp\n") is None
    VariantKey.parse_id("cu128-torch2.10-abi1-sm80.90")
    with pytest.raises(ValueError):
        VariantKey.parse_id("cu128-torch2.10-abi1-sm80.90\n")
    with pytest.raises(ValueError):
        VariantKey.parse_local_version("cu12.8.torch2.10.abi1.sm80.90\n")


@pytest.mark.parametrize(
    "entry",
    [
        '{"peak_bytes": Infinity}',
        '{"peak_bytes": 1e400}',
        '{"peak_bytes": -1}',
        '{"peak_bytes": 1000, "wall_s": NaN}',
        '{"peak_bytes": 1000, "wall_s": -1}',
        '{"peak_bytes": 1000, "envelope": [1, Infinity]}',
        '{"peak_bytes": ' + "9" * 400 + "}",
    ],
)
def test_a_profile_with_numbers_no_compile_measures_is_refused(
    entry: str, tmp_path: Path, factory_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    path = tmp_path / "p.compile-profile.json"
    path.write_text('{"format": 1, "package": "x", "version": "1", "entries": {"a.cu|80|1": ' + entry + "}}")
    code, output = factory_cli(["memory", "import", str(path)])
    assert code == 2 and "Traceback" not in output, output
    assert len(output.strip().splitlines()) == 1, output
    assert "bad profile entry 'a.cu|80|1'" in output, output
