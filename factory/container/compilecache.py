"""The compile cache: its on-disk format, its keys, and the lookup and store of one compile. The one owner of
the cache's format and its grammar (`classify`); the host (`factory.cache.sync`) imports, signs, syncs and
prunes.

A cache root (one trust domain's: `factory.cache.sync`) holds
  m/<dk[:2]>/<dk>/<rk>.json   a manifest: the files one compile of direct key dk read, with their sha256, and
                              the sha256 of the object it wrote
  o/<sha[:2]>/<sha>           an object, named by the sha256 of its content
A build container reads the root (read-only: FACTORY_CACHE_DIR) and writes what it compiles, in the same
layout, to its job's outbox (FACTORY_CACHE_OUT), with a mark `h/<dk>-<rk>` for each entry it used; the host
checks and imports the outbox. Every file is written under a temporary name (TEMP_PREFIX) in its own
directory and renamed into place, the object before its manifest: a reader never sees half an entry.

Direct mode, as ccache's: the direct key (dk) hashes the compiler's identity, the call's arguments with the
paths that differ between jobs replaced by placeholders, the source's content and the environment the
compiler reads. Every manifest under dk records the files the compile read (its depfile, which lists every
header of every pass) as [normalised path, sha256]; a lookup hits only when each of them is a regular file
with the same content now. The result key (rk) hashes dk and those inputs. Python's include directory is a
placeholder in the arguments (@PYINC@) and so takes no part in dk: a file that never includes Python.h has
the same key for every Python, and one that does records Python.h among its inputs, so another Python's
header misses.

Objects are deterministic where the factory can make them so (`deterministic`, `pinned`), so a hit can
be checked by compiling it again (FACTORY_CACHE_CHECK).

Standard library only, like its package.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import time
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from . import nvcccall, protocol

LAYOUT_VERSION = "v3"  # v3: manifests signed with Ed25519 (v2 had HMAC tags: never read again)
CACHE_DIR_ENV = protocol.ENV_CACHE_DIR
CACHE_OUT_ENV = protocol.ENV_CACHE_OUT
CACHE_CHECK_ENV = protocol.ENV_CACHE_CHECK
TEMP_PREFIX = ".tmp-"
# temporary files younger than this may belong to a writer still at work
TEMP_GRACE_S = 3600.0
KEY_FORMAT = 3  # 3: nvcc compiles run with `module_path`: an object of 2 is not what a miss makes now
MANIFEST_SUFFIX = ".json"
HIT_SEPARATOR = "-"


# --- the grammar of a cache's files ------------------------------------------------------------------------

OBJECT, MANIFEST, HIT = "o", "m", "h"


def is_key(text: str) -> bool:
    """A sha256 in lower-case hex: every name in the cache is one (or two, or one with a suffix)."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def classify(relative: str | PurePosixPath) -> tuple[str, ...] | None:
    """What a path relative to a cache root names, by the cache's grammar alone, or None for anything else:
    ("o", sha256) for `o/<sha[:2]>/<sha>`, an object named by the sha256 of its content;
    ("m", dk, rk) for `m/<dk[:2]>/<dk>/<rk>.json`, a manifest;
    ("h", dk, rk) for `h/<dk>-<rk>`, an outbox's mark that a build used that entry."""
    parts = PurePosixPath(relative).parts
    if len(parts) == 3 and parts[0] == OBJECT and is_key(parts[2]) and parts[1] == parts[2][:2]:
        return (OBJECT, parts[2])
    if len(parts) == 4 and parts[0] == MANIFEST and is_key(parts[2]) and parts[1] == parts[2][:2]:
        name = parts[3]
        if name.endswith(MANIFEST_SUFFIX) and is_key(name[: -len(MANIFEST_SUFFIX)]):
            return (MANIFEST, parts[2], name[: -len(MANIFEST_SUFFIX)])
    if len(parts) == 2 and parts[0] == HIT:
        dk, sep, rk = parts[1].partition(HIT_SEPARATOR)
        if sep and is_key(dk) and is_key(rk):
            return (HIT, dk, rk)
    return None


