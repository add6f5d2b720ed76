"""`factory build` for real: dockerd, the PyPI-toolkit image on a bootstrapped base, nvcc, torch 2.14.1.

One module-scoped build runs three jobs of the demo extension (two good arch sets and one that fails to
compile) with --keep-going; the other tests exercise OOM and interruption.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import docker.errors
import pytest

# The S3-protocol server fixture (moto in server mode) of the publish tests, reused for the real demo wheel.
from test_publish_s3 import moto  # noqa: F401

from bench.matrices import DEMO, write_matrix
from factory.build import engine
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DEMO_SRC = ROOT / "examples" / "demo-ext"
FACTORY = [sys.executable, "-m", "factory.cli"]


def demo_matrix(
    tmp: Path,
    *,
    arch: list[str],
    include: list[dict[str, Any]] | None = None,
    build: Mapping[str, Any] | None = None,
    publish_to: Path | None = None,
) -> Path:
    """The demo matrix (`examples/demo.yaml`) of `arch`, with `include` entries, `build` keys and a local
    index to publish to; no memory of its own unless `build` gives one."""
    return write_matrix(
        DEMO,
        tmp / "matrix.yaml",
        matrix={"arch": arch, "include": include},
        build={"memory": None, **(build or {})},
        publish=None if publish_to is None else {"to": str(publish_to)},
    )


def run_factory(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*FACTORY, *args], capture_output=True, text=True, cwd=ROOT, **kwargs)


@pytest.fixture(scope="module")
def demo_build(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("demo-build")
    matrix = demo_matrix(
        tmp,
        arch=["8.0", "9.0;12.0", "7.5"],
        include=[{"arch": "7.5", "env": {"DEMO_FAIL_COMPILE": "1"}}],
        # three containers at once (their limits within the host budget), as a scheduled run builds a matrix
        build={"memory": "5GiB", "concurrency": 3},
        publish_to=tmp / "index",
    )
    out = tmp / "wheels"
    proc = run_factory(
        "build", "--trust-paths", "--matrix", str(matrix), "--output", str(out), "--keep-going", "--publish"
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {
        "proc": proc,
        "out": out,
        "report": report,
        "jobs": {j["job_id"]: j for j in report["jobs"]},
        "index": tmp / "index",
        "matrix": matrix,
    }


def test_build_exit_code_reflects_the_failed_job(demo_build: dict[str, Any]) -> None:
    proc = demo_build["proc"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_good_arch_sets_produce_checked_wheels(demo_build: dict[str, Any]) -> None:
    jobs = demo_build["jobs"]
    for job_id, archs in (
        ("cu130-torch2.14-abi1-sm80-py311", {80}),
        ("cu130-torch2.14-abi1-sm90.120-py311", {90, 120}),
    ):
        job = jobs[job_id]
        assert job["result"] == "ok", (job["reason"], job["log_tail"])
        wheel = demo_build["out"] / job["wheel"]
        assert wheel.is_file()
        label = job_id.removesuffix("-py311").replace("cu130", "cu13.0").replace("-", ".")
        assert wheel.name.startswith(f"factory_demo_ext-0.1.0+{label}-cp311-cp311-manylinux_2_")
        with zipfile.ZipFile(wheel) as zf:
            metadata = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
            text = zf.read(metadata).decode()
            assert "Requires-Dist: torch==2.14.*" in text.splitlines()
            sos = [n for n in zf.namelist() if n.endswith(".so")]
            assert sos
            for so in sos:
                assert device_code(zf.read(so)).cubin_archs == frozenset(archs)
        assert job["peak_bytes"] > 0
        assert len(job["attempts"]) == 1
        log = Path(job["log"]).read_text()
        assert "MAX_JOBS=" in log
        assert '"phase": "install-check"' in log and '"phase": "done"' in log


def test_compile_error_is_a_failed_job_with_log_tail(demo_build: dict[str, Any]) -> None:
    job = demo_build["jobs"]["cu130-torch2.14-abi1-sm75-py311"]
    assert job["result"] == "failed"
    assert "exit" in job["reason"]
    assert any("error" in line and "DEMO_FAIL_COMPILE" in line for line in job["log_tail"]), job["log_tail"]
    assert job["wheel"] is None


def test_jobs_of_a_matrix_run_side_by_side_within_the_budget(demo_build: dict[str, Any]) -> None:
    report = demo_build["report"]
    jobs = report["jobs"]
    # concurrency 3: each container got the matrix's 5 GiB (15 GiB, within 3/4 of this machine's memory)
    assert {a["memory_limit"] for j in jobs for a in j["attempts"]} == {5 * 2**30}
    # the three jobs overlapped: together they ran far longer than the whole run
    assert sum(j["wall_s"] for j in jobs) > 2 * (report["finished"] - report["started"])


def test_no_container_left_after_build(demo_build: dict[str, Any], docker_client: Any) -> None:
    run_id = demo_build["report"]["run_id"]
    assert docker_client.containers.list(all=True, filters={"label": f"{engine.RUN_LABEL}={run_id}"}) == []


def _containers_of(client: Any, pid: int) -> list[Any]:
    # docker's list inspects each container it found: one removed in between is a NotFound, not a failure
    for _ in range(10):
        try:
            return client.containers.list(all=True, filters={"label": f"{engine.PID_LABEL}={pid}"})
        except docker.errors.NotFound:
            continue
    return client.containers.list(all=True, filters={"label": f"{engine.PID_LABEL}={pid}"})


def test_sigterm_leaves_no_container(tmp_path: Path, docker_client: Any) -> None:
    matrix = demo_matrix(tmp_path, arch=["8.0"])
    proc = subprocess.Popen(
        [*FACTORY, "build", "--trust-paths", "--matrix", str(matrix), "--output", str(tmp_path / "w")],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 600
    while not _containers_of(docker_client, proc.pid):
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
        assert time.monotonic() < deadline, "no container was started"
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert "Traceback" not in output
    assert _containers_of(docker_client, proc.pid) == []


def test_containers_of_a_crashed_run_are_removed_by_the_next(tmp_path: Path, docker_client: Any) -> None:
    image = docker_client.images.list(filters={"label": "io.wheel-factory.flavor"})
    assert image, "the builder image should exist after the other build tests"
    # A process id that is certainly dead on this host: a child that has exited and been reaped.
    dead = subprocess.Popen(["true"])
    dead.wait()
    labels = {
        engine.LABEL: "1",
        engine.RUN_LABEL: "crashed",
        engine.PID_LABEL: str(dead.pid),
        engine.HOST_LABEL: os.uname().nodename,
    }
    container = docker_client.containers.run(
        image[0].id, ["sleep", "600"], detach=True, labels=labels, network_mode="none"
    )
    try:
        assert engine.remove_stale_containers(docker_client)
        assert _containers_of(docker_client, dead.pid) == []
    finally:
        with pytest.raises(Exception):  # noqa: B017 - already removed: any docker error is fine here
            container.remove(force=True)


def test_published_index_has_good_variants_and_shows_the_failure(demo_build: dict[str, Any]) -> None:
    index = demo_build["index"]
    for vid in ("cu130-torch2.14-abi1-sm80", "cu130-torch2.14-abi1-sm90.120"):
        page = (index / "simple" / vid / "factory-demo-ext" / "index.html").read_text()
        assert "factory_demo_ext-0.1.0%2B" in page and "#sha256=" in page
    assert not (index / "simple" / "cu130-torch2.14-abi1-sm75").exists()
    human = (index / "index.html").read_text()
    assert "failed" in human and "cu130-torch2.14-abi1-sm75" in human


def test_every_published_wheel_has_provenance_and_an_sbom_its_library_accepts(
    demo_build: dict[str, Any],
) -> None:
    """PEP 770's sboms/ and the factory's provenance in each published wheel: CycloneDX's own validator and
    parser accept the SBOM, the provenance names the job, and `factory inspect` prints both."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    from factory.wheel import embedded
    from factory.wheel import record as buildrecord

    wheels = sorted((demo_build["index"] / "files").glob("*/*.whl"))
    assert len(wheels) == 2
    for wheel in wheels:
        found = embedded.read(wheel)
        prov = found.provenance
        job = demo_build["jobs"][prov["job"]["id"]]
        assert job["wheel"] == wheel.name
        assert prov["source"]["kind"] == "path" and len(prov["source"]["path"]["tree_sha256"]) == 64
        assert prov["torch"]["version"].startswith("2.14.")
        assert prov["toolchain"]["nvcc"].startswith("13.0") and prov["toolchain"]["cxx"]
        assert prov["image"]["dockerfile_sha256"] and "cache" not in prov
        assert any(r["filename"].startswith("torch-") for r in prov["build_requirements"])
        assert job["image_id"].startswith("sha256:") and job["image_id"] not in json.dumps(prov)
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(found.sbom_path).decode()
        assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
        bom = Bom.from_json(json.loads(text))  # type: ignore[attr-defined]
        names = {c.name for c in bom.components}
        assert {"torch", "cuda-toolkit", "factory-demo-ext"} <= names
        assert any(n.startswith("libc10") for n in names), names  # what the module links from torch
        # the build record beside it: what differs between runs, from report.json, naming this wheel
        record = buildrecord.parse(wheel.with_name(wheel.name + buildrecord.SUFFIX).read_bytes())
        assert record.sha256 == hashlib.sha256(wheel.read_bytes()).hexdigest()
        assert record.provenance_sha256 == embedded.provenance_sha256(wheel)
        assert record.image_id == job["image_id"] and record.started and record.finished
        assert record.compile_cache == demo_build["report"]["compile_cache"]
        assert (record.cache_hits, record.compiled) == (job["compiles_cached"], job["compiles_compiled"])
        proc = run_factory("inspect", str(wheel))
        assert proc.returncode == 0, proc.stderr
        assert f"job {prov['job']['id']}" in proc.stdout and "sbom        " in proc.stdout
        assert f"image id    {job['image_id']}" in proc.stdout, proc.stdout


