"""Reproducible wheels through the real factory (dockerd, the pypi builder image, real nvcc and g++), and
`factory rebuild` finding what differs.

One job of the demo extension (sm80), built as little as the claims allow. Its four `.cu` files keep their
kernels in anonymous namespaces, as real packages do, so each module's symbols carry nvcc's module id, which
nvcc derives from the source's path: the job directory differs in every run below, and the id must not.
- A: cold, the compile cache off, in its own empty `$FACTORY_HOME`;
- C: the cache on, in another home: compiled cold into its cache; its bytes are A's (the wheel does not
  record whether the cache was on);
- B: `factory rebuild C --cache off` in a third empty home (another run, job directory and
  container, later), as a team that no longer trusts a compile cache checks a wheel it built: it passes,
  the wheel it rebuilt is C's bytes, and so the same job built twice gives one sha256;
- D: `rebuild` of C with one byte of its extension changed, `--cache local`: every compile a cache
  hit, it names the changed member, and the wheel it rebuilt is C's bytes (cache hits give the cold bytes);
- E: one entry of that cache replaced by a wrong object (signed with the home's key, as a runner that holds
  it could): `rebuild C --cache local` builds with it and names the extension module.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import subprocess
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from homes import fresh_home
from test_build import DEMO_SRC, FACTORY, ROOT, demo_matrix

from factory.cache import sync
from factory.container import compilecache
from factory.trust import cachekeys
from factory.wheel import wheeldiff

pytestmark = [pytest.mark.integration, pytest.mark.slow]
SO = "factory_demo_ext/_C.cpython-311-x86_64-linux-gnu.so"
POISON = (b"has no CPU kernels", b"has no CPU kernelz")  # a string of bindings.cpp, in its object
# a symbol in an anonymous namespace of a .cu file: `_GLOBAL__N__<hash of its path>_<len>_<name>_cu_`
MODULE_ID = re.compile(rb"_GLOBAL__N__([0-9a-f]{8})_\d+_(\w+?)_cu_")


def run_factory(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTORY_CACHE_")}
    return subprocess.run(
        [*FACTORY, *args], capture_output=True, text=True, cwd=ROOT, env={**env, "FACTORY_HOME": str(home)}
    )


def built_wheel(out: Path, proc: subprocess.CompletedProcess[str]) -> Path:
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    (job,) = json.loads((out / "report.json").read_text())["jobs"]
    assert job["result"] == "ok", (job.get("reason"), job.get("log_tail"))
    return out / job["wheel"]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True, kw_only=True)
class Built:
    matrix: Path
    tmp: Path
    cold: Path  # A: the cache off
    cached_home: Path
    cached: Path  # C: the cache on, compiled cold into it


@pytest.fixture(scope="module")
def built(
    tmp_path_factory: pytest.TempPathFactory, docker_client: object, session_factory_home: Path
) -> Iterator[Built]:
    tmp = tmp_path_factory.mktemp("reproducible")
    matrix = demo_matrix(tmp, arch=["8.0"])
    home_a = fresh_home(tmp, "home-a", session_factory_home)
    proc = run_factory(
        home_a, "build", "--trust-paths", "-m", str(matrix), "-o", str(tmp / "a"), "--cache", "off"
    )
    cold = built_wheel(tmp / "a", proc)
    home_c = fresh_home(tmp, "home-c", session_factory_home)
    proc = run_factory(home_c, "build", "--trust-paths", "-m", str(matrix), "-o", str(tmp / "c"))
    cached = built_wheel(tmp / "c", proc)
    yield Built(matrix=matrix, tmp=tmp, cold=cold, cached_home=home_c, cached=cached)


def module_ids(wheel: Path) -> dict[str, set[bytes]]:
    """The module ids in a wheel's extension, by the .cu file they name."""
    with zipfile.ZipFile(wheel) as archive:
        data = archive.read(SO)
    found: dict[str, set[bytes]] = {}
    for digest, name in MODULE_ID.findall(data):
        found.setdefault(name.decode(), set()).add(digest)
    return found


