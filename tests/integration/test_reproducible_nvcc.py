"""The same `.cu` files compiled by the real nvcc (the test venv's toolkit) in two job directories, cold, and
served from the compile cache in a third, give one object each: the compile cache's side of a reproducible
wheel, as the build container's wrapper runs it (`compilecache.plain` when the cache is off, `attempt` when it
is on), without a container.

Each file keeps its kernel in an anonymous namespace, so its symbols carry nvcc's module id
(`_GLOBAL__N__<hash>_<len>_<name>_cu_`), which nvcc hashes from the source's absolute path: unpinned, the job
directory is in every object (the first test shows it, so the others cannot pass for want of a module id)."""

from __future__ import annotations

import hashlib
import re
import subprocess
from pathlib import Path

import pytest

from factory.container import compilecache

pytestmark = pytest.mark.integration

SOURCES = {
    f"{name}.cu": (
        f"namespace {{\n__global__ void {name}_kernel(float* x) {{ x[threadIdx.x] {op}= 2.0f; }}\n}}\n"
        f"void {name}_launch(float* x) {{ {name}_kernel<<<1, 32>>>(x); }}\n"
    )
    for name, op in (("twice", "*"), ("plus", "+"), ("minus", "-"))
}
GENCODE = "-gencode=arch=compute_80,code=sm_80"
MODULE_ID = re.compile(rb"_GLOBAL__N__([0-9a-f]{8})_\d+_(\w+?)_cu_")


def job(tmp_path: Path, name: str) -> Path:
    """A job directory with the sources under src/csrc, as a build container's (`jobspec.job_dir`)."""
    root = tmp_path / "jobs" / name
    (root / "src" / "csrc").mkdir(parents=True)
    (root / "src" / "build").mkdir()
    for file, text in SOURCES.items():
        (root / "src" / "csrc" / file).write_text(text)
    return root


def args(file: str) -> list[str]:
    # relative paths from the build directory, as ninja's rules write them
    return ["-c", f"../csrc/{file}", "-o", f"{file}.o", GENCODE, "-MD", "-MF", f"{file}.o.d"]


def compile_plain(nvcc: str, root: Path, file: str) -> bytes:
    """A compile with the cache off, as the wrapper runs it."""
    cwd = root / "src" / "build"
    call = compilecache.plain("nvcc", args(file), environ={"FACTORY_JOB_DIR": str(root)}, cwd=str(cwd))
    proc = subprocess.run([nvcc, *call.run_args], cwd=cwd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    call.finish(proc.returncode)
    return (cwd / f"{file}.o").read_bytes()


def compile_cached(nvcc: str, root: Path, file: str, cache: Path) -> tuple[bytes, bool]:
    """A compile with the cache on, as the wrapper runs it: served when `cache` has it, else compiled into
    it. The object, and whether it was served."""
    cwd = root / "src" / "build"
    environ = {"FACTORY_JOB_DIR": str(root), "FACTORY_CACHE_DIR": str(cache), "FACTORY_CACHE_OUT": str(cache)}
    attempt = compilecache.attempt("nvcc", nvcc, args(file), environ=environ, cwd=str(cwd))
    assert isinstance(attempt, compilecache.Attempt), attempt
    served = attempt.serve(environ)
    if not served:
        attempt.start()
        proc = subprocess.run([nvcc, *attempt.run_args], cwd=cwd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert attempt.finish(proc.returncode) is not None  # stored
    return (cwd / f"{file}.o").read_bytes(), served


def module_ids(data: bytes) -> set[tuple[bytes, bytes]]:
    return set(MODULE_ID.findall(data))


def test_unpinned_the_job_directory_is_in_the_module_id(toolkit_nvcc: str, tmp_path: Path) -> None:
    """Why `module_path` exists: nvcc's own choice differs between two job directories."""
    objects = []
    for name in ("one", "two"):
        cwd = job(tmp_path, name) / "src" / "build"
        command = [toolkit_nvcc, *args("twice.cu")[:5]]  # no depfile, no pins
        proc = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stderr[-2000:]
        objects.append((cwd / "twice.cu.o").read_bytes())
    one, two = (module_ids(o) for o in objects)
    assert {n for _, n in one} == {n for _, n in two} == {b"twice"}
    assert one != two


def test_cold_in_two_job_directories_and_from_the_cache_is_one_object(
    toolkit_nvcc: str, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    first, second, third, fourth = (job(tmp_path, n) for n in ("demo-1", "demo-2", "demo-3", "demo-4"))
    ids: set[tuple[bytes, bytes]] = set()
    for file in SOURCES:
        cold = compile_plain(toolkit_nvcc, first, file)
        again = compile_plain(toolkit_nvcc, second, file)
        stored, served = compile_cached(toolkit_nvcc, third, file, cache)
        assert not served
        hit, served = compile_cached(toolkit_nvcc, fourth, file, cache)
        assert served
        digests = {hashlib.sha256(o).hexdigest() for o in (cold, again, stored, hit)}
        assert len(digests) == 1, file
        found = module_ids(cold)
        assert len(found) == 1 and {n for _, n in found} == {file.removesuffix(".cu").encode()}, found
        ids |= found
    assert len({digest for digest, _ in ids}) == len(SOURCES)  # one module id per source, each its own
