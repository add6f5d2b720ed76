"""Memory control through the real factory: container, cgroup limit, nvcc admission wrapper, OOM resume.

The memext fixture has two heavy translation units, two medium and four light ones; the tests build its half
scale (MEMEXT_SCALE=half: nvcc peaks at ~0.65 GiB for a heavy TU, ~0.35 GiB for a medium one and ~0.2 GiB for
a light one, in about half the time of the benchmark's full scale). Under a 1.3 GiB container limit the two
heavy ones cannot compile side by side. Measured through the factory with admission off: one TU at a time
peaks at 1.06 GiB (with setup.py, ninja and page cache); two at a time, ninja starting both heavy TUs
together, were not OOM-killed under 1.65 GiB and were under 1.5 GiB in all but one run.

A heavy TU's peak is its ptxas, which holds 660 MiB for the last fifth of its compile (cicc before it holds
150 MiB): two heavy ptxas hold 1.29 GiB, and pip, setup.py, ninja and the nvcc drivers the rest, so the
kill needs their last fifths to meet, which ninja starting both together makes them do. At 1.3 GiB the
uncontrolled build was OOM-killed in 15 of 15 runs (5 of them beside a process spinning on one of the two
CPUs); the injected OOM was recovered in 4 of 4.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from bench.matrices import MEMEXT, write_matrix
from factory.memory import profiles
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
LIMIT = "1.3GiB"
SCALE = {"MEMEXT_SCALE": "half"}
GIB_PER_ARCH = 0.7  # the recipe's estimate: the heaviest TU, rounded up
# enough of each kind for what the tests show; the benchmark builds all eight
TUS = ("heavy1", "heavy2", "medium1", "light1", "light2")


def memext_matrix(
    tmp: Path,
    *,
    gib_per_arch: float,
    env: dict[str, str],
    max_attempts: int,
    by_file: dict[str, float] | None = None,
    memory: str = LIMIT,
) -> Path:
    """The memext matrix (`tests/fixtures/memext.yaml`) with the recipe's estimates, one entry's env and the
    build's memory and attempts."""
    return write_matrix(
        MEMEXT,
        tmp / "matrix.yaml",
        recipe={"compile_gib_per_arch": gib_per_arch, "compile_gib_by_file": by_file or {}},
        matrix={"include": [{"arch": "8.0", "env": env}]},
        build={"memory": memory, "max_attempts": max_attempts},
    )


