"""The compile cache through the real factory (dockerd, the pypi builder image, real nvcc), shared through a
directory store between two `$FACTORY_HOME`s, as between two machines.

- the demo extension built twice: the second build, from an empty home, compiles nothing; then a third, an
  untrusted build (the store's public key only), hits the store's entries, compiles the one taken out of the
  store and adds nothing to it (7 min on 2 busy cores, images built: three builds of one job)
- resume: a memext build SIGKILLed (the factory and its container) once a compile reached the store; the
  rerun from an empty home serves those compiles from the store (4-5 min on 2 busy cores)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from homes import fresh_home
from test_build import FACTORY, ROOT, demo_matrix
from test_kill import build_containers
from test_memory_build import SCALE, memext_matrix

from factory.cache.sync import LAYOUT, parse_store_key
from factory.trust import cachekeys, signing
from factory.wheel.fatbin import device_code

pytestmark = [pytest.mark.integration, pytest.mark.slow]
# the store's key pair: trusted runners hold the private key, untrusted builds the public one
SHARED_KEY, SHARED_PUB = (k.decode() for k in signing.generate_key())
WRITER = {cachekeys.SIGN_KEY_ENV: SHARED_KEY}
READER = {cachekeys.PUBLIC_KEYS_ENV: SHARED_PUB}


def factory_build(matrix: Path, out: Path) -> list[str]:
    return [*FACTORY, "build", "--trust-paths", "--matrix", str(matrix), "--output", str(out)]


def run_build(
    matrix: Path, out: Path, home: Path, *extra: str, keys: dict[str, str] = WRITER
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTORY_CACHE_")}
    proc = subprocess.run(
        [*factory_build(matrix, out), *extra],
        capture_output=True,
        text=True,
        cwd=ROOT,
        # the runners that write a store hold its private key (a CI secret); the others its public key
        env={**env, "FACTORY_HOME": str(home), **keys},
    )
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    return proc, job


def store_entries(store: Path) -> list[Path]:
    """The committed manifests in a store (one per cached compile)."""
    return [p for p in (store / LAYOUT).glob("*/m/*/*/*.json") if parse_store_key(str(p.relative_to(store)))]


def kernel_entries(store: Path) -> list[Path]:
    """The manifests of nvcc compiles (a .cu among their inputs), as opposed to the host compiler's."""
    found = []
    for path in store_entries(store):
        try:
            inputs = json.loads(path.read_text())["inputs"]
        except (OSError, ValueError, KeyError):
            continue
        if any(str(name).endswith(".cu") for name, _ in inputs):
            found.append(path)
    return found


def cubin_archs(wheel: Path) -> frozenset[int]:
    with zipfile.ZipFile(wheel) as zf:
        (so,) = [n for n in zf.namelist() if n.endswith(".so")]
        return device_code(zf.read(so)).cubin_archs


