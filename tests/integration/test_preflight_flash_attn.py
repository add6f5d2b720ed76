"""The preflight of one real flash-attn 2.8.3 variant (CUDA 13.0, torch 2.14, Python 3.13, sm_80, the pypi
flavor's forky image), by the built-in recipe alone: the sdist fetched and patched (C++20 for torch >= 2.13,
gencodes from FLASH_ATTN_CUDA_ARCHS), flash_api.cpp compiled against torch's and Python's headers, and the
cheapest kernel by the recipe's per-file estimate for sm_80; no link, no wheel (about 4 minutes on 2 busy
cores, warm images, against the hours of the whole build).

Its own `$FACTORY_HOME`, but for the wheelhouses and the sdists, which it shares with the user's (both are
keyed by their content and never change once made), as the other integration tests do, and its compile cache,
kept across sessions as a CI cache keeps it (`homes.kept_compile_cache`): a warm run takes both compiles from
it (a preflight counts a cache hit as a compile that passed), a changed input compiles again.
"""

from __future__ import annotations

import json
import os
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from homes import SHARED, fresh_home, kept_compile_cache
from test_build import FACTORY, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = "cu130-torch2.14-abi1-sm80-py313"


@pytest.fixture(scope="module")
def flash_attn_preflight(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, session_factory_home: Path
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("flash-attn-preflight")
    home = fresh_home(tmp, "home", session_factory_home, shared=SHARED)
    matrix = tmp / "matrix.yaml"
    matrix.write_text(
        textwrap.dedent(
            """\
            package: {name: flash-attn, version: "2.8.3"}
            recipe: flash-attn
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.13"]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
              flavor: pypi
              torch_index: {"13.0": default}
            """
        )
    )
    out = tmp / "out"
    with kept_compile_cache(home, session_factory_home, "flash-attn-preflight"):
        proc = subprocess.run(
            [*FACTORY, "build", "--matrix", str(matrix), "--output", str(out), "--preflight", "--keep-going"],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env={**os.environ, "FACTORY_HOME": str(home)},
            timeout=1800,
        )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    return {"proc": proc, "job": job, "out": out}


def test_the_flash_attn_variant_passes(flash_attn_preflight: dict[str, Any]) -> None:
    proc, job = flash_attn_preflight["proc"], flash_attn_preflight["job"]
    assert proc.returncode == 0, (job["preflight"], proc.stderr[-3000:])
    assert job["job_id"] == JOB and job["result"] == "ok" and job["wheel"] is None
    preflight = job["preflight"]
    assert preflight["result"] == "pass" and preflight["line"] is None
    assert preflight["host_compiles"] == 1  # csrc/flash_attn/flash_api.cpp
    # the cheapest kernel by the recipe's compile_seconds_by_file: a head dimension 32 forward kernel
    assert preflight["device"].startswith("flash_fwd_hdim32_") and preflight["arch"] == "sm_80", preflight
    assert f"{JOB}  pass  {job['reason']}  log: {job['log']}" in proc.stderr.splitlines()
    assert not list(flash_attn_preflight["out"].glob("*.whl"))


def test_its_compiles_are_those_of_the_real_build(flash_attn_preflight: dict[str, Any]) -> None:
    log = Path(flash_attn_preflight["job"]["log"]).read_text()
    compiled = [
        json.loads(line.split("::factory-compile::", 1)[1])
        for line in log.splitlines()
        if "::factory-compile::" in line
    ]
    ran = [(m["source"], m.get("tool", "nvcc")) for m in compiled if m["cache"] != "skipped"]
    device = flash_attn_preflight["job"]["preflight"]["device"]
    assert sorted(ran) == sorted([("flash_api.cpp", "cxx"), (device, "nvcc")])
    # every other kernel of the build stood in for, the real flags on each line (the recipe's C++20 patch)
    assert sum(m["cache"] == "skipped" for m in compiled) >= 70
    assert "-std=c++20" in log and "-gencode arch=compute_80,code=sm_80" in log
