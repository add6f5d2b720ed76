"""Builder images and wheelhouses for real: debootstrap, dockerd, pip download and nvcc inside the image.

The base and builder images are the factory's ordinary ones (`factory-base:bookworm`,
`factory-builder:cu13.0-py3.11-pypi`): made when missing, reused when present, so a warm CI run is quick.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import require

from factory.build import engine, images
from factory.build.wheelhouse import POOL, download_wheelhouse, link_wheels, wheel_files
from factory.core.errors import FactoryError, ImageError

pytestmark = pytest.mark.integration

CUDA = "13.0"
PYTHON = "3.11"
KERNEL = r"""
#include <cstdio>
__global__ void axpy(float *y, const float *x, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] += a * x[i];
}
int main() {
    float *x, *y;
    cudaMalloc(&x, 1024 * sizeof(float));
    cudaMalloc(&y, 1024 * sizeof(float));
    axpy<<<4, 256>>>(y, x, 2.0f, 1024);
    cudaDeviceSynchronize();
    std::puts("ok");
    return 0;
}
"""


def _factory_cli() -> list[str]:
    script = Path(sys.executable).with_name("factory")
    require(script.exists(), f"the factory console script next to {sys.executable}")
    return [str(script)]


@pytest.fixture(scope="module")
def builder(docker_client: Any) -> Iterator[str]:
    if engine.get_image(docker_client, images.DEFAULT_BASE_IMAGE) is None:
        require(
            shutil.which("debootstrap") is not None or os.path.exists("/usr/sbin/debootstrap"), "debootstrap"
        )
        require(os.geteuid() == 0, "root (for debootstrap)")
    messages: list[str] = []
    tag = images.ensure_builder_image(
        docker_client,
        cuda=CUDA,
        python=PYTHON,
        flavor="pypi",
        base_image=images.DEFAULT_BASE_IMAGE,
        progress=messages.append,
    )
    yield tag


def _device_archs(binary: bytes) -> set[int]:
    """SM numbers of the cubins embedded in a host binary's fatbin (each is a little ELF)."""
    archs = set()
    start = binary.find(b"\x7fELF", 1)  # skip the host ELF itself
    while start >= 0:
        osabi, abi_version = binary[start + 7], binary[start + 8]
        flags = struct.unpack_from("<I", binary, start + 48)[0]
        if osabi == 0x41 or (osabi == 0x33 and abi_version >= 8):
            archs.add((flags >> 8) & 0xFF)
        elif osabi == 0x33:
            archs.add(flags & 0xFF)
        start = binary.find(b"\x7fELF", start + 1)
    return archs


def test_builder_image_labels(docker_client: Any, builder: str) -> None:
    assert builder == "factory-builder:cu13.0-py3.11-pypi"
    labels = docker_client.images.get(builder).labels
    assert labels[images.LABEL] == "builder"
    assert labels[images.LABEL_CUDA] == CUDA
    assert labels[images.LABEL_PYTHON] == PYTHON
    assert labels[images.LABEL_FLAVOR] == "pypi"
    assert labels[images.LABEL_TOOLKIT].startswith("13.0.")
    assert len(labels[images.LABEL_INPUTS]) == 64
    base_labels = docker_client.images.get(images.DEFAULT_BASE_IMAGE).labels
    assert base_labels[images.LABEL] == "base"
    assert base_labels[images.LABEL_SUITE] == "bookworm"


def test_ensure_reuses_an_unchanged_image(docker_client: Any, builder: str) -> None:
    before = docker_client.images.get(builder).id
    messages: list[str] = []
    again = images.ensure_builder_image(
        docker_client,
        cuda=CUDA,
        python=PYTHON,
        flavor="pypi",
        base_image=images.DEFAULT_BASE_IMAGE,
        progress=messages.append,
    )
    assert again == builder
    assert docker_client.images.get(again).id == before
    assert messages == [f"reusing {builder}"]


def test_nvcc_compiles_two_archs_offline_as_non_root(
    docker_client: Any, builder: str, tmp_path: Path
) -> None:
    work = tmp_path / "src"
    work.mkdir()
    work.chmod(0o777)  # the container's user is uid 10001, not the test's
    (work / "axpy.cu").write_text(KERNEL)
    script = (
        "set -e; id -u; id -un; echo $HOME; nvcc --version | tail -n 2; ninja --version; uv --version; "
        "nvcc -gencode arch=compute_80,code=sm_80 -gencode arch=compute_120,code=sm_120 -o axpy axpy.cu"
    )
    output = docker_client.containers.run(
        builder,
        ["bash", "-c", script],
        network_mode="none",
        volumes={str(work): {"bind": "/src", "mode": "rw"}},
        working_dir="/src",
        remove=True,
        labels={"io.wheel-factory.test": "images"},
        stderr=True,
    ).decode()
    lines = output.splitlines()
    assert lines[:3] == ["10001", "factory", "/home/factory"]
    assert "release 13.0" in output
    binary = (work / "axpy").read_bytes()
    assert binary[:4] == b"\x7fELF"
    assert _device_archs(binary) == {80, 120}


