"""The pypi flavor builds sources that include <ATen/cuda/CUDAContext.h> (cusparse.h, cublas_v2.h: absent
from its toolkit, present in the build venv's nvidia wheels) and link -lcusparse: a tiny extension
(tests/fixtures/atenctx), one arch, through `factory build` in the real builder image, then the factory's own
wheel check and install check."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "atenctx"
JOB = "cu130-torch2.14-abi1-sm80-py311"


def test_aten_cuda_context_compiles_and_links_in_the_pypi_flavor(tmp_path: Path, docker_client: Any) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        f"""\
package: {{name: factory-atenctx, version: "0.1.0", source: {{path: {FIXTURE}}}}}
recipe:
  name: atenctx
  local_version_env: ATENCTX_LOCAL_VERSION
  import_name: factory_atenctx
  compile_gib_per_arch: 1.0
matrix: {{cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["8.0"]}}
build: {{flavor: pypi, cpus: 2, torch_index: {{"13.0": default}}}}
"""
    )
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "factory.cli",
            "build",
            "--trust-paths",
            "--matrix",
            str(matrix),
            "--output",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    job = {j["job_id"]: j for j in json.loads((out / "report.json").read_text())["jobs"]}[JOB]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = Path(job["log"]).read_text()
    lacked = next(line for line in log.splitlines() if "what the CUDA toolkit lacks" in line)
    assert "libcusparse.so" in lacked.split("libraries: ")[1]
    headers = lacked.split("lacks: ")[1].split(" headers")[0]
    assert int(headers) > 10, lacked  # cusparse.h, cublas_v2.h, cusolverDn.h, curand.h, ...
    # the wheel passed the factory's checks (exactly sm_80) and imported in a fresh container
    assert '"phase": "done"' in log
    with zipfile.ZipFile(out / job["wheel"]) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        data = zf.read(so)
    assert device_code(data).cubin_archs == frozenset({80})
    assert b"libcusparse.so." in data  # linked by -lcusparse, through LIBRARY_PATH's unversioned link
