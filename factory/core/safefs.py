"""Reading and writing trees that a build container could have written, without following its links.

A build container runs someone else's code as a user that can write its outbox, its output directory and its
job directory. Anything it leaves there may be a symlink to a host file (`/proc/self/environ`, a credentials
file), a symlink to a host directory (so that a write "into" the tree lands elsewhere), a FIFO that blocks a
reader forever, or a device that never ends. Every function here walks from a directory the host made and
trusts nothing below it: each level is opened with O_NOFOLLOW relative to its parent's descriptor, a link is
never followed, only regular files are read, and every read is bounded.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

# a writer's temporaries are named as the compile cache's own, so its prune removes those of dead writers
from factory.container.compilecache import TEMP_PREFIX

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO for reading must not wait for a writer (it is refused by its type right after)
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
CHUNK = 1 << 20
# a tree deeper or larger than this is not one the factory made: stop walking rather than run away
MAX_DEPTH = 16
MAX_ENTRIES = 1_000_000


class UnsafePath(OSError):
    """A path that is a link, not a regular file, too large, or leaves its root."""


@dataclass(frozen=True, kw_only=True)
class Found:
    """A regular file of a walked tree: its path relative to the root, and what lstat said of it."""

    relative: PurePosixPath
    size: int
    mtime: float
    inode: int


def _parts(relative: str | PurePosixPath) -> tuple[str, ...]:
    parts = PurePosixPath(relative).parts
    if not parts or any(p in ("", ".", "..", "/") or "/" in p or "\0" in p for p in parts):
        raise UnsafePath(f"{relative}: not a plain relative path")
    return parts


def _parent(parts: tuple[str, ...]) -> PurePosixPath | str:
    return PurePosixPath(*parts[:-1]) if len(parts) > 1 else ""


@contextlib.contextmanager
def open_dir(root: Path, relative: str | PurePosixPath = "", *, create: bool = False) -> Iterator[int]:
    """A descriptor of `root/relative`, each level below `root` opened without following links (and made,
    mode 0755, when `create`). `root` itself is the caller's: a directory the host made."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in _parts(relative) if str(relative) not in ("", ".") else ():
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o755, dir_fd=fd)
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (40, 20):  # ELOOP: a link; ENOTDIR: a file where a directory should be
                    raise UnsafePath(f"{root}/{relative}: {part} is not a directory") from None
                raise
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_regular(root: Path, relative: str | PurePosixPath, *, max_bytes: int | None = None) -> Iterator[int]:
    """A read descriptor of the regular file `root/relative`, no link followed on the way or at the end;
    UnsafePath for a link, a FIFO, a device, a directory or a file over `max_bytes`."""
    parts = _parts(relative)
    with open_dir(root, _parent(parts)) as parent:
        try:
            fd = os.open(parts[-1], _FILE_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno == 40:  # ELOOP
                raise UnsafePath(f"{root}/{relative}: a symbolic link") from None
            raise
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise UnsafePath(f"{root}/{relative}: not a regular file")
            if max_bytes is not None and st.st_size > max_bytes:
                raise UnsafePath(f"{root}/{relative}: {st.st_size} bytes, over {max_bytes}")
            os.set_blocking(fd, True)
            yield fd
        finally:
            os.close(fd)


def read_bytes(root: Path, relative: str | PurePosixPath, *, max_bytes: int) -> bytes:
    """The content of a regular file under `root`, at most `max_bytes` (more: UnsafePath; a file that grows
    while it is read is cut off there and refused the same way)."""
    with open_regular(root, relative, max_bytes=max_bytes) as fd:
        data = bytearray()
        while chunk := os.read(fd, CHUNK):
            data += chunk
            if len(data) > max_bytes:
                raise UnsafePath(f"{root}/{relative}: over {max_bytes} bytes")
        return bytes(data)


def copy_out(
    root: Path,
    relative: str | PurePosixPath,
    dest_root: Path,
    dest: str | PurePosixPath,
    *,
    max_bytes: int,
    expect_sha256: str | None = None,
) -> str:
    """Copy a regular file under `root` (a tree a container wrote) to `dest_root/dest` (the host's), whole or
    not at all; the sha256 of exactly the bytes copied. With `expect_sha256`, bytes of another hash are not
    kept (UnsafePath)."""
    with open_regular(root, relative, max_bytes=max_bytes) as src:
        return write_stream(
            dest_root, dest, iter(lambda: os.read(src, CHUNK), b""), max_bytes=max_bytes,
            expect_sha256=expect_sha256,
        )  # fmt: skip


def write_stream(
    root: Path,
    relative: str | PurePosixPath,
    chunks: Iterable[bytes],
    *,
    max_bytes: int,
    expect_sha256: str | None = None,
    expect_size: int | None = None,
    mode: int = 0o644,
) -> str:
    """Write `chunks` to `root/relative` whole or not at all: its directories made level by level without
    following a link, the content written aside, checked (size bound, expected hash and size) and renamed
    into place. The sha256 of the content; UnsafePath when a check fails (nothing is left behind)."""
    parts = _parts(relative)
    with open_dir(root, _parent(parts), create=True) as parent:
        tmp = f"{TEMP_PREFIX}{parts[-1]}.{os.getpid()}.{os.urandom(4).hex()}"
        fd = os.open(tmp, _NEW_FLAGS, mode, dir_fd=parent)
        try:
            digest = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as fh:
                for chunk in chunks:
                    size += len(chunk)
                    if size > max_bytes:
                        raise UnsafePath(f"{relative}: over {max_bytes} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
            if expect_sha256 is not None and digest.hexdigest() != expect_sha256:
                raise UnsafePath(f"{relative}: content does not match its sha256")
            if expect_size is not None and size != expect_size:
                raise UnsafePath(f"{relative}: {size} bytes, not {expect_size}")
            os.chmod(tmp, mode, dir_fd=parent)
            os.replace(tmp, parts[-1], src_dir_fd=parent, dst_dir_fd=parent)
            return digest.hexdigest()
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=parent)


def walk(root: Path, *, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Iterator[Found]:
    """The regular files under `root` (sorted per directory), by lstat: links, FIFOs, sockets and devices
    are passed over, a linked directory is never entered. Nothing when `root` is not a directory."""
    seen = 0

    def visit(fd: int, prefix: PurePosixPath, depth: int) -> Iterator[Found]:
        nonlocal seen
        try:
            names = sorted(os.listdir(fd))
        except OSError:
            return
        for name in names:
            seen += 1
            if seen > max_entries:
                return
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                yield Found(relative=prefix / name, size=st.st_size, mtime=st.st_mtime, inode=st.st_ino)
            elif stat.S_ISDIR(st.st_mode) and depth < max_depth:
                try:
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except OSError:  # replaced by a link between the lstat and the open
                    continue
                try:
                    yield from visit(child, prefix / name, depth + 1)
                finally:
                    os.close(child)

    try:
        top = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        yield from visit(top, PurePosixPath(), 0)
    finally:
        os.close(top)


def unlink(root: Path, relative: str | PurePosixPath) -> None:
    """Remove one entry under `root` (a file or a link, never what a link points to); gone already is fine."""
    parts = _parts(relative)
    gone = (FileNotFoundError, UnsafePath, NotADirectoryError)
    with contextlib.suppress(*gone), open_dir(root, _parent(parts)) as fd:
        os.unlink(parts[-1], dir_fd=fd)


def touch(root: Path, relative: str | PurePosixPath) -> None:
    """Mark a regular file under `root` used now (its mtime), without following a link."""
    with contextlib.suppress(OSError), open_regular(root, relative) as fd:
        os.utime(fd)


def write_bytes(root: Path, relative: str | PurePosixPath, data: bytes, *, mode: int = 0o644) -> str:
    """`write_stream` of one block of bytes."""
    return write_stream(root, relative, [data], max_bytes=len(data), mode=mode)


def exists(root: Path, relative: str | PurePosixPath) -> bool:
    """Whether `root/relative` is a regular file, no link followed."""
    try:
        with open_regular(root, relative):
            return True
    except OSError:
        return False
