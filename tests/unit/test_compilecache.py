"""The compile cache (factory/container/compilecache.py): its keys and path placeholders, its entries on disk,
what a corrupt entry or a race does, prune and stats; and the `c++` launcher through it, with a stand-in
compiler whose object is every line it read (so a wrong hit shows as a wrong object). Real nvcc:
tests/integration/test_compilecache_nvcc.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from factory.container import CONTAINER_DIR, compilecache, driver, protocol
from factory.container.compilecache import CacheStats, Roots
from factory.memory import profiles

CXX = CONTAINER_DIR / "c++"

FAKE_CXX = textwrap.dedent("""\
    #!{python}
    import os, re, sys
    args = sys.argv[1:]
    if args == ["--version"]:
        print("fake c++ " + os.environ.get("FAKE_VERSION", "1")); sys.exit(0)
    out = args[args.index("-o") + 1]
    dep = args[args.index("-MF") + 1] if "-MF" in args else None
    incs = [a[2:] for a in args if a.startswith("-I") and len(a) > 2]
    incs += [args[i + 1] for i, a in enumerate(args) if a in ("-I", "-isystem")]
    src = next(a for a in args if a.endswith((".cpp", ".cu")))
    read = []
    def include(path):
        read.append(path)
        body = []
        for line in open(path).read().splitlines():
            m = re.match(r'#include [<"](.+)[>"]', line)
            if not m:
                body.append(line)
                continue
            for d in [os.path.dirname(path)] + incs:
                p = os.path.join(d, m.group(1))
                if os.path.exists(p):
                    body.append(include(p))
                    break
            else:
                sys.exit(f"{{m.group(1)}}: not found")
        return "\\n".join(body)
    text = include(src)
    with open(os.environ["FAKE_LOG"], "a") as fh:
        fh.write(os.path.basename(src) + "\\n")
    if os.environ.get("FAKE_RC"):
        sys.exit(int(os.environ["FAKE_RC"]))
    flags = [a for a in args if a.startswith(("-D", "-O"))]
    open(out, "w").write(" ".join(flags) + "\\n" + text + "\\n")
    if dep:
        open(dep, "w").write(out + ": " + " \\\\\\n ".join(read) + "\\n")
