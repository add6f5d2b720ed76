"""factory/core/safefs.py: reading and writing trees a build container wrote. A link is never followed (to a
file or to a directory, at any level), only regular files are read, a FIFO never blocks, every read and write
is
bounded, and a failed write leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import stat
from pathlib import Path, PurePosixPath

import pytest

from factory.core import safefs
from factory.core.safefs import UnsafePath

SECRET = b"AWS_SECRET_ACCESS_KEY=do-not-leak\n"
DEEP = PurePosixPath("a/b/c/f")


@pytest.fixture
def trees(tmp_path: Path) -> dict[str, Path]:
    """`root` (the container's tree) and `host` (elsewhere on the host, the same shape, a secret inside)."""
    root, host = tmp_path / "root", tmp_path / "host"
    for base, data in ((root, b"the container's own"), (host, SECRET)):
        (base / DEEP).parent.mkdir(parents=True)
        (base / DEEP).write_bytes(data)
    return {"root": root, "host": host, "tmp": tmp_path}


def link_level(trees: dict[str, Path], level: int) -> None:
    """Replace the path's component at `level` (0: `a`, 3: `f` itself) in root by a link to host's."""
    part = PurePosixPath(*DEEP.parts[: level + 1])
    target, path = trees["host"] / part, trees["root"] / part
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    path.symlink_to(target, target_is_directory=target.is_dir())


def files_under(path: Path) -> dict[str, bytes]:
    return {
        p.relative_to(path).as_posix(): p.read_bytes()
        for p in path.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


LEVELS = list(range(len(DEEP.parts)))


@pytest.mark.parametrize("level", LEVELS)
def test_a_link_at_any_level_is_never_read(trees: dict[str, Path], level: int) -> None:
    link_level(trees, level)
    assert (trees["root"] / DEEP).read_bytes() == SECRET  # what following the link would give
    with pytest.raises(UnsafePath):
        safefs.read_bytes(trees["root"], DEEP, max_bytes=1 << 20)
    with pytest.raises(UnsafePath), safefs.open_regular(trees["root"], DEEP):
        pass
    assert not safefs.exists(trees["root"], DEEP)


@pytest.mark.parametrize("level", LEVELS)
def test_copy_out_never_copies_through_a_link(trees: dict[str, Path], level: int) -> None:
    link_level(trees, level)
    dest = trees["tmp"] / "dest"
    dest.mkdir()
    with pytest.raises(UnsafePath):
        safefs.copy_out(trees["root"], DEEP, dest, "copied", max_bytes=1 << 20)
    assert files_under(dest) == {}


@pytest.mark.parametrize("level", LEVELS[:-1])
def test_a_write_into_a_tree_with_a_linked_directory_writes_nothing_outside(
    trees: dict[str, Path], level: int
) -> None:
    """The destination's directory `a`, `a/b` or `a/b/c` is a link to a host directory: write_stream,
    write_bytes and copy_out into it are refused and the host directory is as it was."""
    link_level(trees, level)
    before = files_under(trees["host"])
    src = trees["tmp"] / "src"
    src.mkdir()
    (src / "new").write_bytes(b"planted")
    target = DEEP.parent / "new"
    with pytest.raises(UnsafePath):
        safefs.write_stream(trees["root"], target, [b"planted"], max_bytes=100)
    with pytest.raises(UnsafePath):
        safefs.write_bytes(trees["root"], target, b"planted")
    with pytest.raises(UnsafePath):
        safefs.copy_out(src, "new", trees["root"], target, max_bytes=100)
    with pytest.raises(UnsafePath):  # over an existing file too: the host's secret is not replaced
        safefs.write_bytes(trees["root"], DEEP, b"replaced")
    assert files_under(trees["host"]) == before
    assert sorted(p.name for p in trees["host"].rglob("*")) == sorted(DEEP.parts)  # no temporaries either


def test_a_link_as_the_file_to_write_is_replaced_not_followed(trees: dict[str, Path]) -> None:
    link_level(trees, 3)
    safefs.write_bytes(trees["root"], DEEP, b"new")
    assert (trees["host"] / DEEP).read_bytes() == SECRET
    assert not (trees["root"] / DEEP).is_symlink() and (trees["root"] / DEEP).read_bytes() == b"new"


@pytest.mark.parametrize("relative", ["../x", "/etc/passwd", "a/../../x", "", "."])
def test_a_path_that_could_leave_its_root_is_refused(trees: dict[str, Path], relative: str) -> None:
    with pytest.raises(UnsafePath):
        safefs.read_bytes(trees["root"], relative, max_bytes=100)
    with pytest.raises(UnsafePath):
        safefs.write_bytes(trees["root"], relative, b"x")


# --- what is not a regular file ---------------------------------------------------------------------------


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_without_blocking(trees: dict[str, Path]) -> None:
    fifo = trees["root"] / "a" / "fifo"
    os.mkfifo(fifo)
    dest = trees["tmp"] / "dest"
    dest.mkdir()
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_bytes(trees["root"], "a/fifo", max_bytes=100)
    with pytest.raises(UnsafePath):
        safefs.copy_out(trees["root"], "a/fifo", dest, "x", max_bytes=100)
    assert not safefs.exists(trees["root"], "a/fifo")
    safefs.touch(trees["root"], "a/fifo")  # nothing to touch, and no wait
    assert files_under(dest) == {}


@pytest.mark.timeout(10)
def test_a_link_to_a_device_or_a_directory_is_refused(trees: dict[str, Path]) -> None:
    (trees["root"] / "zero").symlink_to("/dev/zero")
    with pytest.raises(UnsafePath):
        safefs.read_bytes(trees["root"], "zero", max_bytes=1 << 20)
    with pytest.raises(UnsafePath, match="not a regular file"):
        safefs.read_bytes(trees["root"], "a", max_bytes=1 << 20)
    assert not safefs.exists(trees["root"], "a")


# --- bounds -------------------------------------------------------------------------------------------------


def test_reads_are_bounded(trees: dict[str, Path]) -> None:
    (trees["root"] / "big").write_bytes(b"x" * 100)
    assert safefs.read_bytes(trees["root"], "big", max_bytes=100) == b"x" * 100
    with pytest.raises(UnsafePath, match="over 99"):
        safefs.read_bytes(trees["root"], "big", max_bytes=99)
    with pytest.raises(UnsafePath), safefs.open_regular(trees["root"], "big", max_bytes=10):
        pass
    dest = trees["tmp"] / "dest"
    dest.mkdir()
    with pytest.raises(UnsafePath):
        safefs.copy_out(trees["root"], "big", dest, "big", max_bytes=99)
    assert list(dest.iterdir()) == []


def test_a_write_over_its_bound_or_of_other_bytes_leaves_nothing(tmp_path: Path) -> None:
    good = b"content"
    sha = safefs.write_bytes(tmp_path, "d/ok", good)
    assert sha == hashlib.sha256(good).hexdigest() and (tmp_path / "d" / "ok").read_bytes() == good
    with pytest.raises(UnsafePath):
        safefs.write_stream(tmp_path, "d/big", [b"x" * 60, b"x" * 60], max_bytes=100)
    with pytest.raises(UnsafePath):
        safefs.write_stream(tmp_path, "d/bad", [b"other"], max_bytes=100, expect_sha256=sha)
    with pytest.raises(UnsafePath):
        safefs.write_stream(tmp_path, "d/short", [good], max_bytes=100, expect_size=len(good) + 1)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == ["ok"]  # no temporaries left
    assert safefs.write_stream(tmp_path, "d/ok2", [good], max_bytes=100, expect_sha256=sha) == sha


def test_a_written_file_has_its_mode_and_directories_0755(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        safefs.write_bytes(tmp_path, "x/y/key", b"k", mode=0o600)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "x/y/key").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "x").stat().st_mode) == 0o755


