"""`factory matrix` output formats and options."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from factory.cli import app
from factory.core.errors import ConfigError

runner = CliRunner()
BODY = """\
package: {name: flash-attn, version: "2.8.3"}
matrix:
  cuda: ["12.6", "13.0"]
  torch: ["2.9"]
  python: ["3.9", "3.11"]
  cxx11_abi: [true]
  arch: ["7.0;8.0;10.0"]
  include:
    - cuda: "13.0"
      env: {NVCC_THREADS: "1"}
      runner: big
"""


def write(tmp_path: Path) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(BODY))
    return path


def test_json(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.stdout)["jobs"]
    assert [j["job_id"] for j in jobs] == [
        "cu126-torch2.9-abi1-sm80-py311",
        "cu130-torch2.9-abi1-sm80.100-py311",
    ]
    j = jobs[1]
    assert j["id"] == "cu130-torch2.9-abi1-sm80.100"
    assert (j["package"], j["version"], j["cuda"], j["torch"], j["python"]) == (
        "flash-attn",
        "2.8.3",
        "13.0",
        "2.9",
        "3.11",
    )
    assert j["cxx11_abi"] is True and j["arch"] == "8.0;10.0"
    assert j["local_version"] == "cu13.0.torch2.9.abi1.sm80.100" and j["known"] is True
    assert j["env"] == {"NVCC_THREADS": "1"} and j["runner"] == "big"
    assert "env" not in jobs[0]


def test_github(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--format", "github"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert list(data) == ["include"] and len(data["include"]) == 2


def test_only_filters_by_variant_or_job_id(tmp_path: Path) -> None:
    path = str(write(tmp_path))
    result = runner.invoke(app, ["matrix", "--matrix", path, "--json", "--only", "cu130-*"])
    assert [j["cuda"] for j in json.loads(result.stdout)["jobs"]] == ["13.0"]
    result = runner.invoke(app, ["matrix", "--matrix", path, "--json", "--only", "*-py311"])
    assert len(json.loads(result.stdout)["jobs"]) == 2


def test_no_prune(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json", "--no-prune"])
    jobs = json.loads(result.stdout)["jobs"]
    assert len(jobs) == 4 and all(j["arch"] == "7.0;8.0;10.0" for j in jobs)


def test_table_shows_reasons(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "cu130-torch2.9-abi1-sm80.100" in out
    assert "dropped" in out and "no wheels for Python 3.9" in out
    assert "trimmed" in out
    assert "2 jobs in 2 variants; 2 dropped" in out


def test_check(tmp_path: Path) -> None:
    # flash-attn's recipe has patches: --no-source keeps this test off the network (test_recipes tries them)
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--check", "--no-source"])
    assert result.exit_code == 0
    assert "ok: 2 jobs in 2 variants, 2 dropped, 0 unknown" in result.output


DEBIAN = """\
package: {name: flash-attn, version: "2.8.3"}
matrix:
  cuda: ["CUDA"]
  torch: ["2.10"]
  python: ["3.13"]
  cxx11_abi: [true]
  arch: ["ARCHS"]
build:
  flavor: debian
