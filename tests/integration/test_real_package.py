"""A real third-party sdist, built end to end with a real CUDA 12 toolkit: causal-conv1d 1.7.0 from the
configured index, by its built-in recipe alone (`recipe: causal-conv1d`), for sm_80 against torch 2.10 (a CUDA
12.8 build) with the debian flavor (Debian trixie's nvidia-cuda-toolkit 12.4), through the `factory build`
command line; its wheel then installed with pip into a fresh Python 3.13 venv beside torch 2.10 and imported
(an extension imports without a GPU), in a container of its own with no network.

One module-scoped build (about 5 minutes on two cores; its compiles are kept across sessions as a CI cache
would keep them, `homes.kept_compile_cache`, so a warm run links what an earlier one compiled with the same
inputs), several assertions on it. Before it, every built-in
recipe's patches are tried against the real sdist they were made for (`factory matrix --check`). The CUDA 13
and C++20 path of a real package is the flash-attn preflight's (test_preflight_flash_attn.py).
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from elftools.elf.elffile import ELFFile
from homes import SHARED, fresh_home, kept_compile_cache
from packaging.utils import parse_wheel_filename

from factory.build.jobspec import requirements
from factory.build.wheelhouse import download_wheelhouse
from factory.core.home import factory_home
from factory.plan.plan import plan_matrix
from factory.spec.config import load_matrix_file
from factory.spec.recipes import BUILTIN_RECIPES
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory.cli"]
JOB = "cu128-torch2.10-abi1-sm80-py313"
LABEL = "cu12.8.torch2.10.abi1.sm80"
IMAGE = "factory-builder:cu12.4-trixie-debian"


@pytest.mark.parametrize("name", sorted(n for n, r in BUILTIN_RECIPES.items() if r.patches))
def test_builtin_patches_apply_to_the_sdists_they_were_made_for(name: str, tmp_path: Path) -> None:
    recipe = BUILTIN_RECIPES[name]
    assert recipe.versions is not None and recipe.versions.startswith("==")
    version = recipe.versions.removeprefix("==").removesuffix(".*")
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f'package: {{name: {recipe.package}, version: "{version}"}}\nrecipe: {name}\n'
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["8.0"]}\n'
    )
    proc = subprocess.run(
        [*FACTORY, "matrix", "--matrix", str(matrix), "--check"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    count = len(recipe.patches)
    assert proc.stdout.rstrip().endswith(
        f"{'es apply' if count > 1 else ' applies'} to "
        + (f"{recipe.package.replace('-', '_')}-{version}.tar.gz")
    ), proc.stdout
    assert proc.stderr == ""  # no warning: the version is the one the patches were made for


@pytest.fixture(scope="module")
def real_build(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, session_factory_home: Path
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("real-package")
    home = fresh_home(tmp, "home", session_factory_home, shared=SHARED)
    matrix = tmp / "matrix.yaml"
    matrix.write_text(
        textwrap.dedent(
            """\
            package: {name: causal-conv1d, version: "1.7.0"}
            recipe: causal-conv1d
            matrix:
              cuda: ["12.8"]
              torch: ["2.10"]
              python: ["3.13"]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
              flavor: debian
              torch_index: {"12.8": default}
            """
        )
    )
    out = tmp / "wheels"
    with kept_compile_cache(home, session_factory_home, "real-package"):
        proc = subprocess.run(
            [*FACTORY, "build", "--matrix", str(matrix), "--output", str(out)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "FACTORY_HOME": str(home)},
        )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    job = {j["job_id"]: j for j in report["jobs"]}[JOB]
    return {"proc": proc, "out": out, "report": report, "job": job, "tmp": tmp, "matrix": matrix}


def _wheel(real_build: dict[str, Any]) -> Path:
    job = real_build["job"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    return real_build["out"] / job["wheel"]


def test_build_succeeds_without_warnings_about_the_recipe(real_build: dict[str, Any]) -> None:
    proc = real_build["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    # 1.7.0 is the version the recipe's patch was made for: nothing to warn about
    assert "were made for" not in proc.stderr
    assert real_build["job"]["result"] == "ok", real_build["job"]["log_tail"]


def test_debian_toolkit_compiled_it(real_build: dict[str, Any]) -> None:
    """Debian's CUDA 12.4 nvcc compiled for torch's CUDA 12.8: the report and the summary say so, and torch's
    extension builder saw the minor mismatch it accepts with a warning."""
    job = real_build["job"]
    assert job["image"] == IMAGE and job["toolkit"] == "12.4"
    summary = real_build["proc"].stderr
    assert f"{JOB}  ok" in summary and "nvcc 12.4" in summary
    log = Path(job["log"]).read_text()
    assert "The detected CUDA version (12.4) has a minor version mismatch" in log
    assert "-gencode=arch=compute_80,code=sm_80" in log


def test_wheel_carries_exactly_sm80_device_code(real_build: dict[str, Any]) -> None:
    """The recipe's patch dropped setup.py's nine fixed -gencode flags: TORCH_CUDA_ARCH_LIST alone decides."""
    wheel = _wheel(real_build)
    with zipfile.ZipFile(wheel) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
        assert sos == ["causal_conv1d_cuda.cpython-313-x86_64-linux-gnu.so"]
        data = zf.read(sos[0])
        assert device_code(data).cubin_archs == frozenset({80})
    # the runtime it needs is the soname torch 2.10's nvidia-cuda-runtime-cu12 wheel provides
    dynamic = ELFFile(io.BytesIO(data)).get_section_by_name(".dynamic")
    assert "libcudart.so.12" in {tag.needed for tag in dynamic.iter_tags() if tag.entry.d_tag == "DT_NEEDED"}
    # and the factory's own wheel check said so in the report
    log = Path(real_build["job"]["log"]).read_text()
    assert '"phase": "install-check"' in log and '"phase": "done"' in log


def test_wheel_name_metadata_version_and_torch_pin(real_build: dict[str, Any]) -> None:
    wheel = _wheel(real_build)
    name, version, _build, tags = parse_wheel_filename(wheel.name)
    assert name == "causal-conv1d" and str(version) == f"1.7.0+{LABEL}"
    # auditwheel's tag for the trixie base's symbols: manylinux, never newer than its glibc 2.41
    (tag,) = tags
    assert (tag.interpreter, tag.abi) == ("cp313", "cp313")
    assert tag.platform.startswith("manylinux_2_") and tag.platform.endswith("_x86_64"), tag
    assert int(tag.platform.split("_")[2]) <= 41
    # the report says which sdist, by hash, the wheel was built from
    source = real_build["report"]["source"]
    assert source["kind"] == "pypi" and source["sdist"] == "causal_conv1d-1.7.0.tar.gz"
    assert len(source["sha256"]) == 64
    with zipfile.ZipFile(wheel) as zf:
        metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        lines = zf.read(metadata).decode().splitlines()
    assert f"Version: 1.7.0+{LABEL}" in lines
    assert "Requires-Dist: torch==2.10.*" in lines


def test_wheel_installs_with_pip_and_imports(real_build: dict[str, Any], docker_client: Any) -> None:
    """pip, in a fresh Python 3.13 venv (the trixie base: this host has no 3.13) with no network, installs the
    wheel and the torch 2.10 its pin allows from the job's own wheelhouse, and the extension imports."""
    wheel = _wheel(real_build)
    mf = load_matrix_file(real_build["matrix"])
    (job,) = plan_matrix(mf).jobs
    wheelhouse = download_wheelhouse(requirements(mf, job), factory_home() / "wheelhouses", python="3.13")
    script = (
        "set -e; python3.13 -m venv /tmp/venv; "
        "/tmp/venv/bin/pip install -q --disable-pip-version-check --no-index --find-links /wheelhouse "
        f"/in/{wheel.name}; cd /tmp; /tmp/venv/bin/python -I -c "
        '"import importlib.metadata as m, torch, causal_conv1d, causal_conv1d_cuda as c; '
        "print(m.version('causal-conv1d'), torch.__version__, c.__file__)\""
    )
    out = docker_client.containers.run(
        "factory-base:trixie",
        ["sh", "-c", script],
        remove=True,
        network_mode="none",
        volumes={
            str(wheelhouse): {"bind": "/wheelhouse", "mode": "ro"},
            str(wheel.parent): {"bind": "/in", "mode": "ro"},
        },
    )
    version, torch_version, where = out.decode().split()[-3:]
    assert version == f"1.7.0+{LABEL}"
    assert torch_version.startswith("2.10.")
    assert where.startswith("/tmp/venv/")