# --- walk, unlink, touch ------------------------------------------------------------------------------------


def test_walk_lists_regular_files_only_and_never_enters_a_linked_directory(trees: dict[str, Path]) -> None:
    root = trees["root"]
    (root / "a" / "file-link").symlink_to(trees["host"] / DEEP)
    (root / "a" / "dir-link").symlink_to(trees["host"] / "a", target_is_directory=True)
    (root / "dangling").symlink_to(trees["tmp"] / "nowhere")
    os.mkfifo(root / "a" / "fifo")
    sock = socket.socket(socket.AF_UNIX)
    try:
        sock.bind(str(root / "sock"))
        (root / "z.txt").write_text("zz")
        found = list(safefs.walk(root))
    finally:
        sock.close()
    assert [f.relative for f in found] == [DEEP, PurePosixPath("z.txt")]
    assert [f.size for f in found] == [len(b"the container's own"), 2]
    assert found[0].mtime == (root / DEEP).stat().st_mtime


def test_walk_of_a_link_a_file_or_nothing_is_empty(trees: dict[str, Path]) -> None:
    assert list(safefs.walk(trees["tmp"] / "absent")) == []
    assert list(safefs.walk(trees["root"] / DEEP)) == []


def test_walk_is_bounded(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d"] * 5)
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    for n in range(5):
        (tmp_path / f"f{n}").write_text("x")
    assert [f.relative.name for f in safefs.walk(tmp_path, max_depth=4)] == [f"f{n}" for n in range(5)]
    assert len(list(safefs.walk(tmp_path, max_depth=5))) == 6
    assert len(list(safefs.walk(tmp_path, max_entries=3))) < 6


def test_unlink_removes_a_link_not_what_it_points_to(trees: dict[str, Path]) -> None:
    link_level(trees, 3)
    safefs.unlink(trees["root"], DEEP)
    assert not os.path.lexists(trees["root"] / DEEP)
    assert (trees["host"] / DEEP).read_bytes() == SECRET
    safefs.unlink(trees["root"], DEEP)  # gone already: fine


@pytest.mark.parametrize("level", LEVELS[:-1])
def test_unlink_through_a_linked_directory_removes_nothing(trees: dict[str, Path], level: int) -> None:
    link_level(trees, level)
    safefs.unlink(trees["root"], DEEP)
    assert (trees["host"] / DEEP).read_bytes() == SECRET


def test_touch_marks_a_regular_file_and_never_a_link_target(trees: dict[str, Path]) -> None:
    old = 1_000_000.0
    os.utime(trees["root"] / DEEP, (old, old))
    safefs.touch(trees["root"], DEEP)
    assert (trees["root"] / DEEP).stat().st_mtime > old
    os.utime(trees["host"] / DEEP, (old, old))
    link_level(trees, 3)
    safefs.touch(trees["root"], DEEP)
    assert (trees["host"] / DEEP).stat().st_mtime == old
    safefs.touch(trees["root"], "absent")  # nothing there: nothing made
    assert not (trees["root"] / "absent").exists()
