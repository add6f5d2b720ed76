"""bench.compiles_export on what a real build recorded: the demo extension built for one arch (cache off, so
every kernel compiles through the admission wrapper), then its compiles exported from $FACTORY_HOME."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import DEMO, write_matrix
from factory.container import protocol

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
KERNELS = {"add.cu", "relu.cu", "saxpy.cu", "scale.cu"}


def test_a_real_builds_compiles_become_csv_rows_with_their_origin(tmp_path: Path, docker_client: Any) -> None:
    matrix = write_matrix(DEMO, tmp_path / "matrix.yaml", matrix={"arch": ["8.0"]}, publish=None)
    out = tmp_path / "wheels"
    build = [sys.executable, "-m", "factory.cli", "build", "--trust-paths", "--matrix", str(matrix)]
    proc = subprocess.run(
        [*build, "--output", str(out), "--cache", "off"], capture_output=True, text=True, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    (job,) = report["jobs"]
    source = f"run/{report['run_id']}/{job['job_id']}"

    exported = tmp_path / "compiles.csv"
    proc = subprocess.run(
        [sys.executable, "-m", "bench.compiles_export", "--matrix", str(matrix), "--csv", str(exported)],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [
        r
        for r in csv.DictReader(line for line in exported.open() if not line.startswith("#"))
        if r["source"] == source
    ]
    assert {r["tu"] for r in rows} == KERNELS
    # what the job's own log measured, read independently of the tool
    log = Path(job["log"]).read_text().splitlines()
    measured = {m.source: m for m in map(protocol.parse_measurement, log) if m is not None and m.learns}
    for r in rows:
        m = measured[r["tu"]]
        assert (r["gencodes"], r["nvcc_threads"]) == ("sm_80", "1")
        assert r["peak_gib"] == f"{m.peak_bytes / 2**30:.2f}" and float(r["peak_gib"]) > 0
        assert m.cpu_s is not None and r["cpu_s"] == f"{m.cpu_s:.0f}"
        assert r["torch"].startswith("2.14.") and r["python"] == "3.11"
        # the driver's toolchain mark: the PyPI toolkit's nvcc 13.0 and the image's GCC
        # ("c++ (Debian 12.2.0-14) 12.2.0" on bookworm)
        assert r["toolkit"].startswith("13.0.") and re.match(
            r"(c|g)\+\+ .*\d+\.\d+\.\d+", r["host_compiler"]
        ), r
    assert "| add.cu|compute_80|1 |" in proc.stdout and "peak / predicted" in proc.stdout
