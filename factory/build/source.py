"""Fetching a package's source on the host and applying the recipe's patches.

The build container mounts the result read-only; fetching on the host means the host's index configuration,
mirrors and CA certificates apply, and the container's network can stay off.

An sdist is looked up the way pip would find it, through the host's pip configuration (index-url,
extra-index-url, find-links, cert, client-cert, proxy, trusted-host, timeout, from every pip.conf and the
PIP_* variables), but without running pip's resolver: `pip download` of an sdist runs its setup.py to read
metadata, which fails for packages whose setup.py imports torch. The project's simple page (PEP 691 JSON
when offered, else PEP 503 HTML) names the files; the sdist of the exact version is downloaded and its
sha256 checked against the matrix file's pin or the one the index gives: one of them is required.

An index is not trusted to be small, quick or well-formed: pages, downloads and unpacked trees are bounded
(factory.spec.options.FetchLimits), each request has a wall-clock deadline, a page over http(s) may link only
to http(s) files, and whatever is refused is one line.
"""

from __future__ import annotations

import dataclasses
import filecmp
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import tarfile
import tempfile
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from http.client import HTTPException
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from factory.core import bounded, leftovers, reproducible
from factory.core.errors import BuildError, ConfigError, PatchError
from factory.core.home import factory_home
from factory.core.units import format_size
from factory.core.urls import urls_without_credentials, without_credentials
from factory.core.validate import GIT_TRANSPORTS, git_transport, git_url_problem, shown_name
from factory.plan.pipindex import (
    CHUNK,
    IndexClient,
    IndexFile,
    PipSettings,
    _copy_local,
    _NotFound,
    _reason,
    _TooLarge,
    _TooSlow,
    read_pip_settings,
)
from factory.spec.options import FetchLimits, PackageSpec, Recipe

if TYPE_CHECKING:
    from factory.spec.config import MatrixFile

IGNORED = shutil.ignore_patterns(".git", "build", "dist", "*.egg-info", "__pycache__", ".venv")
SHOWN_VERSIONS = 12  # the newest versions named when the asked one is missing
# A recipe's patch: flash-attn's are a few KiB; one of this size is not a patch anyone reviewed.
MAX_PATCH_BYTES = 64 << 20


@dataclass(frozen=True, kw_only=True)
class PreparedSource:
    """The patched tree a build mounts, and for `source: pypi` the sdist it came from (for the report)."""

    tree: Path
    sdist: str | None = None  # the sdist's filename
    sha256: str | None = None  # of the sdist, checked against the matrix file's pin or the index's hash
    # whose code this is: the sdist's sha256, the git URL or the directory, and the patches (the compile
    # cache's trust domain: `cache.trust_domain`)
    code_id: str = ""
    # the source's date (`reproducible.source_date_epoch`): SOURCE_DATE_EPOCH of its builds
    source_date_epoch: int = reproducible.DEFAULT_EPOCH


def _versions_shown(versions: Iterable[Version]) -> str:
    ordered = [str(v) for v in sorted(set(versions))]
    if len(ordered) > SHOWN_VERSIONS:
        return "…, " + ", ".join(ordered[-SHOWN_VERSIONS:])
    return ", ".join(ordered)


