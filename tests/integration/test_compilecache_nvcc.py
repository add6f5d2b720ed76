"""The compile cache with the real nvcc (the test venv's CUDA toolkit) behind the wrapper, run as a build runs
it: torch-style calls in two job dirs whose venvs and Pythons differ. A kernel hits across Pythons only when
it does not read Python.h; an edited header or a changed flag misses. The host compiler's `c++` launcher
with the real c++ as well."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import require
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.cache import sync as cache
from factory.cache.sync import stats as cache_stats
from factory.container import CONTAINER_DIR, compilecache, protocol
from factory.trust import cachekeys

pytestmark = pytest.mark.integration

NVCC = CONTAINER_DIR / "nvcc"
CXX = CONTAINER_DIR / "c++"

PLAIN = r"""
#include "pkg.h"
__global__ void scale(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= PKG_FACTOR;
}
void launch(float* x, int n) { scale<<<(n + 255) / 256, 256>>>(x, n); }
"""

# torch/extension.h brings Python.h into the device pass too: here the kernel's code depends on it
PYTHON_DEPENDENT = r"""
#include "pkg.h"
#include <Python.h>
__global__ void version(int* x) { *x = PY_VERSION_HEX + PKG_FACTOR; }
void launch(int* x) { version<<<1, 1>>>(x); }
"""

FLAGGED = r"""
__global__ void flagged(int* x) {
#ifdef FOO
  *x = 2;
#else
  *x = 1;
#endif
}
"""

HOST = r"""
#include <vector>
#include "pkg.h"
float total() { std::vector<float> v(3, PKG_FACTOR); float s = 0; for (float x : v) s += x; return s; }
"""

ARCH = "-gencode=arch=compute_90,code=sm_90"
# the source's own path in the object, as TORCH_CHECK and assert write it
FILE_NAME = r"""
const char* where() { return __FILE__; }
"""


# kernels internal to their file, as most packages write them: their symbols carry nvcc's module id,
# `_GLOBAL__N__<hash>_<len>_<name>_cu_`, whose hash nvcc takes from the source's absolute path
INTERNAL = {
    f"csrc/{name}.cu": (
        f"namespace {{\n__global__ void {name}(float* x) {{ x[threadIdx.x] {op}= 2.0f; }}\n}}\n"
        f"void launch_{name}(float* x) {{ {name}<<<1, 32>>>(x); }}\n"
    )
    for name, op in (("twice", "*"), ("plus", "+"), ("minus", "-"))
}
MODULE_ID = re.compile(rb"_GLOBAL__N__([0-9a-f]{8})_\d+_(\w+?)_cu_")


def make_job(root: Path, name: str, python: str, sources: dict[str, str]) -> Path:
    job = root / "jobs" / name
    site = job / "venv" / "lib" / f"python{python}" / "site-packages"
    (site / "pkg" / "include").mkdir(parents=True)
    (site / "pkg" / "include" / "pkg.h").write_text("#define PKG_FACTOR 2.0f\n")
    inc = root / "pythons" / python / "include" / f"python{python}"
    if not inc.exists():
        inc.mkdir(parents=True)
        hexv = {"3.11": "0x030B07F0", "3.13": "0x030D05F0"}[python]
        (inc / "Python.h").write_text(f"#pragma once\n#define PY_VERSION_HEX {hexv}\n")
    (job / "src" / "csrc").mkdir(parents=True)
    (job / "src" / "build" / f"temp.linux-x86_64-cpython-{python.replace('.', '')}" / "csrc").mkdir(
        parents=True
    )
    for rel, text in sources.items():
        (job / "src" / rel).write_text(text)
    return job


def torch_call(job: Path, python: str, src: str, *flags: str) -> list[str]:
    """What torch's ninja rule runs: the depfile flags, every include dir (Python's among them), -c, -o."""
    obj = next((job / "src" / "build").glob("temp.*")) / "csrc" / (Path(src).stem + ".o")
    site = job / "venv" / "lib" / f"python{python}" / "site-packages"
    pyinc = job.parent.parent / "pythons" / python / "include" / f"python{python}"
    return [
        "--generate-dependencies-with-compile", "--dependency-output", f"{obj}.d",
        f"-I{site}/pkg/include", f"-I{pyinc}",
        "-c", str(job / "src" / src), "-o", str(obj),
        "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", "--compiler-options", "-fPIC",
        "-O3", ARCH, *flags,
    ]  # fmt: skip


def obj_of(args: list[str]) -> Path:
    return Path(args[args.index("-o") + 1])


KEYRING = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
DOMAIN = "d" * 64


def domain(local: Path) -> Path:
    """The trust domain's directory the build sees read-only, made as the host makes it."""
    path = cache.domain_dir(local, DOMAIN)
    path.mkdir(parents=True, exist_ok=True)
    return path


