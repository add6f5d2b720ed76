"""Where two wheels differ, diffoscope-style but in one line: the first member whose name, zip metadata or
bytes differ, and inside an ELF member (an extension module, an object) the first section that does.

`factory rebuild` (`build.rebuild`) compares a published wheel with the one it rebuilt; the
reproducibility test compares two builds of one job. Everything here is pure over the two files: nothing is
extracted, and a member is read in bounded chunks until it is known to differ (an ELF member is then read
whole, up to MAX_ELF_BYTES, to name the section).
"""

from __future__ import annotations

import hashlib
import io
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from factory.core import bounded
from factory.core.errors import CheckError

ELF_MAGIC = b"\x7fELF"
MAX_ELF_BYTES = 4 << 30
_CHUNK = 1 << 20
_UNREADABLE = (zipfile.BadZipFile, OSError, EOFError, RuntimeError, NotImplementedError, ValueError)


@dataclass(frozen=True, kw_only=True)
class Difference:
    """The first difference between wheel A and wheel B: `member` is None when the archives hold the same
    members with the same bytes and differ only around them."""

    member: str | None
    what: str

    def line(self) -> str:
        return f"{self.member}: {self.what}" if self.member is not None else self.what


# --- inside one member -----------------------------------------------------------------------------------


def first_byte_difference(a: bytes, b: bytes) -> int | None:
    """The offset of the first byte that differs (the shorter one's length when one is a prefix of the
    other); None when they are equal."""
    if a == b:
        return None
    for offset, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return offset
    return min(len(a), len(b))


def _sections(data: bytes) -> list[tuple[str, int, int, bytes]]:
    """An ELF's sections as (name, file offset, size, contents); NOBITS sections hold no bytes."""
    elf = ELFFile(io.BytesIO(data))
    out: list[tuple[str, int, int, bytes]] = []
    for section in elf.iter_sections():
        contents = b"" if section["sh_type"] == "SHT_NOBITS" else section.data()
        out.append((section.name, int(section["sh_offset"]), int(section["sh_size"]), contents))
    return out


# a hash of the linked bytes (ld --build-id): it differs whenever anything else does, so it is named only when
# it is the one difference
_DERIVED_SECTIONS = frozenset({".note.gnu.build-id"})


def elf_difference(a: bytes, b: bytes) -> str | None:
    """Which part of two ELF files differs, in one line: the first section (in A's order) whose bytes, or
    whose size, differ, a section derived from the others (the build id) only when nothing else does; else
    the headers or padding, at an offset. None when they are equal."""
    offset = first_byte_difference(a, b)
    if offset is None:
        return None
    try:
        left, right = _sections(a), _sections(b)
    except (ELFError, ValueError, IndexError, KeyError, OSError) as exc:
        return f"differs at byte {offset} (not an ELF this can read: {exc})"
    names_a, names_b = [s[0] for s in left], [s[0] for s in right]
    if names_a != names_b:
        only = [n for n in names_a if n not in names_b] or [n for n in names_b if n not in names_a]
        return f"ELF sections differ: {', '.join(only[:3]) or 'their order'}"
    found: list[tuple[str, str]] = []
    for (name, _, size_a, data_a), (_, _, size_b, data_b) in zip(left, right, strict=True):
        shown = name or "(null)"
        if size_a != size_b:
            found.append((name, f"ELF section {shown} differs in size ({size_a} vs {size_b} bytes)"))
        elif (within := first_byte_difference(data_a, data_b)) is not None:
            found.append((name, f"ELF section {shown} differs at byte {within} of {size_a}"))
        if found and found[-1][0] not in _DERIVED_SECTIONS:
            return found[-1][1]
    if found:
        return found[0][1]
    for name, off_a, size, _ in left:
        if off_a <= offset < off_a + size:
            return f"ELF section {name} is placed differently (byte {offset})"
    return f"ELF headers or padding differ at byte {offset}"