def rebuild(home: Path, wheel: Path, workdir: Path, *extra: str) -> tuple[int, dict[str, object], str]:
    args = ["--source", str(DEMO_SRC), "--workdir", str(workdir), "--json", *extra]
    proc = run_factory(home, "rebuild", str(wheel), *args)
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout), proc.stderr


def changed_one_byte(wheel: Path, dest: Path) -> Path:
    """`wheel` with one byte of its extension module changed, everything else (RECORD too) as it was."""
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / wheel.name
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(target, "w") as out:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == SO:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]
            out.writestr(info, data)
    return target


def test_cold_and_cached_builds_are_one_wheel_and_a_rebuild_without_the_cache_passes(
    built: Built, session_factory_home: Path
) -> None:
    ids = module_ids(built.cold)
    assert sorted(ids) == ["add", "relu", "saxpy", "scale"] and all(len(i) == 1 for i in ids.values()), ids
    assert module_ids(built.cached) == ids  # another job directory, the same ids
    assert wheeldiff.compare_wheels(built.cold, built.cached) is None
    assert sha256(built.cold) == sha256(built.cached)
    home_b = fresh_home(built.tmp, "home-b", session_factory_home)
    code, result, log = rebuild(home_b, built.cached, built.tmp / "b", "--cache", "off")
    assert code == 0, (result, log[-3000:])
    assert result["difference"] is None
    (rebuilt,) = (built.tmp / "b" / "out").glob("*.whl")
    assert sha256(rebuilt) == sha256(built.cached) == result["rebuilt_sha256"]
    report = json.loads((built.tmp / "b" / "out" / "report.json").read_text())
    (job,) = report["jobs"]
    assert job["compiles_cached"] == 0 and job["compiles_compiled"] > 0, job


def test_a_wheel_from_cache_hits_is_the_cold_ones_and_a_changed_byte_is_named(built: Built) -> None:
    tampered = changed_one_byte(built.cached, built.tmp / "published")
    code, result, log = rebuild(built.cached_home, tampered, built.tmp / "d", "--cache", "local")
    assert code == 1, (result, log[-3000:])
    assert result["difference"] is not None
    assert result["difference"]["member"] == SO  # type: ignore[index]
    assert str(result["difference"]["what"]).startswith("ELF ")  # type: ignore[index]
    report = json.loads((built.tmp / "d" / "out" / "report.json").read_text())
    (job,) = report["jobs"]
    assert job["compiles_cached"] > 0 and job["compiles_compiled"] == 0, job
    (rebuilt,) = (built.tmp / "d" / "out").glob("*.whl")
    assert sha256(rebuilt) == sha256(built.cold) == result["rebuilt_sha256"]


def poison(home: Path) -> str:
    """Replace the object of bindings.cpp's entry in `home`'s compile cache by one with a changed string,
    signed with the home's own key; the entry's manifest path."""
    keyring = cachekeys.load_keyring(sync.local_dir(home).parent, {})
    local = sync.local_dir(home) / sync.LAYOUT
    for manifest in sorted(local.glob("*/m/*/*/*.json")):
        domain = manifest.relative_to(local).parts[0]
        entry = cachekeys.verified_entry(manifest.read_bytes(), domain=domain, keyring=keyring)
        if entry is None:
            continue
        root = local / domain
        obj = compilecache.object_path(root, entry.object_sha256).read_bytes()
        if POISON[0] not in obj:
            continue
        bad = obj.replace(*POISON)
        digest = hashlib.sha256(bad).hexdigest()
        target = compilecache.object_path(root, digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(bad)
        wrong = dataclasses.replace(entry, object_sha256=digest, object_size=len(bad))
        manifest.write_bytes(cachekeys.signed_manifest(wrong, domain=domain, keyring=keyring))
        return str(manifest)
    raise AssertionError(f"no entry of bindings.cpp in {local}")


def test_a_wrong_object_in_the_compile_cache_is_found_by_a_rebuild(built: Built) -> None:
    poison(built.cached_home)
    code, result, log = rebuild(built.cached_home, built.cached, built.tmp / "e", "--cache", "local")
    assert code == 1, (result, log[-3000:])
    assert result["difference"] == {"member": SO, "what": result["difference"]["what"]}  # type: ignore[index]
    assert "ELF section .rodata" in str(result["difference"]["what"])  # type: ignore[index]