def run(
    nvcc: str,
    cuda_home: Path,
    job: Path,
    local: Path,
    args: list[str],
    *,
    state: Path | None = None,
    extra: dict[str, str] | None = None,
) -> tuple[protocol.Measurement, subprocess.CompletedProcess[str]]:
    """The wrapper as a build runs it, its outbox then imported by the host as after a job; with `state`,
    admitted as in a build (a state dir, a memory limit)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.pop("FACTORY_STATE_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    if state is not None:
        env.update({"FACTORY_STATE_DIR": str(state), "FACTORY_MEM_LIMIT": str(64 << 30)})
    outbox = job / "outbox"
    env.update(
        {
            "FACTORY_REAL_NVCC": nvcc,
            "CUDA_HOME": str(cuda_home),
            "FACTORY_JOB_DIR": str(job),
            "FACTORY_CACHE_DIR": str(domain(local)),
            "FACTORY_CACHE_OUT": str(outbox),
            **(extra or {}),
        }
    )
    proc = subprocess.run(
        [str(NVCC), *args],
        env=env,
        cwd=obj_of(args).parent,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    cache.import_outbox(outbox, domain(local), domain=DOMAIN, keyring=KEYRING)
    (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
    return m, proc


def manifests(local: Path) -> list[compilecache.Entry]:
    found = [
        cachekeys.verified_entry(p.read_bytes(), domain=DOMAIN, keyring=KEYRING)
        for p in sorted((domain(local) / "m").rglob("*.json"))
    ]
    assert None not in found, "every manifest in the local cache is signed by the host"
    return [e for e in found if e is not None]


def test_a_kernel_without_python_h_compiles_once_for_two_pythons(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path
) -> None:
    cache = tmp_path / "cache"
    a = make_job(tmp_path, "demo-py3.11-1", "3.11", {"csrc/plain.cu": PLAIN})
    b = make_job(tmp_path, "demo-py3.13-1", "3.13", {"csrc/plain.cu": PLAIN})
    args_a, args_b = torch_call(a, "3.11", "csrc/plain.cu"), torch_call(b, "3.13", "csrc/plain.cu")
    first, _ = run(toolkit_nvcc, cuda_home, a, cache, args_a, state=tmp_path / "state-a")
    second, _ = run(toolkit_nvcc, cuda_home, b, cache, args_b, state=tmp_path / "state-b")
    assert (first.cache, second.cache) == ("miss", "hit")
    # the miss was admitted; the hit never asked
    assert (tmp_path / "state-a").is_dir() and not (tmp_path / "state-b").exists()
    assert second.peak_bytes == 0 and second.wall_s < first.wall_s
    assert obj_of(args_b).read_bytes() == obj_of(args_a).read_bytes()
    depfile = Path(f"{obj_of(args_b)}.d").read_text()
    assert str(b / "venv" / "lib" / "python3.13" / "site-packages" / "pkg" / "include" / "pkg.h") in depfile
    assert "cuda_runtime.h" in depfile and str(a) not in depfile and "@" not in depfile
    (manifest,) = manifests(cache)
    paths = [p for p, _ in manifest.inputs]
    assert "@SITE@/pkg/include/pkg.h" in paths and "@JOB@/src/csrc/plain.cu" in paths
    assert any(p.startswith("@CUDA@/") for p in paths) and not any("Python.h" in p for p in paths)


def test_a_kernel_that_reads_python_h_is_compiled_per_python(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path
) -> None:
    cache = tmp_path / "cache"
    jobs = [
        (make_job(tmp_path, name, python, {"csrc/py.cu": PYTHON_DEPENDENT}), python)
        for name, python in (("a", "3.11"), ("b", "3.13"), ("c", "3.11"))
    ]
    calls = [torch_call(job, python, "csrc/py.cu") for job, python in jobs]
    states = [
        run(toolkit_nvcc, cuda_home, job, cache, args)[0].cache
        for (job, _), args in zip(jobs, calls, strict=True)
    ]
    assert states == ["miss", "miss", "hit"]
    objects = [obj_of(args).read_bytes() for args in calls]
    assert objects[0] != objects[1] and objects[0] == objects[2]
    assert cache_stats(cache).entries == 2


def test_an_edited_header_misses(tmp_path: Path, toolkit_nvcc: str, cuda_home: Path) -> None:
    cache = tmp_path / "cache"
    a = make_job(tmp_path, "a", "3.11", {"csrc/plain.cu": PLAIN})
    b = make_job(tmp_path, "b", "3.11", {"csrc/plain.cu": PLAIN})
    (b / "venv" / "lib" / "python3.11" / "site-packages" / "pkg" / "include" / "pkg.h").write_text(
        "#define PKG_FACTOR 3.0f\n"
    )
    args_a, args_b = torch_call(a, "3.11", "csrc/plain.cu"), torch_call(b, "3.11", "csrc/plain.cu")
    assert run(toolkit_nvcc, cuda_home, a, cache, args_a)[0].cache == "miss"
    assert run(toolkit_nvcc, cuda_home, b, cache, args_b)[0].cache == "miss"
    assert obj_of(args_a).read_bytes() != obj_of(args_b).read_bytes()


@pytest.mark.parametrize(
    "changed", [["-DFOO"], ["-O2"], ["-gencode=arch=compute_80,code=sm_80"]], ids=["define", "opt", "arch"]
)
def test_a_changed_flag_misses(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path, changed: list[str]
) -> None:
    cache = tmp_path / "cache"
    a = make_job(tmp_path, "a", "3.11", {"csrc/flagged.cu": FLAGGED})
    base = torch_call(a, "3.11", "csrc/flagged.cu")
    other = [f for f in base if f != "-O3"] + changed if changed == ["-O2"] else [*base, *changed]
    assert run(toolkit_nvcc, cuda_home, a, cache, base)[0].cache == "miss"
    assert run(toolkit_nvcc, cuda_home, a, cache, other)[0].cache == "miss"
    assert cache_stats(cache).entries == 2


def test_the_host_compiler_through_the_c_launcher_records_its_system_headers(tmp_path: Path) -> None:
    # torch's ninja rule for a .cpp: `$CXX -MMD -MF X.o.d ... -c SRC -o X.o`; -MMD alone would leave out
    # <vector>, which a manifest must not
    cxx = shutil.which("c++")
    require(cxx is not None, "a host c++")
    local = tmp_path / "cache"
    jobs = [make_job(tmp_path, name, "3.11", {"csrc/host.cpp": HOST}) for name in ("a", "b")]
    objects = []
    for job in jobs:
        obj = next((job / "src" / "build").glob("temp.*")) / "csrc" / "host.o"
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env.update(
            {
                "FACTORY_REAL_CXX": str(cxx),
                "FACTORY_JOB_DIR": str(job),
                "FACTORY_CACHE_DIR": str(domain(local)),
                "FACTORY_CACHE_OUT": str(job / "outbox"),
            }
        )
        site = job / "venv" / "lib" / "python3.11" / "site-packages"
        args = ["-MMD", "-MF", f"{obj}.d", f"-I{site}/pkg/include", "-O2", "-fPIC", "-std=c++17"]
        proc = subprocess.run(
            [str(CXX), *args, "-c", str(job / "src" / "csrc" / "host.cpp"), "-o", str(obj)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        cache.import_outbox(job / "outbox", domain(local), domain=DOMAIN, keyring=KEYRING)
        (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
        objects.append((m.cache, obj.read_bytes(), Path(f"{obj}.d").read_text()))
    assert [c for c, _, _ in objects] == ["miss", "hit"]
    assert objects[0][1] == objects[1][1] and str(jobs[1]) in objects[1][2]
    (entry,) = manifests(local)
    assert any(p.endswith("/vector") for p, _ in entry.inputs)
    assert "@SITE@/pkg/include/pkg.h" in [p for p, _ in entry.inputs]


def test_two_jobs_compile_the_same_bytes_so_a_hit_can_be_checked_by_compiling_it(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path
) -> None:
    # nvcc names its host pass after a temporary file (pid and counter in it), and a job's paths reach the
    # object through __FILE__: the wrapper fixes the one and maps the other, so two jobs in different
    # directories, on different Pythons, write the same object, and FACTORY_CACHE_CHECK can compare
    local = tmp_path / "cache"
    a = make_job(tmp_path, "demo-py3.11-1", "3.11", {"csrc/plain.cu": PLAIN + FILE_NAME})
    b = make_job(tmp_path, "demo-py3.13-22", "3.13", {"csrc/plain.cu": PLAIN + FILE_NAME})
    args_a, args_b = torch_call(a, "3.11", "csrc/plain.cu"), torch_call(b, "3.13", "csrc/plain.cu")
    assert run(toolkit_nvcc, cuda_home, a, local, args_a)[0].cache == "miss"
    assert b"@JOB@/src/csrc/plain.cu" in obj_of(args_a).read_bytes()
    checked, _ = run(toolkit_nvcc, cuda_home, b, local, args_b, extra={"FACTORY_CACHE_CHECK": "1"})
    assert (checked.cache, checked.cache_check) == ("miss", "same")
    (entry,) = manifests(local)
    assert checked.entry == f"{entry.direct_key}-{entry.result_key}"
    assert obj_of(args_b).read_bytes() == obj_of(args_a).read_bytes()
    # the one claim is spent: the next lookup is served
    served, _ = run(toolkit_nvcc, cuda_home, b, local, args_b, extra={"FACTORY_CACHE_CHECK": "1"})
    assert (served.cache, served.cache_check) == ("hit", None)


def test_a_hit_checked_by_compiling_it_reports_an_object_that_differs(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path
) -> None:
    # a signer gone bad (a runner's key, a build of the same code): an entry whose object is not what the
    # compile writes, with a valid signature; verification catches it and the build uses its own object
    local = tmp_path / "cache"
    a = make_job(tmp_path, "a", "3.11", {"csrc/plain.cu": PLAIN})
    b = make_job(tmp_path, "b", "3.11", {"csrc/plain.cu": PLAIN})
    args_a, args_b = torch_call(a, "3.11", "csrc/plain.cu"), torch_call(b, "3.11", "csrc/plain.cu")
    run(toolkit_nvcc, cuda_home, a, local, args_a)
    honest = obj_of(args_a).read_bytes()
    (entry,) = manifests(local)
    planted = honest.replace(b"scale", b"SCALE")
    assert planted != honest
    forged = replace(entry, object_sha256=hashlib.sha256(planted).hexdigest(), object_size=len(planted))
    obj = domain(local) / compilecache.object_relative(forged.object_sha256)
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(planted)
    manifest = domain(local) / compilecache.manifest_relative(entry.direct_key, entry.result_key)
    manifest.write_bytes(cachekeys.signed_manifest(forged, domain=DOMAIN, keyring=KEYRING))
    checked, _ = run(toolkit_nvcc, cuda_home, b, local, args_b, extra={"FACTORY_CACHE_CHECK": "1"})
    assert (checked.cache, checked.cache_check) == ("miss", "differs")
    assert obj_of(args_b).read_bytes() == honest


def test_internal_kernels_are_one_object_cold_in_two_jobs_into_the_cache_and_from_it(
    tmp_path: Path, toolkit_nvcc: str, cuda_home: Path
) -> None:
    """Three .cu files, each compiled with the cache off in two job directories, into the cache in a third
    and served from it in a fourth: one object per file, its module id pinned (`compilecache.module_path`).
    nvcc's own id differs between two job directories: the pin is what makes them one."""
    local = tmp_path / "cache"
    jobs = [make_job(tmp_path, f"demo-py3.11-{n}", "3.11", INTERNAL) for n in ("1", "22", "333", "4444")]
    off = {"FACTORY_CACHE_DIR": ""}
    ids: set[bytes] = set()
    for src in INTERNAL:
        calls = [torch_call(job, "3.11", src) for job in jobs]
        states = []
        for i, (job, args) in enumerate(zip(jobs, calls, strict=True)):
            # admitted as in a build (a state dir), so a compile with the cache off reports itself too
            extra = off if i < 2 else None
            states.append(
                run(toolkit_nvcc, cuda_home, job, local, args, state=tmp_path / "state", extra=extra)
            )
        assert [m.cache for m, _ in states] == [protocol.CACHE_OFF, protocol.CACHE_OFF, "miss", "hit"]
        objects = [obj_of(args).read_bytes() for args in calls]
        assert len({hashlib.sha256(o).hexdigest() for o in objects}) == 1, src
        (found,) = set(MODULE_ID.findall(objects[0]))
        assert found[1] == Path(src).stem.encode()
        ids.add(found[0])
    assert len(ids) == len(INTERNAL)  # each file its own id, as rdc's device link needs
    unpinned = []
    for job in jobs[:2]:
        args = torch_call(job, "3.11", "csrc/twice.cu")
        proc = subprocess.run(
            [toolkit_nvcc, *args], cwd=obj_of(args).parent, capture_output=True, check=False
        )
        assert proc.returncode == 0, proc.stderr
        unpinned.append(set(MODULE_ID.findall(obj_of(args).read_bytes())))
    assert unpinned[0] != unpinned[1] and len(unpinned[0]) == 1
