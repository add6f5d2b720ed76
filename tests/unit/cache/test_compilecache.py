"""The compile cache's container side (factory/container/compilecache.py): its keys and path placeholders,
its entries on disk, what a corrupt entry or a race does, deterministic objects, verification claims; and the
`c++` launcher through it, with a stand-in compiler whose object is every line it read (so a wrong hit shows
as a wrong object), a build's outbox imported and signed by the host (factory/cache/sync.py) as a run does.
The host's side (import, signatures, sync, prune, stats): test_cache.py, test_cache_trust.py. Real nvcc:
tests/integration/test_compilecache_nvcc.py."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.cache import sync as cache
from factory.container import CONTAINER_DIR, compilecache, driver, nvcccall, protocol
from factory.container.compilecache import Roots
from factory.core import safefs
from factory.memory import profiles
from factory.trust import cachekeys

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
    world: dict[str, Path],
    job: Path,
    args: list[str],
    *,
    cache: bool = True,
    root: Path | None = None,
    out: Path | None = None,
    **extra: str,
) -> subprocess.CompletedProcess[str]:
    """The launcher in a job: it looks up in `root` (world["cache"]) and records in `out` (the root itself,
    unless a separate outbox is given, as a run's container has)."""
    root = root or world["cache"]
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join((str(Path(sys.executable).parent), env.get("PATH", "")))
    env.update(
        {
            "FACTORY_REAL_CXX": str(world["fake"]),
            "FAKE_LOG": str(world["log"]),
            "FACTORY_JOB_DIR": str(job),
            "FACTORY_CACHE_DIR": str(root) if cache else "",
            "FACTORY_CACHE_OUT": str(out or root) if cache else "",
            "TMPDIR": str(world["tmp"]),
        }
    )
    env.pop("VIRTUAL_ENV", None)
    env.pop("CUDA_HOME", None)
    env.pop("FACTORY_CACHE_CHECK", None)
    env.update(extra)
    return subprocess.run([str(CXX), *args], env=env, capture_output=True, text=True, timeout=60, check=False)


def compiled(world: dict[str, Path]) -> list[str]:
    return world["log"].read_text().split() if world["log"].exists() else []


def measurement(proc: subprocess.CompletedProcess[str]) -> protocol.Measurement:
    (m,) = [m for m in map(protocol.parse_measurement, proc.stderr.splitlines()) if m is not None]
    return m


def obj_of(args: list[str]) -> Path:
    return Path(args[args.index("-o") + 1])


def cache_files(root: Path, kind: str) -> list[Path]:
    """The files of one kind ("o", "m", "h") of a cache root or an outbox, by the cache's grammar."""
    return [
        root / f.relative
        for f in safefs.walk(root)
        if (named := compilecache.classify(f.relative)) is not None and named[0] == kind
    ]


KEY = cachekeys.Keyring(signing=Ed25519PrivateKey.generate(), writes_store=True)
DOMAIN = cache.trust_domain("demo-src")


def host_import(world: dict[str, Path], outbox: Path) -> tuple[Path, cache.ImportResult]:
    """What the host does while and after a job runs: the outbox's entries checked, signed and imported into
    the domain's directory, which the next job mounts read-only."""
    dest = cache.domain_dir(world["tmp"] / "local", DOMAIN)
    dest.mkdir(parents=True, exist_ok=True)
    return dest, cache.import_outbox(outbox, dest, domain=DOMAIN, keyring=KEY)


# --- through the c++ launcher ------------------------------------------------------------------------------


def test_a_second_job_on_another_python_hits_with_the_same_object_and_its_own_depfile(
    world: dict[str, Path],
) -> None:
    """The real flow: job A compiles into its outbox, the host imports and signs it into the domain's
    directory, job B (another job directory, another Python) looks up there read-only and hits."""
    a = make_job(world, "demo-py3.11-1", "3.11", {"csrc/k.cpp": KERNEL})
    b = make_job(world, "demo-py3.13-1", "3.13", {"csrc/k.cpp": KERNEL})
    args_a = compile_args(world, a, "3.11", "csrc/k.cpp")
    args_b = compile_args(world, b, "3.13", "csrc/k.cpp")
    dest = cache.domain_dir(world["tmp"] / "local", DOMAIN)
    dest.mkdir(parents=True)
    out_a, out_b = world["tmp"] / "out-a", world["tmp"] / "out-b"
    first = run_cxx(world, a, args_a, root=dest, out=out_a)
    assert first.returncode == 0, first.stderr
    assert measurement(first).cache == protocol.CACHE_MISS
    assert cache_files(dest, "m") == [] and len(cache_files(out_a, "m")) == 1  # the root is only read
    _, imported = host_import(world, out_a)
    assert (imported.objects, imported.entries, imported.refused) == (1, 1, 0)
    (manifest,) = cache_files(dest, "m")
    assert cachekeys.verified_entry(manifest.read_bytes(), domain=DOMAIN, keyring=KEY) is not None
    second = run_cxx(world, b, args_b, root=dest, out=out_b)
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
    # B's outbox holds its hit's mark, no entry: the host counts the use
    assert (cache_files(out_b, "m"), len(cache_files(out_b, "h"))) == ([], 1)
    assert host_import(world, out_b)[1].hits == 1


def test_an_entry_no_host_imported_is_not_seen_by_another_job(world: dict[str, Path]) -> None:
    """A job's outbox is its own: what it compiled reaches another job only through the host's import."""
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    b = make_job(world, "b", "3.11", {"csrc/k.cpp": KERNEL})
    dest = cache.domain_dir(world["tmp"] / "local", DOMAIN)
    dest.mkdir(parents=True)
    assert (
        run_cxx(
            world, a, compile_args(world, a, "3.11", "csrc/k.cpp"), root=dest, out=world["tmp"] / "oa"
        ).returncode
        == 0
    )
    second = run_cxx(
        world, b, compile_args(world, b, "3.11", "csrc/k.cpp"), root=dest, out=world["tmp"] / "ob"
    )
    assert measurement(second).cache == "miss" and compiled(world) == ["k.cpp", "k.cpp"]


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
def test_a_corrupt_object_is_a_miss_and_nothing_is_deleted(world: dict[str, Path], damage: str) -> None:
    """A lookup only reads: a corrupt object is a miss, the root is left as it is (the host prunes), and the
    compile that ran is recorded in the outbox."""
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    good = obj_of(args).read_bytes()
    (obj,) = cache_files(world["cache"], "o")
    (manifest,) = cache_files(world["cache"], "m")
    if damage == "truncate":
        obj.write_bytes(good[:5])
    elif damage == "flip":
        obj.write_bytes(bytes([good[0] ^ 1]) + good[1:])
    else:
        obj.unlink()
    before = {p: p.read_bytes() for p in world["cache"].rglob("*") if p.is_file()}
    obj_of(args).unlink()
    out = world["tmp"] / "outbox"
    proc = run_cxx(world, a, args, out=out)
    assert proc.returncode == 0 and measurement(proc).cache == "miss"
    assert obj_of(args).read_bytes() == good
    assert {p: p.read_bytes() for p in world["cache"].rglob("*") if p.is_file()} == before
    assert manifest.is_file() and [p.read_bytes() for p in cache_files(out, "o")] == [good]
    # recorded where it is looked up (a cache that is its own outbox): whole again, a hit
    assert measurement(run_cxx(world, a, args)).cache == "miss"
    assert measurement(run_cxx(world, a, args)).cache == "hit"
    assert [p.read_bytes() for p in cache_files(world["cache"], "o")] == [good]


@pytest.mark.parametrize("text", ["", "{", '{"version": "v1"}', "[1, 2]"])
def test_an_unreadable_manifest_is_a_miss_and_is_left_to_the_host(world: dict[str, Path], text: str) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    (manifest,) = cache_files(world["cache"], "m")
    manifest.write_text(text)
    out = world["tmp"] / "outbox"
    assert measurement(run_cxx(world, a, args, out=out)).cache == "miss"
    assert manifest.read_text() == text  # not removed, not rewritten: the root is read-only to a build
    (stored,) = cache_files(out, "m")
    assert stored.relative_to(out) == manifest.relative_to(world["cache"])
    assert compilecache.parse_manifest(stored.read_bytes()) is not None


def test_a_manifest_that_lies_about_its_inputs_is_not_a_hit(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    assert run_cxx(world, a, args).returncode == 0
    (manifest,) = cache_files(world["cache"], "m")
    raw = json.loads(manifest.read_text())
    raw["inputs"] = raw["inputs"][:1]  # a result key that no longer matches its inputs
    manifest.write_text(json.dumps(raw))
    assert measurement(run_cxx(world, a, args)).cache == "miss"


def test_a_failed_compile_is_not_stored(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    proc = run_cxx(world, a, args, FAKE_RC="3")
    assert proc.returncode == 3 and measurement(proc).rc == 3
    assert cache_files(world["cache"], "m") == [] and cache_files(world["cache"], "o") == []


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
    named = nvcccall.include_dirs(nvcccall.scan(args))
    assert compilecache.python_include_dirs(named, "/") == [str(tmp_path / "py")]
    roots = compilecache.job_roots(named, "/", {})
    assert roots.normalise(f"-I{tmp_path}/py") == "-I@PYINC@"


TORCH_NVCC = [
    "--generate-dependencies-with-compile", "--dependency-output", "/j/src/build/t/k.o.d",
    "-I/j/venv/lib/python3.11/site-packages/torch/include", "-I/usr/include/python3.11", "-c",
    "/j/src/csrc/k.cu", "-o", "/j/src/build/t/k.o", "-D__CUDA_NO_HALF_OPERATORS__",
    "--expt-relaxed-constexpr",
    "-gencode=arch=compute_90,code=sm_90", "-std=c++17", "-O3", "--threads", "4", "-ccbin", "g++",
]  # fmt: skip


def test_parse_call_of_torch_lines() -> None:
    call = compilecache.parse_call(nvcccall.parse(TORCH_NVCC), "/tmp/own.d")
    assert isinstance(call, compilecache.Call)
    assert (call.source, call.output, call.depfile) == (
        "/j/src/csrc/k.cu",
        "/j/src/build/t/k.o",
        "/j/src/build/t/k.o.d",
    )
    assert "-o" not in call.key_args and "--dependency-output" not in call.key_args
    assert "/tmp/own.d" not in call.run_args  # it named a depfile of its own
    cxx = compilecache.parse_call(
        nvcccall.parse(["-MMD", "-MF", "k.o.d", "-c", "k.cpp", "-o", "k.o"], nvcccall.CXX)
    )
    assert isinstance(cxx, compilecache.Call)
    assert cxx.run_args[0] == "-MD"  # system headers too: a manifest without them would be unsound
    bare = compilecache.parse_call(nvcccall.parse(["-c", "k.cpp", "-o", "k.o"], nvcccall.CXX), "/tmp/own.d")
    assert isinstance(bare, compilecache.Call) and bare.depfile is None
    assert bare.run_args[-3:] == ("-MD", "-MF", "/tmp/own.d")
    nvcc_bare = compilecache.parse_call(nvcccall.parse(["-c", "k.cu", "-o", "k.o"]), "/tmp/own.d")
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
    assert isinstance(compilecache.parse_call(nvcccall.parse(args, nvcccall.CXX), "/tmp/own.d"), str)


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
    line = [a.replace("/j/", f"{job}/") for a in args]
    call = compilecache.parse_call(nvcccall.parse(line), "/tmp/own.d")
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
    call = compilecache.parse_call(
        nvcccall.parse(["-Iinc", "-c", "k.cpp", "-o", "k.o"], nvcccall.CXX), "/tmp/own.d"
    )
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


# --- verifying hits: compiled anyway, compared ---------------------------------------------------------


def test_a_verified_hit_is_compiled_and_same_and_a_poisoned_one_differs(world: dict[str, Path]) -> None:
    """Job A's entry is imported and signed. With FACTORY_CACHE_CHECK=1 job B's hit is compiled anyway and
    found "same" (and records nothing). A compromised signer then swaps the object for other bytes and
    re-signs a manifest naming them: job C, verifying, reports "differs" for that entry; job D, not
    verifying, would have been served the planted bytes."""
    jobs = {n: make_job(world, n, "3.11", {"csrc/k.cpp": KERNEL}) for n in "abcd"}
    args = {n: compile_args(world, j, "3.11", "csrc/k.cpp") for n, j in jobs.items()}
    dest = cache.domain_dir(world["tmp"] / "local", DOMAIN)
    dest.mkdir(parents=True)
    outs = {n: world["tmp"] / f"out-{n}" for n in jobs}
    assert measurement(run_cxx(world, jobs["a"], args["a"], root=dest, out=outs["a"])).cache == "miss"
    host_import(world, outs["a"])
    (manifest,) = cache_files(dest, "m")
    entry = cachekeys.verified_entry(manifest.read_bytes(), domain=DOMAIN, keyring=KEY)
    assert entry is not None
    checked = run_cxx(world, jobs["b"], args["b"], root=dest, out=outs["b"], FACTORY_CACHE_CHECK="1")
    assert checked.returncode == 0, checked.stderr
    m = measurement(checked)
    assert (m.cache, m.cache_check, m.entry, m.source) == (
        "miss",
        "same",
        f"{entry.direct_key}-{entry.result_key}",
        "k.cpp",
    )
    assert compiled(world) == ["k.cpp", "k.cpp"]
    assert obj_of(args["b"]).read_bytes() == obj_of(args["a"]).read_bytes()
    assert cache_files(outs["b"], "m") == [] and cache_files(outs["b"], "h") == []
    # the signer is compromised: other bytes, a manifest naming them, a valid signature
    planted = b"-O3\nint kernel() { return evil(); }\n"
    poisoned = compilecache.Entry(
        **{
            **entry.__dict__,
            "object_sha256": hashlib.sha256(planted).hexdigest(),
            "object_size": len(planted),
        }
    )
    compilecache.object_path(dest, poisoned.object_sha256).parent.mkdir(parents=True, exist_ok=True)
    compilecache.object_path(dest, poisoned.object_sha256).write_bytes(planted)
    manifest.write_bytes(cachekeys.signed_manifest(poisoned, domain=DOMAIN, keyring=KEY))
    differs = measurement(
        run_cxx(world, jobs["c"], args["c"], root=dest, out=outs["c"], FACTORY_CACHE_CHECK="1")
    )
    assert (differs.cache_check, differs.entry) == ("differs", f"{entry.direct_key}-{entry.result_key}")
    assert obj_of(args["c"]).read_bytes() == obj_of(args["a"]).read_bytes()  # what it compiled, not the plant
    assert measurement(run_cxx(world, jobs["d"], args["d"], root=dest, out=outs["d"])).cache == "hit"
    assert obj_of(args["d"]).read_bytes() == planted


def test_only_the_first_hits_of_a_build_are_verified(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    args = compile_args(world, a, "3.11", "csrc/k.cpp")
    out = world["tmp"] / "outbox"
    assert run_cxx(world, a, args, out=out).returncode == 0
    host_import(world, out)
    dest = cache.domain_dir(world["tmp"] / "local", DOMAIN)
    states = [
        measurement(run_cxx(world, a, args, root=dest, out=out, FACTORY_CACHE_CHECK="2")).cache_check
        for _ in range(4)
    ]
    assert states == ["same", "same", None, None]


@pytest.mark.parametrize(
    ("verify", "claims"), [("2", 2), ("1", 1), ("0", 0), (None, 0), ("", 0), ("x", 0), ("-3", 0)]
)
def test_claim_check_takes_exactly_as_many_as_asked(tmp_path: Path, verify: str | None, claims: int) -> None:
    env = {} if verify is None else {compilecache.CACHE_CHECK_ENV: verify}
    assert sum(compilecache.claim_check(tmp_path, env) for _ in range(20)) == claims
    assert not compilecache.claim_check(None, {compilecache.CACHE_CHECK_ENV: "5"})


CLAIMER = textwrap.dedent("""\
    import sys
    from pathlib import Path
    from factory.container import compilecache as cc
    won = sum(cc.claim_check(Path(sys.argv[1]), {"FACTORY_CACHE_CHECK": "3"}) for _ in range(50))
    print(won)
""")


def test_concurrent_compiles_never_claim_more_than_asked(tmp_path: Path) -> None:
    procs = [
        subprocess.Popen([sys.executable, "-c", CLAIMER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
        for _ in range(6)
    ]
    assert sum(int(p.communicate(timeout=60)[0]) for p in procs) == 3


# --- deterministic objects ---------------------------------------------------------------------------------


def test_nvcc_temporary_names_are_made_the_same_length_and_bytes() -> None:
    one = b"\x7fELF\x00tmpxft_0001a2b3_00000000-6_k.cudafe1.cpp\x00tmpxft_0001a2b3_00000001-5_k.stub.c\x00"
    two = b"\x7fELF\x00tmpxft_00ff0c1d_00000007-6_k.cudafe1.cpp\x00tmpxft_00ff0c1d_0000000a-5_k.stub.c\x00"
    assert one != two
    fixed = compilecache.deterministic(one, "nvcc")
    assert fixed == compilecache.deterministic(two, "nvcc") and len(fixed) == len(one)
    assert b"tmpxft_00000000_00000000-6_k.cudafe1.cpp" in fixed
    assert compilecache.deterministic(one, "cxx") == one  # the host compiler has no such names
    other = b"tmpxft_0001a2b3_0000000-6 tmpxft_0001A2B3_00000000-6 xtmpxft"  # not nvcc's form
    assert compilecache.deterministic(other, "nvcc") == other


def test_prefix_maps_put_the_longest_path_last_and_nvcc_passes_them_on() -> None:
    roots = Roots.of(
        [
            ("@JOB@", "/var/factory/jobs/a-1"),
            ("@SITE@", "/var/factory/jobs/a-1/venv/lib/python3.11/site-packages"),
            ("@CUDA@", "/nonexistent/cuda"),
            ("@PYINC@", "/opt/py,3.11/include"),
        ]
    )
    maps = compilecache.prefix_maps(roots, "cxx")
    assert maps == [
        "-ffile-prefix-map=/nonexistent/cuda=@CUDA@",
        "-ffile-prefix-map=/var/factory/jobs/a-1=@JOB@",
        "-ffile-prefix-map=/var/factory/jobs/a-1/venv/lib/python3.11/site-packages=@SITE@",
    ]  # the comma's path is left out: -Xcompiler would split it
    assert compilecache.prefix_maps(roots, "nvcc") == ["-Xcompiler", ",".join(maps)]
    assert compilecache.prefix_maps(Roots(), "nvcc") == [] == compilecache.prefix_maps(Roots(), "cxx")
    spaced = Roots.of([("@JOB@", "/a b"), ("@SITE@", "/x=y")])
    assert compilecache.prefix_maps(spaced, "cxx") == []


def test_an_attempt_runs_with_the_prefix_maps(world: dict[str, Path]) -> None:
    a = make_job(world, "a", "3.11", {"csrc/k.cpp": KERNEL})
    env = {"FACTORY_CACHE_DIR": str(world["cache"]), "FACTORY_JOB_DIR": str(a)}
    got = compilecache.attempt(
        nvcccall.parse(compile_args(world, a, "3.11", "csrc/k.cpp"), nvcccall.CXX),
        str(world["fake"]),
        environ=env,
        cwd="/",
    )
    assert isinstance(got, compilecache.Attempt)
    assert got.run_args[-1] == f"-ffile-prefix-map={os.path.realpath(a)}=@JOB@" or (
        f"-ffile-prefix-map={a}=@JOB@" in got.run_args
    )
    assert got.run_args[: len(got.call.run_args)] == got.call.run_args


# --- what is not a regular file ----------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_file_sha256_of_a_device_or_a_fifo_is_none_at_once(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo")
    assert compilecache.file_sha256("/dev/zero") is None
    assert compilecache.file_sha256(str(tmp_path / "fifo")) is None
    assert compilecache.file_sha256(str(tmp_path / "absent")) is None
    (tmp_path / "f").write_bytes(b"x")
    assert compilecache.file_sha256(str(tmp_path / "f")) == hashlib.sha256(b"x").hexdigest()


def test_file_sha256_of_a_directory_is_none_and_keeps_no_descriptor(tmp_path: Path) -> None:
    """Its contract: None for anything not a regular file. A lookup whose manifest names a path that is a
    directory now must be a miss of that manifest, not an exception that ends the whole lookup."""
    before = len(os.listdir("/proc/self/fd"))
    try:
        got = [compilecache.file_sha256(str(tmp_path)) for _ in range(5)]
    except OSError as exc:
        pytest.fail(
            "BUG factory/container/compilecache.py file_sha256: os.fdopen of a directory's descriptor raises "
            f"{type(exc).__name__} (outside any try) and leaks the descriptor os.open returned"
        )
    assert got == [None] * 5
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.timeout(10)
@pytest.mark.parametrize("hostile", ["/dev/zero", "fifo"])
def test_a_manifest_naming_a_device_or_a_fifo_is_a_miss_at_once(tmp_path: Path, hostile: str) -> None:
    root = tmp_path / "cache"
    root.mkdir()
    (tmp_path / "h.h").write_text("int h;")
    if hostile == "fifo":
        os.mkfifo(tmp_path / "fifo")
        hostile = str(tmp_path / "fifo")
    data = b"object"
    honest = ((str(tmp_path / "h.h"), hashlib.sha256(b"int h;").hexdigest()),)
    for n, inputs in enumerate([((hostile, hashlib.sha256(b"").hexdigest()), *honest), honest]):
        dkey = dk(100 + n)
        entry = compilecache.Entry(
            direct_key=dkey, result_key=compilecache.result_key(dkey, inputs), inputs=inputs,
            object_sha256=hashlib.sha256(data).hexdigest(), object_size=len(data), depfile=None, created=1.0,
        )  # fmt: skip
        safefs.write_bytes(root, compilecache.object_relative(entry.object_sha256), data)
        safefs.write_bytes(
            root,
            compilecache.manifest_relative(dkey, entry.result_key),
            compilecache.manifest_json(entry).encode(),
        )
    assert compilecache.lookup(root, dk(100), Roots()) is None
    assert compilecache.lookup(root, dk(101), Roots()) is not None  # the same, without it: a hit


# --- races --------------------------------------------------------------------------------------------------


def dk(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


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
            assert compilecache.fetch(root, found[0], call=call, roots=Roots(), cwd="/")
            assert (tmp_path / "read.o").read_bytes() == objs[0].read_bytes()
            seen += 1
    assert [w.wait() for w in writers] == [0, 0]
    assert seen > 0
    assert len(cache_files(root, "m")) == 1 and len(cache_files(root, "o")) == 1
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


def test_the_driver_puts_the_host_compiler_through_the_launcher_cache_or_not() -> None:
    # cache or not: the launcher records each shared link (which modules link nvcc's objects)
    assert driver.cache_env({}) == {"CXX": str(CXX)}
    assert driver.cache_env({"FACTORY_CACHE_DIR": "", "CXX": "g++"}) == {
        "CXX": str(CXX),
        "FACTORY_REAL_CXX": "g++",
    }
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache"}) == {"CXX": str(CXX)}
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache", "CXX": "g++-13"}) == {
        "CXX": str(CXX),
        "FACTORY_REAL_CXX": "g++-13",
    }
    assert driver.cache_env({"FACTORY_CACHE_DIR": "/cache", "CXX": str(CXX)}) == {}