def cache_root(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The cache's root from the environment; None when the cache is off."""
    value = environ.get(CACHE_DIR_ENV, "")
    return Path(value) if value else None


def cache_out(environ: Mapping[str, str] = os.environ) -> Path | None:
    """Where a build's new entries go; None: it only looks up."""
    value = environ.get(CACHE_OUT_ENV, "")
    return Path(value) if value else None


def manifest_relative(direct_key: str, result_key: str) -> PurePosixPath:
    return PurePosixPath(MANIFEST, direct_key[:2], direct_key, f"{result_key}{MANIFEST_SUFFIX}")


def object_relative(sha256: str) -> PurePosixPath:
    return PurePosixPath(OBJECT, sha256[:2], sha256)


def hit_relative(direct_key: str, result_key: str) -> PurePosixPath:
    return PurePosixPath(HIT, f"{direct_key}{HIT_SEPARATOR}{result_key}")


def manifest_dir(root: Path, direct_key: str) -> Path:
    return root / MANIFEST / direct_key[:2] / direct_key


def manifest_path(root: Path, direct_key: str, result_key: str) -> Path:
    return root / manifest_relative(direct_key, result_key)


def object_path(root: Path, sha256: str) -> Path:
    return root / object_relative(sha256)


def is_temp(name: str) -> bool:
    return name.startswith(TEMP_PREFIX)


# --- path normalisation ------------------------------------------------------------------------------------

OUT = "@OUT@"


@dataclass(frozen=True, kw_only=True)
class Roots:
    """The directories whose absolute paths differ between jobs of one variant, each with its placeholder."""

    pairs: tuple[tuple[str, str], ...] = ()  # (placeholder, absolute path), longest path first

    @staticmethod
    def of(named: Sequence[tuple[str, str | None]]) -> Roots:
        pairs: dict[str, str] = {}
        for placeholder, path in named:
            if not path:
                continue
            for form in {os.path.normpath(path), os.path.realpath(path)}:
                if form != "/":
                    pairs.setdefault(form, placeholder)
        ordered = sorted(((p, d) for d, p in pairs.items()), key=lambda pd: (-len(pd[1]), pd[1]))
        return Roots(pairs=tuple(ordered))

    def normalise(self, text: str) -> str:
        for placeholder, path in self.pairs:
            text = _root_pattern(path).sub(placeholder.replace("\\", r"\\"), text)
        return text

    def denormalise(self, text: str) -> str:
        # the first path of a placeholder is the one given (normpath before realpath in `of`)
        seen: dict[str, str] = {}
        for placeholder, path in self.pairs:
            seen.setdefault(placeholder, path)
        for placeholder, path in sorted(seen.items(), key=lambda pp: -len(pp[0])):
            text = text.replace(placeholder, path)
        return text


@functools.lru_cache(maxsize=64)
def _root_pattern(path: str) -> re.Pattern[str]:
    # a root only where a path component ends: /work/jobs/a-1 is no prefix of /work/jobs/a-10
    return re.compile(re.escape(path) + r"(?=/|$|[\s,;:=\"'\\])")


def site_packages(venv: str | None) -> str | None:
    if not venv:
        return None
    found = sorted(Path(venv, "lib").glob("python*/site-packages"))
    return str(found[0]) if found else None


def python_include_dirs(include_dirs: Sequence[str], cwd: str) -> list[str]:
    """The include directories of a call (`nvcccall.include_dirs`) that hold a Python.h (the interpreter's
    headers), in order."""
    dirs: list[str] = []
    for value in include_dirs:
        path = os.path.normpath(os.path.join(cwd, value))
        if path not in dirs and os.path.isfile(os.path.join(path, "Python.h")):
            dirs.append(path)
    return dirs


def job_roots(include_dirs: Sequence[str], cwd: str, environ: Mapping[str, str] = os.environ) -> Roots:
    """The placeholders of a compile in a build container: its job dir, the venv's site-packages, the
    toolkit, and the Python include dirs among those the call names (`nvcccall.include_dirs`)."""
    job = environ.get(protocol.ENV_JOB_DIR)
    venv = environ.get("VIRTUAL_ENV") or (os.path.join(job, "venv") if job else None)
    named: list[tuple[str, str | None]] = [
        ("@JOB@", job),
        ("@SITE@", site_packages(venv)),
        ("@CUDA@", environ.get("CUDA_HOME") or environ.get("CUDA_PATH")),
    ]
    pyinc = python_include_dirs(include_dirs, cwd)
    named += [("@PYINC@" if i == 0 else f"@PYINC{i}@", d) for i, d in enumerate(pyinc)]
    return Roots.of(named)


# --- the call -----------------------------------------------------------------------------------------------

# arguments after which a compile's output is not one object file, or that write other files
_UNCACHEABLE = {
    "-E", "-M", "-MM", "-S", "-ptx", "--ptx", "-cubin", "--cubin", "-fatbin", "--fatbin", "-lib", "--lib",
    "-link", "--link", "-dlink", "--device-link", "-run", "--run", "-save-temps", "--save-temps", "-keep",
    "--keep", "--keep-dir", "-keep-dir", "-gsplit-dwarf", "--coverage", "-ftest-coverage", "-fprofile-arcs",
    "-time", "--time", "-optf", "--options-file", "-dryrun", "--dryrun", "-preprocess", "--preprocess",
    "--generate-dependencies", "--generate-nonsystem-dependencies", "-o-",
}  # fmt: skip
_UNCACHEABLE_PREFIXES = ("-fprofile-", "-save-temps=", "--save-temps=", "--keep-dir=", "--time=", "-Wp,")
# the dependency options the key leaves out: they change no object
_DEP_FLAGS = {
    "-MD",
    "-MMD",
    "--generate-dependencies-with-compile",
    "--generate-nonsystem-dependencies-with-compile",
}


@dataclass(frozen=True, kw_only=True)
class Call:
    """A cacheable compile: one source, `-c`, one object file."""

    mode: str  # "nvcc" or "cxx"
    source: str
    output: str
    depfile: str | None  # the depfile the call asked for
    key_args: tuple[str, ...]  # its arguments less output and dependency options
    run_args: tuple[str, ...] = field(default=())  # the arguments to run, with a depfile of our own if needed
    include_dirs: tuple[str, ...] = ()  # those the key's arguments name (`nvcccall.include_dirs`)
    host_compiler: str | None = None  # nvcc's -ccbin


def parse_call(parsed: nvcccall.NvccCall, depfile_for: str | None = None) -> Call | str:
    """A cacheable compile, or why the call is not one. depfile_for: where the depfile goes when the call
    names none (the caller deletes it)."""
    mode = parsed.mode
    wants_deps = False
    key: list[str] = []
    key_scanned: list[nvcccall.Arg] = []
    run: list[str] = []
    for arg in parsed.args:
        if arg.text.startswith("@") and arg.option is None:
            return "a response file"
        if arg.text in _UNCACHEABLE or arg.text.startswith(_UNCACHEABLE_PREFIXES):
            return f"{arg.text} is not a plain compile"
        if arg.option in ("-o", "-MF"):
            if arg.missing:
                return f"{arg.text} without a file"
            run += arg.raw  # where it writes changes no object
        elif arg.text in _DEP_FLAGS:
            wants_deps = True
            # every header, system ones too: a manifest missing one would be unsound
            run.append(
                "-MD"
                if arg.text == "-MMD"
                else "--generate-dependencies-with-compile"
                if "nonsystem" in arg.text
                else arg.text
            )
        else:
            key += arg.raw
            key_scanned.append(arg)
            run += arg.raw
    if not parsed.compile_only:
        return "not a compile (-c)"
    if len(parsed.sources) != 1 or parsed.reads_stdin:
        return "not one source file"
    output, depfile = parsed.output, parsed.depfile
    if not output or output == "-":
        return "no object file (-o)"
    if wants_deps and depfile is None:
        if mode == "nvcc":
            return "a depfile without a name"
        depfile = os.path.splitext(output)[0] + ".d"  # gcc's own choice for -MD without -MF
    if depfile is None:
        if depfile_for is None:
            return "no depfile"
        extra = ["--generate-dependencies-with-compile", "--dependency-output", depfile_for]
        run += extra if mode == "nvcc" else ["-MD", "-MF", depfile_for]
    elif not wants_deps:
        return f"a depfile ({depfile}) without -MD"
    return Call(
        mode=mode,
        source=parsed.sources[0],
        output=output,
        depfile=depfile,
        key_args=tuple(key),
        run_args=tuple(run),
        include_dirs=tuple(nvcccall.include_dirs(key_scanned)),
        host_compiler=parsed.host_compiler,
    )


# --- hashing -----------------------------------------------------------------------------------------------

_HASHES: dict[str, tuple[int, int, str]] = {}


def file_sha256(path: str) -> str | None:
    """The content hash of a regular file (remembered by size and mtime for the rest of the process); None
    when it cannot be read or is not a regular file: a manifest may name /dev/zero or a FIFO as an input."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    with os.fdopen(fd, "rb") as fh:
        known = _HASHES.get(path)
        if known and known[:2] == (st.st_size, st.st_mtime_ns):
            return known[2]
        os.set_blocking(fd, True)
        digest = hashlib.sha256()
        try:
            while chunk := fh.read(1 << 20):
                digest.update(chunk)
        except OSError:
            return None
    _HASHES[path] = (st.st_size, st.st_mtime_ns, digest.hexdigest())
    return digest.hexdigest()


def tool_identity(program: str, environ: Mapping[str, str] = os.environ) -> str:
    """What a compiler is: the content of its program (and, for nvcc, of the toolkit programs it runs) and
    its `--version`, never its path. Empty when it is not found. Hashing a toolkit's programs takes a few
    tenths of a second, so the result is remembered in IDENTITY_DIR by their inode, size and times."""
    path = shutil.which(program, path=environ.get("PATH")) if os.sep not in program else program
    if not path or not os.path.isfile(path):
        return ""
    real = os.path.realpath(path)
    files = [("", real)]
    if os.path.basename(real) == "nvcc":
        bindir = os.path.dirname(real)
        files += [
            (rel, os.path.normpath(os.path.join(bindir, rel)))
            for rel in ("cudafe++", "ptxas", "fatbinary", "nvlink", "../nvvm/bin/cicc", "nvcc.profile")
        ]
    memo = _identity_memo(files)
    if memo is not None:
        with contextlib.suppress(OSError):
            return Path(memo).read_text().strip()
    parts = [os.path.basename(real)]
    for rel, tool in files:
        parts += [rel, file_sha256(tool) or "-"]
    identity = hashlib.sha256("\0".join([*parts, _version(real)]).encode()).hexdigest()
    if memo is not None:
        with contextlib.suppress(OSError):
            _write_atomic(memo, identity.encode(), mkdir=True)
    return identity


def identity_dir() -> str:
    """Where compiler identities are remembered: this machine's (or container's) temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"factory-compiler-identity-{os.getuid()}")


