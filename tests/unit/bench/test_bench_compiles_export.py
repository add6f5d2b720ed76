"""bench.compiles_export on synthetic records: which logs count, the CSV's rows and origins, the report."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from bench import compiles_export as X
from factory.container import protocol
from factory.container.admission import GIB
from factory.container.driver import nvcc_release
from factory.memory import profiles
from factory.spec import measured
from factory.spec.recipes import FLASH_ATTN

BWD = "flash_bwd_hdim256_fp16_sm80.cu|compute_80|1"
FWD = "flash_fwd_hdim64_fp16_sm80.cu|compute_80|1"
SPLIT = "flash_fwd_split_hdim128_fp16_sm80.cu|compute_80|1"
JOB = "cu130-torch2.14-abi1-sm80-py313"
# a course that climbs to its peak, falls to 3/10 of it, then holds 4/10 of it: after_peak 0.4 (the envelope
# is the most from each point to the end)
COURSE = [10, 10, 10, 3, 3, 4, 4, 4]


def envelope(course: list[int], unit: int) -> list[int]:
    return [max(course[k:]) * unit for k in range(len(course))]


def measurement(
    key: str, *, peak: int, cpu: float, rc: int = 0, cache: str = "miss", tool: str = "nvcc"
) -> str:
    record = {
        "key": key, "source": key.split("|")[0], "peak_bytes": peak, "wall_s": cpu * 1.25, "cpu_s": cpu,
        "rc": rc, "cache": cache, "tool": tool, "envelope": envelope(COURSE, peak // 10),
        "predicted_bytes": 7 * GIB,
    }  # fmt: skip
    return "  " + protocol.measurement_line(record)


def write_log(
    home: Path, run: str, job: str, lines: list[str], *, snapshot: dict[str, object] | None = None
) -> Path:
    path = home / "runs" / run / "logs" / f"{job}.log"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    if snapshot is not None:
        snap = home / "runs" / run / "profiles" / job / "profile.json"
        snap.parent.mkdir(parents=True)
        snap.write_text(json.dumps(snapshot))
    return path


def save_profile(home: Path, package: str, version: str, keys: dict[str, int]) -> None:
    entries = {
        k: protocol.ProfileEntry(
            peak_bytes=peak, wall_s=100.0, samples=1, envelope=tuple(envelope(COURSE, peak // 10))
        )
        for k, peak in keys.items()
    }
    profiles.save_profile(
        profiles.Profile(package=package, version=version, entries=entries),
        profiles.profile_path(package, version, home=home),
    )


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """flash-attn 2.8.3's profile (three keys) and the logs of four jobs: one of its first build (no
    snapshot), one given its profile (snapshot), one of another package with the same file names, one
    unrelated."""
    home = tmp_path / "home"
    save_profile(home, "flash-attn", "2.8.3", {BWD: int(6.5 * GIB), FWD: int(3.5 * GIB), SPLIT: 4 * GIB})
    marks = [
        protocol.mark_line(torch="2.14.1+cu130", torch_cuda="13.0"),
        protocol.mark_line(toolchain={"nvcc": "13.0.88", "cxx": "g++ (Debian 14.2.0-19) 14.2.0"}),
    ]
    write_log(
        home, "r1", JOB,
        [*marks, measurement(BWD, peak=int(6.6 * GIB), cpu=370.0),
         measurement(FWD, peak=int(3.6 * GIB), cpu=230.0),
         measurement(SPLIT, peak=int(2 * GIB), cpu=50.0, rc=137),  # killed: a lower bound, left out
         measurement(FWD, peak=0, cpu=0.0, cache="hit"),  # served from the cache: measured nothing
         measurement("flash_api.cpp|host|1", peak=GIB, cpu=40.0, tool="cxx"),  # the host compiler's
         "some compiler output, a forged line: ::factory-compile:: {not json"],
    )  # fmt: skip
    write_log(  # an older factory's log: no toolchain mark; the job id says its torch and CUDA
        home, "r2", "cu128-torch2.10-abi1-sm80-py312",
        [measurement(BWD, peak=int(6.4 * GIB), cpu=360.0)],
        snapshot={"package": "flash_attn", "version": "2.8.3", "entries": {}},
    )  # fmt: skip
    write_log(  # same file names, another package's snapshot: not flash-attn's
        home, "r3", JOB, [measurement(BWD, peak=int(9 * GIB), cpu=999.0)],
        snapshot={"package": "other-ext", "version": "2.8.3", "entries": {}},
    )  # fmt: skip
    write_log(home, "r4", JOB, [measurement("add.cu|compute_80|1", peak=GIB, cpu=1.0)])  # keys not in profile
    return home


def rows(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(line for line in io.StringIO(text) if not line.startswith("#")))


def test_collects_the_package_versions_logs_and_the_profile_only_compiles(home: Path) -> None:
    got = X.collect(home, "flash-attn", "2.8.3")
    assert (got.logs, got.failed) == (2, 1)
    sources = sorted((c.key, c.origin.source) for c in got.compiles)
    assert sources == sorted(
        [
            (BWD, f"run/r1/{JOB}"),
            (FWD, f"run/r1/{JOB}"),
            (BWD, "run/r2/cu128-torch2.10-abi1-sm80-py312"),
            (SPLIT, "profile"),  # measured only by the killed compile in a log: the profile's figures
        ]
    )


def test_csv_rows_carry_the_measurement_and_its_origin(home: Path) -> None:
    text = X.csv_text([X.collect(home, "flash-attn", "2.8.3")])
    assert text.startswith("# ")
    by_source = {(r["tu"], r["source"]): r for r in rows(text)}
    r1 = by_source[("flash_bwd_hdim256_fp16_sm80.cu", f"run/r1/{JOB}")]
    assert (r1["flash_attn_version"], r1["gencodes"], r1["nvcc_threads"]) == ("2.8.3", "sm_80", "1")
    assert (r1["peak_gib"], r1["cpu_s"], r1["wall_s"], r1["after_peak"]) == ("6.60", "370", "462", "0.400")
    assert (r1["toolkit"], r1["torch"], r1["python"]) == ("13.0.88", "2.14.1+cu130", "3.13")
    assert r1["host_compiler"] == "g++ (Debian 14.2.0-19) 14.2.0" and len(r1["date"]) == 10
    r2 = by_source[("flash_bwd_hdim256_fp16_sm80.cu", "run/r2/cu128-torch2.10-abi1-sm80-py312")]
    assert (r2["toolkit"], r2["torch"], r2["host_compiler"], r2["python"]) == (
        "CUDA 12.8",
        "2.10",
        "",
        "3.12",
    )
    profile_only = by_source[("flash_fwd_split_hdim128_fp16_sm80.cu", "profile")]
    assert (profile_only["peak_gib"], profile_only["cpu_s"], profile_only["wall_s"]) == ("4.00", "", "100")


def test_the_exported_csv_is_what_factory_measured_reads(home: Path) -> None:
    exported = measured.parse_rows(X.csv_text([X.collect(home, "flash-attn", "2.8.3")]))
    table = dict(measured.flash_attn_file_estimates(exported))
    # the most measured of the backward hdim256 file (6.6 GiB), with the estimate's 3% margin, rounded up
    assert table["flash_bwd_hdim256_*"] == 6.8
    assert table["flash_fwd_hdim64_*"] == 3.8  # 3.6 GiB measured
    seconds = dict(measured.flash_attn_file_seconds(exported))
    assert seconds["flash_bwd_hdim256_*"] == 370.0  # the CPU seconds, not the wall time
    assert measured.measured_after_peak(exported) == 0.44  # 0.4 with the 10% margin
    # a post release of 2.8.3 is the same kernels: its rows count
    post = [{**r, "flash_attn_version": "2.8.3.post2"} for r in exported]
    assert measured.flash_attn_file_estimates(post) == measured.flash_attn_file_estimates(exported)
    assert not measured.flash_attn_file_estimates([{**r, "flash_attn_version": "2.8.4"} for r in exported])


def test_comparison_against_the_recipes_first_build_figures(home: Path) -> None:
    by_key = {c.key: c for c in X.compare(X.collect(home, "flash-attn", "2.8.3"), FLASH_ATTN)}
    bwd = by_key[BWD]
    # the recipe's table says 6.9 GiB per arch for backward hdim256 files, plus the 0.25 GiB base
    assert bwd.predicted_bytes == pytest.approx(7.15 * GIB, rel=1e-3)
    assert (bwd.samples, bwd.peak_bytes, bwd.cpu_s) == (2, int(6.6 * GIB), 365.0)
    assert bwd.peak_ratio == pytest.approx(6.6 / 7.15, rel=1e-3) and bwd.admitted_bytes == 7 * GIB
    assert bwd.predicted_s == dict(FLASH_ATTN.compile_seconds_by_file)["flash_bwd_hdim256_*"]
    assert bwd.cpu_ratio == pytest.approx(365.0 / bwd.predicted_s)
    assert by_key[SPLIT].cpu_s is None and by_key[SPLIT].cpu_ratio is None
    report = X.report_text(X.collect(home, "flash-attn", "2.8.3"), FLASH_ATTN, list(by_key.values()))
    assert f"| {BWD} | 2 | 6.60 | 7.15 | 0.92 | 7.00 | 365 |" in report
    assert "above the prediction (a first build would have under-reserved them): 0" in report


def test_a_compile_above_its_prediction_is_named(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_profile(home, "flash-attn", "2.8.3", {FWD: 5 * GIB})
    collected = X.collect(home, "flash-attn", "2.8.3")
    report = X.report_text(collected, FLASH_ATTN, X.compare(collected, FLASH_ATTN))
    assert f"under-reserved them): 1 ({FWD})" in report


def test_named_runs_are_the_packages_without_a_profile(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A first build still running has no profile yet: its runs are named, and all their logs count."""
    home = tmp_path / "home"
    write_log(home, "r1", JOB, [measurement(FWD, peak=3 * GIB, cpu=200.0)])
    write_log(home, "r2", JOB, [measurement(BWD, peak=6 * GIB, cpu=300.0)])
    got = X.collect(home, "flash-attn", "2.8.3", runs=["r1"])
    assert [(c.key, c.origin.source) for c in got.compiles] == [(FWD, f"run/r1/{JOB}")]
    assert X.collect(home, "flash-attn", "2.8.3").compiles == ()  # not attributed without the name
    args = ["--package", "flash-attn", "--home", str(home), "--run", "r1"]
    assert X.main([*args, "--version", "2.8.3"]) == 0
    assert f"| {FWD} | 1 | 3.00 |" in capsys.readouterr().out
    assert X.main(args) == 2 and "--run needs the version" in capsys.readouterr().err
    assert X.main([*args, "--version", "2.8.3", "--run", "r7"]) == 2
    assert capsys.readouterr().err.startswith("error: no run r7 under ")


