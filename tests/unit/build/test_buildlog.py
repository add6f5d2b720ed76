"""What the host reads from a build log (`factory.build.logs`) and what the container's launchers write into
it (`factory.container.links`, `protocol.link_line`): progress over every extension, host-only modules, a
failed
check's reason."""

from __future__ import annotations

import json

from factory.build import logs
from factory.container import links, nvcccall, protocol
from factory.container.protocol import IMPORT_CHECK_MARKER
from factory.wheel.checks import library_glob_matches

JOB = "/var/factory/jobs/j-1/src"
TEMP = f"{JOB}/build/temp.linux-x86_64-cpython-313"
LIB = f"{JOB}/build/lib.linux-x86_64-cpython-313"
CPU_SO = "torch_cluster/_version_cpu.cpython-313-x86_64-linux-gnu.so"
CUDA_SO = "torch_cluster/_fps_cuda.cpython-313-x86_64-linux-gnu.so"


# --- progress -----------------------------------------------------------------------------------------------


def test_progress_adds_up_the_ninja_runs_of_every_extension() -> None:
    progress = logs.CompileProgress()
    lines = [
        "  building 'torch_cluster._version_cpu' extension", "  [1/1] c++ version.cpp",
        "  building 'torch_cluster._fps_cpu' extension", "  [1/3] c++ a.cpp", "  [2/3] c++ b.cpp",
    ]  # fmt: skip
    for line in lines:
        progress.feed(line)
    assert (progress.done, progress.total, progress.runs) == (3, 4, 2)  # 3 of the 4 known so far
    progress.feed("  [3/3] c++ c.cpp")
    # the next extension's run has as many files as the last one's: told apart by setuptools' line
    for line in ("  building 'torch_cluster._grid_cpu' extension", "  [1/3] c++ d.cpp"):
        progress.feed(line)
    assert (progress.done, progress.total, progress.runs) == (5, 7, 3)


def test_a_run_without_setuptools_line_is_told_by_its_count_falling_back() -> None:
    log = "\n".join(["[1/2] a", "[2/2] b", "[1/2] c", "irrelevant [9/9] text", "[1/4] d"])
    progress = logs.compile_progress(log)
    assert progress is not None and (progress.done, progress.total, progress.runs) == (4, 8, 3)
    assert logs.compile_progress("no ninja here") is None


def test_failed_edges_are_finished_but_not_compiled() -> None:
    log = "\n".join(["[1/2] a", "building 'x' extension", "[1/3] b", "FAILED: c.o", "[2/3] c"])
    progress = logs.compile_progress(log)
    assert progress is not None and (progress.done, progress.compiled, progress.total) == (3, 2, 5)


# --- links and host-only modules ----------------------------------------------------------------------------


def test_the_launcher_reads_a_shared_link_and_a_compile_s_object() -> None:
    argv = [
        "-shared", "-Wl,-O1", f"{TEMP}/csrc/version.o", "-L/torch/lib", "-lc10", "-Xlinker", "odd.o",
        "-o", f"build/lib.linux-x86_64-cpython-313/{CPU_SO}",
    ]  # fmt: skip
    link = links.link_of(nvcccall.parse(argv, nvcccall.CXX), JOB)
    assert link == links.Link(output=f"{LIB}/{CPU_SO}", inputs=(f"{TEMP}/csrc/version.o",))
    assert (
        links.link_of(nvcccall.parse(["-c", "a.cpp", "-o", "a.o"], nvcccall.CXX), JOB) is None
    )  # a compile is no link
    assert links.link_of(nvcccall.parse(["-shared", "a.o"], nvcccall.CXX), JOB) is None  # no output named
    assert links.output_of(nvcccall.parse(["-c", "x.cu", "-o", "build/x.o"]), JOB) == f"{JOB}/build/x.o"
    assert (
        links.output_of(nvcccall.parse(["-c", "x.cpp", "-obuild/y.o"], nvcccall.CXX), "/w") == "/w/build/y.o"
    )
    assert links.output_of(nvcccall.parse(["-c", "x.cu", "--output-file=../z.o"]), "/w/a") == "/w/z.o"
    # the line round-trips, indented as pip -v prints it
    assert protocol.parse_link("  " + protocol.link_line(link)) == link