# pip installs the real wheel from the S3 bucket below; the publish tests run both clients on both indexes.
@pytest.mark.parametrize("tool", ["uv"])
def test_consumer_installs_the_real_wheel_from_the_served_index(
    demo_build: dict[str, Any], tmp_path: Path, tool: str
) -> None:
    """pip/uv in a fresh venv pick the variant index's wheel and torch==2.14.* from the normal index."""
    from publish_helpers import fresh_venv, pip_install, torch_wheelhouse, uv_install
    from test_serve_install import start_server

    normal = torch_wheelhouse(demo_build["matrix"], tmp_path)
    server, url = start_server(demo_build["index"], tmp_path / "access.log")
    try:
        venv = fresh_venv(tmp_path / "venv", tool=tool)
        install = pip_install if tool == "pip" else uv_install
        vid = "cu130-torch2.14-abi1-sm90.120"
        proc = install(venv, f"{url}simple/{vid}/", "--find-links", str(normal), "factory-demo-ext")
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    finally:
        server.terminate()
        server.wait(timeout=30)
    probe = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-I",
            "-c",
            "import importlib.metadata as m, torch, factory_demo_ext as d; "
            "print(m.version('factory-demo-ext'), torch.__version__, d.__file__)",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr[-2000:]
    version, torch_version, where = probe.stdout.split()
    assert version == "0.1.0+cu13.0.torch2.14.abi1.sm90.120"
    assert torch_version.startswith("2.14.")
    assert str(venv) in where


