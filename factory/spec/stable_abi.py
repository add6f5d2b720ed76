"""Stable-ABI wheels: the recipe's `stable_abi` value, what the one wheel requires, and the check that its
extension modules keep to torch's stable C ABI.

A recipe with `stable_abi = "2.12"` says the package is written against torch's stable ABI
(`torch/csrc/stable/*`, `torch/headeronly/*`, the C shim `aoti_torch_*` / `torch_*`) with torch 2.12 as its
target: one wheel then serves every torch from 2.12 on, as an abi3 wheel serves every later CPython. The
plan builds one job per (CUDA, C++11 ABI, arch set, Python) in place of one per torch
(`plan.stable_abi_plan`), with the newest torch the matrix names, and `TORCH_TARGET_VERSION` set to the
floor in the build environment (the package's setup.py passes it to its compilers as
`-DTORCH_TARGET_VERSION=...`): the newer torch's headers then call only what the floor's libtorch has. The
wheel requires `torch>=2.12` (the CUDA build comes from the page it is listed on, one per covered torch
variant) and is installed and imported with the oldest and the newest torch it covers.

The symbol check reads each extension module's ELF dynamic symbol table (bounded, standard library only) and
refuses a module whose undefined symbols include a C++ function, object, vtable or typeinfo of torch's own
namespaces (at::, c10::, torch::, caffe2::) or a libtorch_python global (THP*): torch keeps no ABI promise for
those. The C shim's functions are plain C names and pass, and so does everything in std:: (libstdc++).
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from packaging.version import InvalidVersion, Version

STABLE = "stable"
_FLOOR = re.compile(r"(?:0|[1-9]\d*)\.(?:0|[1-9]\d*)")
# The most of one ELF table the check reads (a module's dynamic symbol and string tables are a few MiB at
# most, whatever its device code weighs).
MAX_TABLE_BYTES = 64 << 20
_SHT_DYNSYM = 11
_SHN_UNDEF = 0

# A mangled name (Itanium C++ ABI) whose own scope is one of torch's namespaces: `_ZN` (nested name), with
# cv/ref qualifiers of a member function (`_ZNK`), or the special names of a class there: vtable `_ZTV`,
# typeinfo `_ZTI`, typeinfo name `_ZTS`, VTT `_ZTT`, TLS wrapper/init `_ZTW`/`_ZTH`, guard variable `_ZGV`,
# and the thunks `_ZThn8_`/`_ZTv0_n24_` (the nested name may then carry its own `N`).
_SPECIAL = r"(?:T[VISTWH]|GV|Th n?\d+_|Tv n?\d+_n?\d+_)?".replace(" ", "")
_TORCH_SCOPE = re.compile(rf"^_Z{_SPECIAL}N[rVK]*[RO]?(?:2at|3c10|5torch|6caffe2)(?=[0-9A-Za-z])")
# Global-scope functions of libtorch_python (THPVariable_Wrap, ...): `_Z` + length + THP...
_TORCH_GLOBAL = re.compile(r"^_Z\d+THP")


def parse_stable_abi(value: object) -> str | None:
    """A recipe's `stable_abi`: a torch release "2.12" (quoted: YAML and TOML read 2.10 as 2.1) -> "2.12";
    false/absent -> None. ValueError (a message without the key's name) for anything else."""
    if value is False or value is None:
        return None
    if isinstance(value, float):
        raise ValueError(
            f'{value!r} must be a quoted torch version like "2.12" (unquoted, 2.10 reads as 2.1)'
        )
    if isinstance(value, str):
        text = value.strip()
        if _FLOOR.fullmatch(text):
            return text
        try:
            release = Version(text).release
        except InvalidVersion:
            release = ()
        if len(release) == 3 and release[2] == 0 and Version(text) == Version(".".join(map(str, release))):
            return f"{release[0]}.{release[1]}"
    raise ValueError(f'{value!r} must be the torch release the package targets, like "2.12"')


def floor_key(floor: str) -> tuple[int, int]:
    """ "2.12" -> (2, 12)."""
    major, minor = (int(p) for p in floor.split(".")[:2])
    return major, minor


def covers_torch(floor: str, torch: str) -> bool:
    """Does a wheel whose stable-ABI target is `floor` serve torch `torch` ("2.14" or "2.14.1")?"""
    release = Version(torch).release
    return (release[0], (*release, 0)[1]) >= floor_key(floor)


def target_version(floor: str) -> str:
    """TORCH_TARGET_VERSION for a floor, as torch/csrc/stable/version.h spells it: major in bits 56-63, minor
    in bits 48-55 ("2.12" -> "0x020c000000000000")."""
    major, minor = floor_key(floor)
    if not (0 <= major < 256 and 0 <= minor < 256):
        raise ValueError(f"torch {floor} does not fit TORCH_TARGET_VERSION")
    return f"0x{(major << 56) | (minor << 48):016x}"


def is_non_stable(symbol: str) -> bool:
    """Is an undefined symbol one of torch's C++ ABI (at::, c10::, torch::, caffe2:: or libtorch_python's
    THP*), which the stable ABI does not promise to keep?"""
    return bool(_TORCH_SCOPE.match(symbol) or _TORCH_GLOBAL.match(symbol))


def non_stable_symbols(symbols: Iterable[str]) -> list[str]:
    """The undefined symbols that break the stable-ABI claim, in table order."""
    return [s for s in symbols if is_non_stable(s)]


class ElfError(ValueError):
    """A file that is no ELF64 little-endian shared object this reader takes."""


def _read_at(fh: IO[bytes], offset: int, size: int) -> bytes:
    fh.seek(offset)
    data = fh.read(size)
    if len(data) != size:
        raise ElfError("truncated file")
    return data


def undefined_symbols(fh: IO[bytes]) -> list[str]:
    """The undefined symbols of an ELF64 shared object's dynamic symbol table, in table order (what
    `nm -D --undefined-only` lists). Reads only the header, the section headers and the two tables (each at
    most MAX_TABLE_BYTES), seeking in `fh` (a zip member seeks too); ElfError for a file it does not take."""
    header = _read_at(fh, 0, 64)
    if header[:4] != b"\x7fELF":
        raise ElfError("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise ElfError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", header, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", header, 0x3A)
    if shentsize < 64 or shnum * shentsize > MAX_TABLE_BYTES:
        raise ElfError("malformed section headers")
    table = _read_at(fh, shoff, shnum * shentsize)
    sections = []
    for n in range(shnum):
        base = n * shentsize
        (sh_type,) = struct.unpack_from("<I", table, base + 4)
        offset, size = struct.unpack_from("<QQ", table, base + 0x18)
        (link,) = struct.unpack_from("<I", table, base + 0x28)
        (entsize,) = struct.unpack_from("<Q", table, base + 0x38)
        sections.append((sh_type, offset, size, link, entsize))
    found: list[str] = []
    for sh_type, offset, size, link, entsize in sections:
        if sh_type != _SHT_DYNSYM:
            continue
        if entsize != 24 or size > MAX_TABLE_BYTES or link >= len(sections):
            raise ElfError("malformed dynamic symbol table")
        _type, str_offset, str_size, _link, _entsize = sections[link]
        if str_size > MAX_TABLE_BYTES:
            raise ElfError("malformed dynamic string table")
        symbols = _read_at(fh, offset, size)
        strings = _read_at(fh, str_offset, str_size)
        for n in range(1, size // 24):  # entry 0 is the null symbol
            name_offset, _info, _other, shndx = struct.unpack_from("<IBBH", symbols, n * 24)
            if shndx != _SHN_UNDEF or not name_offset:
                continue
            if name_offset >= len(strings):
                raise ElfError("symbol name outside the string table")
            end = strings.find(b"\0", name_offset)
            found.append(strings[name_offset : end if end >= 0 else None].decode("ascii", "backslashreplace"))
    return found


def module_problem(member: str, fh: IO[bytes]) -> str | None:
    """Why extension module `member` (`fh`, open for reading) breaks the stable-ABI claim, naming the first
    offending symbol and how many there are; None when it keeps to it."""
    try:
        symbols = undefined_symbols(fh)
    except (ElfError, struct.error, OSError) as exc:
        return f"{member}: its dynamic symbols cannot be read ({exc})"
    bad = non_stable_symbols(symbols)
    if not bad:
        return None
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return (
        f"{member}: uses {bad[0]}{more}, outside torch's stable ABI (a stable-ABI wheel may call only the C "
        "shim, aoti_torch_*/torch_*)"
    )


# --- detection: a hint `factory matrix --check` gives, which the user confirms by setting the key ----------

_SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".cu", ".cuh", ".h", ".hh", ".hpp")
MAX_SOURCE_FILES = 5000
MAX_SOURCE_BYTES = 1 << 20  # per file: a larger one is generated code, read no further than this
_STABLE_USE = re.compile(
    rb"\bSTABLE_TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\(|#\s*include\s*[<\"]torch/csrc/stable/"
)
# What only torch's C++ ABI offers: its headers, and the non-stable registration macros.
_CXX_USE = re.compile(
    rb"#\s*include\s*[<\"](?:ATen/|c10/|torch/extension\.h|torch/library\.h|torch/all\.h|torch/python\.h)"
    rb"|(?<![A-Z_])TORCH_LIBRARY(?:_IMPL|_FRAGMENT)?\s*\("
)


def detect(sources: Iterable[tuple[str, bytes]]) -> str | None:
    """A one-line hint when C++/CUDA sources ((path, text) pairs) look written against torch's stable ABI:
    one registers its operators with STABLE_TORCH_LIBRARY or includes torch/csrc/stable/, and none uses a
    header or macro of torch's C++ ABI. None otherwise. Only a hint: the symbol check proves it."""
    stable_in: str | None = None
    for path, text in sources:
        if _CXX_USE.search(text):
            return None
        if stable_in is None and _STABLE_USE.search(text):
            stable_in = path
    if stable_in is None:
        return None
    return (
        f"the source looks written against torch's stable ABI ({stable_in}; no ATen/c10 header): "
        'set recipe.stable_abi to the oldest torch it targets (like "2.12") for one wheel per CUDA and arch '
        "set that serves every torch from it"
    )


def source_files(tree: Path) -> Iterator[tuple[str, bytes]]:
    """(path, first MAX_SOURCE_BYTES) of the C++/CUDA files of a source tree, links never followed, at most
    MAX_SOURCE_FILES of them."""
    from factory.core import safefs

    count = 0
    for found in safefs.walk(tree):
        name = str(found.relative)
        if not name.endswith(_SOURCE_SUFFIXES):
            continue
        count += 1
        if count > MAX_SOURCE_FILES:
            return
        try:
            with safefs.open_regular(tree, found.relative) as fd, os.fdopen(os.dup(fd), "rb") as fh:
                yield name, fh.read(MAX_SOURCE_BYTES)
        except OSError:
            continue
