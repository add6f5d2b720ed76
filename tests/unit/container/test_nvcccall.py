"""The one reading of a compiler command line (`factory.container.nvcccall`), and its callers using it."""

from __future__ import annotations

import pytest

from factory.container import compilecache, links, nvcccall, preflightcompiles, shardskip
from factory.container.nvcccall import CXX, NVCC, Arg, parse, scan

TORCH_NVCC = [
    "--generate-dependencies-with-compile", "--dependency-output", "/j/build/k.o.d", "-I/j/torch/include",
    "-isystem", "/usr/include/python3.11", "-c", "/j/csrc/k.cu", "-o", "/j/build/k.o",
    "-D__CUDA_NO_HALF_OPERATORS__", "--expt-relaxed-constexpr", "-gencode", "arch=compute_80,code=sm_80",
    "-gencode=arch=compute_90a,code=[sm_90a,compute_90a]", "-std=c++17", "-O3", "--threads", "4",
    "-ccbin", "g++", "-Xcompiler", "-fPIC",
]  # fmt: skip


def test_a_torch_nvcc_line() -> None:
    call = parse(TORCH_NVCC)
    assert call.is_compile and call.compile_only
    assert call.sources == ("/j/csrc/k.cu",) and call.source == "/j/csrc/k.cu"
    assert (call.output, call.depfile) == ("/j/build/k.o", "/j/build/k.o.d")
    assert call.archs == ("compute_80", "compute_90a")
    assert call.gencodes == ("arch=compute_80,code=sm_80", "arch=compute_90a,code=[sm_90a,compute_90a]")
    assert call.threads == 4 and call.host_compiler == "g++"
    assert call.values("-Xcompiler") == ("-fPIC",) and call.values("-std") == ("c++17",)
    assert not call.reads_stdin


def test_every_argument_is_kept_once_in_order() -> None:
    args = scan(TORCH_NVCC)
    assert [x for a in args for x in a.raw] == TORCH_NVCC
    assert [a.index for a in args] == sorted(a.index for a in args)
    assert all(TORCH_NVCC[a.index] == a.text for a in args)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-o", "k.o"], Arg(index=0, raw=("-o", "k.o"), option="-o", spelling="-o", value="k.o")),
        (["--output-file", "k.o"], Arg(index=0, raw=("--output-file", "k.o"), option="-o",
                                       spelling="--output-file", value="k.o")),
        (["--output-file=k.o"], Arg(index=0, raw=("--output-file=k.o",), option="-o",
                                    spelling="--output-file", value="k.o")),
        (["-o=k.o"], Arg(index=0, raw=("-o=k.o",), option="-o", spelling="-o", value="k.o")),
        (["-I/inc"], Arg(index=0, raw=("-I/inc",), option="-I", spelling="-I", value="/inc")),
        (["-isystem/inc"], Arg(index=0, raw=("-isystem/inc",), option="-isystem", spelling="-isystem",
                               value="/inc")),
        (["-DX=1"], Arg(index=0, raw=("-DX=1",), option="-D", spelling="-D", value="X=1")),
        (["-t", "2"], Arg(index=0, raw=("-t", "2"), option="-t", spelling="-t", value="2")),
        (["-c"], Arg(index=0, raw=("-c",), option="-c", spelling="-c")),
        (["--compile"], Arg(index=0, raw=("--compile",), option="-c", spelling="--compile")),
        (["-o"], Arg(index=0, raw=("-o",), option="-o", spelling="-o", missing=True)),
        (["k.cu"], Arg(index=0, raw=("k.cu",))),
        (["--use_fast_math"], Arg(index=0, raw=("--use_fast_math",))),
        # to nvcc `-odir` is an option of its own and `-lineinfo` a flag: no value attached to -o or -l
        (["-okdir"], Arg(index=0, raw=("-okdir",))),
        (["-lineinfo"], Arg(index=0, raw=("-lineinfo",))),
    ],
)  # fmt: skip
def test_how_nvcc_options_take_their_values(argv: list[str], expected: Arg) -> None:
    assert scan(argv, NVCC) == (expected,)


@pytest.mark.parametrize(
    ("argv", "option", "value"),
    [
        (["-ok.o"], "-o", "k.o"),
        (["-MFk.d"], "-MF", "k.d"),
        (["-o=k.o"], "-o", "=k.o"),  # gcc takes `=` for a long option only: this names the file `=k.o`
        (["--output-file=k.o"], "-o", "k.o"),
        (["-MF", "k.d"], "-MF", "k.d"),
    ],
)
def test_how_a_host_compiler_takes_values(argv: list[str], option: str, value: str) -> None:
    (arg,) = scan(argv, CXX)
    assert (arg.option, arg.value) == (option, value)


def test_an_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown compiler mode 'clang'"):
        scan(["-c"], "clang")


def test_the_value_of_an_option_is_never_a_source() -> None:
    call = parse(["-c", "-x", "cu", "-o", "out.cu", "-include", "pre.cc", "real.cu"])
    assert call.sources == ("real.cu",) and call.output == "out.cu"


@pytest.mark.parametrize(
    ("mode", "name", "source"),
    [
        (NVCC, "k.cu", True), (NVCC, "k.cpp", True), (NVCC, "k.cc", True), (NVCC, "k.cxx", True),
        (NVCC, "k.c", True), (NVCC, "k.o", False), (NVCC, "k.mm", False), (NVCC, "k.C", False),
        (CXX, "k.c++", True), (CXX, "k.C", True), (CXX, "k.m", True), (CXX, "k.mm", True),
        (CXX, "k.cu", True), (CXX, "k.so", False),
    ],
)  # fmt: skip
def test_source_suffixes_by_compiler(mode: str, name: str, source: bool) -> None:
    assert parse(["-c", name], mode).sources == ((name,) if source else ())