""")

KERNEL = '#include "pkg.h"\nint kernel() { return PKG; }\n'
WITH_PYTHON = '#include "pkg.h"\n#include <Python.h>\nint kernel() { return PY_VERSION_HEX; }\n'


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    fake = tmp_path / "fake-c++"
    fake.write_text(FAKE_CXX.format(python=sys.executable))
    fake.chmod(0o755)
    for version, hexv in (("3.11", "0x030b00f0"), ("3.13", "0x030d00f0")):
        inc = tmp_path / "python" / version / "include" / f"python{version}"
        inc.mkdir(parents=True)
        (inc / "Python.h").write_text(f"#define PY_VERSION_HEX {hexv}\n")
    return {"tmp": tmp_path, "fake": fake, "cache": tmp_path / "cache", "log": tmp_path / "fake.log"}


def make_job(world: dict[str, Path], name: str, python: str, sources: dict[str, str]) -> Path:
    job = world["tmp"] / "jobs" / name
    site = job / "venv" / "lib" / f"python{python}" / "site-packages"
    (site / "pkg" / "include").mkdir(parents=True)
    (site / "pkg" / "include" / "pkg.h").write_text("#define PKG 7\n")
    src = job / "src"
    (src / "csrc").mkdir(parents=True)
    for rel, text in sources.items():
        (src / rel).write_text(text)
    build = src / "build" / f"temp.linux-x86_64-cpython-{python.replace('.', '')}"
    (build / "csrc").mkdir(parents=True)
    return job


def pyinc(world: dict[str, Path], python: str) -> Path:
    return world["tmp"] / "python" / python / "include" / f"python{python}"


def compile_args(world: dict[str, Path], job: Path, python: str, src: str, *extra: str) -> list[str]:
    """A torch-style ninja line: absolute paths, -MMD -MF beside the object, every include dir."""
    build = next((job / "src" / "build").glob("temp.*"))
    obj = build / "csrc" / (Path(src).stem + ".o")
    site = next((job / "venv" / "lib").glob("python*/site-packages"))
    return [
        "-MMD", "-MF", f"{obj}.d",
        f"-I{site}/pkg/include", f"-I{pyinc(world, python)}", f"-I{job}/venv/include",
        "-O3", *extra, "-c", str(job / "src" / src), "-o", str(obj),
    ]  # fmt: skip


def run_cxx(
    world: dict[str, Path], job: Path, args: list[str], *, cache: bool = True, **extra: str
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update(
        {
            "FACTORY_REAL_CXX": str(world["fake"]),
            "FAKE_LOG": str(world["log"]),
            "FACTORY_JOB_DIR": str(job),
            "FACTORY_CACHE_DIR": str(world["cache"]) if cache else "",
            "TMPDIR": str(world["tmp"]),
            **extra,
        }
    )
    env.pop("VIRTUAL_ENV", None)
    env.pop("CUDA_HOME", None)
    return subprocess.run([str(CXX), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def compiled(world: dict[str, Path]) -> list[str]:
    return world["log"].read_text().split() if world["log"].exists() else []


def measurement(proc: subprocess.CompletedProcess[str]) -> protocol.Measurement:
    (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
    return m


def obj_of(args: list[str]) -> Path:
    return Path(args[args.index("-o") + 1])


# --- through the c++ launcher ------------------------------------------------------------------------------


def test_a_second_job_on_another_python_hits_with_the_same_object_and_its_own_depfile(
    world: dict[str, Path],
) -> None:
    a = make_job(world, "demo-py3.11-1", "3.11", {"csrc/k.cpp": KERNEL})
    b = make_job(world, "demo-py3.13-1", "3.13", {"csrc/k.cpp": KERNEL})
    args_a = compile_args(world, a, "3.11", "csrc/k.cpp")
    args_b = compile_args(world, b, "3.13", "csrc/k.cpp")
    first = run_cxx(world, a, args_a)
    assert first.returncode == 0, first.stderr
    assert measurement(first).cache == protocol.CACHE_MISS
    second = run_cxx(world, b, args_b)
    assert second.returncode == 0, second.stderr
    m = measurement(second)
    assert (m.cache, m.tool, m.compiled, m.learns) == ("hit", "cxx", False, False)
    assert compiled(world) == ["k.cpp"]
    assert obj_of(args_a).read_bytes() == obj_of(args_b).read_bytes()
    depfile = Path(f"{obj_of(args_b)}.d").read_text()
    assert str(b / "src" / "csrc" / "k.cpp") in depfile and str(obj_of(args_b)) in depfile
    assert str(a) not in depfile and "@" not in depfile
    # the depfile the caller asked for is all that is left beside the object: ours went away
    assert sorted(p.name for p in obj_of(args_a).parent.iterdir()) == ["k.o", "k.o.d"]
    assert not list(world["tmp"].glob("factory-dep-*"))


def test_a_file_that_includes_python_h_is_compiled_per_python(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/py.cpp": WITH_PYTHON})
    b = make_job(world, "b", "3.13", {"csrc/py.cpp": WITH_PYTHON})
    c = make_job(world, "c", "3.11", {"csrc/py.cpp": WITH_PYTHON})
    for job, python in ((a, "3.11"), (b, "3.13"), (c, "3.11")):
        assert run_cxx(world, job, compile_args(world, job, python, "csrc/py.cpp")).returncode == 0
    assert compiled(world) == ["py.cpp", "py.cpp"]  # the third, on 3.11 again, hit
    objs = [
        obj_of(compile_args(world, j, p, "csrc/py.cpp")).read_text() for j, p in ((a, "3.11"), (b, "3.13"))
    ]
    assert "0x030b00f0" in objs[0] and "0x030d00f0" in objs[1]


def test_an_edited_header_misses(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    b = make_job(world, "b", "3.11", {"csrc/k.cpp": KERNEL})
    assert run_cxx(world, a, compile_args(world, a, "3.11", "csrc/k.cpp")).returncode == 0
    next((b / "venv" / "lib").glob("*/site-packages")).joinpath("pkg/include/pkg.h").write_text(
        "#define PKG 8\n"
    )
    args = compile_args(world, b, "3.11", "csrc/k.cpp")
    assert measurement(run_cxx(world, b, args)).cache == "miss"
    assert "8" in obj_of(args).read_text()
    assert compiled(world) == ["k.cpp", "k.cpp"]


@pytest.mark.parametrize(
    "first, second",
    [([], ["-DFOO"]), (["-DFOO=1"], ["-DFOO=2"]), (["-O2"], ["-O1"]), ([], ["-isystem", "/nonexistent"])],
)
def test_a_changed_flag_misses(world: dict[str, Path], first: list[str], second: list[str]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    assert run_cxx(world, a, compile_args(world, a, "3.11", "csrc/k.cpp", *first)).returncode == 0
    assert (
        measurement(run_cxx(world, a, compile_args(world, a, "3.11", "csrc/k.cpp", *second))).cache == "miss"
    )
    assert measurement(run_cxx(world, a, compile_args(world, a, "3.11", "csrc/k.cpp", *first))).cache == "hit"


def test_another_compiler_misses(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert measurement(run_cxx(world, a, args)).cache == "miss"
    world["fake"].write_text(world["fake"].read_text() + "# another build of the compiler\n")
    assert measurement(run_cxx(world, a, args)).cache == "miss"


def test_a_call_without_a_depfile_is_cached_too(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")[3:]  # no -MMD -MF
    assert measurement(run_cxx(world, a, args)).cache == "miss"
    obj_of(args).unlink()
    assert measurement(run_cxx(world, a, args)).cache == "hit"
    assert obj_of(args).is_file() and not Path(f"{obj_of(args)}.d").exists()
    assert not list(world["tmp"].glob("factory-dep-*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "remove"])
def test_a_corrupt_object_is_a_miss_and_is_replaced(world: dict[str, Path], damage: str) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    good = obj_of(args).read_bytes()
    (obj,) = [world["cache"] / p for p in compilecache.iter_files(world["cache"]) if p.parts[1] == "o"]
    if damage == "truncate":
        obj.write_bytes(good[:5])
    elif damage == "flip":
        obj.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    else:
        obj.unlink()
    obj_of(args).unlink()
    proc = run_cxx(world, a, args)
    assert proc.returncode == 0 and measurement(proc).cache == "miss"
    assert obj_of(args).read_bytes() == good
    assert measurement(run_cxx(world, a, args)).cache == "hit"  # stored again, whole
    assert compilecache.stats(world["cache"]).entries == 1


@pytest.mark.parametrize("text", ["", "{", '{"version": "v1"}', "[1, 2]"])
def test_an_unreadable_manifest_is_a_miss_and_is_removed(world: dict[str, Path], text: str) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    (manifest,) = [world["cache"] / p for p in compilecache.iter_files(world["cache"]) if p.parts[1] == "m"]
    manifest.write_text(text)
    assert measurement(run_cxx(world, a, args)).cache == "miss"
    assert compilecache.parse_manifest(manifest.read_text()) is not None  # the miss stored it again


def test_a_manifest_that_lies_about_its_inputs_is_not_a_hit(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    (manifest,) = [world["cache"] / p for p in compilecache.iter_files(world["cache"]) if p.parts[1] == "m"]
    raw = json.loads(manifest.read_text())
    raw["inputs"] = raw["inputs"][:1]  # a result key that no longer matches its inputs
    manifest.write_text(json.dumps(raw))
    assert measurement(run_cxx(world, a, args)).cache == "miss"


def test_a_failed_compile_is_not_stored(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    proc = run_cxx(world, a, args, FAKE_RC="3")
    assert proc.returncode == 3 and measurement(proc).rc == 3
    assert compilecache.stats(world["cache"]).entries == 0


def test_without_a_cache_or_for_a_link_the_compiler_runs_as_it_is(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    proc = run_cxx(world, a, args, cache=False)
    assert proc.returncode == 0 and protocol.MEASUREMENT_MARK not in proc.stderr
    version = run_cxx(world, a, ["--version"])
    assert version.stdout.strip() == "fake c++ 1" and protocol.MEASUREMENT_MARK not in version.stderr
    assert not world["cache"].exists()


def test_an_unwritable_cache_is_no_cache(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    world["cache"].write_text("a file, not a directory")
    proc = run_cxx(world, a, compile_args(world, a, "3.11", "csrc/k.cpp"))
    assert proc.returncode == 0 and measurement(proc).cache == "miss"


# --- keys and paths ----------------------------------------------------------------------------------------


def test_roots_replace_whole_path_components_longest_first() -> None:
    roots = Roots.of(
        [
            ("@JOB@", "/work/jobs/a-1"),
            ("@SITE@", "/work/jobs/a-1/venv/lib/python3.11/site-packages"),
        ]
    )
    assert roots.normalise("-I/work/jobs/a-1/venv/lib/python3.11/site-packages/torch/include") == (
        "-I@SITE@/torch/include"
    )
    assert roots.normalise("/work/jobs/a-10/src") == "/work/jobs/a-10/src"
    assert roots.normalise("-isystem=/work/jobs/a-1") == "-isystem=@JOB@"
    assert roots.denormalise("@SITE@/x @JOB@/y") == (
        "/work/jobs/a-1/venv/lib/python3.11/site-packages/x /work/jobs/a-1/y"
    )


def test_the_python_include_dir_is_a_placeholder_only_where_python_h_is(tmp_path: Path) -> None:
    (tmp_path / "py").mkdir()
    (tmp_path / "py" / "Python.h").write_text("")
    (tmp_path / "other").mkdir()
    args = ["-I", str(tmp_path / "other"), f"-I{tmp_path / 'py'}", "-Xcompiler", f"-isystem{tmp_path}/py"]
    assert compilecache.python_include_dirs(args, "/") == [str(tmp_path / "py")]
    roots = compilecache.job_roots(args, "/", {})
    assert roots.normalise(f"-I{tmp_path}/py") == "-I@PYINC@"


TORCH_NVCC = [
    "--generate-dependencies-with-compile", "--dependency-output", "/j/src/build/t/k.o.d",
    "-I/j/venv/lib/python3.11/site-packages/torch/include", "-I/usr/include/python3.11", "-c",
    "/j/src/csrc/k.cu", "-o", "/j/src/build/t/k.o", "-D__CUDA_NO_HALF_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90,code=sm_90", "-std=c++17", "-O3", "--threads", "4", "-ccbin", "g++",
]  # fmt: skip


def test_parse_call_of_torch_lines() -> None:
    call = compilecache.parse_call("nvcc", TORCH_NVCC, "/tmp/own.d")
    assert isinstance(call, compilecache.Call)
    assert (call.source, call.output, call.depfile) == (
        "/j/src/csrc/k.cu",
        "/j/src/build/t/k.o",
        "/j/src/build/t/k.o.d",
    )
    assert "-o" not in call.key_args and "--dependency-output" not in call.key_args
    assert "/tmp/own.d" not in call.run_args  # it named a depfile of its own
    cxx = compilecache.parse_call("cxx", ["-MMD", "-MF", "k.o.d", "-c", "k.cpp", "-o", "k.o"])
    assert isinstance(cxx, compilecache.Call)
    assert cxx.run_args[0] == "-MD"  # system headers too: a manifest without them would be unsound
    bare = compilecache.parse_call("cxx", ["-c", "k.cpp", "-o", "k.o"], "/tmp/own.d")
    assert isinstance(bare, compilecache.Call) and bare.depfile is None
    assert bare.run_args[-3:] == ("-MD", "-MF", "/tmp/own.d")
    nvcc_bare = compilecache.parse_call("nvcc", ["-c", "k.cu", "-o", "k.o"], "/tmp/own.d")
    assert isinstance(nvcc_bare, compilecache.Call)
    assert nvcc_bare.run_args[-3:] == (
        "--generate-dependencies-with-compile",
        "--dependency-output",
        "/tmp/own.d",
    )


@pytest.mark.parametrize(
    "args",
    [
        ["-c", "a.cpp", "b.cpp", "-o", "x.o"],
        ["a.cpp", "-o", "x"],
        ["-c", "a.cpp"],
        ["-E", "-c", "a.cpp", "-o", "x.o"],
        ["@flags.rsp", "-c", "a.cpp", "-o", "x.o"],
        ["-c", "-", "-o", "x.o"],
        ["-c", "a.cpp", "-o", "-"],
        ["-save-temps", "-c", "a.cpp", "-o", "x.o"],
        ["-fprofile-generate", "-c", "a.cpp", "-o", "x.o"],
        ["-shared", "a.o", "-o", "x.so"],
    ],
)
def test_what_is_not_a_cacheable_compile(args: list[str]) -> None:
    assert isinstance(compilecache.parse_call("cxx", args, "/tmp/own.d"), str)


def test_depfiles_of_nvcc_and_gcc() -> None:
    nvcc = "k.o : k.cu \\\n    /usr/include/stdc-predef.h \\\n    /cuda/bin/..//include/cuda_runtime.h\n"
    assert compilecache.depfile_inputs(nvcc) == [
        "k.cu",
        "/usr/include/stdc-predef.h",
        "/cuda/bin/..//include/cuda_runtime.h",
    ]
    gcc = "k.o: k.cpp a\\ b.h \\\n  c.h\na b.h:\nc.h:\n"  # -MP's phony rules name nothing new
    assert compilecache.depfile_inputs(gcc) == ["k.cpp", "a b.h", "c.h"]


def key_of(
    args: list[str], job: str, *, compiler: str = "c", env: dict[str, str] | None = None
) -> str | None:
    call = compilecache.parse_call("nvcc", [a.replace("/j/", f"{job}/") for a in args], "/tmp/own.d")
    assert isinstance(call, compilecache.Call)
    roots = Roots.of([("@JOB@", job), ("@SITE@", f"{job}/venv/lib/python3.11/site-packages")])
    return compilecache.direct_key(call, compiler=compiler, host="h", roots=roots, cwd="/", environ=env or {})


def test_the_direct_key_leaves_out_the_job_and_keeps_the_rest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for job in ("a", "b"):
        (tmp_path / job / "src" / "csrc").mkdir(parents=True)
        (tmp_path / job / "src" / "csrc" / "k.cu").write_text("x")
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    base = key_of(TORCH_NVCC, a)
    assert base is not None and base == key_of(TORCH_NVCC, b)
    assert key_of([*TORCH_NVCC, "-DFOO"], a) != base
    assert key_of([x.replace("sm_90", "sm_80") for x in TORCH_NVCC], a) != base
    assert key_of([*TORCH_NVCC, "-gencode=arch=compute_80,code=sm_80"], a) != base
    assert key_of(TORCH_NVCC, a, compiler="d") != base
    assert key_of(TORCH_NVCC, a, env={"NVCC_APPEND_FLAGS": "-G"}) != base
    assert (
        key_of([x.replace("/usr/include/python3.11", "/usr/include/python3.13") for x in TORCH_NVCC], a)
        != base
    )
    (tmp_path / "a" / "src" / "csrc" / "k.cu").write_text("y")
    monkeypatch.setattr(compilecache, "_HASHES", {})
    assert key_of(TORCH_NVCC, a) != base


def test_a_relative_path_keys_the_working_directory(tmp_path: Path) -> None:
    (tmp_path / "k.cpp").write_text("x")
    call = compilecache.parse_call("cxx", ["-Iinc", "-c", "k.cpp", "-o", "k.o"], "/tmp/own.d")
    assert isinstance(call, compilecache.Call)
    keys = {
        compilecache.direct_key(call, compiler="c", host=None, roots=Roots(), cwd=str(cwd), environ={})
        for cwd in (tmp_path, tmp_path / ".")
    }
    assert len(keys) == 1
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "k.cpp").write_text("x")
    other = compilecache.direct_key(
        call, compiler="c", host=None, roots=Roots(), cwd=str(tmp_path / "sub"), environ={}
    )
    assert other not in keys


def test_a_tool_is_known_by_its_content_and_version_remembered_by_its_inode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    monkeypatch.setattr(compilecache.tempfile, "tempdir", None)
    tool = tmp_path / "bin" / "cc"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho cc 1\n")
    tool.chmod(0o755)
    first = compilecache.tool_identity(str(tool))
    assert first and list((tmp_path / "tmp").iterdir())
    copy = tmp_path / "elsewhere" / "cc"
    copy.parent.mkdir()
    copy.write_bytes(tool.read_bytes())
    copy.chmod(0o755)
    assert compilecache.tool_identity(str(copy)) == first  # same content elsewhere: the same compiler
    tool.write_text("#!/bin/sh\necho cc 2\n")
    monkeypatch.setattr(compilecache, "_HASHES", {})
    monkeypatch.setattr(compilecache, "_VERSIONS", {})
    assert compilecache.tool_identity(str(tool)) != first
    assert compilecache.tool_identity(str(tmp_path / "none")) == ""


# --- entries on disk: stats, prune, files, races --------------------------------------------------------


def put(root: Path, dk: str, *, size: int, mtime: float) -> compilecache.Entry:
    """An entry whose only input is a file of its own, with its object of `size` bytes."""
    src = root.parent / "inputs" / dk
    src.parent.mkdir(parents=True, exist_ok=True)
    src.write_text(dk)
    obj = root.parent / "objs" / f"{dk}.o"
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(b"x" * size)
    call = compilecache.Call(mode="cxx", source=str(src), output=str(obj), depfile=None, key_args=())
    entry = compilecache.store(
        root,
        dk,
        call=call,
        depfile_text=f"x.o: {src}\n",
        roots=Roots(),
        cwd="/",
        started_ns=time.time_ns() + 10**9,
    )
    assert entry is not None
    for path in (
        compilecache.manifest_path(root, dk, entry.result_key),
        compilecache.object_path(root, entry.result_key),
    ):
        os.utime(path, (mtime, mtime))
    return entry


def dk(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


def test_stats_and_files(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    assert compilecache.stats(root) == CacheStats(entries=0, objects=0, bytes=0, oldest=None, newest=None)
    e1 = put(root, dk(1), size=100, mtime=1000.0)
    put(root, dk(2), size=50, mtime=2000.0)
    (compilecache.object_path(root, e1.result_key).parent / ".tmp-half-written").write_text("x")
    s = compilecache.stats(root)
    assert (s.entries, s.objects, s.oldest, s.newest) == (2, 2, 1000.0, 2000.0)
    files = list(compilecache.iter_files(root))
    assert len(files) == 4 and all(not p.is_absolute() and not p.name.startswith(".tmp-") for p in files)
    assert s.bytes == sum((root / p).stat().st_size for p in files)
    assert [p.parts[:2] for p in files] == [("v1", "o")] * 2 + [("v1", "m")] * 2  # objects before manifests
    assert f"v1/m/{dk(1)[:2]}/{dk(1)}/{e1.result_key}.json" in {p.as_posix() for p in files}
    assert f"v1/o/{e1.result_key[:2]}/{e1.result_key}" in {p.as_posix() for p in files}


def test_prune_removes_the_least_recently_used_first(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    entries = [put(root, dk(i), size=1000, mtime=1000.0 + i) for i in range(5)]
    # a hit makes the oldest the newest
    assert compilecache.fetch(
        root,
        entries[0],
        compilecache.manifest_path(root, dk(0), entries[0].result_key),
        call=compilecache.Call(
            mode="cxx", source="s", output=str(tmp_path / "out.o"), depfile=None, key_args=()
        ),
        roots=Roots(),
        cwd="/",
    )
    total = compilecache.stats(root).bytes
    per = total // 5
    result = compilecache.prune(root, max_bytes=total - per)
    assert result.removed_entries == 1 and result.kept_bytes == compilecache.stats(root).bytes <= total - per
    assert not compilecache.object_path(root, entries[1].result_key).exists()
    assert compilecache.object_path(root, entries[0].result_key).exists()
    result = compilecache.prune(root, max_bytes=2 * per + 100)
    assert result.removed_entries == 2 and compilecache.stats(root).entries == 2
    assert compilecache.prune(root, max_bytes=0).kept_bytes == 0
    assert compilecache.stats(root).entries == 0 and not list((root / "v1" / "m").rglob("*.json"))


def test_prune_removes_orphans_and_old_temporaries_but_not_a_writer_at_work(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    now = time.time()
    lost = put(root, dk(1), size=10, mtime=now)
    compilecache.object_path(root, lost.result_key).unlink()  # a manifest without its object
    young = put(root, dk(2), size=10, mtime=now)
    compilecache.manifest_path(root, dk(2), young.result_key).unlink()  # its manifest is about to follow
    old = put(root, dk(3), size=10, mtime=now - 2 * compilecache.TEMP_GRACE_S)
    compilecache.manifest_path(root, dk(3), old.result_key).unlink()
    fresh_tmp = root / "v1" / "o" / ".tmp-x-1-aa"
    stale_tmp = root / "v1" / "o" / ".tmp-x-2-bb"
    for tmp, age in ((fresh_tmp, 0), (stale_tmp, 2 * compilecache.TEMP_GRACE_S)):
        tmp.write_text("x")
        os.utime(tmp, (now - age, now - age))
    result = compilecache.prune(root, max_bytes=10**9, now=now)
    assert result.removed_entries == 1
    assert not compilecache.manifest_path(root, dk(1), lost.result_key).exists()
    assert compilecache.object_path(root, young.result_key).exists() and fresh_tmp.exists()
    assert not compilecache.object_path(root, old.result_key).exists() and not stale_tmp.exists()


RACER = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from factory.container import compilecache as cc
    root, src, obj, dk = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    call = cc.Call(mode="cxx", source=src, output=obj, depfile=None, key_args=())
    for _ in range(int(sys.argv[5])):
        assert cc.store(root, dk, call=call, depfile_text=f"x.o: {src}\\n", roots=cc.Roots(), cwd="/",
                        started_ns=time.time_ns() + 10**12)
""")


