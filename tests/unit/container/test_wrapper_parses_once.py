"""One compile's command line is read once: the wrapper parses it (`nvcccall.parse`) and hands the parsed
call to the compile cache, the link records, a shard's and a preflight's stand-ins and admission.

The wrapper runs in this process (its `main`, as its launcher runs it) with a stand-in compiler, so that
every reading of a command line is counted: `nvcccall.scan` is what each reading goes through. The only
other scans allowed are of an `-Xcompiler` value's own host options (its include directories).
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path

import pytest

from factory.container import nvcccall, protocol, wrapper

# writes the object (and the depfile it is asked for), logs what it compiled
FAKE = textwrap.dedent("""\
    #!{python}
    import os, sys
    a = sys.argv[1:]
    if a == ["--version"]:
        print("fake compiler 1.0"); sys.exit(0)
    def after(*names):
        for n in names:
            if n in a:
                return a[a.index(n) + 1]
    out, dep, src = after("-o"), after("--dependency-output", "-MF"), after("-c")
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(src + "\\n")
    with open(out, "wb") as fh:
        fh.write(b"object of " + src.encode())
    if dep:
        with open(dep, "w") as fh:
            fh.write(out + ": " + src + "\\n")
""")


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [n for n in os.environ if n.startswith("FACTORY_")]:
        monkeypatch.delenv(name)
    fake = tmp_path / "fake-compiler"
    fake.write_text(FAKE.format(python=sys.executable))
    fake.chmod(0o755)
    (tmp_path / "k.cu").write_text("__global__ void k() {}\n")
    (tmp_path / "h.cpp").write_text("int h;\n")
    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(protocol.ENV_REAL_NVCC, str(fake))
    monkeypatch.setenv(protocol.ENV_REAL_CXX, str(fake))
    # one directory to look up in and to store into: the second compile of a line hits
    monkeypatch.setenv(protocol.ENV_CACHE_DIR, str(cache))
    monkeypatch.setenv(protocol.ENV_CACHE_OUT, str(cache))
    monkeypatch.setenv(protocol.ENV_JOB_DIR, str(tmp_path / "job"))
    monkeypatch.setenv(protocol.ENV_CGROUP_ROOT, str(tmp_path / "no-cgroup"))
    monkeypatch.setenv(protocol.ENV_SAMPLE_S, "0.05")
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def nvcc_line(work: Path) -> list[str]:
    return [
        "--generate-dependencies-with-compile", "--dependency-output", str(work / "k.o.d"),
        "-I", str(work / "inc"), "-c", str(work / "k.cu"), "-o", str(work / "k.o"),
        "-gencode", "arch=compute_90,code=sm_90", "-gencode=arch=compute_80,code=sm_80",
        "--threads", "2", "-Xcompiler", "-fPIC,-isystem/opt/x", "-Xcompiler", "-O2",
    ]  # fmt: skip


@pytest.fixture
def scans(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, ...]]:
    """Every command line `nvcccall.scan` reads from now on."""
    seen: list[tuple[str, ...]] = []
    real = nvcccall.scan

    def counting(args: Sequence[str], mode: str = nvcccall.NVCC) -> tuple[nvcccall.Arg, ...]:
        seen.append(tuple(args))
        return real(args, mode)

    monkeypatch.setattr(nvcccall, "scan", counting)
    return seen


def readings(
    seen: list[tuple[str, ...]], argv: list[str], mode: str = nvcccall.NVCC
) -> list[tuple[str, ...]]:
    """The scans that read a command line: all but those of an -Xcompiler value's host options."""
    made = list(seen)  # before the reading of the test's own below
    values = {tuple(v.split(",")) for v in nvcccall.parse(argv, mode).values("-Xcompiler")}
    return [s for s in made if s not in values]


def run(
    argv: list[str], seen: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> dict[str, object]:
    """The wrapper's main on one line, with the scans it made (`seen`, emptied first) and its measurement."""
    seen.clear()
    assert wrapper.main(argv) == 0
    err = capsys.readouterr().err
    (line,) = [x for x in err.splitlines() if protocol.MEASUREMENT_MARK in x]
    measured: dict[str, object] = json.loads(line.split(protocol.MEASUREMENT_MARK, 1)[1])
    return measured


def compiled(work: Path) -> list[str]:
    log = work / "fake.log"
    return [Path(p).name for p in log.read_text().splitlines()] if log.exists() else []


def test_a_miss_and_then_a_hit_each_read_the_line_once(
    work: Path, scans: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = nvcc_line(work)
    miss = run(argv, scans, capsys)
    assert miss["cache"] == protocol.CACHE_MISS and compiled(work) == ["k.cu"]
    assert miss["object"] == str(work / "k.o")
    assert readings(scans, argv) == [tuple(argv)]
    assert len(scans) > 1  # the -Xcompiler values were read for include directories: the count sees scans

    hit = run(argv, scans, capsys)
    assert hit["cache"] == protocol.CACHE_HIT and compiled(work) == ["k.cu"]  # not compiled again
    assert (work / "k.o").read_bytes().startswith(b"object of ")
    assert readings(scans, argv) == [tuple(argv)]


def test_another_shards_compile_reads_the_line_once(
    work: Path,
    scans: list[tuple[str, ...]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(protocol.ENV_SHARD_SOURCES, json.dumps(["other.cu"]))
    argv = nvcc_line(work)
    skipped = run(argv, scans, capsys)
    assert skipped["cache"] == protocol.CACHE_SKIPPED and compiled(work) == []
    assert (work / "k.o").exists() and (work / "k.o.d").read_text().endswith(f"{work / 'k.cu'}\n")
    assert readings(scans, argv) == [tuple(argv)]


def test_a_preflights_device_compile_reads_the_line_once_and_keeps_one_arch(
    work: Path,
    scans: list[tuple[str, ...]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(protocol.ENV_PREFLIGHT, json.dumps(["k.cu"]))
    argv = nvcc_line(work)
    device = run(argv, scans, capsys)
    assert device["archs"] == ["compute_80"] and compiled(work) == ["k.cu"]
    assert readings(scans, argv) == [tuple(argv)]  # the one-arch line is derived, not read again


def test_a_host_compile_through_the_cxx_launcher_reads_the_line_once(
    work: Path, scans: list[tuple[str, ...]], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["-MMD", "-MF", str(work / "h.o.d"), "-c", str(work / "h.cpp"), "-o", str(work / "h.o"), "-fPIC"]
    for state in (protocol.CACHE_MISS, protocol.CACHE_HIT):
        measured = run([wrapper.CXX_FLAG, *argv], scans, capsys)
        assert measured["cache"] == state and compiled(work) == ["h.cpp"]
        assert readings(scans, argv, nvcccall.CXX) == [tuple(argv)]
