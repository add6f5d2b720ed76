"""A package with no recipe, as a new user brings it, through the real factory (dockerd, the forky builder
image, real nvcc, torch 2.14, uv and pip in fresh venvs).

The fixture (tests/fixtures/norecipe) is an unpacked sdist whose setup.py reads no version variable, builds
a CUDA module and a plain C++ one (no kernels), and whose PKG-INFO lists a runtime requirement, six, that
is no build requirement and that the package imports. The matrix declares a recipe mapping with a name
and nothing else, no `base:` (as a user writes a first recipe): its other keys come from `torch-ext`
(FORCE_CUDA=1, TORCH_CUDA_ARCH_LIST), as docs/MATRIX.md says; issue 42 §3 found it starting from an empty
recipe instead, and the package built host code alone. The factory must download six for the install
check before the build, find from the build's links that `_version_cpu` carries no kernels, and give the
wheel its variant label in its file name, METADATA and .dist-info, so that pip installs it and its metadata
shows the label.

One build of one job (three small compiles, the torch install of the check): 2-4 minutes on 2 busy cores with
the image and the cp313 wheelhouse there.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from packaging.utils import parse_wheel_filename
from test_build import FACTORY, ROOT

from factory.build import engine
from factory.memory import profiles
from factory.wheel import checks
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURE = ROOT / "tests" / "fixtures" / "norecipe"
IMAGE = "factory-builder:cu13.0-forky-pypi"
LABEL = "cu13.0.torch2.14.abi1.sm80"
HOST_ONLY = "factory_norecipe/_version_cpu.cpython-313-x86_64-linux-gnu.so"
KERNELS = "factory_norecipe/_kernels.cpython-313-x86_64-linux-gnu.so"


def norecipe_matrix(tmp: Path) -> Path:
    path = tmp / "matrix.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package:
              name: factory-norecipe
              version: "0.1.0"
              source: {{path: {FIXTURE}}}
            recipe: {{name: my-first-recipe}}
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.13"]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
              flavor: pypi
              memory: 6GiB
              cpus: 2
              torch_index: {{"13.0": default}}
            """
        )
    )
    return path


@pytest.fixture(scope="module")
def norecipe_build(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, session_factory_home: Path
) -> dict[str, Any]:
    require(engine.get_image(docker_client, IMAGE) is not None, f"{IMAGE} (make images)")
    tmp = tmp_path_factory.mktemp("norecipe")
    out = tmp / "wheels"
    proc = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "--matrix", str(norecipe_matrix(tmp)), "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FACTORY_HOME": str(session_factory_home)},
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    return {"proc": proc, "out": out, "job": job, "home": session_factory_home}


def test_a_package_without_a_recipe_builds_and_passes_its_checks(norecipe_build: dict[str, Any]) -> None:
    job, proc = norecipe_build["job"], norecipe_build["proc"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the runtime requirement came from PKG-INFO, its marker and extra evaluated for 3.13, torch left out
    assert job["check_requirements"] == ["six"]
    log = Path(job["log"]).read_text(errors="replace")
    assert "runtime requirements (PKG-INFO): six, for the install check" in log
    # the factory's install check imported it (six and both modules) and its metadata has the label
    assert f"factory_norecipe metadata version 0.1.0+{LABEL}" in log


def test_the_host_only_module_is_found_from_the_build(norecipe_build: dict[str, Any]) -> None:
    job = norecipe_build["job"]
    assert job["host_only"] == [HOST_ONLY]
    with zipfile.ZipFile(norecipe_build["out"] / job["wheel"]) as zf:
        assert device_code(zf.read(KERNELS)).cubin_archs == frozenset({80})
        assert not device_code(zf.read(HOST_ONLY)).cubin_archs


def test_progress_counts_every_extension_s_compiles(norecipe_build: dict[str, Any]) -> None:
    (attempt,) = norecipe_build["job"]["attempts"]
    # two ninja runs, one per extension: version.cpp, then bindings.cpp and twice.cu
    assert (attempt["objects_compiled"], attempt["objects_planned"]) == (3, 3)
    # the next build's progress counts against this one's whole total from its first compile on
    assert profiles.load_compile_total("factory-norecipe", "0.1.0", home=norecipe_build["home"]) == 3


def test_a_build_that_ran_nvcc_warns_of_nothing(norecipe_build: dict[str, Any]) -> None:
    job = norecipe_build["job"]
    assert job["warnings"] == []  # FORCE_CUDA came from torch-ext: nvcc ran
    assert "no nvcc yet" not in Path(job["log"]).read_text(errors="replace")


def test_the_wheel_carries_the_label_everywhere_and_pip_installs_it(
    norecipe_build: dict[str, Any], docker_client: Any
) -> None:
    job, out = norecipe_build["job"], norecipe_build["out"]
    wheel = out / job["wheel"]
    name, version, _build, _tags = parse_wheel_filename(wheel.name)
    assert (name, str(version)) == ("factory-norecipe", f"0.1.0+{LABEL}")
    assert checks.wheel_archive_problems(wheel) == []  # RECORD matches every file, paths and hashes
    with zipfile.ZipFile(wheel) as zf:
        dist_info = f"factory_norecipe-0.1.0+{LABEL}.dist-info"
        assert {n.split("/")[0] for n in zf.namelist() if ".dist-info/" in n} == {dist_info}
        metadata = zf.read(f"{dist_info}/METADATA").decode()
        assert f"Version: 0.1.0+{LABEL}" in metadata.splitlines()
        assert "Requires-Dist: six" in metadata.splitlines()
    # pip, not uv (the factory's check): a fresh venv of the image's python3.13, the wheel alone
    script = (
        "python3.13 -m venv /tmp/v && /tmp/v/bin/pip install -q --no-index --no-deps /w/"
        + wheel.name
        + " && /tmp/v/bin/python -c \"import importlib.metadata as m; print(m.version('factory-norecipe'))\""
    )
    output = docker_client.containers.run(
        IMAGE,
        ["sh", "-c", script],
        volumes={str(out): {"bind": "/w", "mode": "ro"}},
        network_mode="none",
        remove=True,
    )
    assert output.decode().strip().splitlines()[-1] == f"0.1.0+{LABEL}"
