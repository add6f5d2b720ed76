"""An abi3 recipe for real: the limited-API fixture (tests/fixtures/abi3ext, TORCH_LIBRARY registration, no
pybind11) built once for sm_80 with Python 3.11 in the PyPI builder image, tagged cp311-abi3, audited by
abi3audit, installed and imported on 3.11 and on the later 3.13 it covers (in the image a 3.13 job gets,
with that Python's torch), published once, and resolved from the index by pip for CPython 3.13; the same
module calling a function outside the limited API (sm_86 job) is refused in one line.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from factory.build.wheelhouse import compatible_platforms

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "abi3ext"
FACTORY = [sys.executable, "-m", "factory.cli"]
VARIANT = "cu130-torch2.14-abi1-sm80"
LABEL = "cu13.0.torch2.14.abi1.sm80"


def real_python(version: str) -> str | None:
    """An interpreter of CPython `version` on this host, if there is one that runs (a pyenv shim of a
    version not selected does not)."""
    found = [str(p) for p in sorted(Path.home().glob(f".pyenv/versions/{version}*/bin/python{version}"))]
    found += [p for p in (shutil.which(f"python{version}"),) if p]
    for python in found:
        if subprocess.run([python, "-c", "pass"], capture_output=True).returncode == 0:
            return python
    return None


def abi3_matrix(tmp: Path, *, index: Path) -> Path:
    path = tmp / "matrix.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package:
              name: factory-abi3ext
              version: "0.1.0"
              source: {{path: {FIXTURE}}}
            recipe:
              name: abi3ext
              arch_env: ABI3EXT_CUDA_ARCHS
              local_version_env: ABI3EXT_LOCAL_VERSION
              import_name: factory_abi3ext
              compile_gib_per_arch: 1.0
              py_limited_api: true
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.13", "3.11"]
              cxx11_abi: [true]
              arch: ["8.0", "8.6"]
              include:
                - arch: "8.6"
                  env: {{ABI3EXT_NON_LIMITED: "1"}}
            build:
              flavor: pypi
              cpus: 2
              memory: 6GiB
              torch_index: {{"13.0": default}}
            publish:
              to: {index}
            """
        )
    )
    return path


@pytest.fixture(scope="module")
def abi3_build(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("abi3-build")
    matrix = abi3_matrix(tmp, index=tmp / "index")
    from publish_helpers import plan_and_build

    return plan_and_build(matrix, index=tmp / "index")


def test_one_job_builds_the_variant_with_its_lowest_python(abi3_build: dict[str, Any]) -> None:
    plan = abi3_build["plan"]
    assert plan.returncode == 0, plan.stderr
    jobs = json.loads(plan.stdout)["jobs"]
    assert [(j["job_id"], j["abi"], j["covers"]) for j in jobs] == [
        (f"{VARIANT}-py311", "cp311-abi3", ["3.13"]),
        ("cu130-torch2.14-abi1-sm86-py311", "cp311-abi3", ["3.13"]),
    ]
    proc = abi3_build["proc"]
    assert proc.returncode == 1, proc.stderr[-3000:]  # the sm86 job's wheel is refused (below)
    job = abi3_build["jobs"][f"{VARIANT}-py311"]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert job["covers"] == ["3.13"] and job["checked_pythons"] == ["3.11", "3.13"]


def test_the_wheel_is_cp311_abi3_with_an_abi3_module(abi3_build: dict[str, Any]) -> None:
    job = abi3_build["jobs"][f"{VARIANT}-py311"]
    wheel = abi3_build["out"] / job["wheel"]
    assert wheel.name.startswith(f"factory_abi3ext-0.1.0+{LABEL}-cp311-abi3-manylinux_2_"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        modules = [n for n in zf.namelist() if n.endswith(".so")]
    assert modules == ["factory_abi3ext/_C.abi3.so"]
    log = Path(job["log"]).read_text()
    assert "--py-limited-api=cp311" in log  # the factory's tag, over the cp39 setup.py hard-codes
    assert "-DPy_LIMITED_API=" in log
    # the check on 3.13 installed torch's cp313 wheel and imported the cp311-abi3 module with it
    assert "install check on Python 3.13" in log
    assert log.count('"phase": "done"') == 2


def test_published_once_and_pip_for_python_313_resolves_to_it(
    abi3_build: dict[str, Any], tmp_path: Path
) -> None:
    job = abi3_build["jobs"][f"{VARIANT}-py311"]
    files = sorted((abi3_build["index"] / "files" / VARIANT).glob("*.whl"))
    assert [f.name for f in files] == [job["wheel"]]
    # pip asked for CPython 3.13's tags picks the cp311-abi3 wheel from the variant's index
    simple = (abi3_build["index"] / "simple" / VARIANT).as_uri() + "/"
    dest = tmp_path / "dl"
    # pip takes each --platform as an exact tag: every manylinux tag a glibc 2.36 host accepts
    platforms = [a for p in compatible_platforms("manylinux_2_36_x86_64") for a in ("--platform", p)]
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
         "3.13", "--implementation", "cp", "--abi", "cp313", *platforms,
         "--index-url", simple, "-d", str(dest), "factory-abi3ext"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    assert [p.name for p in dest.iterdir()] == [job["wheel"]]
    # and a real CPython 3.13, where the host has one, installs it
    python313 = real_python("3.13")
    if python313 is None:
        return
    venv = tmp_path / "venv313"
    subprocess.run([python313, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "--index-url", simple, "factory-abi3ext"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    installed = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.metadata as m; d = m.distribution('factory-abi3ext'); "
         "print([str(f) for f in d.files if str(f).endswith('.so')])"],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    assert "factory_abi3ext/_C.abi3.so" in installed


def test_a_module_outside_the_limited_api_is_refused_in_one_line(abi3_build: dict[str, Any]) -> None:
    job = abi3_build["jobs"]["cu130-torch2.14-abi1-sm86-py311"]
    assert (job["result"], job["wheel"], job["checked_pythons"]) == ("failed", None, [])
    assert job["reason"] == (
        "wheel check failed: _C.abi3.so: uses symbols outside the limited API: PyUnicode_AsUTF8 (abi3audit)"
    )
    assert not (abi3_build["index"] / "files" / "cu130-torch2.14-abi1-sm86").exists()
