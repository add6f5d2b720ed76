"""The compile cache across two Pythons of one variant, through the real factory (dockerd, the forky builder
image with python3.13 and 3.14 and one g++, real nvcc), one `factory build` run and one `$FACTORY_HOME`.

The fixture (tests/fixtures/pyhexext) has a .cu file that includes Python.h (its host function returns
PY_VERSION_HEX), a .cu kernel file that includes no Python header, and a .cpp binding. The 3.14 job, which
starts after the 3.13 one (schedule.py), must compile the two Python-dependent files again and take the kernel
file's object from the cache; its wheel passes every check the factory runs, and the factory's install check
(a fresh venv on python3.14 in the builder image) imports it: the package refuses to import unless the
extension returns the importing interpreter's PY_VERSION_HEX, and prints the value it got.

One build of two jobs: 54-98 s measured (load 3-8 on 2 cores), the image and cp313/cp314 wheelhouses there.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest
from conftest import require
from test_build import FACTORY, ROOT

from factory.build import engine
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FIXTURE = ROOT / "tests" / "fixtures" / "pyhexext"
# PY_VERSION_HEX's major and minor bytes: 0x030D.... for 3.13
HEX = {"3.13": 0x030D, "3.14": 0x030E}


def pythons_matrix(tmp: Path) -> Path:
    path = tmp / "matrix.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package:
              name: factory-pyhexext
              version: "0.1.0"
              source: {{path: {FIXTURE}}}
            recipe:
              name: pyhexext
              arch_env: PYHEXEXT_CUDA_ARCHS
              arch_format: torch
              local_version_env: PYHEXEXT_LOCAL_VERSION
              import_name: factory_pyhexext
              compile_gib_per_arch: 0.5
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.13", "3.14"]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
              flavor: pypi
              memory: 6GiB
              cpus: 2
              torch_index: {{"13.0": default}}
            """
        )
    )
    return path


def built_hex(log: Path) -> int:
    """The PY_VERSION_HEX the installed extension returned in the factory's install check."""
    found = re.findall(r"factory_pyhexext PY_VERSION_HEX (0x[0-9a-f]+)", log.read_text(errors="replace"))
    assert found, f"no import line in {log}"
    return int(found[-1], 16)


def test_a_later_python_compiles_only_what_includes_python(
    tmp_path: Path, docker_client: Any, session_factory_home: Path
) -> None:
    require(
        engine.get_image(docker_client, "factory-builder:cu13.0-forky-pypi") is not None,
        "factory-builder:cu13.0-forky-pypi (make images)",
    )
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "--matrix", str(pythons_matrix(tmp_path)), "--output", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FACTORY_HOME": str(session_factory_home)},
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    jobs = {job["python"]: job for job in json.loads((out / "report.json").read_text())["jobs"]}
    assert sorted(jobs) == ["3.13", "3.14"]
    for python, job in jobs.items():
        # accepted: tags, torch pin, device code for exactly sm_80, manylinux tag, installed and imported
        assert job["result"] == "ok", (python, job["reason"], job["log_tail"])
        assert built_hex(Path(job["log"])) >> 16 == HEX[python], python
        with zipfile.ZipFile(out / job["wheel"]) as zf:
            (so,) = [n for n in zf.namelist() if n.endswith(".so")]
            assert device_code(zf.read(so)).cubin_archs == frozenset({80})
    first, second = jobs["3.13"], jobs["3.14"]
    # 3.13 compiled all three (pyhex.cu, fill.cu, module.cpp)
    assert (first["compiles_cached"], first["compiles_compiled"]) == (0, 3)
    # 3.14: pyhex.cu and module.cpp include Python.h, compiled again; fill.cu's object from the cache
    assert (second["compiles_cached"], second["compiles_compiled"]) == (1, 2)
    assert proc.returncode == 0, proc.stderr[-3000:]