def find_sdist(
    name: str,
    version: str,
    pip: PipSettings,
    http: IndexClient | None = None,
    *,
    limits: FetchLimits | None = None,
    matrix_file: str | None = None,
) -> IndexFile:
    """The sdist of exactly `name` `version` on the configured indexes and find-links, in pip's order.

    A project, version or sdist that every index read says it lacks is a ConfigError naming `matrix_file`:
    the file asks for something that does not exist. With an index that could not be read, it may be there:
    a BuildError."""
    http = http or IndexClient(pip)
    limits = limits or FetchLimits()
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise BuildError(f"{name} {version}: not a PEP 440 version") from None
    project = canonicalize_name(name)
    locations = [(http.bare(i).rstrip("/") + f"/{project}/", i.rstrip("/") + "/") for i in pip.indexes]
    locations += [(http.bare(link), link) for link in pip.find_links]
    asked: list[str] = []
    unreadable: list[str] = []
    versions: set[Version] = set()
    sdists: list[IndexFile] = []
    for url, location in locations:
        shown = without_credentials(location)
        asked.append(shown)
        try:
            files = http.page(url, limits)
        except _NotFound:
            continue
        except (OSError, ValueError, HTTPException) as exc:  # URLError is an OSError
            unreadable.append(f"{shown}: {_reason(exc)}")
            continue
        for filename, file_url, digest in files:
            try:
                if filename.endswith(".whl"):
                    dist, found = parse_wheel_filename(filename)[:2]
                    is_sdist = False
                else:
                    dist, found = parse_sdist_filename(filename)
                    is_sdist = True
            except (InvalidWheelFilename, InvalidSdistFilename):
                continue
            if dist != project:
                continue
            versions.add(found)
            if found == wanted and is_sdist:
                sdists.append(
                    IndexFile(filename=filename, url=http.bare(file_url), digest=digest, where=shown)
                )
    if sdists:
        # a .tar.gz is what `python -m build --sdist` makes; a .zip only where nothing else is offered
        return next((f for f in sdists if f.filename.endswith(".tar.gz")), sdists[0])
    where = ", ".join(asked) if asked else "no index (pip's no-index is set and find-links is empty)"
    what = f"{shown_name(name)} {shown_name(version)}"
    if wanted in versions:
        message = f"{what} has no sdist on {where} (only wheels)"
    elif versions:
        message = f"{what}: no such version on {where} (versions: {_versions_shown(versions)})"
    else:
        message = f"{what}: no such project on {where}"
    if unreadable:
        raise BuildError(f"{message}; could not read {'; '.join(unreadable)}")
    raise ConfigError(message, file=matrix_file or None)


def _file_digests(path: Path, algo: str) -> tuple[str, str]:
    """The file's `algo` and sha256 hex digests, in one read."""
    hashers = {name: hashlib.new(name) for name in (algo, "sha256")}
    with path.open("rb") as fh:
        while block := fh.read(CHUNK):
            for h in hashers.values():
                h.update(block)
    return hashers[algo].hexdigest(), hashers["sha256"].hexdigest()


def expected_sha256(
    found: IndexFile, pin: str | None, *, name: str, version: str, matrix_file: str | None = None
) -> str:
    """The sha256 the download must have: the matrix file's pin (an index that gives another is refused before
    anything is fetched), else the index's. With neither, nothing would check the bytes: a ConfigError saying
    how to pin them."""
    given = found.digest[1] if found.digest and found.digest[0] == "sha256" else None
    if pin is not None and given is not None and pin != given:
        raise BuildError(
            f"{name} {version}: {found.where} gives sha256 {given} for {found.filename}, "
            f"the matrix file pins {pin}"
        )
    if pin is not None:
        return pin
    if given is not None:
        return given
    raise ConfigError(
        f"{name} {version}: {found.where} gives no sha256 for {found.filename}; "
        "pin it in the matrix file: package: {sha256: <hex>}",
        file=matrix_file or None,
    )


def fetch_sdist(
    found: IndexFile,
    dest: Path,
    http: IndexClient,
    *,
    sha256: str,
    pinned: bool = False,
    limits: FetchLimits | None = None,
) -> tuple[Path, str]:
    """`found` in `dest`, its sha256 `sha256` (a cached copy that has it is reused); the path and sha256.

    A digest of another algorithm the index gives is checked too. `pinned`: `sha256` is the matrix file's."""
    limits = limits or FetchLimits()
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / found.filename
    algo = found.digest[0] if found.digest else "sha256"
    if target.is_file() and _file_digests(target, algo)[1] == sha256:
        return target, sha256
    shown = f"{found.filename} from {found.where}"
    fd, tmp_name = tempfile.mkstemp(dir=dest, prefix=leftovers.partial_prefix())
    tmp = Path(tmp_name)
    try:
        try:
            with os.fdopen(fd, "wb") as out:
                if urlsplit(found.url).scheme == "file":
                    local = Path(urllib.request.url2pathname(urlsplit(found.url).path))
                    _copy_local(local, out, limits.download_bytes)
                else:
                    http.get(
                        found.url, out.write, limit=limits.download_bytes, seconds=limits.download_seconds
                    )
        except _TooLarge:
            raise BuildError(
                f"cannot download {shown}: larger than {format_size(limits.download_bytes)}; "
                "if the sdist really is, raise package.max_download in the matrix file"
            ) from None
        except _TooSlow:
            raise BuildError(
                f"cannot download {shown}: not done within {limits.download_seconds:g} s; "
                "for a slow index raise package.download_deadline in the matrix file"
            ) from None
        except (OSError, ValueError, HTTPException) as exc:  # URLError is an OSError
            raise BuildError(f"cannot download {shown}: {_reason(exc)}") from None
        got, got_sha256 = _file_digests(tmp, algo)
        if got_sha256 != sha256:
            says = "the matrix file pins" if pinned else "the index says"
            raise BuildError(f"{shown}: sha256 of the download is {got_sha256}, {says} {sha256}")
        if found.digest is not None and got != found.digest[1]:
            raise BuildError(f"{shown}: {algo} of the download is {got}, the index says {found.digest[1]}")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target, sha256


