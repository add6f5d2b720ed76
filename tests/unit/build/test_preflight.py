"""`factory build --preflight`: the jobs and the device compile it picks, one arch of a compile line, the
first error line of real compilers' output, the verdict and the summary; the wrapper, the `c++` launcher and
the driver's part as processes (a stand-in nvcc, the host's gcc); the CLI's usage errors."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from test_memory_wrapper import LAUNCHER, compile_cmd, setup

from factory.build import preflight as P
from factory.build.report import BuildReport, JobResult, PreflightResult
from factory.cli import progress
from factory.container import driver, nvcccall, protocol, wrapper
from factory.container import preflightcompiles as CP
from factory.container.protocol import ProfileEntry
from factory.core.variants import Variant, parse_arch_set
from factory.plan.plan import Job

ROOT = Path(__file__).resolve().parents[3]
SAMPLES = ROOT / "tests" / "fixtures" / "compiler-errors"
CXX_LAUNCHER = LAUNCHER.parent / "c++"


def variant(arch: str) -> Variant:
    return Variant(
        package="p", version="1", cuda="13.0", torch="2.14", cxx11_abi=True, archs=parse_arch_set(arch)
    )


# --- which jobs --------------------------------------------------------------------------------------------


def test_each_variant_preflights_once_with_its_first_python() -> None:
    a, b = variant("8.0"), variant("9.0")
    jobs = [Job(variant=a, python="3.13"), Job(variant=b, python="3.13"), Job(variant=a, python="3.14"),
            Job(variant=b, python="3.12")]  # fmt: skip
    assert [(j.variant, j.python) for j in P.lead_jobs(jobs)] == [(a, "3.13"), (b, "3.13")]
    assert P.lead_jobs([]) == []


# --- the device compile's candidates -----------------------------------------------------------------------


def tree(tmp_path: Path, files: dict[str, int]) -> Path:
    for rel, size in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x" * size)
    return tmp_path


def test_candidates_by_the_recipes_seconds_cheapest_first(tmp_path: Path) -> None:
    src = tree(tmp_path, {"k/fwd_hdim32.cu": 9000, "k/fwd_hdim64.cu": 10, "k/bwd_hdim32.cu": 5, "x.cu": 1})
    seconds = (("fwd_hdim32*", 190.0), ("fwd_hdim64*", 230.0), ("bwd_*", 280.0))
    ranked, basis = P.candidates(src, seconds_by_file=seconds)
    # x.cu matches no glob: after every file with an estimate, however small it is
    assert (ranked, basis) == (("k/fwd_hdim32.cu", "k/fwd_hdim64.cu", "k/bwd_hdim32.cu", "x.cu"), "recipe")
    # equal estimates: the smaller file first
    even = P.candidates(src, seconds_by_file=(("*.cu", 1.0),))
    assert even == (("x.cu", "k/bwd_hdim32.cu", "k/fwd_hdim64.cu", "k/fwd_hdim32.cu"), "recipe")


def profile(**walls: float) -> dict[str, ProfileEntry]:
    return {
        f"{name}.cu|compute_80|1": ProfileEntry(peak_bytes=1, wall_s=w, samples=1)
        for name, w in walls.items()
    }


def test_candidates_by_the_learned_profile_before_the_recipe(tmp_path: Path) -> None:
    src = tree(tmp_path, {"a.cu": 1, "b.cu": 1})
    ranked, basis = P.candidates(src, entries=profile(a=90.0, b=30.0), seconds_by_file=(("a.cu", 1.0),))
    assert (ranked, basis) == (("b.cu", "a.cu"), "profile")


def test_a_profile_of_one_file_ranks_only_that_one(tmp_path: Path) -> None:
    # an earlier preflight measured its one device compile: the others do not take its figure (a shard's
    # median), which would tie them all and rank by name
    src = tree(tmp_path, {"add.cu": 50, "relu.cu": 40, "scale.cu": 60})
    assert P.candidates(src, entries=profile(relu=12.0)) == (("relu.cu", "add.cu", "scale.cu"), "profile")
    # beside the recipe's figures: each file by whichever it has, the learned one first
    src = tree(tmp_path / "r", {"a_fwd.cu": 1, "b_fwd.cu": 1, "c.cu": 1})
    seconds = (("a_*", 100.0), ("b_*", 50.0))
    assert P.candidates(src, entries=profile(a_fwd=120.0), seconds_by_file=seconds) == (
        ("b_fwd.cu", "a_fwd.cu", "c.cu"), "profile+recipe"
    )  # fmt: skip


def test_candidates_without_estimates_smallest_source_first(tmp_path: Path) -> None:
    src = tree(tmp_path, {"big.cu": 500, "small.cu": 20, "tests/tiny.cu": 1, "same_b.cu": 20, "main.cpp": 1})
    assert P.candidates(src) == (("same_b.cu", "small.cu", "big.cu"), "size")
    assert P.candidates(tree(tmp_path / "none", {"main.cpp": 1})) == ((), "size")


# --- one arch of a compile line ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "kept"),
    [
        (["-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_80,code=sm_80"],
         ["-gencode", "arch=compute_80,code=sm_80"]),
        # by number, not as text: 100 is above 80
        (["-gencode=arch=compute_100,code=sm_100", "--generate-code=arch=compute_80,code=[sm_80,compute_80]"],
         ["--generate-code=arch=compute_80,code=[sm_80,compute_80]"]),
        # a cubin and the PTX of the lowest arch stay together
        (["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80",
          "-gencode", "arch=compute_120,code=sm_120"],
         ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80"]),
        (["-gencode", "arch=compute_80,code=sm_80"], ["-gencode", "arch=compute_80,code=sm_80"]),
        (["-arch=sm_90"], ["-arch=sm_90"]),
    ],
)  # fmt: skip
def test_one_arch_keeps_the_lowest_archs_gencode_entries(argv: list[str], kept: list[str]) -> None:
    line = ["-c", "/s/a.cu", "-o", "a.o", *argv, "--threads", "2"]
    got = CP.one_arch(nvcccall.parse(line))
    assert list(got.argv) == ["-c", "/s/a.cu", "-o", "a.o", *kept, "--threads", "2"]
    assert got == nvcccall.parse(got.argv)


def test_arch_label_names_the_cubin() -> None:
    assert CP.arch_label(("compute_80",)) == "sm_80"
    assert CP.arch_label(("compute_90a",)) == "sm_90a"
    assert CP.arch_label(("default",)) is None


def test_candidates_from_the_environment() -> None:
    assert CP.candidates({}) is None
    assert CP.candidates({protocol.ENV_PREFLIGHT: '["a.cu", "b.cu"]'}) == ("a.cu", "b.cu")
    assert CP.candidates({protocol.ENV_PREFLIGHT: "[]"}) == ()
    assert CP.candidates({protocol.ENV_PREFLIGHT: '{"a": 1}'}) is None  # not a list: no preflight
    assert CP.candidates({protocol.ENV_PREFLIGHT: "nope"}) is None


def test_choose_the_recorded_compile_the_host_ranks_first(tmp_path: Path) -> None:
    (tmp_path / "gen.cu").write_text("xx")
    (tmp_path / "gen2.cu").write_text("x")

    def call(source: str) -> CP.Call:
        return CP.Call(argv=("-c", source), cwd=str(tmp_path), source=source, env={})

    ranked = ("src/first.cu", "src/b.cu", "src/a.cu")
    calls = [call("/j/src/src/a.cu"), call("gen.cu"), call("/j/src/src/b.cu"), call("gen2.cu")]
    assert CP.choose(calls, ranked) == calls[2]
    # sources the host did not rank: the smallest (relative to the call's directory)
    assert CP.choose([calls[1], calls[3]], ranked) == calls[3]
    assert CP.choose([], ranked) is None


# --- the first error line ----------------------------------------------------------------------------------

JOB = "/var/factory/jobs/cu130-torch2.14-abi1-sm80-py313-0123456789ab"


def build_log(compiler_output: str) -> list[str]:
    """A failed build's log around a compiler's output, as pip -v, ninja and the driver write it."""
    before = [
        '::factory:: {"phase": "build"}',
        f"+ {JOB}/venv/bin/python -m pip wheel --no-build-isolation --no-deps --no-index -v .",
        "  running build_ext",
        "  [1/3] /opt/factory/factory/container/c++ -MMD -MF x.o.d -Werror=return-type -c x.cpp -o x.o",
        '  ::factory-compile:: {"cache": "miss", "key": "x.cpp|host|1", "peak_bytes": 1, "rc": 1, '
        '"source": "error: not this", "tool": "cxx", "wall_s": 1}',
        f"  FAILED: {JOB}/src/build/temp/x.o",
    ]
    after = [
        "  ninja: build stopped: subcommand failed.",
        "  Traceback (most recent call last):",
        "  subprocess.CalledProcessError: Command '['ninja', '-v']' returned non-zero exit status 1.",
        "  RuntimeError: Error compiling objects for extension",
        "  error: subprocess-exited-with-error",
        "  ERROR: Failed building wheel for flash_attn",
        f"factory: '{JOB}/venv/bin/python -m pip wheel' failed with exit code 1",
    ]
    return [*before, *(f"  {line}" for line in compiler_output.splitlines()), *after]


@pytest.mark.parametrize(
    ("sample", "line"),
    [
        ("gcc-badstd",
         "g++: error: unrecognized command-line option ‘-std=c++29’; did you mean ‘-std=c++20’?"),
        ("gcc-header", "header.cpp:1:10: fatal error: missing_header.h: No such file or directory"),
        ("gcc-std", 'torchish.h:3:2: error: #error "C++20 or later compatible compiler is required to use '
                    'PyTorch."'),
        ("gcc-undeclared", "undeclared.cpp:2:10: error: ‘undeclared_name’ was not declared in this scope"),
        ("nvcc-arch", "nvcc fatal   : Unsupported gpu architecture 'compute_20'"),
        ("nvcc-device", 'kernel.cu(2): error: identifier "undefined_thing" is undefined'),
        ("nvcc-header", "kheader.cu:1:10: fatal error: missing.cuh: No such file or directory"),
        ("nvcc-std", 'torchish.h:3:2: error: #error "C++20 or later compatible compiler is required to use '
                     'PyTorch."'),
    ],
)  # fmt: skip
def test_the_first_error_line_of_real_compiler_output(sample: str, line: str) -> None:
    output = (SAMPLES / f"{sample}.txt").read_text()
    assert P.first_error_line(build_log(output)) == line


def test_the_first_error_line_is_shortened_to_the_job_directory_and_one_line() -> None:
    text = (
        f"\x1b[01m{JOB}/venv/lib/python3.13/site-packages/torch/include/c10/macros/Macros.h:12:2: error: "
        '#error "C++20 or later compatible compiler is required to use PyTorch."\x1b[m\x07'
    )
    # colours taken out, any other control character escaped
    assert P.first_error_line(build_log(text)) == (
        "site-packages/torch/include/c10/macros/Macros.h:12:2: error: #error "
        '"C++20 or later compatible compiler is required to use PyTorch."\\x07'
    )
    long = f"{JOB}/src/a.cpp:1:1: error: " + "x" * 1000
    found = P.first_error_line(build_log(long))
    assert found is not None and len(found) == P.MAX_LINE and found.startswith("src/a.cpp:1:1: error: xx")
    assert found.endswith("...")


def test_without_a_compiler_error_the_factorys_own_line_then_a_python_exception() -> None:
    patch = (
        "factory: patch /r/p.patch does not apply: setup.py hunk #2 @@ -176,27 +177,9 @@ FAILED at line 177"
    )
    # the factory's own line wins over a Python exception, wherever each is
    said = patch.removeprefix("factory: ")
    assert P.first_error_line(["  ModuleNotFoundError: No module named 'einops'", patch]) == said
    assert P.first_error_line(["x", patch, "RuntimeError: y"]) == said
    assert P.first_error_line(["  ModuleNotFoundError: No module named 'einops'"]) == (
        "ModuleNotFoundError: No module named 'einops'"
    )
    # the line that only says the build failed says nothing of why
    assert (
        P.first_error_line([f"factory: '{JOB}/venv/bin/python -m pip wheel .' failed with exit code 1"])
        is None
    )
    assert P.first_error_line(["all good", "error: subprocess-exited-with-error"]) is None


# --- the verdict -------------------------------------------------------------------------------------------


def measurement(**fields: object) -> str:
    return "  " + protocol.measurement_line({"key": "k|host|1", "peak_bytes": 1, "wall_s": 1.0, **fields})


def test_a_pass_names_its_host_compiles_and_its_device_compile() -> None:
    lines = [measurement(tool="cxx", cache="miss"), measurement(tool="cxx", cache="hit"),
             measurement(cache="skipped"), measurement(cache="miss"),
             measurement(tool="cxx", rc=1)]  # fmt: skip
    mark = {"source": "/var/factory/jobs/j/src/csrc/add.cu", "arch": "sm_80", "deferred": False}
    result = P.passed(mark=mark, lines=lines, log="/l.log")
    assert result == PreflightResult(
        result="pass", log="/l.log", host_compiles=2, device="add.cu", arch="sm_80"
    )
    assert P.summary(result) == "preflight: 2 host compiles, device add.cu for sm_80"
    # the mark is the container's word: only strings, one printable line each
    odd = P.passed(mark={"source": ["x"], "arch": "sm_80\n\x1b[2J"}, lines=[], log=None)
    assert (odd.device, odd.arch) == (None, "sm_80\\x0a\\x1b[2J")
    assert P.summary(odd) == "preflight: 0 host compiles, no device compile"


def test_a_failure_names_its_first_error_else_its_reason() -> None:
    lines = build_log((SAMPLES / "gcc-undeclared.txt").read_text())
    result = P.failed(lines=lines, reason="build exited with code 1 (attempt 1)", log="/l.log")
    assert (result.result, result.log) == ("fail", "/l.log")
    assert result.line == "undeclared.cpp:2:10: error: ‘undeclared_name’ was not declared in this scope"
    quiet = P.failed(lines=["nothing to see"], reason="OOM-killed at 8 GiB", log=None)
    assert quiet.line == "OOM-killed at 8 GiB"


def preflight_report() -> BuildReport:
    ok = JobResult(job_id="cu130-torch2.14-abi1-sm80-py311", variant_id="v1", python="3.11", result="ok",
                   reason="preflight: 1 host compile, device add.cu for sm_80")  # fmt: skip
    ok.preflight = PreflightResult(result="pass", log="/runs/r/logs/a.log", host_compiles=1, device="add.cu")
    bad = JobResult(job_id="cu130-torch2.14-abi1-sm120-py311", variant_id="v2", python="3.11",
                    result="failed", reason="build exited with code 1 (attempt 1)",
                    log="/runs/r/logs/b.log")  # fmt: skip
    bad.preflight = PreflightResult(
        result="fail", line="src/x.cpp:2:10: error: boom", log="/runs/r/logs/b.log"
    )
    never = JobResult(job_id="cu130-torch2.14-abi1-sm90-py311", variant_id="v3", python="3.11",
                      result="skipped", reason="not started")  # fmt: skip
    return BuildReport(run_id="r", matrix="m.yaml", started=0.0, jobs=[ok, bad, never])


def test_the_summary_has_a_row_per_variant_with_its_line_and_log() -> None:
    report = preflight_report()
    assert progress.preflight_lines(report) == [
        "preflight:",
        "cu130-torch2.14-abi1-sm80-py311  pass  preflight: 1 host compile, device add.cu for sm_80"
        "  log: /runs/r/logs/a.log",
        "cu130-torch2.14-abi1-sm120-py311  fail  src/x.cpp:2:10: error: boom  log: /runs/r/logs/b.log",
        "cu130-torch2.14-abi1-sm90-py311  skipped  not started",
    ]
    out = io.StringIO()
    progress.show_report(Console(file=out, width=100, color_system=None), report, "r.json", interactive=False)
    text = out.getvalue()
    assert (
        text.startswith("preflight:\n")
        and "summary:" not in text
        and text.rstrip().endswith("report: r.json")
    )
    wide = io.StringIO()
    progress.show_report(Console(file=wide, width=200, color_system=None), report, "r.json", interactive=True)
    assert "src/x.cpp:2:10: error: boom" in wide.getvalue() and "/runs/r/logs/b.log" in wide.getvalue()


def test_report_json_has_a_preflight_section_per_job() -> None:
    jobs = preflight_report().to_json()["jobs"]
    assert jobs[0]["preflight"] == {"result": "pass", "line": None, "log": "/runs/r/logs/a.log",
                                    "host_compiles": 1, "device": "add.cu", "arch": None}  # fmt: skip
    assert jobs[1]["preflight"]["line"] == "src/x.cpp:2:10: error: boom"
    assert jobs[2]["preflight"] is None


# --- the container's part, as processes --------------------------------------------------------------------


def preflight_env(tmp_path: Path, ranked: list[str]) -> dict[str, str]:
    return setup(
        tmp_path, **{protocol.ENV_PREFLIGHT: json.dumps(ranked), "FACTORY_JOB_DIR": str(tmp_path / "j")}
    )


def measured(stderr: str) -> list[dict[str, object]]:
    return [json.loads(x.split(protocol.MEASUREMENT_MARK, 1)[1]) for x in stderr.splitlines()
            if protocol.MEASUREMENT_MARK in x]  # fmt: skip


def test_the_wrapper_compiles_the_first_candidate_for_one_arch_and_stands_in_for_the_rest(
    tmp_path: Path,
) -> None:
    env = preflight_env(tmp_path, ["src/mine.cu", "src/theirs.cu"])
    two_archs = ["-gencode", "arch=compute_120,code=sm_120"]
    out = subprocess.run(
        [*compile_cmd(tmp_path, "theirs"), *two_archs], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "theirs.o").read_bytes()[:4] == b"\x7fELF" and not (tmp_path / "fake.log").exists()
    assert [m["cache"] for m in measured(out.stderr)] == [protocol.CACHE_SKIPPED]
    (call,) = CP.recorded(str(tmp_path / "j" / CP.DIR_NAME))
    assert (call.source, call.cwd, call.env["FACTORY_REAL_NVCC"]) == ("/src/theirs.cu", os.getcwd(),
                                                                      env["FACTORY_REAL_NVCC"])  # fmt: skip
    assert CP.device_done(str(tmp_path / "j" / CP.DIR_NAME)) is None

    out = subprocess.run(
        [*compile_cmd(tmp_path, "mine"), *two_archs], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    (m,) = measured(out.stderr)
    assert (m["key"], m["archs"]) == ("mine.cu|compute_80|1", ["compute_80"])  # sm_120 left out
    assert "start /src/mine.cu" in (tmp_path / "fake.log").read_text()
    assert CP.device_done(str(tmp_path / "j" / CP.DIR_NAME)) == {"source": "/src/mine.cu", "arch": "sm_80"}
    assert len(CP.recorded(str(tmp_path / "j" / CP.DIR_NAME))) == 1


def test_the_driver_compiles_the_best_recorded_call_when_the_build_made_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the host's first candidate is a file the build never compiles
    ranked = ["vendor/unused.cu", "src/b.cu", "src/a.cu"]
    env = preflight_env(tmp_path, ranked)
    for name in ("a", "b"):
        cmd = [*compile_cmd(tmp_path, name), "-gencode", "arch=compute_90,code=sm_90"]
        assert subprocess.run(cmd, env=env, capture_output=True).returncode == 0
    assert not (tmp_path / "fake.log").exists()
    monkeypatch.setenv(protocol.ENV_PREFLIGHT, json.dumps(ranked))
    monkeypatch.setattr(driver, "NVCC_LAUNCHER", LAUNCHER)
    state = tmp_path / "j" / CP.DIR_NAME
    assert driver.preflight_device(state) == {"source": "/src/b.cu", "arch": "sm_80", "deferred": True}
    assert [line.split()[:2] for line in (tmp_path / "fake.log").read_text().splitlines()] == [
        ["start", "/src/b.cu"], ["end", "/src/b.cu"]
    ]  # fmt: skip
    (m,) = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    assert m["key"] == "b.cu|compute_80|1"  # a compile like any other, for one arch


def test_the_driver_leaves_a_device_compile_the_build_made(tmp_path: Path) -> None:
    CP.mark_device("/s/mine.cu", ("compute_80",), {"FACTORY_JOB_DIR": str(tmp_path)})
    got = driver.preflight_device(tmp_path / CP.DIR_NAME)
    assert got == {"source": "/s/mine.cu", "arch": "sm_80", "deferred": False}


def test_a_preflight_links_nothing(tmp_path: Path) -> None:
    env = preflight_env(tmp_path, [])
    env["FACTORY_REAL_CXX"] = "gcc"
    link = [str(CXX_LAUNCHER), "missing.o", "-shared", "-o", str(tmp_path / "x.so"), "-lnothing"]
    out = subprocess.run(link, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "x.so").read_bytes()[:4] == b"\x7fELF"  # a shared object, of nothing
    assert "is stood in for" in out.stderr
    # outside a preflight the same line is the real link, which fails for the missing object
    del env[protocol.ENV_PREFLIGHT]
    out = subprocess.run([str(CXX_LAUNCHER), "missing.o", "-shared", "-o", str(tmp_path / "y.so")],
                         env=env, capture_output=True, text=True)  # fmt: skip
    assert out.returncode != 0 and not (tmp_path / "y.so").exists()


def test_a_preflight_puts_the_host_compiler_through_the_launcher_without_a_cache() -> None:
    # the launcher is CXX with or without the cache (it records the links), so a preflight's links stand in
    assert driver.cache_env({protocol.ENV_PREFLIGHT: "[]", "CXX": "g++-14"}) == {
        "CXX": str(driver.CXX_LAUNCHER), "FACTORY_REAL_CXX": "g++-14"
    }  # fmt: skip
    assert driver.cache_env({"CXX": str(driver.CXX_LAUNCHER)}) == {}


def test_select_runs_everything_outside_a_shard_or_preflight(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(protocol.ENV_PREFLIGHT, raising=False)
    monkeypatch.delenv(protocol.ENV_SHARD_SOURCES, raising=False)
    argv = [
        "-c",
        "/s/a.cu",
        "-gencode",
        "arch=compute_90,code=sm_90",
        "-gencode",
        "arch=compute_80,code=sm_80",
    ]
    call = nvcccall.parse(argv)
    assert wrapper.select(call) is call


# --- the CLI -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("extra", "says"), [(["--publish"], "--publish"), (["--shard", "1/2"], "--shard")])
def test_preflight_with_publish_or_shard_is_a_usage_error_in_one_line(extra: list[str], says: str) -> None:
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(ROOT / "matrix.yaml"), "--preflight", *extra]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--preflight" in lines[0] and says in lines[0], result.stderr


def test_preflight_dry_run_lists_one_job_per_variant(tmp_path: Path) -> None:
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        "package: {name: p, version: '1.0', source: {path: src}}\n"
        "recipe: {name: r, arch_env: ARCHS, import_name: p}\n"
        "matrix: {cuda: ['13.0'], torch: ['2.14'], python: ['3.13', '3.14'], cxx11_abi: [true], "
        "arch: ['8.0', '9.0']}\n"
    )
    (tmp_path / "src").mkdir()
    cmd = [sys.executable, "-m", "factory", "build", "-m", str(matrix), "--trust-paths", "--dry-run"]
    every = subprocess.run(cmd, capture_output=True, text=True)
    once = subprocess.run([*cmd, "--preflight"], capture_output=True, text=True)
    assert every.returncode == 0 and once.returncode == 0, every.stderr + once.stderr
    assert [line.split("\t")[0] for line in once.stdout.splitlines()] == [
        "cu130-torch2.14-abi1-sm80-py313", "cu130-torch2.14-abi1-sm90-py313"
    ]  # fmt: skip
    assert len(every.stdout.splitlines()) == 4
