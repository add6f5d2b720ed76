"""The source's date and the wheel's canonical archive: two builds of the same bytes give the same wheel."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
import zipfile
from pathlib import Path

import pytest

from factory.container import compilecache
from factory.container.nvcccall import CXX, parse
from factory.core import reproducible
from factory.wheel import checks

DIST_INFO = "demo-1.0.dist-info"


def sdist(path: Path, mtimes: dict[str, int]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, mtime in mtimes.items():
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 1, mtime
            tar.addfile(info, io.BytesIO(b"x"))
    return path


def test_sdist_epoch_reads_tar_and_zip(tmp_path: Path) -> None:
    tgz = sdist(
        tmp_path / "demo-1.0.tar.gz", {"demo-1.0/PKG-INFO": 1_700_000_000, "demo-1.0/a.py": 1_600_000_000}
    )
    assert reproducible.sdist_epoch(tgz) == 1_700_000_000
    z = tmp_path / "demo-1.0.zip"
    with zipfile.ZipFile(z, "w") as out:
        out.writestr(zipfile.ZipInfo("demo-1.0/PKG-INFO", date_time=(2023, 11, 14, 22, 13, 20)), b"x")
    assert reproducible.sdist_epoch(z) == 1_700_000_000  # read as UTC, whatever the host's zone
    assert reproducible.source_date_epoch("pypi", archive=tgz) == 1_700_000_000


def test_a_source_without_a_date_gets_the_fixed_one(tmp_path: Path) -> None:
    broken = tmp_path / "x.tar.gz"
    broken.write_bytes(b"not a tar")
    assert reproducible.sdist_epoch(broken) is None
    assert reproducible.source_date_epoch("pypi", archive=broken) == reproducible.DEFAULT_EPOCH
    assert reproducible.source_date_epoch("path", tree=tmp_path) == reproducible.DEFAULT_EPOCH
    assert reproducible.source_date_epoch("git", tree=tmp_path) == reproducible.DEFAULT_EPOCH  # no checkout
    old = sdist(tmp_path / "old.tar.gz", {"a": 100})
    assert (
        reproducible.source_date_epoch("pypi", archive=old) == reproducible.DEFAULT_EPOCH
    )  # clamped to 1980


def test_a_git_checkouts_epoch_is_its_commit(tmp_path: Path) -> None:
    env = {
        **os.environ,
        "GIT_AUTHOR_DATE": "@1700000000 +0000",
        "GIT_COMMITTER_DATE": "@1700000000 +0000",
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.invalid",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.invalid",
    }
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, env=env)
    subprocess.run(
        ["git", "-C", str(tmp_path), "commit", "-q", "--allow-empty", "-m", "x"], check=True, env=env
    )
    assert reproducible.source_date_epoch("git", tree=tmp_path) == 1_700_000_000


def test_zip_dates_are_utc_and_even() -> None:
    assert reproducible.zip_date_time(reproducible.DEFAULT_EPOCH) == (1980, 1, 1, 0, 0, 0)
    assert reproducible.zip_date_time(1_700_000_001) == (2023, 11, 14, 22, 13, 20)
    assert reproducible.zip_date_time(0) == (1980, 1, 1, 0, 0, 0)


def test_members_sort_with_dist_info_last_and_record_at_the_end() -> None:
    names = [f"{DIST_INFO}/RECORD", f"{DIST_INFO}/METADATA", "z/b.py", "a/", "a/x.so", f"{DIST_INFO}/WHEEL"]
    assert reproducible.canonical_order(names) == [
        "a/",
        "a/x.so",
        "z/b.py",
        f"{DIST_INFO}/METADATA",
        f"{DIST_INFO}/WHEEL",
        f"{DIST_INFO}/RECORD",
    ]


@pytest.mark.parametrize(
    ("attr", "is_dir", "mode"),
    [
        (0o100600 << 16, False, 0o644),
        (0o100700 << 16, False, 0o755),
        (0o100664 << 16, False, 0o644),
        (0, True, 0o755),
    ],
)
def test_modes_are_0644_or_0755(attr: int, is_dir: bool, mode: int) -> None:
    assert reproducible.canonical_mode(attr, is_dir=is_dir) == mode


def wheel_bytes(path: Path, members: list[tuple[str, bytes, tuple[int, ...], int]]) -> Path:
    """A wheel as a build might write it: members in the given order, dates and modes as given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as out:
        for name, data, date, mode in members:
            info = zipfile.ZipInfo(name, date_time=date)  # type: ignore[arg-type]
            info.external_attr = mode << 16
            out.writestr(info, data)
        out.writestr(f"{DIST_INFO}/RECORD", b"")
    return path