# ---------------------------------------------------------------------------------------------- trees


def _digest(*parts: object) -> str:
    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def _single_top_dir(root: Path) -> Path:
    entries = [p for p in root.iterdir()]
    return entries[0] if len(entries) == 1 and entries[0].is_dir() else root


def prepare_matrix_source(mf: MatrixFile, home: Path | None = None) -> PreparedSource:
    """The matrix file's package source as its build gets it (fetched, the recipe's patches applied; cached
    under `home`, default $FACTORY_HOME)."""
    return prepare_package(mf.package, mf.recipe, home or factory_home(), matrix_file=mf.display)


def remove_stale_partials(cache: Path) -> list[Path]:
    """Remove the downloads and trees in `cache` that runs now gone left half-made; the removed ones."""
    return [p for sub in ("sdists", "sources") for p in leftovers.remove_stale_partials(cache / sub)]


_SPECIAL = (
    (stat.S_ISFIFO, "named pipe"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "device"),
    (stat.S_ISBLK, "device"),
)


def check_source_tree(tree: Path, cache: Path) -> None:
    """A tree `source: {path}` can copy, else a ConfigError: the factory's home not inside it (the copy would
    copy itself until its path is too long), and only files, directories and symlinks where the copy goes
    (copying a named pipe waits for a writer; a socket cannot be copied)."""
    if cache.resolve().is_relative_to(tree.resolve()):
        raise ConfigError(
            f"FACTORY_HOME {cache} is inside the source tree {tree}; set FACTORY_HOME to a directory outside"
        )
    for top, dirs, files in os.walk(tree):
        ignored = IGNORED(top, [*dirs, *files])
        dirs[:] = [d for d in dirs if d not in ignored]
        for name in files:
            if name in ignored:
                continue
            entry = Path(top, name)
            mode = entry.lstat().st_mode
            for test, what in _SPECIAL:
                if test(mode):
                    raise ConfigError(
                        f"source tree {tree}: {entry.relative_to(tree)} is a {what}; a source tree may hold "
                        "only files, directories and symlinks"
                    )


