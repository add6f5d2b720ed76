"""The demo extension for aarch64 on this x86_64 host, in CI (issue 45): one `factory build --publish` of
the demo for sm_90 on both platforms, so that the aarch64 wheel is published beside its x86_64 sibling on one
variant page. The aarch64 job runs whole under QEMU: the aarch64 pypi builder (on the arm64 debootstrap base;
both made by `factory images build --platform aarch64` when missing), the aarch64 torch and build
requirements in the wheelhouse, the build in the emulated builder, the wheel check of its aarch64 ELF (cubins,
symbols, auditwheel's aarch64 policy), the install and import check beside the aarch64 torch in an emulated
container. Then real pip, in an emulated aarch64 container with no network, takes the aarch64 wheel from the
published index (not its x86_64 sibling on the same page) beside the aarch64 torch, and it imports.

The build's compiles are kept across sessions as a CI cache keeps them (`homes.kept_compile_cache`): every
key names all of a compile's inputs and every entry is signed, so a warm run's compiles are cache hits of the
same compiles and everything else (the emulated venv, `import torch`, setup.py, the link, every check) runs
again. Emulation missing on the host fails under CI=true (`make install` sets it up: scripts/host-tools.sh)
and skips elsewhere.

Run by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1), not by `make test`: measured on this 2-core machine it
takes 10-10.5 minutes cold and 4.5-7.5 warm (docs/BENCHMARKS.md, "aarch64"), over the ~5 minutes a warm CI
run may add: five `import torch` under QEMU, and emulated uv unpacking torch's 3 GB whenever the work
volume's uv cache was emptied, are what a warm run is made of.
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
from conftest import require
from homes import SHARED, fresh_home, kept_compile_cache
from publish_helpers import torch_wheelhouse

from bench.matrices import DEMO, write_matrix
from factory.build import emulation, jobspec
from factory.core.platforms import named
from factory.wheel import platform_tag
from factory.wheel.fatbin import device_code

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("FACTORY_AARCH64_DEMO") != "1",
        reason="the emulated aarch64 demo runs by `make aarch64-demo` (FACTORY_AARCH64_DEMO=1), not in CI",
    ),
]

ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory.cli"]
AARCH64 = named("aarch64")
IMAGE = "factory-builder:cu13.0-py3.11-pypi-aarch64"
VARIANT = "cu130-torch2.14-abi1-sm90"
JOBS = {"x86_64": f"{VARIANT}-py311", "aarch64": f"{VARIANT}-py311-aarch64"}
MACHINES = {"x86_64": 62, "aarch64": 183}  # ELF e_machine: EM_X86_64, EM_AARCH64


def run_factory(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FACTORY, *args], capture_output=True, text=True, cwd=ROOT, check=False, env=env)


@pytest.fixture(scope="module")
def aarch64_build(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, session_factory_home: Path
) -> dict[str, Any]:
    problem = emulation.emulation_problem(AARCH64)
    require(problem is None, f"aarch64 emulation ({problem})")
    images = run_factory("images", "build", "--cuda", "13.0", "--python", "3.11", "--platform", "aarch64")
    assert images.returncode == 0, images.stderr[-3000:]
    assert images.stdout.split() == [IMAGE]
    tmp = tmp_path_factory.mktemp("aarch64-demo")
    home = fresh_home(tmp, "home", session_factory_home, shared=SHARED)
    matrix = write_matrix(
        DEMO,
        tmp / "matrix.yaml",
        matrix={"arch": ["9.0"], "platform": ["x86_64", "aarch64"]},
        # side by side: the x86_64 job is done long before the emulated one
        build={"memory": None, "concurrency": 2},
        publish={"to": str(tmp / "index")},
    )
    out = tmp / "wheels"
    with kept_compile_cache(home, session_factory_home, "aarch64-demo"):
        proc = run_factory(
            "build", "--trust-paths", "--matrix", str(matrix), "--output", str(out), "--publish",
            env={**os.environ, "FACTORY_HOME": str(home)},
        )  # fmt: skip
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {
        "proc": proc,
        "out": out,
        "jobs": {j["job_id"]: j for j in report["jobs"]},
        "index": tmp / "index",
        "matrix": matrix,
        "tmp": tmp,
    }


def built_wheel(aarch64_build: dict[str, Any], platform: str) -> Path:
    job = aarch64_build["jobs"][JOBS[platform]]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    return aarch64_build["out"] / job["wheel"]


def test_both_platforms_build(aarch64_build: dict[str, Any]) -> None:
    proc = aarch64_build["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(aarch64_build["jobs"]) == sorted(JOBS.values())
    log = Path(aarch64_build["jobs"][JOBS["aarch64"]]["log"]).read_text()
    # the factory's own install and import check ran in the emulated container
    assert '"phase": "install-check"' in log and '"phase": "done"' in log
    assert 'FACTORY-IMPORT-CHECK {"ok": true' in log


@pytest.mark.parametrize("platform", ["x86_64", "aarch64"])
def test_the_wheel_is_the_platforms_with_sm90_cubins(aarch64_build: dict[str, Any], platform: str) -> None:
    wheel = built_wheel(aarch64_build, platform)
    assert wheel.name.startswith("factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm90-cp311-cp311-manylinux_2_")
    assert wheel.name.endswith(f"_{platform}.whl")
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        data = zf.read(so)
    assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == MACHINES[platform]
    assert device_code(data).cubin_archs == frozenset({90})
    # auditwheel's policy for the platform: the tag the wheel carries
    policy = platform_tag.audit(wheel).policy
    assert policy.endswith(f"_{platform}") and policy in wheel.name


def test_both_wheels_are_on_one_variant_page(aarch64_build: dict[str, Any]) -> None:
    page = aarch64_build["index"] / "simple" / VARIANT / "factory-demo-ext" / "index.json"
    listed = {f["filename"] for f in json.loads(page.read_text())["files"]}
    assert listed == {built_wheel(aarch64_build, p).name for p in JOBS}


def test_pip_installs_the_aarch64_wheel_from_the_index_beside_torch_and_it_imports(
    aarch64_build: dict[str, Any], docker_client: Any
) -> None:
    """Real pip in an emulated aarch64 container with no network, from the published variant page that lists
    both platforms' wheels, into a venv that has the aarch64 torch of the job's wheelhouse: pip takes the
    aarch64 wheel by its platform tag, the torch it has satisfies the wheel's pin, and the extension imports.
    The torch goes in with uv from the uv cache the job's containers filled (the work volume's, as the
    factory's own install check does); the venv is removed at the end."""
    wheel = built_wheel(aarch64_build, "aarch64")
    wheelhouse = torch_wheelhouse(aarch64_build["matrix"], aarch64_build["tmp"] / "wheelhouse", "aarch64")
    venv = f"{jobspec.WORK_MOUNT}/test-aarch64-pip-{os.getpid()}"
    script = (
        f"trap 'rm -rf {venv}' EXIT; set -e; "
        f"uv venv -q --python python3.11 {venv}; "
        f"uv pip install -q --python {venv}/bin/python --offline --no-index --find-links /wheelhouse "
        "'torch==2.14.*' pip; "
        f"{venv}/bin/python -m pip install --isolated --disable-pip-version-check --no-input "
        f"--only-binary :all: --index-url file:///index/simple/{VARIANT}/ factory-demo-ext; cd /; "
        f"{venv}/bin/python -I -c "
        '"import importlib.metadata as m, torch, factory_demo_ext as d, factory_demo_ext._C as c; '
        "w = m.distribution('factory-demo-ext').read_text('WHEEL'); "
        "print(m.version('factory-demo-ext'), torch.__version__, [l for l in w.splitlines() "
        "if l.startswith('Tag:')][0].split()[1], c.__file__)\""
    )
    out = docker_client.containers.run(
        IMAGE,
        ["sh", "-c", script],
        remove=True,
        network_mode="none",
        user=jobspec.CONTAINER_USER,
        environment={"UV_CACHE_DIR": f"{jobspec.WORK_MOUNT}/uv-cache", "UV_LINK_MODE": "hardlink"},
        volumes={
            jobspec.WORK_VOLUME: {"bind": jobspec.WORK_MOUNT, "mode": "rw"},
            str(wheelhouse): {"bind": "/wheelhouse", "mode": "ro"},
            str(aarch64_build["index"]): {"bind": "/index", "mode": "ro"},
        },
    ).decode()
    assert "Successfully installed factory-demo-ext-0.1.0+" in out, out[-3000:]
    version, torch_version, tag, where = out.split()[-4:]
    assert version == "0.1.0+cu13.0.torch2.14.abi1.sm90"
    assert torch_version.startswith("2.14.") and torch_version.endswith("+cu130")
    assert tag == wheel.name.removesuffix(".whl").split("-", 2)[2]  # the aarch64 wheel's, not its sibling's
    assert where.startswith(f"{venv}/lib/python3.11/site-packages/factory_demo_ext/")
