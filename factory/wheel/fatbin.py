"""Which GPU architectures a shared object carries device code for, read from its ELF `.nv_fatbin` section.

No GPU and no CUDA tools are needed: the section holds one or more fatbin containers (one per translation
unit), each a 16-byte header followed by entries. Every entry header states its kind (PTX or ELF cubin) and
SM arch in clear, even when the payload itself is compressed, so payloads are never decoded.

Layout (little endian), as written by nvcc's fatbinary and read by cuobjdump:

    container header (16 bytes): u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of the entries
    entry header (header size bytes: 64, or more for sm_100 and later):
        +0  u16 kind (1 = PTX, 2 = ELF cubin)     +2  u16 version
        +4  u32 entry header size                 +8  u64 payload size, padded (distance to the next entry)
        +16 u32 compressed payload size (0 when stored plain)
        +24 u32 code version                      +28 u32 SM arch (80, 90, 100, 120; virtual arch for PTX)
        +40 u64 flags

The flag bits for arch-specific ("sm_90a") and family ("sm_100f") targets were read off nvcc 13.0 output; the
arch number itself never depends on them.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from factory.core.errors import CheckError

FATBIN_MAGIC = 0xBA55ED50
FATBIN_SECTION = ".nv_fatbin"
KIND_PTX = 1
KIND_CUBIN = 2
FLAG_COMPRESSED = 0x2000 | 0x8000  # 0x2000: older fatbinary_section.h; 0x8000: seen in nvcc 13.0 output
FLAG_ARCH_SPECIFIC = 1 << 20
FLAG_FAMILY_SPECIFIC = 1 << 21

_MAGIC_BYTES = struct.pack("<I", FATBIN_MAGIC)
_CONTAINER = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIII")  # through the SM arch at +28
_MIN_ENTRY_HEADER = 64

_ELF_MAGIC = b"\x7fELF"
_ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF64_SECTION = struct.Struct("<IIQQQQIIQQ")
_SHN_UNDEF = 0
_SHN_XINDEX = 0xFFFF
_SHT_NOBITS = 8


@dataclass(frozen=True, kw_only=True)
class FatbinEntry:
    kind: int  # KIND_PTX, KIND_CUBIN, or a kind this module does not interpret
    arch: int  # SM number: 80 for sm_80 / compute_80
    header_size: int
    padded_size: int
    flags: int

    @property
    def compressed(self) -> bool:
        return bool(self.flags & FLAG_COMPRESSED)

    @property
    def suffix(self) -> str:
        if self.flags & FLAG_ARCH_SPECIFIC:
            return "a"
        if self.flags & FLAG_FAMILY_SPECIFIC:
            return "f"
        return ""

    @property
    def target(self) -> str:
        """cuobjdump's name for the entry: "sm_90a" for a cubin, "compute_90" for PTX."""
        prefix = "compute" if self.kind == KIND_PTX else "sm"
        return f"{prefix}_{self.arch}{self.suffix}"


@dataclass(frozen=True, kw_only=True)
class DeviceCode:
    cubin_archs: frozenset[int]
    ptx_archs: frozenset[int]
    targets: frozenset[str] = frozenset()  # exact names with suffixes: "sm_80", "sm_90a", "compute_120"

    @property
    def empty(self) -> bool:
        return not self.cubin_archs and not self.ptx_archs

    @property
    def cubin_targets(self) -> frozenset[str]:
        """The cubins' exact targets ("sm_90a"): what decides where the code runs, which the number alone
        does not (an sm_90a cubin runs only on 9.0 and holds what a generic sm_90 one lacks)."""
        return frozenset(t for t in self.targets if t.startswith("sm_"))

    @property
    def ptx_targets(self) -> frozenset[str]:
        """The PTX entries' exact targets ("compute_90")."""
        return frozenset(t for t in self.targets if t.startswith("compute_"))


Buffer = bytes | bytearray | mmap.mmap


