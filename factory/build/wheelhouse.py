"""Host-side wheelhouses: `pip download` for a target Python/platform, cached by the hash of its inputs.

Downloads run on the host with the host's pip configuration, so its mirrors, proxies and CA certificates
apply; build containers then install from the wheelhouse with their network off.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from factory.core import platforms
from factory.core.errors import ConfigError, FactoryError
from factory.core.home import factory_home
from factory.core.units import format_size
from factory.core.validate import requirement_problem

DEFAULT_PLATFORM = platforms.DEFAULT_PLATFORM.wheelhouse_tag

# Bumped when the layout or the pip invocation changes, so old cache entries are not reused.
_CACHE_FORMAT = 1

# manylinux tags below 2_5 do not exist; the legacy aliases name the same glibc levels as PEP 600 tags.
_OLDEST_GLIBC_MINOR = 5
_LEGACY_ALIASES = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}

# Beside the wheelhouses in their cache root: one hard link per distinct wheel, named by its sha256. The CUDA
# wheels torch pulls in (GBs) are the same files for every Python, so a matrix's wheelhouses share them.
POOL = ".pool"


def compatible_platforms(platform: str) -> tuple[str, ...]:
    """Every platform tag a wheel may carry and still run on `platform`, newest first.

    pip treats each `--platform` as an exact tag, so a `manylinux_2_28` target has to list the older
    manylinux levels (and their legacy aliases) explicitly or it misses wheels tagged only
    `manylinux2014`/`manylinux_2_17`.
    """
    prefix = "manylinux_"
    legacy = {alias: minor for minor, alias in _LEGACY_ALIASES.items()}
    for alias, alias_minor in legacy.items():
        if platform.startswith(alias + "_"):
            platform = f"manylinux_2_{alias_minor}_{platform[len(alias) + 1 :]}"
            break
    if not platform.startswith(prefix):
        return (platform,)
    try:
        major, minor, arch = platform[len(prefix) :].split("_", 2)
        glibc_major, glibc_minor = int(major), int(minor)
    except ValueError:
        raise ConfigError(f"invalid manylinux platform tag {platform!r}") from None
    if glibc_major != 2 or not arch:
        raise ConfigError(f"unsupported manylinux platform tag {platform!r}")
    tags: list[str] = []
    for m in range(glibc_minor, _OLDEST_GLIBC_MINOR - 1, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        if m in _LEGACY_ALIASES:
            tags.append(f"{_LEGACY_ALIASES[m]}_{arch}")
    return tuple(tags)


def pip_download_args(
    requirements: Sequence[str],
    dest: Path,
    *,
    python: str,
    platform: str = DEFAULT_PLATFORM,
    index_url: str | None = None,
    extra_index_urls: Iterable[str] = (),
    only_binary: bool = True,
) -> list[str]:
    """The `pip download` command line (without the interpreter) for these inputs."""
    for requirement in requirements:
        problem = requirement_problem(requirement)
        if problem is not None:
            raise ConfigError(f"requirement {requirement!r} {problem}")
    args = ["-m", "pip", "download", "--dest", str(dest), "--progress-bar", "off"]
    if only_binary:
        args += ["--only-binary=:all:", "--python-version", python]
        for tag in compatible_platforms(platform):
            args += ["--platform", tag]
    # Without --only-binary pip refuses target constraints, so such a download is for the host interpreter.
    if index_url is not None:
        args += ["--index-url", index_url]
    for url in extra_index_urls:
        args += ["--extra-index-url", url]
    args += list(requirements)
    return args


def wheelhouse_key(
    requirements: Sequence[str],
    *,
    python: str,
    platform: str = DEFAULT_PLATFORM,
    index_url: str | None = None,
    extra_index_urls: Iterable[str] = (),
    only_binary: bool = True,
    wheels: Mapping[str, str] | None = None,
    find_links: Sequence[str] = (),
) -> str:
    """A stable hash of the inputs of a download; requirement order does not matter. `wheels` (name ->
    sha256) and `find_links` (wheelhouse paths, each named by its own inputs' hash) only where given, so
    the other downloads keep their keys."""
    payload: dict[str, object] = {
        "format": _CACHE_FORMAT,
        "requirements": sorted(r.strip() for r in requirements),
        "python": python,
        "platform": platform,
        "index_url": index_url,
        "extra_index_urls": list(extra_index_urls),
        "only_binary": only_binary,
    }
    if wheels:
        payload["wheels"] = dict(sorted(wheels.items()))
    if find_links:
        payload["find_links"] = list(find_links)
    blob = json.dumps(payload, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


# pip's lines as it downloads (`--progress-bar off`): "Collecting torch==2.14.*", "  Downloading
# torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_<machine>.whl (915.7 MB)", a wheel of --find-links as
# "Processing /path/x.whl", "File was already downloaded /path/x.whl"
_COLLECTING = re.compile(r"^\s*Collecting (\S+)")
_DOWNLOADING = re.compile(r"^\s*Downloading (\S+?\.whl)(?: \((\d+(?:\.\d+)?) ([kMG]?B)\))?\s*$")
_LOCAL = re.compile(r"^\s*(?:Processing|File was already downloaded) (\S+\.whl)\s*$")
_SI = {"B": 1, "kB": 10**3, "MB": 10**6, "GB": 10**9}
MAX_PIP_LINES = 200  # of pip's output kept for its error line
MAX_INPUTS_FILE = 1 << 20  # a wheelhouse's inputs.json, read to tell whether its wheels may seed another
_MISSING = object()


@dataclass
class DownloadProgress:
    """What a `pip download` has done so far, from its output lines: the requirements it has collected
    (each one a wheel to get, the count growing as the resolver finds dependencies), the wheels it has
    downloaded and their size, and the one it is on. Reused wheels (--find-links, already there) count
    as done without a download."""

    collected: int = 0
    downloaded: int = 0
    reused: int = 0
    size: int = 0
    current: str = ""

    def feed(self, line: str) -> bool:
        """Read one line; whether what `describe` says changed."""
        if _COLLECTING.match(line):
            self.collected += 1
            return True
        found = _DOWNLOADING.match(line)
        if found:
            name, amount, unit = found.groups()
            self.downloaded += 1
            if amount is not None:
                self.size += int(float(amount) * _SI[unit])
            self.current = name.rsplit("/", 1)[-1]
            return True
        found = _LOCAL.match(line)
        if found:
            self.reused += 1
            self.current = found.group(1).rsplit("/", 1)[-1]
            return True
        return False

    def describe(self) -> str:
        """ "downloading 3 of 14 wheels so far (2.1 GB): torch-…whl"; M grows while pip resolves."""
        done = self.downloaded + self.reused
        known = max(self.collected, done)
        reused = f", {self.reused} reused" if self.reused else ""
        what = f"downloading {done} of {known} wheels so far ({format_size(self.size)}{reused})"
        return f"{what}: {self.current}" if self.current else what


def last_error_line(output: str) -> str:
    """pip's most telling line: its last `ERROR:` line, else its last non-empty one."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    if errors:
        return errors[-1]
    return lines[-1] if lines else "pip gave no output"


def wheel_files(directory: Path) -> list[Path]:
    """The wheels in a wheelhouse, sorted by name; other files (sdists, partial downloads) are left out."""
    found = []
    for path in sorted(directory.iterdir()):
        if not path.is_file() or path.suffix != ".whl":
            continue
        try:
            parse_wheel_filename(path.name)
        except InvalidWheelFilename:
            continue
        found.append(path)
    return found


def foreign_torch(directory: Path, *, cuda: str) -> str | None:
    """The version of the torch wheel in a wheelhouse when its local label says it is no build for `cuda`'s
    major (`2.13.0+cpu`, `2.9.1+cu126` for CUDA 13), else None. A `+cpu` build sorts above the plain CUDA
    build of the same release, so `torch==2.13.*` from an index that has both takes the CPU one."""
    major = cuda.split(".", 1)[0]
    for path in wheel_files(directory):
        name, version, _build, _tags = parse_wheel_filename(path.name)
        if name != "torch" or version.local is None:
            continue
        label = version.local
        if label == "cpu" or not label.startswith(f"cu{major}"):
            return str(version)
    return None


def without_version(requirement: str, version: str) -> str:
    """`requirement` (a `torch==2.13.*` pin) that also refuses this one exact version."""
    return f"{requirement},!={version}"


def download_wheelhouse(
    requirements: Sequence[str],
    dest: Path | None = None,
    *,
    python: str,
    platform: str = DEFAULT_PLATFORM,
    index_url: str | None = None,
    extra_index_urls: Iterable[str] = (),
    only_binary: bool = True,
    progress: Callable[[str], None] | None = None,
    wheels: Sequence[Path] = (),
    find_links: Sequence[Path] = (),
) -> Path:
    """Download `requirements` (and their dependencies) as wheels for `python` on `platform`; `progress`
    hears what the download is doing (`DownloadProgress.describe`) as pip goes. `wheels`: files pip may take
    (a dependency this run built; the key has their sha256, so one built again is a new wheelhouse);
    `find_links`: wheelhouses pip may take wheels from (named in the key by their path: made once each).

    The wheels land in `<dest>/<hash of the inputs>` (dest: the wheelhouse cache root, by default
    `factory_home()/wheelhouses`), which is returned. That directory is made atomically (a temporary directory
    renamed into place) and reused by later calls with the same inputs, so it holds exactly one download.
    """
    extra = tuple(extra_index_urls)
    if not requirements:
        raise ConfigError("a wheelhouse needs at least one requirement")
    given = {w.name: _sha256(w) for w in wheels}
    links = [str(p.resolve()) for p in find_links]  # one spelling per wheelhouse, whatever links lead to it
    key = wheelhouse_key(
        requirements,
        python=python,
        platform=platform,
        index_url=index_url,
        extra_index_urls=extra,
        only_binary=only_binary,
        wheels=given,
        find_links=links,
    )
    cache_root = dest if dest is not None else factory_home() / "wheelhouses"
    cached = cache_root / key
    if cached.is_dir():
        if cached.stat().st_mode & 0o005 != 0o005:
            cached.chmod(0o755)  # made by an older version with mkdtemp's 0700
        return cached
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=cache_root))
    try:
        args = pip_download_args(
            requirements,
            tmp,
            python=python,
            platform=platform,
            index_url=index_url,
            extra_index_urls=extra,
            only_binary=only_binary,
        )
        inputs: dict[str, object] = {
            "requirements": list(requirements),
            "python": python,
            "platform": platform,
            "index_url": index_url,
            "extra_index_urls": list(extra),
            "only_binary": only_binary,
        }
        if given:
            inputs["wheels"] = given
        if links:
            inputs["find_links"] = links
        with (
            _earlier_downloads(cache_root, exclude=tmp, like=inputs) as seen,
            _linked(cache_root, wheels) as offered,
        ):
            # a wheel another wheelhouse here downloaded (torch, CUDA's GBs) is taken from it: pip
            # prefers a --find-links file to the index's one of the same version
            local = [*([] if offered is None else [offered]), *links, *([] if seen is None else [str(seen)])]
            at = args.index("--dest")
            args[at:at] = [arg for path in local for arg in ("--find-links", str(path))]
            returncode, output = _run_pip(args, progress)
        if returncode != 0:
            raise FactoryError(
                f"pip download for Python {python} ({platform}) failed: {last_error_line(output)}"
            )
        pool_wheels(tmp, cache_root / POOL)
        (tmp / "inputs.json").write_text(json.dumps(inputs, indent=1) + "\n")
        tmp.chmod(0o755)  # mkdtemp's 0700 would hide the wheels from a container's unprivileged user
        try:
            tmp.rename(cached)
        except OSError:
            # Another process finished the same download first; its result is as good as ours.
            if not cached.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return cached


