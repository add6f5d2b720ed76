"""The devel flavor end to end on the local stand-in for nvidia/cuda:13.0-devel, and the manylinux flavor's
answer when its image cannot be pulled (no registry is reachable here).

The stand-in (factory-standin:cuda13.0-devel, made by factory.build.images from the PyPI toolkit wheels on the
bootstrapped base) is reused while its inputs hash is unchanged; one job of the demo extension (one arch, one
Python) then goes through factory/data/docker/Dockerfile.devel and every phase of the driver, wheel checks
included.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix
from factory.build import images
from factory.core.errors import ImageError
from factory.spec import toolchains
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
CUDA = "13.0"


@pytest.fixture(scope="module")
def standin(docker_client: Any) -> str:
    messages: list[str] = []
    tag = images.ensure_standin_devel(docker_client, cuda=CUDA, progress=messages.append)
    assert tag == images.standin_devel_image(CUDA) == "factory-standin:cuda13.0-devel"
    return tag


def test_standin_has_the_devel_layout(standin: str, docker_client: Any) -> None:
    script = (
        "test -x /usr/local/cuda/bin/nvcc && test -d /usr/local/cuda/include && test -d /usr/local/cuda/nvvm"
        ' && test -e /usr/local/cuda/lib64/libcudart.so && ! command -v python3 && test -z "${CUDA_HOME:-}"'
        " && command -v nvcc"
    )
    out = docker_client.containers.run(standin, ["sh", "-c", script], remove=True)
    assert out.decode().strip() == "/usr/local/cuda/bin/nvcc"
    image = docker_client.images.get(standin)
    assert image.labels[images.LABEL] == "standin"
    assert image.labels[images.LABEL_TOOLKIT].startswith("13.0.")


def test_standin_is_reused_while_its_inputs_are_unchanged(standin: str, docker_client: Any) -> None:
    before = docker_client.images.get(standin).id
    messages: list[str] = []
    assert images.ensure_standin_devel(docker_client, cuda=CUDA, progress=messages.append) == standin
    assert messages == [f"reusing {standin}"]
    assert docker_client.images.get(standin).id == before


def _factory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "factory.cli", *args], capture_output=True, text=True, cwd=ROOT
    )


def test_devel_flavor_builds_the_one_job_a_workflow_runner_is_given(
    standin: str, tmp_path: Path, docker_client: Any
) -> None:
    """A real job through Dockerfile.devel on the stand-in, run as the scheduled workflow runs each job:
    `factory matrix --format github` plans, and each runner builds its own with `factory build --only JOB`."""
    matrix = write_matrix(
        DEMO,
        tmp_path / "matrix.yaml",
        matrix={"cuda": [CUDA], "arch": ["8.0", "9.0"]},
        build={"flavor": "devel", "base_image": standin, "memory": None, "torch_index": {CUDA: "default"}},
        publish=None,
    )
    plan = _factory("matrix", "--matrix", str(matrix), "--format", "github", "--trust-paths")
    assert plan.returncode == 0, plan.stderr
    job_ids = [row["job_id"] for row in json.loads(plan.stdout)["include"]]
    assert job_ids == ["cu130-torch2.14-abi1-sm80-py311", "cu130-torch2.14-abi1-sm90-py311"]
    chosen = job_ids[0]
    out = tmp_path / "wheels"
    proc = _factory("build", "--matrix", str(matrix), "--only", chosen, "--output", str(out), "--trust-paths")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert [j["job_id"] for j in report["jobs"]] == [chosen]
    (job,) = report["jobs"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    # exactly that job's wheel came out, and the other job left no log: it never started
    assert [w.name for w in out.glob("*.whl")] == [job["wheel"]]
    assert [p.name for p in Path(job["log"]).parent.iterdir()] == [f"{chosen}.log"]
    wheel = out / job["wheel"]
    assert wheel.name.startswith("factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80-cp311-cp311-manylinux_2_")
    with zipfile.ZipFile(wheel) as zf:
        sos = [n for n in zf.namelist() if n.endswith(".so")]
        assert sos
        for so in sos:
            assert device_code(zf.read(so)).cubin_archs == frozenset({80})
    log = Path(job["log"]).read_text()
    assert '"phase": "install-check"' in log and '"phase": "done"' in log
    builder = docker_client.images.get(
        toolchains.builder_image_name(cuda=CUDA, python="3.11", flavor="devel")
    )
    assert builder.labels[images.LABEL_BASE] == standin
    assert builder.labels[images.LABEL_FLAVOR] == "devel"


def test_manylinux_image_that_cannot_be_pulled_is_one_line(docker_client: Any) -> None:
    image = images.manylinux_base_image("12.8")
    if any(image in i.tags for i in docker_client.images.list()):
        pytest.skip(f"{image} is present here")
    with pytest.raises(ImageError) as info:
        images.ensure_builder_image(docker_client, cuda="12.8", python="3.11", flavor="manylinux")
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"cannot pull {image}: ")
    assert "docker load" in message


# An image with the manylinux builder's layout, for what of the manylinux flavor runs here: the Debian base's
# CPython 3.11 as /opt/python/cp311-cp311 (a free-threaded cp313-cp313t beside it, never to be picked) and the
# stand-in's toolkit in /usr/local/cuda.
FAKE_MANYLINUX = """\
FROM {base}
COPY --from={standin} /usr/local/cuda-13.0 /usr/local/cuda-13.0
RUN ln -s cuda-13.0 /usr/local/cuda && ln -s python3.11 /usr/bin/python \\
    && mkdir -p /opt/python/cp313-cp313t/bin && ln -s /usr /opt/python/cp311-cp311
"""


@pytest.fixture(scope="module")
def fake_manylinux(standin: str, docker_client: Any) -> Iterator[str]:
    tag = "factory-test-manylinux:cuda13.0"
    dockerfile = FAKE_MANYLINUX.format(base=images.DEFAULT_BASE_IMAGE, standin=standin)
    docker_client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, network_mode="none")
    yield tag
    for name in (toolchains.builder_image_name(cuda=CUDA, python="3.11", flavor="manylinux"), tag):
        with contextlib.suppress(Exception):
            docker_client.images.remove(name)


def test_manylinux_flavor_picks_the_jobs_cpython(fake_manylinux: str, docker_client: Any) -> None:
    tag = images.ensure_builder_image(
        docker_client, cuda=CUDA, python="3.11", flavor="manylinux", base_image=fake_manylinux
    )
    script = (
        "readlink /usr/local/bin/python3.11; readlink /usr/local/bin/python3;"
        " python3 -c 'import sys; print(sys.version_info[:2])'"
    )
    out = docker_client.containers.run(tag, ["sh", "-c", script], remove=True).decode().split("\n")
    assert out[:3] == ["/opt/python/cp311-cp311/bin/python", "/opt/python/cp311-cp311/bin/python", "(3, 11)"]


def test_manylinux_flavor_without_the_jobs_cpython_says_so(fake_manylinux: str, docker_client: Any) -> None:
    with pytest.raises(ImageError) as info:
        images.ensure_builder_image(
            docker_client, cuda=CUDA, python="3.12", flavor="manylinux", base_image=fake_manylinux
        )
    assert "factory: the base image has no /opt/python/cp312-cp312/bin/python (Python 3.12)" in str(
        info.value
    )
