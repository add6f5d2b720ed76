"""Which runner each CI job builds on (issue 45 §5): `factory matrix --format github` gives every job the
`runs_on` labels of a host of its own platform (an aarch64 job GitHub's Arm runner, never an emulated build),
the caller overrides them per platform (`--runner PLATFORM=LABELS`) or per include entry (`runs_on:`), and a
bad value is one line, exit 2."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from factory.core.errors import ConfigError
from factory.core.platforms import DEFAULT_PLATFORM, PLATFORMS, named
from factory.core.validate import runner_labels_problem
from factory.plan.ci import RUNS_ON, Runners, parse_runners
from factory.spec.config import load_matrix_file

ROOT = Path(__file__).resolve().parents[3]
PRODUCTION = ROOT / "matrix.yaml"
AARCH64 = named("aarch64")
Cli = Callable[[list[str]], tuple[int, str]]


def github(cli: Cli, *argv: str) -> dict[str, Any]:
    code, out = cli(["matrix", "--format", "github", *argv])
    assert code == 0, out
    (line,) = [line for line in out.splitlines() if line.startswith("{")]
    data: dict[str, Any] = json.loads(line)
    return data


def by_platform(rows: list[dict[str, Any]]) -> dict[str, list[object]]:
    """Each platform's distinct runs_on values (a job of the default platform names none)."""
    out: dict[str, list[object]] = {}
    for row in rows:
        found = out.setdefault(str(row.get("platform", DEFAULT_PLATFORM.name)), [])
        if row[RUNS_ON] not in found:
            found.append(row[RUNS_ON])
    return out


# --- the runners of the platform table, and their syntax ----------------------------------------------------


def test_each_platform_builds_on_a_host_of_its_own() -> None:
    assert DEFAULT_PLATFORM.ci_runner == ("self-hosted", "linux", "x64")  # what the workflow always used
    assert AARCH64.ci_runner == ("ubuntu-24.04-arm",)  # GitHub's hosted Arm runner: native, no QEMU
    for platform in PLATFORMS:
        assert runner_labels_problem(list(platform.ci_runner)) is None, platform.name
    assert len({p.ci_runner for p in PLATFORMS}) == len(PLATFORMS)
    assert Runners().of(AARCH64) == AARCH64.ci_runner


@pytest.mark.parametrize(
    ("labels", "problem"),
    [
        ("ubuntu-24.04-arm", None),
        (["self-hosted", "linux", "ARM64"], None),
        ([], "expected a runner label or a non-empty list of them"),
        ({"group": "x"}, "expected a runner label or a non-empty list of them"),
        ([1], "runner label 1 is not a string"),
        (["a"] * 17, "17 runner labels; at most 16"),
        ("my runner", "runner label 'my runner' is not a label like ubuntu-24.04-arm"),
        ("${{ github.token }}", "runner label '${{ github.token }}' is not a label like"),
        ("-x", "runner label '-x' is not a label like"),
        ("a" * 101, "is not a label like ubuntu-24.04-arm"),
    ],
)
def test_runner_labels_problem(labels: object, problem: str | None) -> None:
    found = runner_labels_problem(labels)
    assert found == problem if problem is None else found is not None and problem in found


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (["aarch64=my-arm"], {"aarch64": ("my-arm",)}),
        (["aarch64=self-hosted, linux,ARM64"], {"aarch64": ("self-hosted", "linux", "ARM64")}),
        (['x86_64="ubuntu-latest"'], {"x86_64": ("ubuntu-latest",)}),
        (
            ['x86_64=["self-hosted","big"]', "aarch64=a"],
            {"x86_64": ("self-hosted", "big"), "aarch64": ("a",)},
        ),
    ],
)
def test_parse_runners(values: list[str], expected: dict[str, tuple[str, ...]]) -> None:
    runners = parse_runners(values)
    assert {p.name: labels for p, labels in runners.chosen.items()} == expected
    for platform in PLATFORMS:
        assert runners.of(platform) == expected.get(platform.name, platform.ci_runner)


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("aarch64", "expected PLATFORM=LABELS, like aarch64=my-runner-label"),
        ("arm64=x", "unknown platform 'arm64': expected one of x86_64, aarch64"),
        ("aarch64=", "runner label '' is not a label like"),
        ("aarch64=a,,b", "runner label '' is not a label like"),
        ("aarch64=[1]", "runner label 1 is not a string"),
        ("aarch64=[oops", "expected a runner label or a non-empty list of them"),
        ("aarch64=a b", "runner label 'a b' is not a label like"),
    ],
)
def test_a_bad_runner_is_refused_naming_it(value: str, said: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_runners([value])
    assert str(exc.value).startswith(f"--runner {value!r}: ") and said in str(exc.value), exc.value
    assert "\n" not in str(exc.value)


def test_a_platform_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"--runner 'aarch64=b': the runner of aarch64 is given twice"):
        parse_runners(["aarch64=a", "aarch64=b"])


# --- factory matrix on the production matrix ----------------------------------------------------------------