def _identity_memo(files: Sequence[tuple[str, str]]) -> str | None:
    parts: list[str] = []
    for rel, path in files:
        try:
            st = os.stat(path)
        except OSError:
            parts.append(f"{rel}:-")
            continue
        parts.append(f"{rel}:{path}:{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}")
    key = hashlib.sha256(f"{KEY_FORMAT}\0{chr(0).join(parts)}".encode()).hexdigest()
    return os.path.join(identity_dir(), key)


_VERSIONS: dict[str, str] = {}


def _version(program: str) -> str:
    if program not in _VERSIONS:
        try:
            out = subprocess.run(
                [program, "--version"], capture_output=True, text=True, timeout=60, check=False
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        _VERSIONS[program] = out
    return _VERSIONS[program]


def host_compilers(ccbin: str | None, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """The host compiler nvcc runs: -ccbin (`NvccCall.host_compiler`), NVCC_CCBIN, else gcc and g++ first
    on PATH."""
    chosen = ccbin or environ.get("NVCC_CCBIN", "")
    if not chosen:
        return ("gcc", "g++")
    if os.path.isdir(chosen):
        return (os.path.join(chosen, "gcc"), os.path.join(chosen, "g++"))
    return (chosen,)


# what the compilers read from the environment besides their arguments
KEY_ENV = (
    "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS", "NVCC_CCBIN", "SOURCE_DATE_EPOCH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
    "DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES",
)  # fmt: skip


def direct_key(
    call: Call,
    *,
    compiler: str,
    host: str | None,
    roots: Roots,
    cwd: str,
    environ: Mapping[str, str] = os.environ,
) -> str | None:
    """The direct key of a call (None when its source cannot be read). compiler, host: identities."""
    source_sha = file_sha256(os.path.join(cwd, call.source))
    if source_sha is None:
        return None
    relative = any(not os.path.isabs(p) for p in [call.source, *call.include_dirs] if p)
    parts = [
        f"factory-compilecache/{KEY_FORMAT}",
        call.mode,
        compiler,
        host or "",
        # a relative path resolves against the directory the compile runs in
        roots.normalise(os.path.normpath(cwd)) if relative else "",
        json.dumps([roots.normalise(a) for a in call.key_args]),
        json.dumps([[n, roots.normalise(environ[n])] for n in KEY_ENV if environ.get(n)]),
        source_sha,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def result_key(dk: str, inputs: Sequence[Sequence[str]]) -> str:
    return hashlib.sha256(f"{dk}\0{json.dumps([list(i) for i in inputs])}".encode()).hexdigest()


# --- depfiles ----------------------------------------------------------------------------------------------


def depfile_inputs(text: str) -> list[str]:
    """The prerequisites a make-style depfile lists (every rule's; targets and escapes removed)."""
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    found: dict[str, None] = {}
    for line in text.splitlines():
        tokens = [_unescape(t) for t in _DEP_TOKEN.findall(line)]
        split = next((i for i, t in enumerate(tokens) if t.endswith(":")), None)
        if split is not None:
            found.update(dict.fromkeys(tokens[split + 1 :]))
    return list(found)


# a token runs to the first whitespace that no backslash escapes
_DEP_TOKEN = re.compile(r"(?:\\.|[^\s\\]|\\$)+")


def _unescape(token: str) -> str:
    return re.sub(r"\\([ #\\])", r"\1", token).replace("$$", "$")


def normalise_depfile(text: str, output: str, cwd: str, roots: Roots) -> str:
    absolute = os.path.normpath(os.path.join(cwd, output))
    for form in sorted({output, absolute}, key=len, reverse=True):
        text = _root_pattern(form).sub(OUT, text)
    return roots.normalise(text)


def denormalise_depfile(text: str, output: str, roots: Roots) -> str:
    return roots.denormalise(text.replace(OUT, output))


# --- lookup and store --------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Entry:
    direct_key: str
    result_key: str
    inputs: tuple[tuple[str, str], ...]
    object_sha256: str  # the object's name too: objects are stored under the hash of their content
    object_size: int
    depfile: str | None
    created: float


def manifest_json(entry: Entry) -> str:
    """A manifest's canonical text: the same entry always gives the same bytes (the host signs them)."""
    return json.dumps(
        {
            "version": LAYOUT_VERSION,
            "direct_key": entry.direct_key,
            "result_key": entry.result_key,
            "inputs": [list(i) for i in entry.inputs],
            "object_sha256": entry.object_sha256,
            "object_size": entry.object_size,
            "depfile": entry.depfile,
            "created": entry.created,
        },
        sort_keys=True,
    )


def parse_manifest(text: str | bytes) -> Entry | None:
    """An entry from a manifest's text; None for anything that is not a whole, consistent one. A signature
    the host added beside the entry's fields is the host's to check."""
    try:
        raw = json.loads(text)
        inputs = tuple((p, h) for p, h in raw["inputs"])
        entry = Entry(
            direct_key=raw["direct_key"],
            result_key=raw["result_key"],
            inputs=inputs,
            object_sha256=raw["object_sha256"],
            object_size=raw["object_size"],
            depfile=raw.get("depfile"),
            created=raw.get("created", 0),
        )
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return None
    typed = (
        all(isinstance(p, str) and isinstance(h, str) for p, h in entry.inputs)
        and isinstance(entry.direct_key, str)
        and isinstance(entry.object_size, int)
        and not isinstance(entry.object_size, bool)
        and entry.object_size >= 0
        and isinstance(entry.object_sha256, str)
        and (entry.depfile is None or isinstance(entry.depfile, str))
        and isinstance(entry.created, int | float)
    )
    if (
        not typed
        or raw.get("version") != LAYOUT_VERSION
        or not is_key(entry.direct_key)
        or not is_key(entry.object_sha256)
        or entry.result_key != result_key(entry.direct_key, entry.inputs)
    ):
        return None
    return Entry(**{**entry.__dict__, "created": float(entry.created)})


def lookup(root: Path, dk: str, roots: Roots) -> tuple[Entry, Path] | None:
    """The entry of dk whose every input has its recorded content now, with its manifest's path. An
    unreadable manifest, or one whose object is gone, is passed over (the host prunes it)."""
    try:
        names = sorted(os.listdir(manifest_dir(root, dk)))
    except OSError:
        return None
    for name in names:
        if classify(PurePosixPath(MANIFEST, dk[:2], dk, name)) is None:
            continue
        path = manifest_dir(root, dk) / name
        try:
            entry = parse_manifest(path.read_bytes())
        except OSError:
            continue
        if entry is None or entry.direct_key != dk or f"{entry.result_key}{MANIFEST_SUFFIX}" != name:
            continue
        current = all(file_sha256(roots.denormalise(p)) == h for p, h in entry.inputs)
        if current and object_path(root, entry.object_sha256).is_file():
            return entry, path
    return None


def fetch(root: Path, entry: Entry, *, call: Call, roots: Roots, cwd: str, out: Path | None = None) -> bool:
    """Copy a found entry's object to the call's output (and its depfile, with this job's paths), checking
    its hash on the way; False when the object is not what its manifest says. A hit is marked in `out`, the
    outbox, for the host to count as a use (the cache itself may be read-only here)."""
    obj = object_path(root, entry.object_sha256)
    target = os.path.join(cwd, call.output)
    digest = hashlib.sha256()
    size = 0
    tmp = _temp_name(target)
    try:
        with open(obj, "rb") as src, open(tmp, "wb") as dst:
            while chunk := src.read(1 << 20):
                digest.update(chunk)
                size += len(chunk)
                dst.write(chunk)
        if digest.hexdigest() != entry.object_sha256 or size != entry.object_size:
            return False
        if call.depfile is not None:
            text = denormalise_depfile(entry.depfile or "", call.output, roots)
            _write_atomic(os.path.join(cwd, call.depfile), text.encode())
        os.replace(tmp, target)
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    if out is not None:
        with contextlib.suppress(OSError):
            _write_atomic(str(out / hit_relative(entry.direct_key, entry.result_key)), b"", mkdir=True)
    return True


def store(
    out: Path, dk: str, *, call: Call, depfile_text: str, roots: Roots, cwd: str, started_ns: int
) -> Entry | None:
    """Record a finished compile in `out`; None (nothing stored) when one of its inputs cannot be read or
    changed while it ran."""
    inputs: dict[str, str] = {}
    for dep in depfile_inputs(depfile_text):
        real = _realpath(os.path.join(cwd, dep))
        try:
            if os.stat(real).st_mtime_ns > started_ns:
                return None
        except OSError:
            return None
        sha = file_sha256(real)
        if sha is None:
            return None
        inputs[roots.normalise(real)] = sha
    if not inputs:
        return None
    ordered = tuple(sorted(inputs.items()))
    rk = result_key(dk, ordered)
    try:
        data = Path(cwd, call.output).read_bytes()
    except OSError:
        return None
    entry = Entry(
        direct_key=dk,
        result_key=rk,
        inputs=ordered,
        object_sha256=hashlib.sha256(data).hexdigest(),
        object_size=len(data),
        depfile=normalise_depfile(depfile_text, call.output, cwd, roots),
        created=time.time(),
    )
    try:
        _write_atomic(str(object_path(out, entry.object_sha256)), data, mkdir=True)
        _write_atomic(str(manifest_path(out, dk, rk)), manifest_json(entry).encode(), mkdir=True)
    except OSError:
        return None
    return entry


@functools.lru_cache(maxsize=4096)
def _real_dir(directory: str) -> str:
    return os.path.realpath(directory)


def _realpath(path: str) -> str:
    """os.path.realpath, with each directory resolved once: a depfile names thousands of headers in a few
    hundred directories."""
    directory, name = os.path.split(path)
    real = os.path.join(_real_dir(directory), name)
    return os.path.realpath(real) if os.path.islink(real) else real


def _temp_name(target: str) -> str:
    directory, name = os.path.split(target)
    return os.path.join(directory, f"{TEMP_PREFIX}{name}-{os.getpid()}-{os.urandom(4).hex()}")


def _write_atomic(target: str, data: bytes, *, mkdir: bool = False) -> None:
    if mkdir:
        os.makedirs(os.path.dirname(target), exist_ok=True)
    tmp = _temp_name(target)
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


# --- one compile through the cache (the wrappers' side) -----------------------------------------------------


# nvcc names the host compiler's input after its temporary file, pid and counter included, and that name is
# the object's STT_FILE symbol: the one byte-for-byte difference between two compiles of the same call
_NVCC_TEMP_NAME = re.compile(rb"tmpxft_[0-9a-f]{8}_[0-9a-f]{8}-")
_NVCC_TEMP_FIXED = b"tmpxft_00000000_00000000-"


def deterministic(data: bytes, mode: str) -> bytes:
    """An object as the same compile would write it in any process: nvcc's temporary names fixed (same
    length, so nothing moves)."""
    return _NVCC_TEMP_NAME.sub(_NVCC_TEMP_FIXED, data) if mode == "nvcc" else data


def prefix_maps(roots: Roots, mode: str) -> list[str]:
    """The host compiler's `-ffile-prefix-map`s that write a job's roots as their placeholders into objects
    (`__FILE__`, debug info): an object then does not depend on which job compiled it. The longest path
    last, as the last matching map wins. nvcc passes them on with -Xcompiler, which splits on commas: a
    path with one is left as it is."""
    maps = [
        f"-ffile-prefix-map={path}={placeholder}"
        for placeholder, path in sorted(roots.pairs, key=lambda pp: (len(pp[1]), pp[1]))
        if "," not in path and "=" not in path and not any(c.isspace() for c in path)
    ]
    if not maps or mode != "nvcc":
        return maps
    return ["-Xcompiler", ",".join(maps)]


def module_path(roots: Roots, mode: str, *, source: str, cwd: str) -> list[str]:
    """The path nvcc's front end (cudafe++) is told its source has: the one a key sees, the job's roots as
    their placeholders, relative paths resolved against the key's working directory.

    cudafe++ names a translation unit's module by a hash of its source's absolute path
    (`_GLOBAL__N__<hash>_<len>_<name>`: every symbol in an anonymous namespace, rdc's registration), so the
    same compile in two job directories wrote two objects, and a cache hit held the module id of the job
    that stored it. That path is the hash's only input (not the time, a pid or the content: measured with
    CUDA 13.0); the one given here pins it and keeps distinct sources distinct, as nvlink needs. The option
    comes last, so it wins over one the call gives. Percent-encoded: -Xcudafe splits on commas, cudafe++ on
    spaces, and nvcc refuses quotes; the text is only hashed (the name in the id is the file's own)."""
    if mode != nvcccall.NVCC:
        return []
    # from the key's own parts (`direct_key`): the source's normalised text, and the directory a relative one
    # is in, so one key is always told one path
    where = roots.normalise(source)
    if not os.path.isabs(source):
        where = os.path.join(roots.normalise(os.path.normpath(cwd)), where)
    path = os.path.normpath(where)
    return ["-Xcudafe", f"--orig_src_path_name={urllib.parse.quote(path, safe='/@')}"]


def pinned(roots: Roots, mode: str, *, source: str, cwd: str) -> list[str]:
    """What a compile is run with so that its object does not depend on its job's directories (`prefix_maps`,
    `module_path`). Derived from the key's own parts, so the key covers it."""
    return [*prefix_maps(roots, mode), *module_path(roots, mode, source=source, cwd=cwd)]


@dataclass(frozen=True, kw_only=True)
class Plain:
    """A compile the cache does not serve (it is off, or the call is not one it takes), run as the cache runs
    its misses: `pinned` as they are, its object then made `deterministic`. The object is the one a
    cache would hold, so a wheel does not depend on whether the cache was on."""

    mode: str
    run_args: tuple[str, ...]
    output: str | None  # the object it writes, absolute; None: not a compile, run as it is

    def finish(self, rc: int) -> None:
        if rc != 0 or self.output is None:
            return
        with contextlib.suppress(OSError):
            data = Path(self.output).read_bytes()
            fixed = deterministic(data, self.mode)
            if fixed != data:
                _write_atomic(self.output, fixed)


def plain(
    parsed: nvcccall.NvccCall, *, environ: Mapping[str, str] = os.environ, cwd: str | None = None
) -> Plain:
    """How to run a call the cache does not take: a compile (`-c`, one object) `pinned` to the job's roots;
    anything else (a link, --version) as it is."""
    cwd = cwd or os.getcwd()
    mode, args = parsed.mode, parsed.argv
    source = parsed.source
    if not parsed.is_compile or source is None or not parsed.output or parsed.output == "-":
        return Plain(mode=mode, run_args=tuple(args), output=None)
    roots = job_roots(nvcccall.include_dirs(parsed.args), cwd, environ)
    output = os.path.normpath(os.path.join(cwd, parsed.output))
    return Plain(mode=mode, run_args=(*args, *pinned(roots, mode, source=source, cwd=cwd)), output=output)


def claim_check(out: Path | None, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether this hit is one of the build's first FACTORY_CACHE_CHECK hits, which are compiled anyway
    and compared with the cache's object. The claims are files in the outbox, made with O_EXCL, so
    concurrent compiles of one build never take more than that many."""
    try:
        wanted = int(environ.get(CACHE_CHECK_ENV, "0") or 0)
    except ValueError:
        return False
    if out is None or wanted <= 0:
        return False
    claims = out / "check"
    with contextlib.suppress(OSError):
        claims.mkdir(parents=True, exist_ok=True)
    for number in range(wanted):
        try:
            os.close(os.open(claims / str(number), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
            return True
        except FileExistsError:
            continue
        except OSError:
            return False
    return False


CHECK_SAME = "same"
CHECK_DIFFERS = "differs"


@dataclass(kw_only=True)
class Attempt:
    """A cacheable call with its key: served from the cache (`serve`), or run as `run_args` and then
    recorded (`finish`)."""

    root: Path
    out: Path | None  # where a compile that ran is recorded; None: look up only
    call: Call
    direct_key: str
    roots: Roots
    cwd: str
    own_depfile: str | None  # the depfile added to a call that named none, removed by `finish`
    started_ns: int = 0
    expected: Entry | None = None  # a hit compiled anyway to check it (FACTORY_CACHE_CHECK)
    check: str | None = None  # CHECK_SAME or CHECK_DIFFERS once that compile has finished

    @property
    def run_args(self) -> tuple[str, ...]:
        pins = pinned(self.roots, self.call.mode, source=self.call.source, cwd=self.cwd)
        return (*self.call.run_args, *pins)

    def serve(self, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether the call's outputs were written from the cache. A hit chosen to be checked is not
        served: it is compiled, and `finish` compares."""
        found = lookup(self.root, self.direct_key, self.roots)
        if found is None:
            return False
        entry, _ = found
        if claim_check(self.out, environ):
            self.expected = entry
            return False
        return fetch(self.root, entry, call=self.call, roots=self.roots, cwd=self.cwd, out=self.out)

    def start(self) -> None:
        # an input changed after this moment may not be what the compiler read
        self.started_ns = time.time_ns()

    def finish(self, rc: int) -> Entry | None:
        """Make the object deterministic, compare it with the entry it checks, record the compile (only a
        successful one, and never one that contradicts the cache: the host reports that), and remove the
        depfile of our own."""
        depfile = self.own_depfile or self.call.depfile
        try:
            if rc != 0:
                return None
            output = os.path.join(self.cwd, self.call.output)
            data = Path(output).read_bytes()
            fixed = deterministic(data, self.call.mode)
            if fixed != data:
                _write_atomic(output, fixed)
            if self.expected is not None:
                same = hashlib.sha256(fixed).hexdigest() == self.expected.object_sha256
                self.check = CHECK_SAME if same else CHECK_DIFFERS
                return None
            if depfile is None or self.out is None:
                return None
            text = Path(self.cwd, depfile).read_text(errors="surrogateescape")
            return store(
                self.out,
                self.direct_key,
                call=self.call,
                depfile_text=text,
                roots=self.roots,
                cwd=self.cwd,
                started_ns=self.started_ns,
            )
        except (OSError, ValueError):
            return None
        finally:
            if self.own_depfile:
                with contextlib.suppress(OSError):
                    os.unlink(self.own_depfile)


def attempt(
    parsed: nvcccall.NvccCall,
    compiler: str,
    *,
    environ: Mapping[str, str] = os.environ,
    cwd: str | None = None,
) -> Attempt | str:
    """The cache's view of a call: an Attempt, or why the cache does not take it ("off" when there is no
    cache). parsed: the call, nvcc's or the host compiler's; compiler: the real compiler's path."""
    root = cache_root(environ)
    if root is None:
        return "off"
    cwd = cwd or os.getcwd()
    own = os.path.join(tempfile.gettempdir(), f"factory-dep-{os.getpid()}-{os.urandom(4).hex()}.d")
    call = parse_call(parsed, own)
    if isinstance(call, str):
        return call
    roots = job_roots(call.include_dirs, cwd, environ)
    host = (
        ",".join(tool_identity(c, environ) for c in host_compilers(call.host_compiler, environ))
        if call.mode == nvcccall.NVCC
        else None
    )
    dk = direct_key(
        call, compiler=tool_identity(compiler, environ), host=host, roots=roots, cwd=cwd, environ=environ
    )
    if dk is None:
        return f"cannot read {call.source}"
    return Attempt(
        root=root,
        out=cache_out(environ),
        call=call,
        direct_key=dk,
        roots=roots,
        cwd=cwd,
        own_depfile=own if call.depfile is None else None,
    )