def build(tmp: Path, matrix: Path, *options: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = tmp / "wheels"
    command = [
        sys.executable,
        "-m",
        "factory.cli",
        "build",
        "--trust-paths",
        "--matrix",
        str(matrix),
        "--output",
        str(out),
        # every compile must run: the compile cache would serve what an earlier test of memext compiled
        "--cache",
        "off",
    ]
    proc = subprocess.run([*command, *options], capture_output=True, text=True, cwd=ROOT)
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    return proc, job


@pytest.fixture
def no_learned_profile() -> None:
    """Each test starts from the recipe's estimate, not from what an earlier test's compiles taught."""
    profiles.profile_path("factory-memext", "0.1.0").unlink(missing_ok=True)


def test_uncontrolled_parallel_build_is_oom_killed(
    tmp_path: Path, docker_client: Any, no_learned_profile: None
) -> None:
    """MAX_JOBS = cores with admission off: what a plain build does under this limit (given on the command
    line, over the matrix's roomier one)."""
    env = {"FACTORY_ADMISSION": "off", "MAX_JOBS": "2", **SCALE}
    matrix = memext_matrix(tmp_path, gib_per_arch=GIB_PER_ARCH, env=env, max_attempts=1, memory="8GiB")
    proc, job = build(tmp_path, matrix, "--memory", LIMIT)
    # what happened, when not an OOM kill: the attempt's peak and the log's end
    assert job["result"] == "oom", (job["result"], job["reason"], job["attempts"], job["log_tail"][-5:])
    assert proc.returncode == 1
    (attempt,) = job["attempts"]
    assert attempt["oom_killed"] is True
    assert attempt["memory_limit"] == int(1.3 * 2**30)
    assert attempt["ninja_jobs"] == 2  # the matrix's MAX_JOBS, whatever the plan
    assert "OOM" in proc.stderr


def test_factory_admission_builds_under_the_same_limit_without_oom(
    tmp_path: Path, docker_client: Any, no_learned_profile: None
) -> None:
    # the recipe's per-file estimates (each above the real peak) plan each kind of TU at its own figure; one
    # of each kind but the two heavy ones (which must not peak together) keep the test short
    by_file = {"light*": 0.2, "medium*": 0.4}
    env = {"MEMEXT_TUS": ",".join(TUS), **SCALE}
    matrix = memext_matrix(tmp_path, gib_per_arch=GIB_PER_ARCH, env=env, max_attempts=1, by_file=by_file)
    proc, job = build(tmp_path, matrix)
    assert proc.returncode == 0, (job["reason"], job["log_tail"])
    assert job["result"] == "ok"
    (attempt,) = job["attempts"]
    assert attempt["oom_killed"] is False
    log = Path(job["log"]).read_text()
    # Every nvcc call went through the wrapper and was measured; the learned profile now knows them all.
    assert log.count("::factory-compile::") == len(TUS)
    learned = profiles.load_profile(profiles.profile_path("factory-memext", "0.1.0"))
    assert len(learned.entries) == len(TUS)
    heavy = max(e.peak_bytes for e in learned.entries.values())
    light = min(e.peak_bytes for e in learned.entries.values())
    assert heavy > 2.5 * light  # the fixture really has TUs of different compile memory
    records = [json.loads(line.split("::factory-compile::", 1)[1]) for line in log.splitlines()
               if "::factory-compile::" in line]  # fmt: skip
    # with nothing learned, each TU was planned at the recipe's figure for its file
    predicted = {r["source"]: r["predicted_bytes"] for r in records}
    assert predicted["light1.cu"] < predicted["medium1.cu"] < predicted["heavy1.cu"]


def test_injected_oom_is_recovered_by_resuming(
    tmp_path: Path, docker_client: Any, no_learned_profile: None
) -> None:
    """An estimate far too low lets both heavy compiles start together: OOM, then a narrower resumed retry."""
    # MAX_JOBS=2 with the light files first makes ninja start the two heavy ones side by side, and the low
    # estimate lets admission take both: a deterministic OOM once objects exist.
    env = {"MEMEXT_ORDER": "light-first", "MAX_JOBS": "2", "MEMEXT_TUS": "heavy1,heavy2,light1,light2"}
    env.update(SCALE)
    proc, job = build(tmp_path, memext_matrix(tmp_path, gib_per_arch=0.05, env=env, max_attempts=3))
    assert proc.returncode == 0, (job["reason"], job["log_tail"])
    first, second, *rest = job["attempts"]
    assert first["oom_killed"] is True
    assert rest == [] and second["oom_killed"] is False
    assert first["ninja_jobs"] == second["ninja_jobs"] == 2  # the matrix sets -j; admission bounds memory
    assert second["max_jobs"] < first["max_jobs"] or second["nvcc_threads"] < first["nvcc_threads"]
    log = Path(job["log"]).read_text()
    plans = [line for line in log.splitlines() if line.startswith("::factory:: attempt ")]
    assert len(plans) == 2 and "OOM at" in plans[1]
    assert "OOM at" in first["note"] and "objects kept" in first["note"]
    # attempt 2 read what attempt 1 measured: the profile snapshot mounted into its container
    snapshot = Path(job["log"]).parents[1] / "profiles" / job["job_id"] / "profile.json"
    assert json.loads(snapshot.read_text())["entries"]
    assert "cannot read the learned profile" not in log
    # Resume: objects compiled before the kill were kept, so the retry compiled fewer.
    assert second["objects_kept"] > 0
    assert second["objects_planned"] < first["objects_planned"]
    assert "attempt 2: OOM at" in proc.stderr
    wheel = tmp_path / "wheels" / job["wheel"]
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        assert device_code(zf.read(so)).cubin_archs == frozenset({80})
