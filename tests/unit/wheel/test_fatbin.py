"""factory.wheel.fatbin on hand-built ELF files; tests/integration/test_fatbin_nvcc.py checks real nvcc
output.

The builders below are also used by test_wheelcheck.py, which loads this file by path.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from factory.core.errors import CheckError
from factory.wheel.fatbin import (
    FLAG_ARCH_SPECIFIC,
    FLAG_FAMILY_SPECIFIC,
    KIND_CUBIN,
    KIND_PTX,
    DeviceCode,
    device_code,
    elf_section,
    iter_fatbin_entries,
    read_device_code,
)

SHT_PROGBITS = 1
SHT_STRTAB = 3
SHT_NOBITS = 8


@dataclass(frozen=True, kw_only=True)
class Entry:
    kind: int
    arch: int
    flags: int = 0x11
    header_size: int = 64
    payload: bytes = b"\x7fELF-payload"


def fatbin_container(entries: list[Entry]) -> bytes:
    body = b""
    for entry in entries:
        padded = (len(entry.payload) + 7) & ~7
        header = struct.pack(
            "<HHIQIIII", entry.kind, 0x0101, entry.header_size, padded, 0, 0, 0x10008, entry.arch
        )
        header += struct.pack("<IIQ", 0, 0, entry.flags)
        header = header.ljust(entry.header_size, b"\0")
        body += header + entry.payload.ljust(padded, b"\0")
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def make_elf(
    sections: dict[str, bytes], *, nobits: frozenset[str] = frozenset(), ident: bytes | None = None
) -> bytes:
    """A minimal ELF64 shared object: the sections given, a .shstrtab, and the section header table last."""
    names = b"\0"
    name_offsets: dict[str, int] = {}
    for name in [*sections, ".shstrtab"]:
        name_offsets[name] = len(names)
        names += name.encode() + b"\0"
    data = bytearray(64)
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for name, content in [*sections.items(), (".shstrtab", names)]:
        kind = SHT_STRTAB if name == ".shstrtab" else SHT_NOBITS if name in nobits else SHT_PROGBITS
        while len(data) % 8:
            data.append(0)
        offset = len(data)
        if kind != SHT_NOBITS:
            data += content
        headers.append(
            struct.pack("<IIQQQQIIQQ", name_offsets[name], kind, 0, 0, offset, len(content), 0, 0, 8, 0)
        )
    while len(data) % 8:
        data.append(0)
    shoff = len(data)
    data += b"".join(headers)
    e_ident = ident or (b"\x7fELF" + bytes([2, 1, 1, 0]) + bytes(8))
    data[:64] = struct.pack(
        "<16sHHIQQQIHHHHHH", e_ident, 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, len(headers), len(headers) - 1
    )
    return bytes(data)


def fake_so(cubins: Sequence[int], ptx: Sequence[int] = (), *, containers: int = 1) -> bytes:
    """A shared object whose .nv_fatbin holds the archs given, split over `containers` like one per TU."""
    entries = [Entry(kind=KIND_CUBIN, arch=a) for a in cubins] + [Entry(kind=KIND_PTX, arch=a) for a in ptx]
    section = b""
    for _ in range(containers):
        section += fatbin_container(entries) + bytes(8)  # the linker pads between containers
    return make_elf({".text": b"\x90" * 16, ".nv_fatbin": section})


_SUFFIX_FLAGS = {"": 0, "a": FLAG_ARCH_SPECIFIC, "f": FLAG_FAMILY_SPECIFIC}


def target_entry(target: str) -> Entry:
    """The fatbin entry nvcc writes for an exact target: "sm_90a" (cubin), "compute_100f" (PTX)."""
    prefix, _, rest = target.partition("_")
    suffix = rest[-1] if rest[-1] in "af" else ""
    kind = {"sm": KIND_CUBIN, "compute": KIND_PTX}[prefix]
    arch = int(rest.removesuffix(suffix))
    return Entry(
        kind=kind, arch=arch, flags=0x11 | _SUFFIX_FLAGS[suffix], header_size=96 if arch >= 100 else 64
    )


def targets_so(*targets: str) -> bytes:
    """A shared object whose .nv_fatbin holds exactly the targets named ("sm_80", "sm_90a", "compute_90")."""
    return make_elf(
        {".text": b"\x90" * 16, ".nv_fatbin": fatbin_container([target_entry(t) for t in targets])}
    )


def test_cubins_and_ptx_are_told_apart() -> None:
    code = device_code(fake_so([80, 90], [90]))
    assert code == DeviceCode(
        cubin_archs=frozenset({80, 90}),
        ptx_archs=frozenset({90}),
        targets=frozenset({"sm_80", "sm_90", "compute_90"}),
    )
    assert not code.empty


def test_every_container_of_the_section_is_read() -> None:
    first = fatbin_container([Entry(kind=KIND_CUBIN, arch=80)])
    second = fatbin_container([Entry(kind=KIND_CUBIN, arch=120, header_size=112)])
    elf = make_elf({".nv_fatbin": first + bytes(24) + second})
    assert device_code(elf).cubin_archs == {80, 120}


def test_long_entry_headers_of_newer_archs_are_stepped_over() -> None:
    entries = [
        Entry(kind=KIND_CUBIN, arch=100, header_size=96, payload=b"x" * 13),
        Entry(kind=KIND_PTX, arch=120, header_size=80, payload=b"y" * 3),
        Entry(kind=KIND_CUBIN, arch=120, header_size=112),
    ]
    section = fatbin_container(entries)
    parsed = list(iter_fatbin_entries(section))
    assert [(e.kind, e.arch, e.header_size) for e in parsed] == [
        (KIND_CUBIN, 100, 96),
        (KIND_PTX, 120, 80),
        (KIND_CUBIN, 120, 112),
    ]
    assert [e.padded_size for e in parsed] == [16, 8, 16]


def test_suffix_flags_name_the_exact_target_but_not_the_number() -> None:
    entries = [
        Entry(kind=KIND_CUBIN, arch=90, flags=0x11 | FLAG_ARCH_SPECIFIC),
        Entry(kind=KIND_CUBIN, arch=100, flags=0x11 | FLAG_FAMILY_SPECIFIC, header_size=96),
        Entry(kind=KIND_PTX, arch=120, flags=0x8011),
    ]
    code = device_code(make_elf({".nv_fatbin": fatbin_container(entries)}))
    assert code.cubin_archs == {90, 100}
    assert code.targets == {"sm_90a", "sm_100f", "compute_120"}
    compressed = list(iter_fatbin_entries(fatbin_container(entries)))
    assert [e.compressed for e in compressed] == [False, False, True]


@pytest.mark.parametrize(
    "targets",
    [
        ("sm_80", "sm_90a"),
        ("sm_90", "sm_90a", "compute_90a"),
        ("sm_100f", "sm_100a", "sm_100", "compute_100f"),
        ("sm_120a", "compute_120"),
    ],
)
def test_exact_targets_split_into_cubins_and_ptx(targets: tuple[str, ...]) -> None:
    code = device_code(targets_so(*targets))
    assert code.targets == set(targets)
    assert code.cubin_targets == {t for t in targets if t.startswith("sm_")}
    assert code.ptx_targets == {t for t in targets if t.startswith("compute_")}
    # the numbers alone cannot tell sm_90 from sm_90a: why decisions use the targets
    assert code.cubin_archs == {int(t[3:].rstrip("af")) for t in code.cubin_targets}


def test_no_device_code_has_no_targets() -> None:
    code = device_code(make_elf({".text": b"\x90"}))
    assert code.cubin_targets == frozenset()
    assert code.ptx_targets == frozenset()


def test_kinds_other_than_ptx_and_cubin_are_ignored() -> None:
    section = fatbin_container([Entry(kind=0x10, arch=80), Entry(kind=KIND_CUBIN, arch=90)])
    code = device_code(make_elf({".nv_fatbin": section}))
    assert code.cubin_archs == {90}
    assert code.ptx_archs == frozenset()


def test_no_fatbin_section_means_no_device_code() -> None:
    code = device_code(make_elf({".text": b"\x90"}))
    assert code.empty
    assert code.cubin_archs == frozenset()


def test_a_similarly_named_section_is_not_the_fatbin() -> None:
    elf = make_elf({".nv_fatbin_x": fatbin_container([Entry(kind=KIND_CUBIN, arch=80)])})
    assert device_code(elf).empty


def test_nobits_fatbin_section_holds_nothing() -> None:
    elf = make_elf({".nv_fatbin": bytes(64)}, nobits=frozenset({".nv_fatbin"}))
    assert elf_section(elf, ".nv_fatbin") is None


def test_elf_section_returns_the_exact_extent() -> None:
    elf = make_elf({".a": b"alpha", ".nv_fatbin": b"payload!"})
    offset, size = elf_section(elf, ".nv_fatbin") or (0, 0)
    assert elf[offset : offset + size] == b"payload!"


def test_zero_fill_after_the_last_entry_ends_the_container() -> None:
    container = bytearray(fatbin_container([Entry(kind=KIND_CUBIN, arch=80)]))
    struct.pack_into("<Q", container, 8, struct.unpack_from("<Q", container, 8)[0] + 64)
    container += bytes(64)
    assert [e.arch for e in iter_fatbin_entries(bytes(container))] == [80]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"MZ" + bytes(100), "not an ELF file"),
        (b"\x7fELF" + bytes([1, 1, 1]) + bytes(100), "64-bit little-endian"),
        (b"\x7fELF", "not an ELF file"),
    ],
)
def test_non_elf_input_is_refused(data: bytes, message: str) -> None:
    with pytest.raises(CheckError, match=message):
        device_code(data, where="lib.so")


def test_truncated_section_header_table_is_refused() -> None:
    elf = make_elf({".nv_fatbin": b""})
    with pytest.raises(CheckError, match="section header table is out of range"):
        device_code(elf[:-10])


def test_container_larger_than_its_section_is_refused() -> None:
    container = fatbin_container([Entry(kind=KIND_CUBIN, arch=80)])
    elf = make_elf({".nv_fatbin": container[:-8]})
    with pytest.raises(CheckError, match=r"claims \d+ bytes"):
        device_code(elf, where="x.so")


def test_entry_running_past_its_container_is_refused() -> None:
    container = bytearray(fatbin_container([Entry(kind=KIND_CUBIN, arch=80)]))
    struct.pack_into("<Q", container, 16 + 8, 4096)  # padded payload size of the first entry
    with pytest.raises(CheckError, match="malformed fatbin entry"):
        list(iter_fatbin_entries(bytes(container)))


def test_errors_name_their_source() -> None:
    with pytest.raises(CheckError, match=r"^ext/_C\.so: not an ELF file"):
        device_code(b"garbage" * 20, where="ext/_C.so")


def test_read_device_code_maps_a_file(tmp_path: Path) -> None:
    path = tmp_path / "lib.so"
    path.write_bytes(fake_so([80, 90], containers=3))
    assert read_device_code(path).cubin_archs == {80, 90}


def test_read_device_code_refuses_missing_and_empty_files(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match="cannot read"):
        read_device_code(tmp_path / "absent.so")
    (tmp_path / "empty.so").write_bytes(b"")
    with pytest.raises(CheckError, match="empty"):
        read_device_code(tmp_path / "empty.so")