def iter_fatbin_entries(
    data: Buffer, *, start: int = 0, end: int | None = None, where: str = "fatbin"
) -> Iterator[FatbinEntry]:
    """Walk every container in `data[start:end]` (a `.nv_fatbin` section); `where` names it in errors."""
    end = len(data) if end is None else end
    while True:
        # The linker pads between the containers of different translation units, so search rather than step.
        offset = data.find(_MAGIC_BYTES, start, end)
        if offset < 0:
            return
        if offset + _CONTAINER.size > end:
            raise CheckError(f"{where}: fatbin container header at offset {offset:#x} is truncated")
        _, _version, header_size, entries_size = _CONTAINER.unpack_from(data, offset)
        if header_size < _CONTAINER.size:
            raise CheckError(f"{where}: fatbin container at offset {offset:#x} has header size {header_size}")
        pos = offset + header_size
        container_end = pos + entries_size
        if container_end > end:
            raise CheckError(
                f"{where}: fatbin container at offset {offset:#x} claims {entries_size} bytes "
                "but its section ends first"
            )
        while pos + _MIN_ENTRY_HEADER <= container_end:
            kind, _ev, entry_header, padded, _compressed, _u20, _code_version, arch = _ENTRY.unpack_from(
                data, pos
            )
            if entry_header == 0:  # zero fill after the last entry of a container
                break
            if entry_header < _MIN_ENTRY_HEADER or pos + entry_header + padded > container_end:
                raise CheckError(f"{where}: malformed fatbin entry at offset {pos:#x}")
            (flags,) = struct.unpack_from("<Q", data, pos + 40)
            yield FatbinEntry(kind=kind, arch=arch, header_size=entry_header, padded_size=padded, flags=flags)
            pos += entry_header + padded
        start = container_end


def elf_section(data: Buffer, name: str, *, where: str = "ELF file") -> tuple[int, int] | None:
    """(offset, size) of the named section of a 64-bit little-endian ELF file; None when it has none."""
    if len(data) < _ELF64_HEADER.size or data[:4] != _ELF_MAGIC:
        raise CheckError(f"{where}: not an ELF file")
    ident = data[:16]
    if ident[4] != 2 or ident[5] != 1:
        raise CheckError(f"{where}: only 64-bit little-endian ELF is supported")
    header = _ELF64_HEADER.unpack_from(data, 0)
    shoff, shentsize, shnum, shstrndx = header[6], header[11], header[12], header[13]
    if shoff == 0:
        return None
    if shentsize < _ELF64_SECTION.size or shoff + shentsize > len(data):
        raise CheckError(f"{where}: section header table is out of range")
    first = _ELF64_SECTION.unpack_from(data, shoff)
    # With 0xff00 or more sections the real counts live in section 0 (ELF extended numbering).
    if shnum == 0:
        shnum = first[5]
    if shstrndx == _SHN_XINDEX:
        shstrndx = first[6]
    if shoff + shnum * shentsize > len(data) or shstrndx == _SHN_UNDEF or shstrndx >= shnum:
        raise CheckError(f"{where}: section header table is out of range")
    sections = [_ELF64_SECTION.unpack_from(data, shoff + i * shentsize) for i in range(shnum)]
    names_offset, names_size = _extent(data, sections[shstrndx], where)
    wanted = name.encode() + b"\0"
    for section in sections:
        name_at = names_offset + section[0]
        if section[0] + len(wanted) <= names_size and data[name_at : name_at + len(wanted)] == wanted:
            return None if section[1] == _SHT_NOBITS else _extent(data, section, where)
    return None


def _extent(data: Buffer, section: tuple[int, ...], where: str) -> tuple[int, int]:
    offset, size = section[4], section[5]
    if offset + size > len(data):
        raise CheckError(f"{where}: a section extends past the end of the file")
    return offset, size


def device_code(data: Buffer, *, where: str = "shared object") -> DeviceCode:
    """Archs with cubins and archs with PTX in an ELF shared object (empty sets when it has no fatbin)."""
    extent = elf_section(data, FATBIN_SECTION, where=where)
    if extent is None:
        return DeviceCode(cubin_archs=frozenset(), ptx_archs=frozenset())
    offset, size = extent
    cubins: set[int] = set()
    ptx: set[int] = set()
    targets: set[str] = set()
    for entry in iter_fatbin_entries(data, start=offset, end=offset + size, where=where):
        if entry.kind == KIND_CUBIN:
            cubins.add(entry.arch)
        elif entry.kind == KIND_PTX:
            ptx.add(entry.arch)
        else:
            continue  # e.g. LTO IR: neither runnable machine code nor JIT-able PTX
        targets.add(entry.target)
    return DeviceCode(cubin_archs=frozenset(cubins), ptx_archs=frozenset(ptx), targets=frozenset(targets))


def read_device_code(path: Path) -> DeviceCode:
    """`device_code` of a file, memory-mapped so that multi-hundred-megabyte extensions are not copied."""
    try:
        with path.open("rb") as handle:
            if path.stat().st_size == 0:
                raise CheckError(f"{path}: not an ELF file (empty)")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
                return device_code(mapped, where=str(path))
    except OSError as exc:
        raise CheckError(f"{path}: cannot read: {exc.strerror or exc}") from None
