"""`factory publish` checks each wheel as an installer would before anything is published: a published file
can never be replaced, so a wheel that pip or uv refuses, or that unpacks outside its directory, must never
get in. One line naming the wheel and the first problem, exit 1, and nothing from that call in the index."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.core.errors import PublishError
from factory.publish.publisher import publish_wheels
from factory.wheel.checks import archive_problems, record_hash

Cli = Callable[[list[str]], tuple[int, str]]

LABEL = "cu13.0.torch2.14.abi1.sm80.90"
VERSION = f"0.1.0+{LABEL}"
DIST_INFO = f"demo_ext-{VERSION}.dist-info"
RECORD = f"{DIST_INFO}/RECORD"
METADATA = f"Metadata-Version: 2.1\nName: demo-ext\nVersion: {VERSION}\n\n".encode()
MODULE = b"X = 1\n"


def members() -> dict[str, bytes]:
    return {"demo_ext/__init__.py": MODULE, f"{DIST_INFO}/METADATA": METADATA}


def record_of(files: dict[str, bytes]) -> list[str]:
    return [f"{name},{record_hash(data)},{len(data)}" for name, data in files.items()] + [f"{RECORD},,"]


def write_wheel(
    directory: Path, files: dict[str, bytes], record: list[str] | None, *, version: str = VERSION
) -> Path:
    """A wheel of `files` whose RECORD has the lines `record` (None: no RECORD at all)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"demo_ext-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in files.items():
            zf.writestr(member, data)
        if record is not None:
            zf.writestr(RECORD, "\n".join(record) + "\n")
    return path


EVIL = b"import os\n"
WRONG = record_hash(b"something else")


def _case(name: str) -> tuple[dict[str, bytes], list[str] | None]:
    files = members()
    record = record_of(files)
    if name == "hash":
        record[0] = f"demo_ext/__init__.py,{WRONG},{len(MODULE)}"
    elif name == "size":
        record[0] = f"demo_ext/__init__.py,{record_hash(MODULE)},{len(MODULE) + 1}"
    elif name == "no-size":
        record[0] = f"demo_ext/__init__.py,{record_hash(MODULE)},"
    elif name == "no-hash":
        record[0] = f"demo_ext/__init__.py,,{len(MODULE)}"
    elif name == "hex-digest":
        record[0] = f"demo_ext/__init__.py,sha256={'0' * 64},{len(MODULE)}"
    elif name == "md5":
        record[0] = f"demo_ext/__init__.py,md5=abc,{len(MODULE)}"
    elif name == "dot-dot":
        files["../evil.py"] = EVIL
        record = record_of(files)
    elif name == "absolute":
        files["/tmp/evil.py"] = EVIL
        record = record_of(files)
    elif name == "dot-dot-listed-only":
        record.insert(0, f"../evil.py,{record_hash(EVIL)},{len(EVIL)}")
    elif name == "duplicate":
        record.insert(1, record[0])
    elif name == "record-hashed":
        record[-1] = f"{RECORD},{WRONG},10"
    elif name == "unlisted":
        record.pop(0)
    elif name == "listed-missing":
        record.insert(0, f"demo_ext/gone.py,{record_hash(EVIL)},{len(EVIL)}")
    elif name == "no-record":
        record = None
    elif name == "bad-line":
        record.insert(0, "demo_ext/x.py,sha256=abc")
    return files, record


CASES = {
    "hash": "RECORD: demo_ext/__init__.py hash mismatch",
    "size": "RECORD: demo_ext/__init__.py size mismatch (RECORD 7, file 6)",
    "no-size": "RECORD: demo_ext/__init__.py has no size",
    "no-hash": "RECORD: demo_ext/__init__.py has no sha256 (or stronger) hash",
    "hex-digest": "RECORD: demo_ext/__init__.py hash mismatch",
    "md5": "RECORD: demo_ext/__init__.py has no sha256 (or stronger) hash: 'md5=abc'",
    "dot-dot": "zip: '../evil.py' is a '..' path",
    "absolute": "zip: '/tmp/evil.py' is an absolute path",
    "dot-dot-listed-only": "RECORD line 1: '../evil.py' is a '..' path",
    "duplicate": "RECORD: demo_ext/__init__.py is listed twice",
    "record-hashed": "RECORD: its own line must have no hash or size",
    "unlisted": "RECORD: demo_ext/__init__.py is in the wheel but not listed",
    "listed-missing": "RECORD: demo_ext/gone.py is listed but not in the wheel",
    "no-record": f"{RECORD}: missing",
    "bad-line": "RECORD line 1: expected 3 fields, got 2",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_wheel_an_installer_refuses_is_not_published(case: str, tmp_path: Path, factory_cli: Cli) -> None:
    files, record = _case(case)
    bad = write_wheel(tmp_path / "bad", files, record)
    index = tmp_path / "index"
    code, output = factory_cli(["publish", str(bad.parent), "--to", str(index)])
    assert code == 1, output
    assert "Traceback" not in output
    lines = output.strip().splitlines()
    assert len(lines) == 1, output
    assert lines[0].startswith(f"error: {bad}: {CASES[case]}"), output
    assert not any(p.is_file() for p in index.rglob("*")), sorted(index.rglob("*"))


def test_nothing_of_a_call_with_one_bad_wheel_is_published(tmp_path: Path) -> None:
    good = write_wheel(tmp_path / "good", members(), record_of(members()))
    files, record = _case("dot-dot")
    # another release, so that nothing but its contents can refuse it
    version = VERSION.replace("0.1.0", "0.2.0")
    files[f"{DIST_INFO}/METADATA"] = METADATA.replace(b"0.1.0", b"0.2.0")
    bad = write_wheel(tmp_path / "bad", files, record_of(files)[:-1] + record[-1:], version=version)
    with pytest.raises(PublishError, match=r"'\.\./evil\.py' is a '\.\.' path"):
        publish_wheels([good, bad], to=str(tmp_path / "index"))
    assert not any(p.is_file() for p in (tmp_path / "index").rglob("*"))


def test_a_well_formed_wheel_is_published(tmp_path: Path, factory_cli: Cli) -> None:
    write_wheel(tmp_path / "wheels", members(), record_of(members()))
    code, output = factory_cli(["publish", str(tmp_path / "wheels"), "--to", str(tmp_path / "index")])
    assert code == 0, output
    assert (tmp_path / "index" / "files").is_dir()


def test_a_record_without_its_own_line_and_with_signatures_is_accepted(tmp_path: Path) -> None:
    """As installers accept it: RECORD need not list itself, and RECORD.jws is never listed."""
    files = {**members(), f"{DIST_INFO}/RECORD.jws": b"{}"}
    record = record_of(members())[:-1]
    with zipfile.ZipFile(write_wheel(tmp_path, files, record)) as archive:
        assert archive_problems(archive) == []


def test_a_damaged_member_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    path = write_wheel(tmp_path, members(), record_of(members()))
    data = bytearray(path.read_bytes())
    stored = data.find(b"demo_ext/__init__.py") + len("demo_ext/__init__.py")
    data[stored : stored + 4] = b"\xff\xff\xff\xff"  # the first member's compressed bytes
    path.write_bytes(bytes(data))
    with zipfile.ZipFile(path) as archive:
        problems = archive_problems(archive)
    assert problems and problems[0].startswith("zip: demo_ext/__init__.py cannot be read"), problems
