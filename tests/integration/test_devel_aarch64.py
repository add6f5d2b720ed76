"""The devel flavor's aarch64 builder image on this x86_64 host, under QEMU: the arm64 stand-in for NVIDIA's
devel image (factory-standin:cuda13.0-devel-aarch64: NVIDIA's aarch64 toolkit wheels on the bootstrapped
factory-base:bookworm-aarch64), then factory/data/docker/Dockerfile.devel on it, whose compilers must target
aarch64-linux-gnu; its nvcc compiles a kernel into an aarch64 object.

Run by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1) beside the emulated demo job, not by CI's `make test`:
the arm64 base alone is minutes of debootstrap under QEMU, and both images' steps run emulated (several
minutes on two cores, docs/BENCHMARKS.md, "aarch64"). The x86_64 devel flavor stays in CI
(tests/integration/test_devel_flavor.py).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from factory.build import emulation, images
from factory.core.platforms import named

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("FACTORY_AARCH64_DEMO") != "1",
        reason="emulated aarch64 images are built by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1), not in CI",
    ),
]

AARCH64 = named("aarch64")
CUDA = "13.0"
EM_AARCH64 = 183
KERNEL = "__global__ void scale(float* x, float a) { x[threadIdx.x] *= a; }\n"
CHECK = f"""\
set -eu
uname -m
gcc -dumpmachine
nvcc --version | grep -o 'release [0-9.]*'
cd /tmp && printf '%s' '{KERNEL}' > k.cu
nvcc -c -arch=sm_90 -o k.o k.cu
python3 -c 'import sys; d = open("k.o", "rb").read(20); print(int.from_bytes(d[18:20], "little"))'
"""


def test_the_aarch64_devel_builder_is_made_on_the_arm64_variant(docker_client: Any) -> None:
    problem = emulation.emulation_problem(AARCH64)
    assert problem is None, problem  # `make aarch64-demo` runs scripts/host-tools.sh first
    messages: list[str] = []
    standin = images.ensure_standin_devel(docker_client, cuda=CUDA, target=AARCH64, progress=messages.append)
    assert standin == "factory-standin:cuda13.0-devel-aarch64"
    labels = docker_client.images.get(standin).labels
    assert labels[images.LABEL_PLATFORM] == "aarch64"
    assert labels[images.LABEL_BASE] == "factory-base:bookworm-aarch64"
    # a matrix names the default platform's stand-in; an aarch64 job gets its platform's
    tag = images.ensure_builder_image(
        docker_client,
        cuda=CUDA,
        python="3.11",
        flavor="devel",
        base_image=images.standin_devel_image(CUDA),
        progress=messages.append,
        target=AARCH64,
    )
    assert tag == "factory-builder:cu13.0-py3.11-devel-aarch64"
    labels = docker_client.images.get(tag).labels
    assert labels[images.LABEL_PLATFORM] == "aarch64"
    assert labels[images.LABEL_FLAVOR] == "devel"
    assert labels[images.LABEL_BASE] == standin
    out = docker_client.containers.run(tag, ["bash", "-c", CHECK], remove=True).decode().split()
    assert out == ["aarch64", "aarch64-linux-gnu", "release", CUDA, str(EM_AARCH64)]