"""


def write_debian(tmp_path: Path, *, cuda: str = "12.8", archs: str = "8.0") -> Path:
    path = tmp_path / "debian.yaml"
    path.write_text(DEBIAN.replace("CUDA", cuda).replace("ARCHS", archs))
    return path


def test_debian_flavor_shows_its_toolkit(tmp_path: Path) -> None:
    path = write_debian(tmp_path, archs="8.0;9.0")
    result = runner.invoke(app, ["matrix", "--matrix", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (job,) = json.loads(result.stdout)["jobs"]
    assert job["cuda"] == "12.8" and job["toolkit"] == "12.4"
    table = runner.invoke(app, ["matrix", "--matrix", str(path)])
    assert "compiled with CUDA 12.4's nvcc" in " ".join(table.output.split())


def refusal(path: Path) -> str:
    """The one-line configuration error (exit 2) `factory matrix --check` stops with."""
    result = runner.invoke(app, ["matrix", "--matrix", str(path), "--check", "--no-source"])
    assert isinstance(result.exception, ConfigError), result.output
    assert result.exception.exit_code == 2
    line = str(result.exception)
    assert "\n" not in line
    return line


def test_an_arch_the_flavors_toolkit_cannot_compile_is_refused(tmp_path: Path) -> None:
    path = write_debian(tmp_path, archs="8.0;12.0")
    line = refusal(path)
    assert f"{path}: arch 12.0: flavor debian compiles the CUDA 12.8 variant with CUDA 12.4" in line
    assert "sm_120 (needs CUDA >= 12.8)" in line and "flavor devel (CUDA 12.8) can" in line


def test_the_debian_flavor_refuses_a_cuda_13_variant(tmp_path: Path) -> None:
    path = write_debian(tmp_path, cuda="13.0")
    line = refusal(path)
    assert "flavor debian: no Debian suite's nvidia-cuda-toolkit builds CUDA 13.0" in line


def test_flavor_option_overrides_the_matrix_files(tmp_path: Path) -> None:
    path = write_debian(tmp_path, archs="8.0;12.0")
    # the file's debian flavor cannot compile sm_120; with --flavor devel the variant's own CUDA does
    result = runner.invoke(app, ["matrix", "--matrix", str(path), "--json", "--flavor", "devel"])
    assert result.exit_code == 0, result.output
    (job,) = json.loads(result.stdout)["jobs"]
    assert job["arch"] == "8.0;12.0" and "toolkit" not in job
    bad = runner.invoke(app, ["matrix", "--matrix", str(path), "--flavor", "conda"])
    assert isinstance(bad.exception, ConfigError)
    assert str(bad.exception) == "--flavor 'conda' must be one of 'devel', 'pypi', 'manylinux', 'debian'"


def test_json_lists_the_dropped_rows_with_their_reasons(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert list(data) == ["jobs", "dropped"]
    assert len(data["jobs"]) == 2 and len(data["dropped"]) == 2
    for row in data["dropped"]:
        assert list(row) == ["id", "reason", "values"]
        assert row["values"]["python"] == "3.9" and "no wheels for Python 3.9" in row["reason"]
        assert row["id"].endswith("-py39")


def test_format_json_is_a_deprecated_alias_with_its_old_shape(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--format", "json"])
    assert result.exit_code == 0, result.output
    new = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json"])
    assert json.loads(result.stdout) == json.loads(new.stdout)["jobs"]
    assert "--format json is deprecated: use --json" in result.stderr


def test_json_and_another_format_are_refused(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json", "-f", "github"])
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == "--json and --format github: give one"


def test_only_that_matches_nothing_is_refused_as_build_refuses_it(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    path = str(write(tmp_path))
    said = []
    for argv in (["matrix"], ["matrix", "--json"], ["build", "--dry-run"]):
        code, output = factory_cli([*argv, "--matrix", path, "--only", "nothing*"])
        assert code == 2
        said.append(output.strip())
    assert said == [f"error: {path}: no job matches --only 'nothing*'"] * 3


def test_only_that_matches_a_dropped_row_shows_it(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--json", "--only", "*-py39"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["jobs"] == [] and len(data["dropped"]) == 2


def test_github_outputs_are_one_json_style(tmp_path: Path) -> None:
    """stdout and $GITHUB_OUTPUT, with and without shards: compact, keys sorted, one line."""
    out = tmp_path / "github_output"
    for extra in ([], ["--shards", "2"]):
        argv = ["matrix", "--matrix", str(write(tmp_path)), "-f", "github", "--github-output", str(out)]
        result = runner.invoke(app, [*argv, *extra])
        assert result.exit_code == 0, result.output
        printed = result.stdout.strip()
        assert "\n" not in printed
        assert printed == json.dumps(json.loads(printed), separators=(",", ":"), sort_keys=True)
    for line in out.read_text().splitlines():
        value = line.split("=", 1)[1]
        assert value == json.dumps(json.loads(value), separators=(",", ":"), sort_keys=True)


def test_the_table_without_a_terminal_breaks_no_word(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path))])
    assert result.exit_code == 0, result.output
    # each dropped row's reason is on its row's line, whole
    rows = [line for line in result.stdout.splitlines() if "-py39" in line]
    assert len(rows) == 2 and all("no wheels for Python 3.9" in row for row in rows)
