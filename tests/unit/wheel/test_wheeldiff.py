"""The first difference between two wheels: the member, and inside an ELF the section."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from factory.core.errors import CheckError
from factory.wheel import wheeldiff

DATE = (2024, 1, 1, 0, 0, 0)


def write(
    path: Path, members: list[tuple[str, bytes]], *, date: tuple[int, ...] = DATE, mode: int = 0o644
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as out:
        for name, data in members:
            info = zipfile.ZipInfo(name, date_time=date)  # type: ignore[arg-type]
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            out.writestr(info, data)
    return path


MEMBERS = [("demo/__init__.py", b"x = 1\n"), ("demo/data.txt", b"abcdef"), ("demo-1.0.dist-info/RECORD", b"")]


def test_identical_wheels_have_no_difference(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "w.whl", MEMBERS)
    b = write(tmp_path / "b" / "w.whl", MEMBERS)
    assert wheeldiff.compare_wheels(a, b) is None


def test_one_changed_byte_names_its_member_and_offset(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "w.whl", MEMBERS)
    changed = [MEMBERS[0], ("demo/data.txt", b"abcXef"), MEMBERS[2]]
    b = write(tmp_path / "b" / "w.whl", changed)
    found = wheeldiff.compare_wheels(a, b)
    assert found is not None
    assert found.line() == "demo/data.txt: content differs at byte 3"


@pytest.mark.parametrize(
    ("b_members", "line"),
    [
        (MEMBERS[:2], "demo-1.0.dist-info/RECORD: only in the first wheel"),
        ([*MEMBERS, ("demo/new.py", b"")], "demo/new.py: only in the second wheel"),
        (
            [MEMBERS[1], MEMBERS[0], MEMBERS[2]],
            "demo/__init__.py: at another place in the archive (member 0)",
        ),
        (
            [("demo/__init__.py", b"x = 12\n"), *MEMBERS[1:]],
            "demo/__init__.py: content differs (6 vs 7 bytes)",
        ),
    ],
)
def test_names_order_and_sizes(tmp_path: Path, b_members: list[tuple[str, bytes]], line: str) -> None:
    a = write(tmp_path / "a" / "w.whl", MEMBERS)
    b = write(tmp_path / "b" / "w.whl", b_members)
    found = wheeldiff.compare_wheels(a, b)
    assert found is not None and found.line() == line


def test_zip_metadata_differences_are_named(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "w.whl", MEMBERS)
    dated = write(tmp_path / "b" / "w.whl", MEMBERS, date=(2025, 1, 1, 0, 0, 0))
    found = wheeldiff.compare_wheels(a, dated)
    assert found is not None and found.member == "demo/__init__.py" and "zip date differs" in found.what
    moded = write(tmp_path / "c" / "w.whl", MEMBERS, mode=0o755)
    found = wheeldiff.compare_wheels(a, moded)
    assert found is not None and found.what == "zip mode differs ('0o100644' vs '0o100755')"


def test_an_unreadable_wheel_is_one_line(tmp_path: Path) -> None:
    a = write(tmp_path / "a" / "w.whl", MEMBERS)
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"PK\x03\x04 not a zip")
    with pytest.raises(CheckError, match="cannot compare"):
        wheeldiff.compare_wheels(a, bad)


def test_first_byte_difference() -> None:
    assert wheeldiff.first_byte_difference(b"abc", b"abc") is None
    assert wheeldiff.first_byte_difference(b"abc", b"abd") == 2
    assert wheeldiff.first_byte_difference(b"ab", b"abc") == 2


@pytest.fixture(scope="module")
def two_objects(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """Two objects of one source compiled with a different constant: their .data sections differ."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    tmp = tmp_path_factory.mktemp("elf")
    out = []
    for value in (1, 2):
        (tmp / "a.c").write_text(f"int value = {value};\nint get(void) {{ return value; }}\n")
        subprocess.run([cc, "-c", "-O2", "a.c", "-o", f"a{value}.o"], cwd=tmp, check=True)
        out.append((tmp / f"a{value}.o").read_bytes())
    return out[0], out[1]


def test_an_elf_difference_names_its_section(two_objects: tuple[bytes, bytes]) -> None:
    a, b = two_objects
    assert wheeldiff.bytes_difference(a, a) is None
    assert wheeldiff.bytes_difference(a, b) == "ELF section .data differs at byte 0 of 4"


def test_an_elf_member_of_a_wheel_names_its_section(tmp_path: Path, two_objects: tuple[bytes, bytes]) -> None:
    a, b = two_objects
    wa = write(tmp_path / "a" / "w.whl", [("demo/_C.so", a), *MEMBERS])
    wb = write(tmp_path / "b" / "w.whl", [("demo/_C.so", b), *MEMBERS])
    found = wheeldiff.compare_wheels(wa, wb)
    assert found is not None and found.line() == "demo/_C.so: ELF section .data differs at byte 0 of 4"


def test_a_broken_elf_still_gives_an_offset() -> None:
    assert wheeldiff.bytes_difference(b"\x7fELF\x00garbage", b"\x7fELF\x01garbage").startswith(
        "differs at byte 4"
    )


def test_the_build_id_is_named_only_when_nothing_else_differs(tmp_path: Path) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    libs = []
    for value in (1, 2):
        (tmp_path / "a.c").write_text(f"int value = {value};\n")
        out = tmp_path / f"a{value}.so"
        subprocess.run(
            [cc, "-shared", "-fPIC", "-Wl,--build-id=sha1", "a.c", "-o", str(out)], cwd=tmp_path, check=True
        )
        libs.append(out.read_bytes())
    found = wheeldiff.bytes_difference(libs[0], libs[1])
    assert found is not None and found.startswith("ELF section .data differs"), found
    assert wheeldiff.elf_difference(libs[0], libs[0]) is None
    (note,) = [s for s in wheeldiff._sections(libs[0]) if s[0] == ".note.gnu.build-id"]
    at = note[1] + note[2] - 1  # the id's last byte
    changed = libs[0][:at] + bytes([libs[0][at] ^ 1]) + libs[0][at + 1 :]
    assert (
        wheeldiff.elf_difference(libs[0], changed)
        == f"ELF section .note.gnu.build-id differs at byte {note[2] - 1} of {note[2]}"
    )
