"""The pypi flavor's builder for a glibc floor below forky's, for real:
`factory-builder:cu13.0-bookworm-cpython-pypi` (bookworm's glibc 2.36 and GCC 12, a CPython 3.13 compiled
from the mirror's source tarball) builds the demo
extension for Python 3.13 with `build.glibc: "2.36"`; the wheel's manylinux tag is at or below 2_36, and pip
installs it beside torch in a fresh container of that base (no toolkit, no network) where it imports.

Not part of `make test`: making the image compiles CPython (several minutes on 2 cores, docs/PUBLISH.md has
the figures) and the demo job for 3.13 adds minutes more, beyond what CI's budget leaves for one test. `make
test-floor-builder` runs it (FACTORY_TEST_FLOOR_BUILDER=1); everywhere else it is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix
from factory.build import images
from factory.core.tags import parse_manylinux

# The gate of every test that needs the floor builder (test_dependency_build.py's floor variant too): a skip
# by marker, never `require`, so under CI=true it stays a skip.
FLOOR_BUILDER = pytest.mark.skipif(
    os.environ.get("FACTORY_TEST_FLOOR_BUILDER") != "1",
    reason="the source-built CPython image takes minutes to make: `make test-floor-builder` runs this",
)
pytestmark = [pytest.mark.integration, pytest.mark.slow, FLOOR_BUILDER]

ROOT = Path(__file__).resolve().parents[2]
CUDA = "13.0"
FLOOR = "2.36"
IMAGE = "factory-builder:cu13.0-bookworm-cpython-pypi"
BASE = "factory-base:bookworm-cpython"


@pytest.fixture(scope="module")
def floor_image(docker_client: Any) -> str:
    messages: list[str] = []
    tag = images.ensure_builder_image(
        docker_client, cuda=CUDA, python="3.13", flavor="pypi", floor=FLOOR, progress=messages.append
    )
    assert tag == IMAGE
    return tag


def run(docker_client: Any, image: str, script: str, **kwargs: Any) -> str:
    out = docker_client.containers.run(
        image, ["bash", "-c", script], remove=True, network_disabled=True, stderr=True, **kwargs
    )
    return str(out.decode())


def test_the_image_is_bookworms_glibc_with_a_source_built_python(
    docker_client: Any, floor_image: str
) -> None:
    out = run(
        docker_client,
        floor_image,
        "ldd --version | head -1; g++ -dumpversion; python3.13 -c 'import sys, sysconfig, ssl, ctypes; "
        'print("%d.%d" % sys.version_info[:2], sysconfig.get_paths()["include"])\'; nvcc --version | tail -1',
    )
    lines = out.splitlines()
    assert lines[0].endswith(" 2.36")
    assert lines[1] == "12"
    assert lines[2] == "3.13 /opt/python3.13/include/python3.13"
    assert "cuda_13.0" in lines[3]
    labels = docker_client.images.get(floor_image).labels
    assert labels[images.LABEL_BASE] == BASE
    assert labels[images.LABEL_SUITE] == "bookworm"
    base = docker_client.images.get(BASE).labels
    assert base[images.LABEL] == "base" and base[images.LABEL_PYTHON] == "3.13"


def test_a_python_313_wheel_at_the_floor_installs_on_the_older_base(
    docker_client: Any, floor_image: str, tmp_path: Path
) -> None:
    matrix = write_matrix(
        DEMO,
        tmp_path / "matrix.yaml",
        matrix={"python": ["3.13"], "arch": ["8.0"]},
        build={"glibc": FLOOR},
        publish=None,
    )
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory.cli",
            "build",
            "--matrix",
            str(matrix),
            "--output",
            str(out),
            "--trust-paths",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (job,) = report["jobs"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    wheel = out / job["wheel"]
    platform = wheel.name.removesuffix(".whl").rsplit("-", 1)[-1]
    parsed = parse_manylinux(platform)
    assert parsed is not None and parsed.glibc <= (2, 36), platform
    assert wheel.name.startswith("factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80-cp313-cp313-manylinux_2_")
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    torch_pin = next(
        line.split(" ", 1)[1] for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")
    )
    # A consumer on the older base: a fresh venv of its Python 3.13, torch and its CUDA wheels from the
    # job's wheelhouse (the host downloaded them), the wheel, no network, no toolkit; then import both.
    shared = Path(os.environ["FACTORY_HOME"]) / "wheelhouses"
    found = re.search(r"==\s*(\d+(?:\.\d+)*)", torch_pin)  # "torch==2.14.*": the release it names
    pinned = found.group(1) if found else "2.14"
    houses = [
        p.parent
        for p in shared.glob(f"*/torch-{pinned}*-cp313-*.whl")
        if any(p.parent.glob("nvidia_cuda_runtime*.whl"))  # torch with its CUDA wheels, as the check had it
    ]
    assert houses, "the job's wheelhouse with torch for cp313"
    script = (
        "set -e; python3.13 -m venv /tmp/v; "
        f"/tmp/v/bin/pip install --quiet --no-index --find-links /house /wheels/{wheel.name} '{torch_pin}'; "
        "/tmp/v/bin/python -c "
        "'import torch, factory_demo_ext, sys; print(sys.version_info[:2], torch.__version__)'"
    )
    result = run(
        docker_client,
        BASE,
        script,
        volumes={
            str(houses[0]): {"bind": "/house", "mode": "ro"},
            str(out): {"bind": "/wheels", "mode": "ro"},
        },
    )
    assert "(3, 13) 2.14" in result, result[-2000:]