def test_two_rewrites_of_the_same_bytes_are_identical_whatever_the_order_dates_and_modes(
    tmp_path: Path,
) -> None:
    so, py = ("demo/_C.so", b"\x7fELF" + bytes(100)), ("demo/__init__.py", b"")
    meta = (f"{DIST_INFO}/METADATA", b"Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n\n")
    wheel = (f"{DIST_INFO}/WHEEL", b"Wheel-Version: 1.0\n")
    first = wheel_bytes(
        tmp_path / "a" / "demo-1.0-py3-none-any.whl",
        [
            (*so, (2024, 1, 1, 0, 0, 0), 0o100755),
            (*py, (2024, 1, 1, 0, 0, 0), 0o100644),
            (*meta, (2024, 1, 1, 0, 0, 0), 0o100644),
            (*wheel, (2024, 1, 1, 0, 0, 0), 0o100644),
        ],
    )
    second = wheel_bytes(
        tmp_path / "b" / "demo-1.0-py3-none-any.whl",
        [
            (*wheel, (2025, 6, 6, 6, 6, 6), 0o100600),
            (*meta, (2025, 6, 6, 6, 6, 6), 0o100664),
            (*py, (2025, 6, 6, 6, 6, 6), 0o100600),
            (*so, (2025, 6, 6, 6, 6, 6), 0o100775),
        ],
    )
    assert first.read_bytes() != second.read_bytes()
    for w in (first, second):
        checks.pin_torch_requirement(w, "2.14.1", epoch=1_700_000_000)
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as archive:
        infos = archive.infolist()
        assert [i.filename for i in infos] == reproducible.canonical_order(i.filename for i in infos)
        assert {i.date_time for i in infos} == {(2023, 11, 14, 22, 13, 20)}
        assert (archive.getinfo("demo/_C.so").external_attr >> 16) & 0o777 == 0o755
        assert checks.record_problems(archive, f"{DIST_INFO}/RECORD") == []
        record = archive.read(f"{DIST_INFO}/RECORD").decode().splitlines()
        assert [r.split(",")[0] for r in record] == [
            i.filename for i in infos
        ]  # RECORD in the archive's order