def test_stdin_is_no_source_file() -> None:
    call = parse(["-c", "-", "-o", "x.o"], CXX)
    assert call.reads_stdin and call.sources == () and not call.is_compile


@pytest.mark.parametrize(
    ("argv", "archs"),
    [
        ([], ("default",)),  # nvcc's own default: one cicc run, and how compile keys name it
        (["-arch=sm_80"], ("compute_80",)),
        (["-arch", "compute_90"], ("compute_90",)),
        (["--gpu-architecture=sm_86"], ("compute_86",)),
        (["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_80,code=sm_80"],
         ("compute_80", "compute_90")),
        # a cubin and the PTX of one arch are one cicc run
        (["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_80,code=compute_80"],
         ("compute_80",)),
        (["--generate-code=arch=compute_100a,code=[sm_100a]"], ("compute_100a",)),
        (["-arch", "[sm_80,compute_90]"], ("compute_80", "compute_90")),
        (["-gencode"], ("default",)),  # given last without its value
    ],
)  # fmt: skip
def test_archs(argv: list[str], archs: tuple[str, ...]) -> None:
    assert parse(["-c", "k.cu", *argv]).archs == archs


@pytest.mark.parametrize(
    ("argv", "threads"),
    [([], 1), (["-t", "2"], 2), (["--threads", "8"], 8), (["--threads=3"], 3), (["-t=5"], 5),
     (["--threads", "0"], nvcccall.ALL_THREADS), (["--threads", "many"], 1)],
)  # fmt: skip
def test_threads(argv: list[str], threads: int) -> None:
    assert parse(["-c", "k.cu", *argv]).threads == threads


def test_the_first_host_compiler_and_the_last_output_count() -> None:
    call = parse(
        ["-ccbin", "gcc-12", "--compiler-bindir=gcc-13", "-o", "a.o", "--output-file=b.o", "-c", "k.cu"]
    )
    assert call.host_compiler == "gcc-12" and call.output == "b.o"
    assert parse(["-c", "k.cu", "-ccbin"]).host_compiler is None


def test_what_is_no_compile() -> None:
    assert not parse(["--version"]).is_compile
    assert not parse(["a.o", "b.o", "-dlink", "-o", "dlink.o"]).is_compile
    assert not parse(["k.cu", "-o", "k"]).is_compile  # compile and link: no -c


def test_include_dirs() -> None:
    args = ["-I", "a", "-Ib", "-isystem", "c", "-isystemd", "-iquotee", "-idirafter", "f",
            "--include-path=g,h", "--system-include", "i", "-Xcompiler", "-isystemj,-Ik",
            "-DI=l"]  # fmt: skip
    assert nvcccall.include_dirs(scan(args)) == list("abcdefghijk")


# --- the callers read with it -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        TORCH_NVCC,
        ["-c", "k.cu", "--output-file", "k.o", "--dependency-output=k.d", "--compiler-bindir=clang"],
        ["-c", "k.cu", "-o=k.o", "-MF=k.d", "-ccbin=g++-13"],
        ["--version"],
    ],
)
def test_the_stand_ins_read_the_host_compiler_of_the_parsed_call(argv: list[str]) -> None:
    call = parse(argv)
    assert call.argv == tuple(argv)
    if call.host_compiler is not None:
        assert shardskip.host_compiler(call) == call.host_compiler
        assert compilecache.host_compilers(call.host_compiler, {}) == (call.host_compiler,)


def test_the_cache_and_admission_agree_on_the_source_and_the_object() -> None:
    call = parse(TORCH_NVCC)
    cached = compilecache.parse_call(call, "/tmp/own.d")
    assert isinstance(cached, compilecache.Call)
    assert (cached.source, cached.output, cached.depfile) == (call.source, call.output, call.depfile)
    # the long spellings are outputs to the cache too, never part of its key
    long = ["-c", "k.cu", "--output-file", "k.o", "--generate-dependencies-with-compile",
            "--dependency-output=k.d"]  # fmt: skip
    cached = compilecache.parse_call(parse(long))
    assert isinstance(cached, compilecache.Call)
    assert (cached.output, cached.depfile, cached.key_args) == ("k.o", "k.d", ("-c", "k.cu"))


def test_preflight_keeps_the_lowest_gencode_as_scanned() -> None:
    line = ["-c", "k.cu", "-Xcompiler", "-gencode", "-gencode", "arch=compute_90,code=sm_90",
            "--generate-code=arch=compute_80,code=sm_80"]  # fmt: skip
    # the -gencode that is -Xcompiler's value is no -gencode of nvcc's
    kept = preflightcompiles.one_arch(parse(line))
    assert kept.argv == ("-c", "k.cu", "-Xcompiler", "-gencode", "--generate-code=arch=compute_80,code=sm_80")
    assert kept == parse(kept.argv)  # derived from the scanned call, as a new reading would have it
    assert kept.archs == ("compute_80",)
    one = parse(["-c", "k.cu", "-gencode", "arch=compute_90,code=sm_90"])
    assert preflightcompiles.one_arch(one) is one


def test_a_links_inputs_leave_out_option_values() -> None:
    link = links.link_of(
        parse(["-shared", "a.o", "-Xlinker", "b.o", "-ok.so", "-L", "lib.a", "c.a"], CXX), "/w"
    )
    assert link is not None and link.output == "/w/k.so" and link.inputs == ("/w/a.o", "/w/c.a")
