"""`factory matrix` output formats and options."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from factory.cli import app
from factory.errors import ConfigError

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
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--format", "json"])
    assert result.exit_code == 0, result.output
    jobs = json.loads(result.output)
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
    assert j["local_version"] == "cu13.0.torch2.9.abi1.sm80.100" and j["verified"] is True
    assert j["env"] == {"NVCC_THREADS": "1"} and j["runner"] == "big"
    assert "env" not in jobs[0]


def test_github(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "--format", "github"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert list(data) == ["include"] and len(data["include"]) == 2


def test_only_filters_by_variant_or_job_id(tmp_path: Path) -> None:
    path = str(write(tmp_path))
    result = runner.invoke(app, ["matrix", "--matrix", path, "-f", "json", "--only", "cu130-*"])
    assert [j["cuda"] for j in json.loads(result.output)] == ["13.0"]
    result = runner.invoke(app, ["matrix", "--matrix", path, "-f", "json", "--only", "*-py311"])
    assert len(json.loads(result.output)) == 2
    result = runner.invoke(app, ["matrix", "--matrix", path, "-f", "json", "--only", "nothing*"])
    assert json.loads(result.output) == []


def test_no_prune(tmp_path: Path) -> None:
    result = runner.invoke(app, ["matrix", "--matrix", str(write(tmp_path)), "-f", "json", "--no-prune"])
    jobs = json.loads(result.output)
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
    assert "ok: 2 jobs in 2 variants, 2 dropped, 0 unverified" in result.output


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
    result = runner.invoke(app, ["matrix", "--matrix", str(path), "--format", "json"])
    assert result.exit_code == 0, result.output
    (job,) = json.loads(result.output)
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
    result = runner.invoke(app, ["matrix", "--matrix", str(path), "--format", "json", "--flavor", "devel"])
    assert result.exit_code == 0, result.output
    (job,) = json.loads(result.output)
    assert job["arch"] == "8.0;12.0" and "toolkit" not in job
    bad = runner.invoke(app, ["matrix", "--matrix", str(path), "--flavor", "conda"])
    assert isinstance(bad.exception, ConfigError)
    assert str(bad.exception) == "--flavor 'conda' must be one of 'devel', 'pypi', 'manylinux', 'debian'"