def test_missing_base_without_bootstrap_says_how_to_make_it(docker_client: Any) -> None:
    with pytest.raises(ImageError, match=r"factory images bootstrap --suite no-such-suite"):
        images.ensure_builder_image(
            docker_client,
            cuda=CUDA,
            python=PYTHON,
            flavor="pypi",
            base_image="factory-base:no-such-suite",
            bootstrap=False,
        )


def test_unpullable_base_is_a_clear_error(docker_client: Any) -> None:
    ref = "factory-images-test.invalid/no-such/cuda:1-devel"
    with pytest.raises(ImageError, match=r"cannot pull factory-images-test\.invalid/no-such/cuda:1-devel"):
        images.ensure_builder_image(docker_client, cuda="12.8", python=PYTHON, flavor="devel", base_image=ref)


def test_cli_list_and_errors(builder: str) -> None:
    listed = subprocess.run([*_factory_cli(), "images", "list", "--json"], capture_output=True, text=True)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    mine = [row for row in rows if builder in row["tags"]]
    assert len(mine) == 1
    assert mine[0]["labels"][images.LABEL_TOOLKIT].startswith("13.0.")

    bad = subprocess.run(
        [*_factory_cli(), "images", "build", "--cuda", "12.8", "--python", "3.11", "--flavor", "pypi"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "error: the PyPI toolkit (flavor pypi, the devel stand-in) needs CUDA >= 13 (CUDA 12.8's PyPI wheels "
        "do not form one toolkit tree); use flavor devel with NVIDIA's image"
    ]
    usage = subprocess.run(
        [*_factory_cli(), "images", "build", "--cuda", "13", "--python", "3.11"],
        capture_output=True,
        text=True,
    )
    assert usage.returncode == 2
    assert "Traceback" not in usage.stderr


def test_wheelhouse_downloads_once_and_links(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    reqs = ["ninja", "packaging", "nvidia-cuda-runtime==13.0.*"]
    first = download_wheelhouse(reqs, python=PYTHON)
    names = [w.name for w in wheel_files(first)]
    assert any(n.startswith("ninja-") for n in names)
    assert any(n.startswith("nvidia_cuda_runtime-13.0.") for n in names)
    assert first.parent == tmp_path / "home" / "wheelhouses"
    assert first.stat().st_mode & 0o777 == 0o755  # readable by a container's unprivileged user
    marker = (first / "inputs.json").stat().st_mtime_ns
    again = download_wheelhouse(list(reversed(reqs)), python=PYTHON)
    assert again == first
    assert (first / "inputs.json").stat().st_mtime_ns == marker  # the cache answered; pip did not run again
    entries = sorted(p.name for p in (tmp_path / "home" / "wheelhouses").iterdir())
    assert entries == sorted([POOL, first.name])  # no temp left
    pooled = {p.stat().st_ino for p in (tmp_path / "home" / "wheelhouses" / POOL).iterdir()}
    assert {w.stat().st_ino for w in wheel_files(first)} == pooled  # each wheel one file with its pool twin
    linked = link_wheels(first, tmp_path / "context" / "wheels")
    assert sorted(p.name for p in wheel_files(linked)) == names
    other_root = download_wheelhouse(["ninja"], tmp_path / "elsewhere", python=PYTHON)
    assert other_root.parent == tmp_path / "elsewhere"
    assert [w.name for w in wheel_files(other_root)] == [n for n in names if n.startswith("ninja-")]


def test_wheelhouse_failure_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    with pytest.raises(FactoryError, match=r"ERROR: .*no-such-package-for-the-factory") as info:
        download_wheelhouse(["no-such-package-for-the-factory==1.0"], python=PYTHON)
    assert "\n" not in str(info.value)
    assert list((tmp_path / "home" / "wheelhouses").iterdir()) == []


def test_wheelhouse_for_torch_cp311(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    try:
        house = download_wheelhouse(["torch==2.14.1"], python=PYTHON)
        names = [w.name for w in wheel_files(house)]
        assert any(n.startswith("torch-2.14.1-cp311-cp311-manylinux") for n in names)
        # torch's CUDA 13 dependencies come along, whatever manylinux level each is tagged with.
        for dist in ("triton-", "nvidia_cuda_runtime-", "nvidia_cublas-", "nvidia_cudnn_cu13-"):
            assert any(n.startswith(dist) for n in names), dist
    finally:
        shutil.rmtree(tmp_path / "home", ignore_errors=True)  # a few GB; pytest would keep it around