def _run_pip(args: Sequence[str], progress: Callable[[str], None] | None) -> tuple[int, str]:
    """pip's exit code and the end of its output, each line of it read as it comes."""
    seen = DownloadProgress()
    kept: collections.deque[str] = collections.deque(maxlen=MAX_PIP_LINES)
    with subprocess.Popen(
        [sys.executable, *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            kept.append(line)
            if seen.feed(line) and progress is not None:
                progress(seen.describe())
        returncode = proc.wait()
    return returncode, "".join(kept)


@contextlib.contextmanager
def _earlier_downloads(
    cache_root: Path, *, exclude: Path, like: Mapping[str, object]
) -> Iterator[Path | None]:
    """A temporary directory of hard links to the wheels of the wheelhouses already in `cache_root` that
    were downloaded for the same Python, platform and indexes as `like` (so from the same candidates: a
    cu126 job never takes a cu128 torch), by their names, for pip's --find-links; None when there are none.
    A changed requirement list (`extra_build_requires`) is a new wheelhouse, but its torch and CUDA wheels
    are the ones already here."""
    same = ("python", "platform", "index_url", "extra_index_urls", "only_binary")
    names: dict[str, Path] = {}
    for house in sorted(cache_root.iterdir()):
        if house == exclude or house.name.startswith(".") or house.is_symlink() or not house.is_dir():
            continue
        try:
            with (house / "inputs.json").open("rb") as fh:
                made = json.loads(fh.read(MAX_INPUTS_FILE))
        except (OSError, ValueError):
            continue
        if not isinstance(made, dict) or any(made.get(k, _MISSING) != like[k] for k in same):
            continue
        with contextlib.suppress(OSError):  # removed meanwhile (`factory clean`, another download's prune)
            for wheel in wheel_files(house):
                if not wheel.is_symlink():
                    names.setdefault(wheel.name, wheel)
    if not names:
        yield None
        return
    seen = Path(tempfile.mkdtemp(prefix=".seen.", dir=cache_root))
    try:
        for name, wheel in names.items():
            with contextlib.suppress(OSError):  # another filesystem: pip downloads that one
                os.link(wheel, seen / name)
        yield seen
    finally:
        shutil.rmtree(seen, ignore_errors=True)


@contextlib.contextmanager
def _linked(cache_root: Path, wheels: Sequence[Path]) -> Iterator[Path | None]:
    """A temporary directory holding `wheels` (hard links, else copies) for pip's --find-links; None when
    there are none."""
    if not wheels:
        yield None
        return
    held = Path(tempfile.mkdtemp(prefix=".given.", dir=cache_root))
    try:
        for wheel in wheels:
            try:
                os.link(wheel, held / wheel.name)
            except OSError:
                shutil.copyfile(wheel, held / wheel.name)
        yield held
    finally:
        shutil.rmtree(held, ignore_errors=True)


def link_wheels(source: Path, dest: Path) -> Path:
    """Hard-link (or, across filesystems, copy) the wheels of a wheelhouse into `dest`; returns `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    for wheel in wheel_files(source):
        target = dest / wheel.name
        if target.exists():
            continue
        try:
            os.link(wheel, target)
        except OSError:
            shutil.copy2(wheel, target)
    return dest


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _links_in_wheelhouses(root: Path, pool: Path) -> Counter[tuple[int, int]]:
    """How many names each file (device, inode) has in the wheelhouses under `root` (the pool's parent,
    finished or being made): the links this factory makes. A pool file with more names than these and its
    own is linked from somewhere else too, as a host file someone linked into the pool would be."""
    counts: Counter[tuple[int, int]] = Counter()
    with os.scandir(root) as houses:
        for house in houses:
            if house.name == pool.name or not house.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError), os.scandir(house.path) as entries:
                for entry in entries:
                    if entry.name.endswith(".whl") and entry.is_file(follow_symlinks=False):
                        st = entry.stat(follow_symlinks=False)
                        counts[(st.st_dev, st.st_ino)] += 1
    return counts


def _twin_problem(staged: Path, *, sha256: str, size: int, known: Counter[tuple[int, int]]) -> str | None:
    """Why the pool's file, linked as `staged` (a name only this process uses, so what is checked is what is
    then put in place), may not stand for a wheel of this sha256 and size; None when it may."""
    st = staged.lstat()
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file"
    if st.st_size != size:
        return "another size"
    if st.st_nlink > known[(st.st_dev, st.st_ino)] + 2:  # + the pool's name and `staged`
        return "linked from outside the wheelhouses"
    if _sha256(staged) != sha256:
        return "other bytes"
    return None


def _replace_twin(wheel: Path, twin: Path) -> None:
    """Make `wheel` the pool's file for its sha256 in place of a file that may not be (see `_twin_problem`):
    the wheels pooled later share the downloaded bytes, not the planted ones."""
    fresh = twin.with_name(f".{twin.name}.{os.getpid()}")
    try:
        fresh.unlink(missing_ok=True)
        os.link(wheel, fresh)
        os.replace(fresh, twin)
    except OSError:
        fresh.unlink(missing_ok=True)  # (a directory in its place stays; the wheel keeps its own copy)


def pool_wheels(directory: Path, pool: Path) -> int:
    """Make each wheel in `directory` one file with its identical twin in `pool` (a hard link named by the
    wheel's sha256), adding the ones the pool lacks; returns the bytes the twins save. Where hard links do not
    work (another filesystem) the wheels stay as they are.

    A pool file is taken for a wheel only when it is a regular file of the wheel's bytes (hashed, never
    trusted by its name and size) that no name outside the wheelhouses links to (a host file linked into the
    pool would become a wheel every build container reads, and change with it); any other file under the
    wheel's name is replaced by the wheel."""
    pool.mkdir(mode=0o700, exist_ok=True)
    found_pool = pool.lstat()
    if not stat.S_ISDIR(found_pool.st_mode) or found_pool.st_uid != os.geteuid():
        return 0  # a link in its place, or another user's directory: the host links nothing into it
    known = _links_in_wheelhouses(pool.parent, pool)
    saved = 0
    for wheel in wheel_files(directory):
        info = wheel.lstat()
        if not stat.S_ISREG(info.st_mode):
            continue  # the host links only files it downloaded, never a link that came with them
        size = info.st_size
        sha256 = _sha256(wheel)
        twin = pool / sha256
        try:
            os.link(wheel, twin)
            continue  # the first of its kind: the pool now holds it
        except FileExistsError:
            pass
        except OSError:
            return saved
        staged = wheel.with_name(f".{wheel.name}.pool")
        staged.unlink(missing_ok=True)  # left by an interrupted run
        try:
            os.link(twin, staged, follow_symlinks=False)  # a link planted as the twin stays a link
        except FileNotFoundError:
            continue  # pruned by another download just now: this wheelhouse keeps its own copy
        except OSError:
            _replace_twin(wheel, twin)  # a directory, or what cannot be linked
            continue
        problem: str | None
        try:
            found = staged.lstat()
            same = (found.st_dev, found.st_ino) == (info.st_dev, info.st_ino)  # pooled already
            problem = None if same else _twin_problem(staged, sha256=sha256, size=size, known=known)
        except OSError:
            same, problem = False, "unreadable"
        if same or problem is not None:
            staged.unlink(missing_ok=True)
            if problem is not None:
                _replace_twin(wheel, twin)
            continue
        os.replace(staged, wheel)
        known[(found.st_dev, found.st_ino)] += 1
        saved += size
    prune_pool(pool)
    return saved


def prune_pool(pool: Path) -> list[Path]:
    """Drop the pool's files that no wheelhouse links to any more (a wheelhouse removed by hand or by a
    cleanup); returns them."""
    dropped = []
    for entry in sorted(pool.iterdir()):
        info = entry.lstat()
        if stat.S_ISREG(info.st_mode) and info.st_nlink == 1:
            entry.unlink()
            dropped.append(entry)
    return dropped
