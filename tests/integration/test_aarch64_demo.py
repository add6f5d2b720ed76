"""The demo extension for aarch64 on this x86_64 host, the whole job under QEMU: the arm64 base (debootstrap,
its second stage emulated) and the aarch64 pypi builder (the toolkit from NVIDIA's aarch64 wheels), the
aarch64 torch and build requirements in the wheelhouse, the build in the emulated builder, the wheel check
of its aarch64 ELF (cubins, symbols, auditwheel's aarch64 policy), the install and import check beside the
aarch64 torch in an emulated container, and the wheel published to a directory index.

Run by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1), not by CI's `make test`: cold, the images alone take
about ten minutes on two cores (debootstrap's second stage under QEMU, then the builder), and the emulated
build and install check more (docs/BENCHMARKS.md, "aarch64"), beyond what CI's budget allows one job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix
from factory.build import emulation
from factory.core.platforms import named
from factory.wheel.fatbin import device_code

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("FACTORY_AARCH64_DEMO") != "1",
        reason="the emulated aarch64 job runs by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1), not in CI",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory.cli"]
AARCH64 = named("aarch64")
EM_AARCH64 = 183


def run_factory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FACTORY, *args], capture_output=True, text=True, cwd=ROOT, check=False)


@pytest.fixture(scope="module")
def aarch64_build(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> dict[str, Any]:
    problem = emulation.emulation_problem(AARCH64)
    assert problem is None, problem  # `make aarch64-demo` runs scripts/host-tools.sh first
    images = run_factory("images", "build", "--cuda", "13.0", "--python", "3.11", "--platform", "aarch64")
    assert images.returncode == 0, images.stderr[-3000:]
    assert images.stdout.split() == ["factory-builder:cu13.0-py3.11-pypi-aarch64"]
    tmp = tmp_path_factory.mktemp("aarch64-demo")
    matrix = write_matrix(
        DEMO,
        tmp / "matrix.yaml",
        matrix={"arch": ["9.0"], "platform": ["aarch64"]},
        build={"memory": None},
        publish={"to": str(tmp / "index")},
    )
    out = tmp / "wheels"
    proc = run_factory("build", "--trust-paths", "--matrix", str(matrix), "--output", str(out), "--publish")
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {"proc": proc, "out": out, "report": report, "index": tmp / "index"}


def test_the_aarch64_wheel_is_built_checked_installed_and_published(aarch64_build: dict[str, Any]) -> None:
    proc = aarch64_build["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    (job,) = aarch64_build["report"]["jobs"]
    assert job["job_id"] == "cu130-torch2.14-abi1-sm90-py311-aarch64"
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    wheel = aarch64_build["out"] / job["wheel"]
    assert wheel.name.startswith("factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm90-cp311-cp311-manylinux_2_")
    assert wheel.name.endswith("_aarch64.whl")
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        data = zf.read(so)
    assert int.from_bytes(data[18:20], "little") == EM_AARCH64
    assert device_code(data).cubin_archs == frozenset({90})
    log = Path(job["log"]).read_text()
    assert '"phase": "install-check"' in log and '"phase": "done"' in log
    listed = list(aarch64_build["index"].rglob(wheel.name))
    assert listed, "the wheel is not in the published index"