def test_after_peak_from_an_envelope() -> None:
    assert X.after_peak([10, 10, 3, 3]) == 0.3
    assert X.after_peak([10, 9, 8]) is None  # never fell to 3/4 of its peak
    assert X.after_peak([]) is None and X.after_peak([0, 0]) is None


def test_container_words_are_printable_and_quoted_in_the_csv(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_profile(home, "flash-attn", "2.8.3", {FWD: 3 * GIB})
    chain = {"nvcc": "13.0.88", "cxx": 'g++, "evil"\nnext,row' + "x" * 500}
    write_log(home, "r1", JOB, [protocol.mark_line(toolchain=chain), measurement(FWD, peak=3 * GIB, cpu=1.0)])
    (row,) = [
        r for r in rows(X.csv_text([X.collect(home, "flash-attn", "2.8.3")])) if r["source"] != "profile"
    ]
    assert row["host_compiler"].startswith('g++, "evil"?next,row') and len(row["host_compiler"]) == X.TEXT_MAX


def test_a_linked_log_or_run_is_not_read(tmp_path: Path) -> None:
    home = tmp_path / "home"
    save_profile(home, "flash-attn", "2.8.3", {FWD: 3 * GIB})
    real = write_log(tmp_path / "elsewhere", "r9", JOB, [measurement(FWD, peak=3 * GIB, cpu=1.0)])
    (home / "runs" / "r1" / "logs").mkdir(parents=True)
    (home / "runs" / "r1" / "logs" / f"{JOB}.log").symlink_to(real)
    (home / "runs" / "r2").symlink_to(real.parent.parent)
    assert X.collect(home, "flash-attn", "2.8.3").logs == 0


def test_cli_writes_the_csv_and_the_report(
    home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out.csv"
    assert X.main(["--package", "flash-attn", "--home", str(home), "--csv", str(out)]) == 0
    assert len(rows(out.read_text())) == 4
    assert "# flash-attn 2.8.3: the factory's measured compiles" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["--package", "nope"], "error: no learned profiles of nope under "),
        (
            ["--package", "flash-attn", "--version", "9.9"],
            "error: no learned profile of flash-attn 9.9 under ",
        ),
        ([], "error: give --package or --matrix (one of them)"),
    ],
)
def test_cli_bad_input_is_one_line(
    home: Path, args: list[str], line: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert X.main([*args, "--home", str(home)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1


def test_nvcc_release_from_its_version_text() -> None:
    text = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild x"
    assert nvcc_release(text) == "13.0.88"
    assert nvcc_release("") is None and nvcc_release("release 12.8") is None


HAND = """\
# hand-run measurements
flash_attn_version,tu,gencodes,nvcc_threads,peak_gib,cpu_s,wall_s,after_peak,note
2.8.3,flash_bwd_hdim256_fp16_sm80.cu,sm_80,1,6.64,372,397,0.638,by hand
2.8.3,flash_bwd_hdim32_fp16_sm80.cu,sm_80,1,4.43,280,364,0.410,by hand
main@0251105a,flash_bwd_hdim256_fp16_sm80.cu,sm_80+sm_90,2,12.3,1199,841,,two archs
"""


def test_measured_rows_replace_the_hand_rows_of_their_files_only(home: Path) -> None:
    text = X.merged_csv(HAND, [X.collect(home, "flash-attn", "2.8.3")])
    lines = text.splitlines()
    assert lines[0] == "# hand-run measurements" and lines[1].startswith("# Rows with a `source`")
    got = rows(text)
    bwd = [r for r in got if r["tu"] == "flash_bwd_hdim256_fp16_sm80.cu" and r["gencodes"] == "sm_80"]
    # the hand row of the file the factory measured is gone; the factory's two measurements are in
    assert sorted(r["source"] for r in bwd) == [f"run/r1/{JOB}", "run/r2/cu128-torch2.10-abi1-sm80-py312"]
    # a file no build measured, and another arch set, keep their hand rows
    kept = {(r["tu"], r["gencodes"]) for r in got if not r["source"]}
    assert kept == {
        ("flash_bwd_hdim32_fp16_sm80.cu", "sm_80"),
        ("flash_bwd_hdim256_fp16_sm80.cu", "sm_80+sm_90"),
    }
    # and factory.spec.measured reads the merge: the unmeasured file's figure survives
    table = dict(measured.flash_attn_file_estimates(measured.parse_rows(text)))
    assert table["flash_bwd_hdim32_*"] == 4.6 and table["flash_bwd_hdim256_*"] == 6.8


def test_merging_again_replaces_the_merge_line_instead_of_adding_one(home: Path) -> None:
    collected = [X.collect(home, "flash-attn", "2.8.3")]
    once = X.merged_csv(HAND, collected)
    twice = X.merged_csv(once, collected)
    assert twice == once
    assert sum(line.startswith(X.MERGED_LINE) for line in twice.splitlines()) == 1