def test_a_forged_or_broken_link_line_is_no_link() -> None:
    assert protocol.parse_link(f"{protocol.LINK_MARK} not json") is None
    assert protocol.parse_link(f'{protocol.LINK_MARK} {{"output": 3, "inputs": []}}') is None
    assert protocol.parse_link(f'{protocol.LINK_MARK} {{"output": "x.so", "inputs": [1]}}') is None
    assert protocol.parse_link('prefix ::factory-link:: {"output": "x.so", "inputs": []}') is None


def nvcc_line(obj: str, *, tool: str = "nvcc", cache: str = "miss") -> str:
    record = {"key": "k", "peak_bytes": 1, "wall_s": 1.0, "tool": tool, "cache": cache, "object": obj}
    return "  " + protocol.measurement_line(record)


def trace_of(*lines: str) -> logs.BuildTrace:
    trace = logs.BuildTrace()
    for line in lines:
        trace.feed(line)
    return trace


def link_line(output: str, *inputs: str) -> str:
    return "  " + protocol.link_line(links.Link(output=output, inputs=inputs))


def test_a_module_whose_link_has_no_object_nvcc_compiled_is_host_only() -> None:
    trace = trace_of(
        nvcc_line(f"{TEMP}/csrc/fps.o", cache="hit"),  # a cache hit wrote the object just the same
        nvcc_line(f"{TEMP}/csrc/version.o", tool="cxx"),  # the host compiler's
        link_line(f"{LIB}/{CPU_SO}", f"{TEMP}/csrc/version.o"),
        link_line(f"{LIB}/{CUDA_SO}", f"{TEMP}/csrc/fps_bind.o", f"{TEMP}/csrc/fps.o"),
    )
    kinds = logs.module_kinds([CPU_SO, CUDA_SO, "torch_cluster/_other.so"], trace)
    assert kinds == {
        CPU_SO: logs.HOST,
        CUDA_SO: logs.DEVICE,
        "torch_cluster/_other.so": logs.UNKNOWN,
    }
    (glob,) = logs.host_only_globs(kinds)
    assert library_glob_matches(CPU_SO, glob) and not library_glob_matches(CUDA_SO, glob)
    line = logs.describe_kinds(kinds)
    assert f"host-only (no object nvcc compiled in their link): {CPU_SO}" in line and "\n" not in line


def test_an_archive_in_a_link_leaves_the_module_unknown() -> None:
    trace = trace_of(link_line(f"{LIB}/{CPU_SO}", f"{TEMP}/version.o", f"{JOB}/third_party/libkernels.a"))
    assert logs.module_kind(CPU_SO, trace) == logs.UNKNOWN


def test_a_module_linked_twice_counts_its_last_link() -> None:
    # an OOM retry links again; a later attempt's objects may come from the earlier one's nvcc
    trace = trace_of(
        nvcc_line(f"{TEMP}/k.o"),
        link_line(f"{LIB}/{CUDA_SO}", f"{TEMP}/b.o"),
        link_line(f"{LIB}/{CUDA_SO}", f"{TEMP}/b.o", f"{TEMP}/k.o"),
    )
    assert logs.module_kind(CUDA_SO, trace) == logs.DEVICE


def test_glob_characters_in_a_module_name_match_only_that_module() -> None:
    odd = "pkg/_m[1]*.so"
    (glob,) = logs.host_only_globs({odd: logs.HOST})
    assert library_glob_matches(odd, glob) and not library_glob_matches("pkg/_m1x.so", glob)


# --- a failed check's reason --------------------------------------------------------------------------------


def test_the_import_error_is_the_reason() -> None:
    error = "ModuleNotFoundError: No module named 'scipy'"
    log = "\n".join([
        "+ uv pip install ...", "Traceback (most recent call last):", error,
        f"{IMPORT_CHECK_MARKER} " + json.dumps({"ok": False, "error": error}),
        "factory: 'python -I -c ...' failed with exit code 1",
    ])  # fmt: skip
    assert logs.check_failure_reason(log) == "ModuleNotFoundError: No module named 'scipy'"


def test_the_installer_s_missing_distribution_is_the_reason() -> None:
    uv = (
        "error: No solution found when resolving dependencies\n"
        "  cause: Because scipy was not found in the provided package locations and x==0.1 depends on "
        "scipy, we can conclude that x==0.1 cannot be used."
    )
    assert logs.check_failure_reason(uv) == (
        "scipy is not in the check's wheelhouse (uv: Because scipy was not found in the provided package "
        "locations)"
    )
    pip = (
        "ERROR: Could not find a version that satisfies the requirement scipy\n"
        "ERROR: No matching distribution found for scipy"
    )
    assert logs.check_failure_reason(pip) == "No matching distribution found for scipy"


