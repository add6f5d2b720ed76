"""`factory build --preflight` for real (dockerd, the pypi builder image, real nvcc and g++, torch 2.14.1):
the demo extension's two variants in one run from an empty `$FACTORY_HOME`, one of them with a deliberate
error in its host file (`DEMO_FAIL_HOST`); then the real build of the good variant, which finds the
preflight's host compile in the cache; and a recipe patch that does not apply (about 3 minutes on 2 busy
cores, images built).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from homes import fresh_home
from test_build import DEMO_SRC, ROOT, demo_matrix
from test_cache_build import factory_build

from factory.build import engine
from factory.cache.sync import LAYOUT
from factory.container import protocol
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]

GOOD = "cu130-torch2.14-abi1-sm80.90-py311"
BAD = "cu130-torch2.14-abi1-sm120-py311"
UNDECLARED = "error: ‘demo_fail_host_undeclared_name’ was not declared in this scope"
# the demo recipe has no per-file estimates and a fresh home no profile: the smallest CUDA file is compiled
DEVICE = min(sorted(DEMO_SRC.glob("csrc/*.cu")), key=lambda p: p.stat().st_size).name


def preflight(matrix: Path, out: Path, home: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*factory_build(matrix, out), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "FACTORY_HOME": str(home)},
    )


@pytest.fixture(scope="module")
def demo_preflight(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any, session_factory_home: Path
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("preflight")
    include = [{"arch": "12.0", "env": {"DEMO_FAIL_HOST": "1"}}]
    matrix = demo_matrix(tmp, arch=["8.0;9.0", "12.0"], include=include, build={"memory": "6GiB"})
    home = fresh_home(tmp, "home", session_factory_home)
    out = tmp / "out"
    proc = preflight(matrix, out, home, "--preflight", "--keep-going")
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {
        "proc": proc,
        "out": out,
        "home": home,
        "matrix": matrix,
        "report": report,
        "jobs": {j["job_id"]: j for j in report["jobs"]},
    }


def measurements(log: str) -> list[dict[str, Any]]:
    return [
        json.loads(line.split(protocol.MEASUREMENT_MARK, 1)[1])
        for line in Path(log).read_text().splitlines()
        if protocol.MEASUREMENT_MARK in line
    ]


def test_a_failed_variant_fails_the_run_and_the_summary_names_its_error(
    demo_preflight: dict[str, Any],
) -> None:
    proc = demo_preflight["proc"]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    rows = proc.stderr[proc.stderr.index("preflight:\n") :].splitlines()
    bad = demo_preflight["jobs"][BAD]
    good = demo_preflight["jobs"][GOOD]
    (bad_row,) = [r for r in rows if r.startswith(f"{BAD}  ")]
    assert re.fullmatch(
        rf"{BAD}  fail  src/csrc/bindings\.cpp:\d+:\d+: {UNDECLARED}  log: {re.escape(bad['log'])}", bad_row
    ), bad_row
    (good_row,) = [r for r in rows if r.startswith(f"{GOOD}  ")]
    assert good_row == f"{GOOD}  pass  {good['reason']}  log: {good['log']}"


def test_report_json_has_each_jobs_preflight(demo_preflight: dict[str, Any]) -> None:
    good, bad = demo_preflight["jobs"][GOOD], demo_preflight["jobs"][BAD]
    assert good["result"] == "ok" and good["wheel"] is None
    assert good["preflight"] == {"result": "pass", "line": None, "log": good["log"], "host_compiles": 1,
                                 "device": DEVICE, "arch": "sm_80"}  # fmt: skip
    assert good["reason"] == f"preflight: 1 host compile, device {DEVICE} for sm_80"
    assert bad["result"] == "failed" and bad["preflight"]["result"] == "fail"
    assert bad["preflight"]["line"].endswith(UNDECLARED) and bad["preflight"]["log"] == bad["log"]
    assert not list(demo_preflight["out"].glob("*.whl"))


def test_it_compiled_the_host_sources_and_one_device_source_for_one_arch(
    demo_preflight: dict[str, Any],
) -> None:
    compiles = measurements(demo_preflight["jobs"][GOOD]["log"])
    host = [m for m in compiles if m.get("tool") == "cxx"]
    assert [(m["source"], m["cache"], m["rc"]) for m in host] == [("bindings.cpp", "miss", 0)]
    device = [m for m in compiles if m.get("tool", "nvcc") == "nvcc" and m["cache"] != protocol.CACHE_SKIPPED]
    assert [(m["source"], m["archs"], m["cache"], m["rc"]) for m in device] == [
        (DEVICE, ["compute_80"], "miss", 0)  # compute_90 left out
    ]
    skipped = sorted(m["source"] for m in compiles if m["cache"] == protocol.CACHE_SKIPPED)
    assert skipped == sorted(p.name for p in DEMO_SRC.glob("csrc/*.cu") if p.name != DEVICE)
    log = Path(demo_preflight["jobs"][GOOD]["log"]).read_text()
    assert "is stood in for (no link in a preflight)" in log  # the extension's link


def test_the_compile_cache_holds_what_it_compiled(demo_preflight: dict[str, Any]) -> None:
    home = demo_preflight["home"]
    manifests = list((home / "cache" / "compile" / LAYOUT).glob("*/m/*/*/*.json"))
    by_source: dict[str, list[frozenset[int]]] = {}
    for path in manifests:
        entry = json.loads(path.read_text())
        source = next(Path(name).name for name, _ in entry["inputs"] if Path(name).suffix in (".cpp", ".cu"))
        sha = entry["object_sha256"]
        obj = next((home / "cache" / "compile" / LAYOUT).glob(f"*/o/{sha[:2]}/{sha}")).read_bytes()
        by_source.setdefault(source, []).append(device_code(obj, where="object").cubin_archs)
    # the failed variant's bindings.cpp stored nothing; its own device compile (sm_120) may have finished
    # beside it before ninja stopped
    assert by_source.pop("bindings.cpp") == [frozenset()]
    assert sorted(by_source) == [DEVICE]
    assert frozenset({80}) in by_source[DEVICE] and set(by_source[DEVICE]) <= {
        frozenset({80}),
        frozenset({120}),
    }


def test_no_container_left(demo_preflight: dict[str, Any], docker_client: Any) -> None:
    run_id = demo_preflight["report"]["run_id"]
    assert docker_client.containers.list(all=True, filters={"label": f"{engine.RUN_LABEL}={run_id}"}) == []


def test_the_real_build_takes_the_preflights_host_compile_from_the_cache(
    demo_preflight: dict[str, Any],
) -> None:
    out = demo_preflight["out"].parent / "real"
    proc = preflight(demo_preflight["matrix"], out, demo_preflight["home"], "--only", GOOD)
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    assert proc.returncode == 0 and job["result"] == "ok", (job["reason"], job["log_tail"])
    assert job["preflight"] is None and job["wheel"]
    cached = [(m["source"], m.get("tool")) for m in measurements(job["log"]) if m["cache"] == "hit"]
    assert cached == [
        ("bindings.cpp", "cxx")
    ]  # the device compile was for sm_80 only: this one wants 80 and 90


def test_a_patch_that_does_not_apply_is_the_variants_failure(
    tmp_path: Path, docker_client: Any, session_factory_home: Path
) -> None:
    (tmp_path / "bad.patch").write_text(
        "--- a/setup.py\n+++ b/setup.py\n@@ -1,2 +1,2 @@\n-not what setup.py says\n+anything\n context\n"
    )
    matrix = demo_matrix(tmp_path, arch=["8.0"])
    matrix.write_text(matrix.read_text().replace("recipe:\n", "recipe:\n  patches: [bad.patch]\n"))
    proc = preflight(
        matrix, tmp_path / "out", fresh_home(tmp_path, "home", session_factory_home), "--preflight"
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    (job,) = json.loads((tmp_path / "out" / "report.json").read_text())["jobs"]
    line = job["preflight"]["line"]
    assert line.startswith(f"patch {tmp_path / 'bad.patch'} does not apply: setup.py hunk #1"), line
    assert f"cu130-torch2.14-abi1-sm80-py311  fail  {line}  log: {job['log']}" in proc.stderr.splitlines()
