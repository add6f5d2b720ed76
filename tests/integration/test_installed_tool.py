"""The factory installed as users install tools: the project's wheel, not editable, in a fresh venv (as the
reusable workflow's `pip install "$FACTORY_REQUIREMENT"`), far from the checkout. Its `factory` finds its
Dockerfiles, builds a builder image (or reuses one with the same inputs, which it can tell only by reading
them) and one demo wheel, its container tree mounted from the venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import factory

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
JOB = "cu130-torch2.14-abi1-sm80-py311"


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory, factory_wheel: Path) -> Path:
    venv = tmp_path_factory.mktemp("installed") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    proc = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", str(factory_wheel)],
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return venv


def run(venv: Path, program: str, *args: str, cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    """`program` of the venv, in `cwd`, with nothing of the checkout on its path."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [str(venv / "bin" / program), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_installed_factory_reads_its_files_from_the_venv(venv: Path, tmp_path: Path) -> None:
    proc = run(venv, "factory", "--version", cwd=tmp_path, timeout=120)
    assert (proc.returncode, proc.stdout) == (0, f"factory {factory.__version__}\n"), proc.stderr
    script = (
        "import json, factory.container, factory.build.images, factory.spec.recipes, factory.core.resources;"
        "print(json.dumps([str(factory.build.images.dockerfile_path('pypi')),"
        " str(factory.core.resources.DATA_DIR), str(factory.spec.recipes.recipes_dir()),"
        " str(factory.container.CONTAINER_DIR)]))"
    )
    proc = run(venv, "python", "-c", script, cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr
    site = venv.resolve() / "lib"
    for found in map(Path, json.loads(proc.stdout)):
        assert found.is_relative_to(site) and found.exists(), found


def test_the_installed_factory_builds_an_image_and_a_demo_wheel(
    venv: Path, tmp_path: Path, docker_client: Any
) -> None:
    image = ["images", "build", "--cuda", "13.0", "--python", "3.11", "--flavor", "pypi"]
    proc = run(venv, "factory", *image, cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "factory-builder:cu13.0-py3.11-pypi" in proc.stdout, proc.stdout

    out = tmp_path / "wheels"
    matrix = ROOT / "examples" / "demo.yaml"
    build = ["build", "--matrix", str(matrix), "--only", JOB, "--output", str(out)]
    proc = run(venv, "factory", *build, cwd=tmp_path, timeout=3600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["factory_version"] == factory.__version__
    (job,) = report["jobs"]
    assert (job["job_id"], job["result"]) == (JOB, "ok"), job.get("log_tail")
    assert (out / job["wheel"]).is_file()
    assert job["wheel"].startswith("factory_demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80-cp311-cp311-manylinux_")