def test_a_second_machine_compiles_nothing(
    tmp_path: Path, docker_client: Any, session_factory_home: Path
) -> None:
    store = tmp_path / "store"
    matrix = demo_matrix(tmp_path, arch=["8.0"], build={"cache": str(store)})
    _, job1 = run_build(matrix, tmp_path / "w1", fresh_home(tmp_path, "home1", session_factory_home))
    assert job1["result"] == "ok", (job1["reason"], job1["log_tail"])
    assert job1["compiles_compiled"] >= 3 and job1["compiles_cached"] == 0
    assert len(store_entries(store)) >= job1["compiles_compiled"]
    second, job2 = run_build(
        matrix, tmp_path / "w2", fresh_home(tmp_path, "home2", session_factory_home), "--check-cache", "1"
    )
    assert job2["result"] == "ok", (job2["reason"], job2["log_tail"])
    # every compile a hit; the one checked by compiling it anyway gave the cache's bytes on another machine,
    # in another job directory (deterministic objects)
    assert (job2["compiles_cached"], job2["compiles_compiled"]) == (job1["compiles_compiled"] - 1, 1)
    assert (job2["cache_checked"], job2["cache_suspects"]) == (1, [])
    assert f"{job2['compiles_cached']} cached / 1 compiled" in second.stderr
    # accepted means every check passed (tags, pin, archs, manylinux, install + import); and the code is there
    assert cubin_archs(tmp_path / "w2" / job2["wheel"]) == frozenset({80})

    # an untrusted build (a pull request: the store's public key only) reads the shared cache and cannot add
    # to it: one entry taken out of the store, it compiles that one, keeps it in its own local cache, and
    # the store is as it was
    (removed,) = kernel_entries(store)[:1]
    relative = str(removed.relative_to(store))
    removed.unlink()
    before = {p: p.read_bytes() for p in store.rglob("*") if p.is_file()}
    home3 = fresh_home(tmp_path, "home3", session_factory_home)
    third, job3 = run_build(matrix, tmp_path / "w3", home3, keys=READER)
    assert job3["result"] == "ok", (job3["reason"], job3["log_tail"])
    assert (job3["compiles_cached"], job3["compiles_compiled"]) == (job1["compiles_compiled"] - 1, 1)
    assert "read only (no $FACTORY_CACHE_SIGN_KEY)" in third.stderr
    assert {p: p.read_bytes() for p in store.rglob("*") if p.is_file()} == before  # nothing added or changed
    mine = (home3 / "cache" / "compile" / relative).read_bytes()  # its own compile, for its own next build
    domain = PurePosixPath(relative).parts[1]
    own = cachekeys.load_keyring(home3 / "cache", {})
    assert cachekeys.verified_entry(mine, domain=domain, keyring=own) is not None
    store_keys = cachekeys.Keyring(
        signing=own.signing, writes_store=False, trusted=cachekeys.public_keys(SHARED_PUB)
    )
    assert cachekeys.verified_entry(mine, domain=domain, keyring=store_keys, from_store=True) is None
    assert cubin_archs(tmp_path / "w3" / job3["wheel"]) == frozenset({80})


def test_a_killed_build_resumes_from_the_store_elsewhere(
    tmp_path: Path, docker_client: Any, session_factory_home: Path
) -> None:
    store = tmp_path / "store"
    tus = "heavy1,heavy2,light1,light2"
    # light files first: they finish while the heavy ones still compile, so the kill comes mid-build
    env = {"MEMEXT_ORDER": "light-first", "MEMEXT_TUS": tus, **SCALE}
    matrix = memext_matrix(tmp_path, gib_per_arch=0.7, env=env, max_attempts=1, memory="4GiB")
    matrix.write_text(matrix.read_text() + f"  cache: {store}\n")
    home1 = fresh_home(tmp_path, "home1", session_factory_home)
    proc = subprocess.Popen(
        factory_build(matrix, tmp_path / "w1"),
        cwd=ROOT,
        env={**os.environ, "FACTORY_HOME": str(home1), **WRITER},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 900
        # the event: a finished kernel compile has reached the store (the host uploads while the job runs)
        while not kernel_entries(store):
            assert proc.poll() is None, "the build ended before a kernel compile reached the store"
            assert time.monotonic() < deadline, "no compile reached the store"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        for container in build_containers(docker_client, proc.pid, running_only=False):
            container.remove(force=True)  # SIGKILL of the container too
    finally:
        if proc.poll() is None:
            proc.kill()
    compiles = len(tus.split(",")) + 1  # and module.cpp, through the c++ launcher
    before = len(store_entries(store))
    assert 1 <= before < compiles and kernel_entries(store)
    _, job = run_build(matrix, tmp_path / "w2", fresh_home(tmp_path, "home2", session_factory_home))
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert job["compiles_cached"] == before
    assert job["compiles_cached"] + job["compiles_compiled"] == compiles
    assert cubin_archs(tmp_path / "w2" / job["wheel"]) == frozenset({80})