def _unpack(archive: Path, dest: Path, limits: FetchLimits) -> Path:
    """`archive` (a .tar.gz or .zip sdist) in `dest`, its top directory. Members are counted, with their
    sizes, before each is written: a small archive of a huge tree stops at the limit, not at a full disk.
    A tar member with an absolute path, a path or link out of `dest`, or a device is refused (tarfile's data
    filter); zipfile makes neither links nor paths out of `dest`."""
    members = size = 0

    def count(nbytes: int) -> None:
        nonlocal members, size
        members += 1
        size += nbytes
        if members > limits.members:
            raise BuildError(f"{archive.name} has more than {limits.members} files, directories and links")
        if size > limits.unpacked_bytes:
            raise BuildError(
                f"{archive.name} unpacks to more than {format_size(limits.unpacked_bytes)}; if the sdist "
                "really does, raise package.max_unpacked in the matrix file"
            )

    if archive.suffix == ".zip":
        with bounded.open_zip(archive, max_entries=limits.members) as zf:
            infos = zf.infolist()
            for info in infos:
                count(info.file_size)  # zipfile writes no more than the size an entry declares
            zf.extractall(dest, members=infos)
    else:

        def admit(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo:
            checked = tarfile.data_filter(member, path)
            count(checked.size if checked.isreg() else 0)
            return checked

        # no mode guessing: an sdist named .tar.gz is gzip, and a file that is not is one line, not five
        with tarfile.open(archive, "r:gz") as tf:
            tf.extractall(dest, filter=admit)
    return _single_top_dir(dest)


_FAILED_HUNK = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")
_CHECKING = re.compile(r"^(?:checking|patching) file (.+)$")
_MISSING_FILE = re.compile(r"can't find file to patch at input line (\d+)")


def _header_name(line: str) -> str | None:
    """The file a `--- ` or `+++ ` line names, as -p1 leaves it; None for /dev/null."""
    name = line[4:].split("\t", 1)[0].strip()
    if name == "/dev/null":
        return None
    return name.split("/", 1)[-1] if "/" in name else name


def _hunk_headers(patch: Path) -> dict[tuple[str, int], str]:
    """(file as the patch names it after -p1, hunk number) -> its `@@ ... @@` line, to name a failed hunk."""
    headers: dict[tuple[str, int], str] = {}
    current, number, old = "", 0, ""
    for line in bounded.iter_lines(patch, max_bytes=MAX_PATCH_BYTES):
        if line.startswith("--- "):
            old = _header_name(line) or ""
        elif line.startswith("+++ "):
            current, number = _header_name(line) or old, 0  # a deleted file: its old name
        elif line.startswith("@@ ") and current:
            number += 1
            headers[(current, number)] = line
    return headers


def _file_at(patch: Path, line_number: int) -> str:
    """The file named by the header before `line_number` (the "input line" patch reports a hunk at)."""
    found = "?"
    for number, line in enumerate(bounded.iter_lines(patch, max_bytes=MAX_PATCH_BYTES), start=1):
        if number > line_number:
            break
        if (line.startswith("+++ ") or line.startswith("--- ")) and (name := _header_name(line)):
            found = name
    return found


def _patch_failure(patch: Path, output: str) -> str:
    """What `patch --dry-run` said went wrong, one line: each failed hunk with its file and `@@` header."""
    headers = _hunk_headers(patch)
    current = "?"
    failed: list[str] = []
    other: list[str] = []
    for line in output.splitlines():
        if match := _CHECKING.fullmatch(line):
            current = match.group(1).strip().strip("'\"")
        elif match := _FAILED_HUNK.match(line):
            number, at = int(match.group(1)), match.group(2)
            header = headers.get((current, number), "")
            failed.append(f"{current} hunk #{number} {header} FAILED at line {at}".replace("  ", " "))
        elif match := _MISSING_FILE.search(line):
            other.append(f"{_file_at(patch, int(match.group(1)))}: no such file to patch")
        elif "Reversed (or previously applied)" in line:
            other.append(f"{current}: {line.strip().rstrip('.!')}")
    details = failed + other
    if not details:
        lines = [line for line in output.splitlines() if line.strip()]
        details = lines[-1:] or ["no output"]
    return "; ".join(details)


def patch_sha256(patch: Path) -> str:
    """The sha256 of a patch file, streamed: a regular file (a FIFO is refused, never waited on) of at most
    MAX_PATCH_BYTES; ConfigError naming the patch otherwise."""
    digest = hashlib.sha256()
    try:
        with bounded.open_file(patch, max_bytes=MAX_PATCH_BYTES) as fh:
            size = 0
            while block := fh.read(CHUNK):
                size += len(block)
                if size > MAX_PATCH_BYTES:  # it grew while it was read
                    raise bounded.Refused(f"{patch}: over {format_size(MAX_PATCH_BYTES)}")
                digest.update(block)
    except bounded.Refused as exc:
        raise ConfigError(f"patch {exc}") from None
    except OSError as exc:
        raise ConfigError(f"patch {patch}: cannot read ({exc.strerror or exc})") from None
    return digest.hexdigest()


def apply_patches(tree: Path, patches: Sequence[Path]) -> None:
    """Apply each patch with -p1 in order, each tried with --dry-run first: a patch that does not apply is a
    ConfigError naming the patch and its failed hunks, and leaves no .rej or half-patched file behind.

    No fuzz: a hunk whose context changed upstream fails rather than landing wherever two lines still match
    (an offset, the same lines moved, is fine)."""
    for patch in patches:
        base = ["patch", "-p1", "--forward", "--batch", "--fuzz=0", "--reject-file=-", "-i", str(patch)]
        for step in ([*base, "--dry-run"], base):
            proc = subprocess.run(step, cwd=tree, capture_output=True, text=True)
            if proc.returncode != 0:
                raise PatchError(
                    f"patch {patch} does not apply: {_patch_failure(patch, proc.stdout + proc.stderr)}"
                )


def git_env(url: str) -> dict[str, str]:
    """The environment git clones `url` in: its transport checked first (`validate.git_url_problem`: a
    ConfigError, exit 2, before git runs), then GIT_ALLOW_PROTOCOL to the remote transports, and `file`
    only when `url` is itself local, so that no submodule the repository names runs a remote helper
    (`ext::`) or reads this host's repositories."""
    problem = git_url_problem(url)
    if problem is not None:
        raise ConfigError(f"git source {problem}")
    allowed = [t for t in GIT_TRANSPORTS if t != "file" or git_transport(url) == "file"]
    return {**os.environ, "GIT_ALLOW_PROTOCOL": ":".join(allowed)}


def prepare_source(
    *,
    kind: str,
    name: str,
    version: str,
    cache: Path,
    url: str | None = None,
    ref: str | None = None,
    path: Path | None = None,
    patches: Sequence[Path] = (),
    pip: PipSettings | None = None,
    sha256: str | None = None,
    limits: FetchLimits | None = None,
    matrix_file: str | None = None,
) -> PreparedSource:
    """The patched source tree, made once per (source, patches) and reused.

    For `source: pypi` the index is asked on every call (`pip` defaults to the host's pip configuration):
    the sdist's sha256 (`sha256`, the matrix file's pin, else the index's) names the tree, so a cached tree is
    never one of other bytes, and the cached sdist is checked against it again. `matrix_file` is named in
    errors that the matrix file can fix.

    What a killed run left half-made in `cache` is removed first (`remove_stale_partials`).
    """
    limits = limits or FetchLimits()
    env = git_env(url or "") if kind == "git" else None  # a transport the factory refuses, before anything
    remove_stale_partials(cache)
    patch_hashes = [patch_sha256(p) for p in patches]
    archive: Path | None = None
    sdist: tuple[str, str] | None = None
    if kind == "path":
        assert path is not None
        if not path.is_dir():
            raise BuildError(f"source directory {path} does not exist")
        check_source_tree(path, cache)
        # Local trees change between runs: key on content so an edit is never built from a stale copy.
        stamp = [
            (str(p.relative_to(path)), p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*"))
            if p.is_file() and ".git" not in p.parts
        ]
        key = _digest(kind, path, stamp, patch_hashes)
        code_id = _digest(kind, os.path.realpath(path), patch_hashes)
    elif kind == "git":
        key = _digest(kind, name, version, url, ref, patch_hashes)
        code_id = _digest(kind, url, patch_hashes)
    else:
        settings = pip or read_pip_settings()
        http = IndexClient(settings)
        found = find_sdist(name, version, settings, http, limits=limits, matrix_file=matrix_file)
        expected = expected_sha256(found, sha256, name=name, version=version, matrix_file=matrix_file)
        archive, digest = fetch_sdist(
            found, cache / "sdists", http, sha256=expected, pinned=sha256 is not None, limits=limits
        )
        sdist = (found.filename, digest)
        key = _digest(kind, digest, patch_hashes)
        code_id = key
    result = PreparedSource(
        tree=cache / "sources" / key / "tree",
        sdist=sdist[0] if sdist else None,
        sha256=sdist[1] if sdist else None,
        code_id=code_id,
        source_date_epoch=reproducible.source_date_epoch(kind, archive=archive),
    )
    final = result.tree.parent
    if final.is_dir():
        return _dated(result, kind)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=final.parent, prefix=leftovers.partial_prefix()))
    try:
        tree = tmp / "tree"
        if kind == "path":
            assert path is not None
            shutil.copytree(path, tree, ignore=IGNORED, symlinks=True)
        elif kind == "git":
            assert url is not None
            # a URL or ref that starts with "-" is never taken for one of git's options
            if ref is not None and ref.startswith("-"):
                raise BuildError(f"git ref {ref!r} is not a tag, branch or commit")
            cmd = ["git", "clone", "--recursive", "--quiet", "--", url, str(tree)]
            for step in (
                cmd,
                ["git", "-C", str(tree), "checkout", "--quiet", ref or "HEAD"],
                ["git", "-C", str(tree), "submodule", "update", "--init", "--recursive", "--quiet"],
            ):
                proc = subprocess.run(step, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    # git repeats the URL, token and all, in its own messages
                    said = urls_without_credentials(" ".join(proc.stderr.strip().splitlines()[-1:]))
                    raise BuildError(f"git failed for {without_credentials(url)}@{ref}: {said}")
        else:
            assert archive is not None
            try:
                unpacked = _unpack(archive, tmp / "unpacked", limits)
            except (OSError, EOFError, zlib.error, tarfile.TarError, zipfile.BadZipFile) as exc:
                raise BuildError(f"cannot unpack {archive.name}: {_reason(exc)}") from None
            unpacked.rename(tree)
        apply_patches(tree, patches)
        # Read-only mounts must still be readable by the container's unprivileged user.
        subprocess.run(["chmod", "-R", "a+rX", str(tree)], check=True)
        tmp.chmod(0o755)
        tmp.rename(final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return _dated(result, kind)


def _dated(prepared: PreparedSource, kind: str) -> PreparedSource:
    """A git checkout's date is its commit's, read from the tree once it is there."""
    if kind != "git":
        return prepared
    epoch = reproducible.source_date_epoch(kind, tree=prepared.tree)
    return dataclasses.replace(prepared, source_date_epoch=epoch)


def prepare_package(
    package: PackageSpec, recipe: Recipe, cache: Path, *, matrix_file: str | None = None
) -> PreparedSource:
    """The source a build of `package` mounts: fetched as its `source:` says, the recipe's patches applied.
    `matrix_file`, where `package` was read, is named in the errors it can fix."""
    src = package.source
    return prepare_source(
        kind=src.kind,
        name=package.name,
        version=package.version,
        cache=cache,
        url=src.url,
        ref=src.ref,
        path=src.path,
        patches=recipe.patches,
        sha256=package.sha256,
        limits=package.limits,
        matrix_file=matrix_file,
    )


# ---------------------------------------------------------------------------------------------- editing


def unpack_for_editing(tree: Path, dest: Path) -> None:
    """A writable copy of a prepared tree in `dest` (which must not exist, or be empty), to edit."""
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{dest} already exists and is not an empty directory")
    shutil.copytree(tree, dest, symlinks=True, dirs_exist_ok=True)
    for path in [dest, *dest.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | 0o200)


def _files(root: Path) -> set[str]:
    """The files under `root` that a build reads, relative, without build outputs and VCS state."""
    out: set[str] = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(IGNORED(str(root), [part]) for part in rel.parts):
            continue
        if path.is_file() or path.is_symlink():
            out.add(rel.as_posix())
    return out


def diff_trees(base: Path, edited: Path) -> str:
    """A unified diff (a/ and b/ prefixes, for patch -p1) that turns `base` into `edited`: changed, added and
    removed text files. A changed binary file cannot be a patch: ConfigError naming it."""
    chunks: list[str] = []
    for rel in sorted(_files(base) | _files(edited)):
        old, new = base / rel, edited / rel
        if old.is_file() and new.is_file() and filecmp.cmp(old, new, shallow=False):
            continue
        if (old.is_file() and not new.exists() and old.stat().st_size == 0) or (
            new.is_file() and not old.exists() and new.stat().st_size == 0
        ):
            raise ConfigError(f"{edited / rel}: an empty file cannot be added or removed by a patch")
        # /dev/null names a created or deleted file, so patch creates or removes it rather than emptying it
        labels = (f"a/{rel}" if old.exists() else "/dev/null", f"b/{rel}" if new.exists() else "/dev/null")
        proc = subprocess.run(
            ["diff", "-uN", "--label", labels[0], "--label", labels[1], str(old), str(new)],
            capture_output=True,
        )
        if proc.returncode == 0:
            continue
        text = proc.stdout.decode("utf-8", "surrogateescape")
        if proc.returncode != 1 or text.startswith("Binary files"):
            raise ConfigError(f"{edited / rel}: a binary file differs; a patch can only carry text")
        chunks.append(text)
    return "".join(chunks)