def test_factory_matrix_shows_the_production_matrix_s_aarch64_jobs(factory_cli: Cli) -> None:
    """Its flavor is devel (NVIDIA's images, multi-platform): the aarch64 jobs are planned, none dropped for
    their flavor, each on its platform's builder."""
    code, out = factory_cli(["matrix", "--matrix", str(PRODUCTION)])
    assert code == 0, out
    assert out.rstrip().endswith("60 jobs in 12 variants; 0 dropped"), out[-2000:]
    for variant in ("cu128-torch2.9-abi1-sm90.100.120", "cu130-torch2.14-abi1-sm90.100.121"):
        assert variant in out
    # each aarch64 variant's Pythons, said as such, in the Pythons column and the glibc one (its builder)
    assert out.count("3.14 aarch64") == 12
    assert out.count("3.14 aarch64: <= 2.35 (factory-builder:cu13.0-py3.14-devel-aarch64, glibc 2.35") == 4
    assert out.count("3.14 aarch64: <= 2.35 (factory-builder:cu12.8-py3.14-devel-aarch64, glibc 2.35") == 2
    assert "builds x86_64 only" not in out
    code, out = factory_cli(["matrix", "--matrix", str(PRODUCTION), "--json"])
    jobs = json.loads(out)["jobs"]
    assert sum(j.get("platform") == "aarch64" for j in jobs) == 30


def test_github_gives_each_job_a_runner_of_its_platform(factory_cli: Cli) -> None:
    rows = github(factory_cli, "--matrix", str(PRODUCTION))["include"]
    assert isinstance(rows, list) and len(rows) == 60
    assert by_platform(rows) == {
        "x86_64": [["self-hosted", "linux", "x64"]],
        "aarch64": [["ubuntu-24.04-arm"]],
    }
    assert all(row["job_id"].endswith("-aarch64") for row in rows if row.get("platform") == "aarch64")


def test_the_caller_overrides_a_platform_s_runner(factory_cli: Cli, tmp_path: Path) -> None:
    out = tmp_path / "github_output"
    argv = ["--matrix", str(PRODUCTION), "--runner", "aarch64=self-hosted,linux,ARM64", "--shards", "2"]
    plan = github(factory_cli, *argv, "--runner", 'x86_64=["big-x64"]', "--github-output", str(out))
    expected = {"x86_64": [["big-x64"]], "aarch64": [["self-hosted", "linux", "ARM64"]]}
    # the final builds and each shard: a shard compiles on a host of its job's platform too
    for matrix in ("finals", "shards"):
        assert by_platform(plan[matrix]["include"]) == expected, matrix
    written = dict(line.split("=", 1) for line in out.read_text().splitlines())
    assert by_platform(json.loads(written["matrix"])["include"]) == expected
    assert by_platform(json.loads(written["shards"])["include"]) == expected
    # one platform named: the other keeps its own
    rows = github(factory_cli, "--matrix", str(PRODUCTION), "--runner", "aarch64=my-arm")["include"]
    assert by_platform(rows) == {"x86_64": [["self-hosted", "linux", "x64"]], "aarch64": [["my-arm"]]}


MATRIX = """\
package: {name: flash-attn, version: "2.8.3"}
matrix:
  cuda: ["13.0"]
  torch: ["2.14"]
  python: ["3.12"]
  cxx11_abi: [true]
  arch: ["9.0"]
  platform: [x86_64, aarch64]
  include:
    - {platform: aarch64, runs_on: RUNS_ON}
build: {torch_index: {"13.0": default}}
"""


def test_an_include_entry_s_runs_on_wins(factory_cli: Cli, tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.replace("RUNS_ON", "[self-hosted, gh200]"))
    rows = github(factory_cli, "--matrix", str(path), "--runner", "aarch64=ignored")["include"]
    assert by_platform(rows) == {
        "x86_64": [["self-hosted", "linux", "x64"]],
        "aarch64": [["self-hosted", "gh200"]],
    }


@pytest.mark.parametrize("value", ["[]", '"a b"', "[x, {y: 1}]", '"${{ secrets.X }}"'])
def test_a_bad_include_runs_on_is_one_line_naming_its_line(
    factory_cli: Cli, tmp_path: Path, value: str
) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(MATRIX.replace("RUNS_ON", value))
    with pytest.raises(ConfigError, match=r"matrix.include\[0\].runs_on: "):
        load_matrix_file(path)
    code, out = factory_cli(["matrix", "--matrix", str(path), "--format", "github"])
    assert code == 2 and len(out.strip().splitlines()) == 1, out
    assert out.startswith(f"error: {path}:10: matrix.include[0].runs_on: "), out


@pytest.mark.parametrize(
    ("extra", "said"),
    [
        (["--runner", "aarch64=x"], "--runner and --github-output apply to --format github only"),
        (["-f", "github", "--runner", "riscv64=x"], "--runner 'riscv64=x': unknown platform 'riscv64'"),
        (["-f", "github", "--runner", "aarch64=a b"], "--runner 'aarch64=a b': runner label 'a b' is not"),
    ],
)
def test_cli_runner_usage_errors(factory_cli: Cli, extra: list[str], said: str) -> None:
    code, out = factory_cli(["matrix", "--matrix", str(PRODUCTION), *extra])
    assert code == 2 and len(out.strip().splitlines()) == 1 and said in out, out
    assert "Traceback" not in out


def test_the_matrix_file_s_own_platform_errors_are_one_line(factory_cli: Cli, tmp_path: Path) -> None:
    """Bad input before any container: an unknown platform on the axis, one line naming the file's line."""
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(MATRIX.replace("[x86_64, aarch64]", "[x86_64, arm]")))
    for command in (["matrix"], ["build", "--dry-run"]):
        code, out = factory_cli([*command, "--matrix", str(path)])
        assert code == 2, out
        assert out.strip() == f"error: {path}:8: unknown platform 'arm': expected one of x86_64, aarch64"