def test_an_uncached_compile_gets_the_prefix_maps_a_cached_one_would(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "demo-1"
    (job / "src").mkdir(parents=True)
    (job / "src" / "a.cpp").write_text("int a;\n")
    env = {"FACTORY_JOB_DIR": str(job)}
    args = ["-c", "a.cpp", "-o", "a.o", "-MD", "-MF", "a.o.d"]
    plain = compilecache.plain(parse(args, CXX), environ=env, cwd=str(job / "src"))
    assert plain.output == str(job / "src" / "a.o")
    assert f"-ffile-prefix-map={job}=@JOB@" in plain.run_args
    cache = tmp_path / "cache"
    cache.mkdir()
    attempt = compilecache.attempt(
        parse(args, CXX),
        "/usr/bin/c++",
        environ={**env, "FACTORY_CACHE_DIR": str(cache)},
        cwd=str(job / "src"),
    )
    if isinstance(attempt, str):
        pytest.skip(f"no host compiler identity here: {attempt}")
    maps = [a for a in plain.run_args if a.startswith("-ffile-prefix-map")]
    assert maps == [a for a in attempt.run_args if a.startswith("-ffile-prefix-map")]
    link = compilecache.plain(parse(["-shared", "a.o", "-o", "a.so"], CXX), environ=env, cwd=str(job / "src"))
    assert link.output is None and link.run_args == ("-shared", "a.o", "-o", "a.so")


def test_an_uncached_nvcc_object_loses_its_temporary_names(tmp_path: Path) -> None:
    obj = tmp_path / "a.o"
    obj.write_bytes(b"\x7fELF..tmpxft_0000004a_00000000-6_add.cudafe1.cpp..")
    compilecache.Plain(mode="nvcc", run_args=(), output=str(obj)).finish(0)
    assert obj.read_bytes() == b"\x7fELF..tmpxft_00000000_00000000-6_add.cudafe1.cpp.."


def module_path_args(run_args: tuple[str, ...]) -> list[str]:
    return [a for a in run_args if a.startswith("--orig_src_path_name=")]


def test_an_nvcc_compile_names_its_source_as_its_key_does_in_every_job_directory(tmp_path: Path) -> None:
    """nvcc hashes the source's path into the module id: each job is told the same path, with its roots as
    their placeholders, whether the cache is on or off."""
    cache = tmp_path / "cache"
    cache.mkdir()
    seen = set()
    for name in ("demo-1", "demo-2"):
        job = tmp_path / "jobs" / name
        (job / "src" / "csrc").mkdir(parents=True)
        (job / "src" / "build").mkdir()
        (job / "src" / "csrc" / "k.cu").write_text("__global__ void k() {}\n")
        env = {"FACTORY_JOB_DIR": str(job)}
        cwd = str(job / "src" / "build")
        for source in ("../csrc/k.cu", str(job / "src" / "csrc" / "k.cu")):
            args = ["-c", source, "-o", "k.o", "-MD", "-MF", "k.o.d"]
            plain = compilecache.plain(parse(args), environ=env, cwd=cwd)
            attempt = compilecache.attempt(
                parse(args), "/nonexistent/nvcc", environ={**env, "FACTORY_CACHE_DIR": str(cache)}, cwd=cwd
            )
            assert isinstance(attempt, compilecache.Attempt), attempt
            for run_args in (plain.run_args, attempt.run_args):
                pinned = module_path_args(run_args)
                assert pinned == ["--orig_src_path_name=@JOB@/src/csrc/k.cu"], run_args
                assert run_args[run_args.index(pinned[0]) - 1] == "-Xcudafe"
                assert str(job) not in pinned[0]
                seen.add(run_args[-2:])
    # last: cudafe++ takes the last one, so it wins over one the call gives
    assert seen == {("-Xcudafe", "--orig_src_path_name=@JOB@/src/csrc/k.cu")}
    host = compilecache.plain(parse(["-c", "k.cpp", "-o", "k.o"], CXX), environ=env, cwd=cwd)
    assert host.run_args[-1].startswith("-ffile-prefix-map=")  # the host compiler has no module id


def test_the_module_path_keeps_sources_apart_and_survives_nvccs_option_splitting() -> None:
    roots = compilecache.Roots.of([("@JOB@", "/var/factory/jobs/a 1,x")])

    def told(source: str, cwd: str = "/var/factory/jobs/a 1,x/src") -> str:
        (flag, value) = compilecache.module_path(roots, "nvcc", source=source, cwd=cwd)
        assert flag == "-Xcudafe"
        return value.removeprefix("--orig_src_path_name=")

    # -Xcudafe splits on commas, cudafe++ on spaces, and nvcc refuses quotes: all are percent-encoded
    assert told("my dir/a,b\"c'.cu") == "@JOB@/src/my%20dir/a%2Cb%22c%27.cu"
    assert told("a%2C.cu") == "@JOB@/src/a%252C.cu"  # an encoded-looking name is not another's
    assert told("a,.cu") != told("a%2C.cu")
    assert told("../csrc/k.cu") == "@JOB@/csrc/k.cu" == told("/var/factory/jobs/a 1,x/csrc/k.cu")
    assert told("k.cu", cwd="/elsewhere") == "/elsewhere/k.cu"  # outside every root: as it is
    assert told("one/k.cu") != told("two/k.cu")
    assert compilecache.module_path(roots, "cxx", source="k.cu", cwd="/") == []