def bytes_difference(a: bytes, b: bytes) -> str | None:
    """How two members' bytes differ, in one line; None when they are equal."""
    if a == b:
        return None
    if a.startswith(ELF_MAGIC) and b.startswith(ELF_MAGIC):
        return elf_difference(a, b)
    if len(a) != len(b):
        return f"content differs ({len(a)} vs {len(b)} bytes)"
    return f"content differs at byte {first_byte_difference(a, b)}"


# --- two archives ----------------------------------------------------------------------------------------


def _chunks(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> Iterator[bytes]:
    with archive.open(info) as fh:
        while chunk := fh.read(_CHUNK):
            yield chunk


def _same_content(za: zipfile.ZipFile, ia: zipfile.ZipInfo, zb: zipfile.ZipFile, ib: zipfile.ZipInfo) -> bool:
    if ia.file_size != ib.file_size or ia.CRC != ib.CRC:
        return False
    ha, hb = hashlib.sha256(), hashlib.sha256()
    for chunk in _chunks(za, ia):
        ha.update(chunk)
    for chunk in _chunks(zb, ib):
        hb.update(chunk)
    return ha.digest() == hb.digest()


def _read_bounded(archive: zipfile.ZipFile, info: zipfile.ZipInfo) -> bytes | None:
    try:
        return bounded.read_member(archive, info, max_bytes=MAX_ELF_BYTES)
    except bounded.Refused:
        return None


def _metadata_difference(ia: zipfile.ZipInfo, ib: zipfile.ZipInfo) -> str | None:
    fields: tuple[tuple[str, object, object], ...] = (
        ("date", ia.date_time, ib.date_time),
        ("mode", oct(ia.external_attr >> 16), oct(ib.external_attr >> 16)),
        ("compression", ia.compress_type, ib.compress_type),
        ("made-by system", ia.create_system, ib.create_system),
        ("extra field", ia.extra, ib.extra),
        ("comment", ia.comment, ib.comment),
    )
    for field, va, vb in fields:
        if va != vb:
            return f"zip {field} differs ({va!r} vs {vb!r})"
    return None


def compare_archives(za: zipfile.ZipFile, zb: zipfile.ZipFile) -> Difference | None:
    """The first difference between two open wheels, member by member in A's order (then B's extras); None
    when every member has the same name, place, metadata and bytes."""
    infos_a, infos_b = za.infolist(), zb.infolist()
    by_name_b = {i.filename: i for i in infos_b}
    names_a = {i.filename for i in infos_a}
    for position, ia in enumerate(infos_a):
        ib = by_name_b.get(ia.filename)
        if ib is None:
            return Difference(member=ia.filename, what="only in the first wheel")
        if not _same_content(za, ia, zb, ib):
            data_a, data_b = _read_bounded(za, ia), _read_bounded(zb, ib)
            if data_a is None or data_b is None:
                return Difference(member=ia.filename, what="content differs")
            return Difference(member=ia.filename, what=bytes_difference(data_a, data_b) or "content differs")
        meta = _metadata_difference(ia, ib)
        if meta is not None:
            return Difference(member=ia.filename, what=meta)
        if position >= len(infos_b) or infos_b[position].filename != ia.filename:
            return Difference(member=ia.filename, what=f"at another place in the archive (member {position})")
    for ib in infos_b:
        if ib.filename not in names_a:
            return Difference(member=ib.filename, what="only in the second wheel")
    return None


def compare_wheels(a: Path, b: Path) -> Difference | None:
    """The first difference between the wheels at `a` and `b` (`compare_archives`), or between their files
    around the members (zip structure); None when they are byte-identical. CheckError: one cannot be read."""
    if a.stat().st_size == b.stat().st_size and bounded.file_sha256(a) == bounded.file_sha256(b):
        return None
    try:
        with bounded.open_zip(a) as za, bounded.open_zip(b) as zb:
            found = compare_archives(za, zb)
    except _UNREADABLE as exc:
        raise CheckError(f"cannot compare {a.name} with {b.name}: {exc}") from None
    if found is not None:
        return found
    return Difference(member=None, what="the zip structure around the same members differs")