def test_concurrent_writers_never_leave_half_an_entry(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    src = tmp_path / "k.cpp"
    src.write_text("int k;")
    objs = []
    for name in ("a.o", "b.o"):
        (tmp_path / name).write_bytes(os.urandom(1) * (4 << 20))  # large enough to be caught half-written
        objs.append(tmp_path / name)
    objs[1].write_bytes(objs[0].read_bytes())  # one compile's object, written by two jobs
    writers = [
        subprocess.Popen([sys.executable, "-c", RACER, str(root), str(src), str(o), dk(7), "40"])
        for o in objs
    ]
    call = compilecache.Call(
        mode="cxx", source=str(src), output=str(tmp_path / "read.o"), depfile=None, key_args=()
    )
    seen = 0
    while any(w.poll() is None for w in writers):
        found = compilecache.lookup(root, dk(7), Roots())
        if found is not None:
            assert compilecache.fetch(root, *found, call=call, roots=Roots(), cwd="/")
            assert (tmp_path / "read.o").read_bytes() == objs[0].read_bytes()
            seen += 1
    assert [w.wait() for w in writers] == [0, 0]
    assert seen > 0
    assert compilecache.stats(root).entries == 1
    assert not [p for p in root.rglob("*") if p.name.startswith(".tmp-")]


# --- what the host reads -----------------------------------------------------------------------------------


def test_a_hit_teaches_no_profile() -> None:
    hit = protocol.parse_measurement(
        protocol.measurement_line({"key": "k", "peak_bytes": 0, "wall_s": 0.01, "cache": "hit"})
    )
    miss = protocol.parse_measurement(
        protocol.measurement_json({"key": "k", "peak_bytes": 5, "wall_s": 2, "cache": "miss"})
    )
    cxx = protocol.parse_measurement(
        protocol.measurement_json({"key": "c", "peak_bytes": 9, "wall_s": 2, "cache": "miss", "tool": "cxx"})
    )
    old = protocol.parse_measurement('{"key": "k", "peak_bytes": 3, "wall_s": 1}')
    assert hit and miss and cxx and old
    assert (hit.compiled, miss.compiled, cxx.compiled, old.compiled) == (False, True, True, True)
    assert (hit.learns, miss.learns, cxx.learns, old.cache) == (False, True, False, None)
    merged = profiles.merge(profiles.Profile(package="p", version="1", entries={}), [hit, cxx, miss])
    assert dict(merged.entries) == {"k": profiles.ProfileEntry(peak_bytes=5, wall_s=2.0, samples=1)}


def test_the_driver_puts_the_host_compiler_through_the_cache_only_when_it_is_on() -> None:
    assert driver.cache_env({}) == {}
    assert driver.cache_env({"FACTORY_CACHE_DIR": "", "CXX": "g++"}) == {}
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache"}) == {"CXX": str(CXX)}
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache", "CXX": "g++-13"}) == {
        "CXX": str(CXX),
        "FACTORY_REAL_CXX": "g++-13",
    }
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache", "CXX": str(CXX)}) == {}
