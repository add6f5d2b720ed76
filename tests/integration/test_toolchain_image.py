"""The multi-Python builder image for real: `factory-builder:cu13.0-forky-pypi` carries Python 3.13, 3.14 and
3.15 side by side and one compiler, g++-14, under every name a build looks for; its nvcc compiles a file that
includes <cmath> against forky's glibc (which CUDA 13.0's headers, as shipped, refuse).

Made when missing (debootstrap of forky and the image: about 1.5 minutes), reused when present. The whole
build of the demo extension for 3.13 and 3.14 in this image is the manual proof in docs/DESIGN.md (about 4-5
minutes warm on 2 cores, more than an integration test may take).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import require

from factory.build import engine, images

pytestmark = pytest.mark.integration

CUDA = "13.0"
PYTHONS = ("3.13", "3.14", "3.15")
KERNEL = r"""
#include <cmath>
#include <Python.h>
__global__ void k(float *x, double *y) { x[0] = rsqrtf(x[0]); y[0] = rsqrt(y[0]) + PY_MINOR_VERSION; }
int main() { return 0; }
"""


@pytest.fixture(scope="module")
def toolchain_image(docker_client: Any) -> Iterator[str]:
    if engine.get_image(docker_client, "factory-base:forky") is None:
        require(
            shutil.which("debootstrap") is not None or os.path.exists("/usr/sbin/debootstrap"), "debootstrap"
        )
        require(os.geteuid() == 0, "root (for debootstrap)")
    # 3.13 and 3.14 name the same image; asking for both makes it once.
    tags = {
        images.ensure_builder_image(docker_client, cuda=CUDA, python=p, flavor="pypi")
        for p in ("3.13", "3.14")
    }
    assert tags == {"factory-builder:cu13.0-forky-pypi"}
    yield tags.pop()


def run(docker_client: Any, image: str, script: str, **kwargs: Any) -> str:
    out = docker_client.containers.run(
        image, ["bash", "-c", script], remove=True, network_disabled=True, stderr=True, **kwargs
    )
    return out.decode()


def test_toolchain_image_labels_name_its_pythons_and_gcc(docker_client: Any, toolchain_image: str) -> None:
    labels = docker_client.images.get(toolchain_image).labels
    assert labels[images.LABEL_PYTHON] == " ".join(PYTHONS)
    assert labels[images.LABEL_GCC] == "14"
    assert labels[images.LABEL_SUITE] == "forky"
    assert labels[images.LABEL_BASE] == "factory-base:forky"
    assert docker_client.images.get("factory-base:forky").labels[images.LABEL_GCC] == "14"


def test_every_python_and_one_compiler(docker_client: Any, toolchain_image: str) -> None:
    pythons = " ".join(PYTHONS)
    out = run(
        docker_client,
        toolchain_image,
        f"set -e; for p in {pythons}; do python$p -c 'import sys, sysconfig, venv; "
        'print("%d.%d" % sys.version_info[:2], sysconfig.get_paths()["include"])\'; done; '
        "for c in gcc g++ cc c++ x86_64-linux-gnu-gcc x86_64-linux-gnu-g++; do "
        "echo $c $($c -dumpversion); done; "
        "python3 --version",
    )
    lines = out.splitlines()
    assert [line.split()[0] for line in lines[:3]] == list(PYTHONS)
    assert all(line.split()[1] == f"/usr/include/python{line.split()[0]}" for line in lines[:3])
    compilers = dict(line.split() for line in lines[3:9])
    assert set(compilers.values()) == {"14"}, compilers
    assert lines[9].startswith("Python 3.")  # the driver's `python3 -m`


def test_nvcc_compiles_cmath_against_forkys_glibc_for_each_python(
    docker_client: Any, toolchain_image: str, tmp_path: Path
) -> None:
    """Every Python's headers, one host compiler (nvcc's `gcc` from PATH is g++-14), glibc >= 2.42's rsqrt."""
    (tmp_path / "k.cu").write_text(KERNEL)
    tmp_path.chmod(0o777)
    script = "set -e; " + "; ".join(
        f"nvcc -std=c++20 -arch=sm_80 -I/usr/include/python{p} -c /w/k.cu -o /tmp/k{p}.o && echo built {p}"
        for p in PYTHONS
    )
    out = run(docker_client, toolchain_image, script, volumes={str(tmp_path): {"bind": "/w", "mode": "ro"}})
    assert [line for line in out.splitlines() if line.startswith("built")] == [f"built {p}" for p in PYTHONS]