def test_consumer_installs_the_real_wheel_straight_from_an_s3_bucket(
    demo_build: dict[str, Any],
    tmp_path: Path,
    moto: Any,  # noqa: F811
) -> None:
    """The same wheels published to an S3-protocol server (moto, over HTTP); pip reads the bucket URL and
    keeps the torch the venv has, which the wheel's pin accepts."""
    from publish_helpers import fresh_venv, pip_install, torch_wheelhouse, uv_install

    from factory.publish.publisher import publish_wheels

    out = demo_build["out"]
    wheels = [out / j["wheel"] for j in demo_build["report"]["jobs"] if j["wheel"]]
    moto.bucket("demo-wheels")
    publish_wheels(wheels, to="s3://demo-wheels/ci", endpoint_url=moto.endpoint, report=out / "report.json")
    normal = torch_wheelhouse(demo_build["matrix"], tmp_path)
    venv = fresh_venv(tmp_path / "venv", tool="pip")
    # torch and its nvidia-* wheels (GBs) go in with uv, which unpacks them in seconds where pip takes a
    # minute; pip resolving torch through the pin is the served-index and wheelcheck tests' part
    seeded = uv_install(venv, None, "--find-links", str(normal), "torch==2.14.*")
    assert seeded.returncode == 0, seeded.stderr[-2000:]
    index_url = f"{moto.endpoint}/demo-wheels/ci/simple/cu130-torch2.14-abi1-sm80/"
    proc = pip_install(venv, index_url, "--find-links", str(normal), "factory-demo-ext")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    probe = (
        "import importlib.metadata as m; t = m.distribution('torch'); "
        "print(m.version('factory-demo-ext'), t.version, t.read_text('INSTALLER').strip())"
    )
    version, torch_version, torch_installer = subprocess.run(
        [str(venv / "bin" / "python"), "-I", "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert version == "0.1.0+cu13.0.torch2.14.abi1.sm80"
    # the wheel's torch==2.14.* pin accepted the venv's torch: pip did not install another one over it
    assert torch_version.startswith("2.14.") and torch_installer == "uv"