def test_a_reason_is_one_bounded_line_and_none_without_one() -> None:
    forged = "ValueError: " + "\x1b[31mred\r" + "x" * 500
    reason = logs.check_failure_reason(forged)
    assert reason is not None and len(reason) <= logs.MAX_REASON and "\x1b" not in reason
    assert logs.check_failure_reason("+ uv pip install\nall fine until it was killed") is None


# --- a build that runs no nvcc ------------------------------------------------------------------------------

NVCC = "/usr/local/cuda/bin/nvcc --generate-dependencies-with-compile -c /src/k.cu -o k.o"


def fed(watch: logs.DeviceWatch, lines: list[str]) -> list[str]:
    return [w for w in (watch.feed(line) for line in lines) if w is not None]


def test_host_compiles_alone_are_said_once_after_n_of_them() -> None:
    watch = logs.DeviceWatch(after=4, runs_after=99)
    host = [f"[{i}/10] c++ -MMD -c /src/f{i}.cpp -o f{i}.o" for i in range(1, 4)]
    assert fed(watch, host) == []  # three host compiles: too early to say
    (warning,) = fed(watch, [f"[{i}/10] c++ -c /src/f{i}.cpp -o f{i}.o" for i in range(4, 11)])
    assert warning.startswith("no nvcc yet after 4 host compile(s)") and "FORCE_CUDA" in warning


def test_two_extensions_of_host_compiles_alone_are_said_before_n() -> None:
    watch = logs.DeviceWatch()  # the defaults: 16 compiles, or two whole ninja runs
    first = ["building 'torch_scatter._scatter_cpu' extension", "[1/2] c++ a.cpp", "[2/2] c++ b.cpp"]
    assert fed(watch, first) == []
    second = ["building 'torch_scatter._segment_cpu' extension", "[1/2] c++ c.cpp", "[2/2] c++ d.cpp"]
    assert len(fed(watch, second)) == 1
    assert watch.host == 4 and watch.host_runs == 2


def test_nvcc_anywhere_in_the_first_compiles_says_nothing() -> None:
    watch = logs.DeviceWatch(after=3)
    lines = [f"[1/20] {NVCC}"] + [f"[{i}/20] c++ -c f{i}.cpp" for i in range(2, 21)]
    assert fed(watch, lines) == [] and watch.nvcc == 1
    # the factory's launcher by its path is nvcc too
    launcher = logs.DeviceWatch(after=1)
    assert fed(launcher, ["[1/2] /opt/factory/container/nvcc -c a.cu -o a.o", "[2/2] c++ b.cpp"]) == []


def test_a_measured_nvcc_compile_counts_as_device_code() -> None:
    watch = logs.DeviceWatch(after=2)
    mark = protocol.measurement_line({"key": "k.cu|compute_80|1", "peak_bytes": 1, "wall_s": 1.0, "rc": 0})
    assert fed(watch, [mark, "[1/3] c++ a.cpp", "[2/3] c++ b.cpp", "[3/3] c++ c.cpp"]) == []
    assert watch.nvcc == 1


def test_the_device_estimate_weighs_each_cuda_file_by_its_time() -> None:
    estimate = logs.DeviceEstimate.of({"csrc/cuda/heavy.cu": 300.0, "csrc/cuda/light.cu": 100.0}, "recipe")
    assert estimate.fraction == 0.0 and estimate.left_s(60.0) is None

    def measured(name: str, **fields: object) -> str:
        return protocol.measurement_line(
            {"key": f"{name}|compute_80|1", "peak_bytes": 1, "wall_s": 1.0, **fields}
        )

    assert estimate.feed(measured("light.cu"))
    assert not estimate.feed(measured("light.cu"))  # the same file again (another arch set): counted once
    assert not estimate.feed(measured("other.cu"))  # not one of the source's files
    assert not estimate.feed(measured("heavy.cu", rc=1))  # a failed compile finished nothing
    assert not estimate.feed(measured("heavy.cu", tool="cxx"))
    assert estimate.fraction == 0.25 and estimate.left_s(60.0) == 180.0
    assert estimate.feed(measured("heavy.cu", cache="hit"))  # served by the cache: done too
    assert estimate.fraction == 1.0 and estimate.left_s(60.0) == 0.0
