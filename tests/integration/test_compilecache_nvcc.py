"""The compile cache with the real nvcc (the test venv's CUDA toolkit) behind the wrapper, run as a build runs
it: torch-style calls in two job dirs whose venvs and Pythons differ. A kernel hits across Pythons only when
it does not read Python.h; an edited header or a changed flag misses. The host compiler's `c++` launcher
with the real c++ as well."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from factory.container import CONTAINER_DIR, compilecache, protocol

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


def run(
    nvcc: str, cuda_home: Path, job: Path, cache: Path, args: list[str], *, state: Path | None = None
) -> tuple[protocol.Measurement, subprocess.CompletedProcess[str]]:
    """The wrapper as a build runs it; with `state`, admitted as in a build (a state dir, a memory limit)."""
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.pop("FACTORY_STATE_DIR", None)
    env.pop("VIRTUAL_ENV", None)
    if state is not None:
        env.update({"FACTORY_STATE_DIR": str(state), "FACTORY_MEM_LIMIT": str(64 << 30)})
    env.update(
        {
            "FACTORY_REAL_NVCC": nvcc,
            "CUDA_HOME": str(cuda_home),
            "FACTORY_JOB_DIR": str(job),
            "FACTORY_CACHE_DIR": str(cache),
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
    (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
    return m, proc


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
    manifest = compilecache.parse_manifest(
        next((cache / compilecache.LAYOUT_VERSION / "m").rglob("*.json")).read_text()
    )
    assert manifest is not None
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
    assert compilecache.stats(cache).entries == 2


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
    assert compilecache.stats(cache).entries == 2


def test_the_host_compiler_through_the_c_launcher_records_its_system_headers(tmp_path: Path) -> None:
    # torch's ninja rule for a .cpp: `$CXX -MMD -MF X.o.d ... -c SRC -o X.o`; -MMD alone would leave out
    # <vector>, which a manifest must not
    cxx = shutil.which("c++")
    require(cxx is not None, "a host c++")
    cache = tmp_path / "cache"
    jobs = [make_job(tmp_path, name, "3.11", {"csrc/host.cpp": HOST}) for name in ("a", "b")]
    objects = []
    for job in jobs:
        obj = next((job / "src" / "build").glob("temp.*")) / "csrc" / "host.o"
        env = dict(os.environ)
        env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
        env.update(
            {"FACTORY_REAL_CXX": str(cxx), "FACTORY_JOB_DIR": str(job), "FACTORY_CACHE_DIR": str(cache)}
        )
        site = job / "venv" / "lib" / "python3.11" / "site-packages"
        args = ["-MMD", "-MF", f"{obj}.d", f"-I{site}/pkg/include", "-O2", "-fPIC", "-std=c++17"]
        proc = subprocess.run(
            [str(CXX), *args, "-c", str(job / "src" / "csrc" / "host.cpp"), "-o", str(obj)],
            env=env, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
        objects.append((m.cache, obj.read_bytes(), Path(f"{obj}.d").read_text()))
    assert [c for c, _, _ in objects] == ["miss", "hit"]
    assert objects[0][1] == objects[1][1] and str(jobs[1]) in objects[1][2]
    (manifest,) = (cache / compilecache.LAYOUT_VERSION / "m").rglob("*.json")
    entry = compilecache.parse_manifest(manifest.read_text())
    assert entry is not None
    assert any(p.endswith("/vector") for p, _ in entry.inputs)
    assert "@SITE@/pkg/include/pkg.h" in [p for p, _ in entry.inputs]
