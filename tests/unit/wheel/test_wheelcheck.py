"""factory.wheel.checks on small wheels zipped by hand (device code from test_fatbin.py's ELF builder)."""

from __future__ import annotations

import base64
import csv
import hashlib
import importlib.util
import io
import json
import os
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from factory.container.protocol import import_check_script, parse_import_check
from factory.core.errors import CheckError
from factory.core.validate import library_glob_problem
from factory.core.variants import Arch
from factory.wheel.checks import (
    check_wheel,
    is_extension_module,
    library_glob_matches,
    pin_torch_in_metadata,
    pin_torch_requirement,
    record_hash,
    record_problems,
    torch_requirements,
)
from factory.wheel.fatbin import device_code
from factory.wheel.platform_tag import repair_platform_tag


def _load_sibling(path: Path) -> ModuleType:
    """Import a helper test module by path: works whatever pytest's import mode."""
    name = f"_factory_test_helpers_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is being made
    spec.loader.exec_module(module)
    return module


_fatbin_helpers = _load_sibling(Path(__file__).with_name("test_fatbin.py"))
fake_so = _fatbin_helpers.fake_so
make_elf = _fatbin_helpers.make_elf
targets_so = _fatbin_helpers.targets_so

LABEL = "cu13.0.torch2.14.abi1.sm80.90"
VERSION = f"0.1.0+{LABEL}"
TAG = "cp311-cp311-manylinux_2_17_x86_64"
DIST_INFO = f"factory_demo_ext-{VERSION}.dist-info"
SO = "factory_demo_ext/_C.cpython-311-x86_64-linux-gnu.so"
JOB: dict[str, Any] = {
    "name": "factory-demo-ext",
    "version": "0.1.0",
    "local_version": LABEL,
    "python": "3.11",
    "torch_version": "2.14.1",
    "archs": ("8.0", "9.0"),
}


def metadata_text(
    *, name: str = "factory-demo-ext", version: str = VERSION, requires: tuple[str, ...] = ("torch==2.14.*",)
) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}", "Requires-Python: >=3.9"]
    lines += [f"Requires-Dist: {r}" for r in requires]
    return (
        "\n".join(lines)
        + "\n\nfactory-demo-ext\n================\n\nRequires-Dist: torch (body text, not a header)\n"
    )


def wheel_text(*tags: str, purelib: bool = False) -> str:
    lines = ["Wheel-Version: 1.0", "Generator: hand (tests)", f"Root-Is-Purelib: {str(purelib).lower()}"]
    return "\n".join(lines + [f"Tag: {t}" for t in tags or (TAG,)]) + "\n"


def members(
    *,
    dist_info: str = DIST_INFO,
    metadata: str | None = None,
    wheel: str | None = None,
    so: bytes | None = None,
    extra: Mapping[str, bytes] | None = None,
) -> dict[str, bytes]:
    files = {
        "factory_demo_ext/__init__.py": b"from factory_demo_ext import _C\n",
        SO: fake_so([80, 90]) if so is None else so,
        f"{dist_info}/METADATA": (metadata or metadata_text()).encode(),
        f"{dist_info}/WHEEL": (wheel or wheel_text()).encode(),
        f"{dist_info}/top_level.txt": b"factory_demo_ext\n",
    }
    files.update(extra or {})
    return files


def write_wheel(
    path: Path,
    files: Mapping[str, bytes],
    *,
    record: bool = True,
    record_edit: Mapping[str, tuple[str, str]] | None = None,
    modes: Mapping[str, int] | None = None,
) -> Path:
    """Zip `files` with a correct RECORD (optionally with rows replaced or added by `record_edit`)."""
    dist_info = next(n.split("/")[0] for n in files if n.split("/")[0].endswith(".dist-info"))
    rows = {n: (record_hash(d), str(len(d))) for n, d in files.items()}
    rows.update(record_edit or {})
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows((n, h, s) for n, (h, s) in rows.items())
    writer.writerow((f"{dist_info}/RECORD", "", ""))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2024, 1, 2, 3, 4, 6))
            info.external_attr = ((modes or {}).get(name, 0o644) | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
        if record:
            archive.writestr(f"{dist_info}/RECORD", text.getvalue())
    return path


def good_wheel(tmp_path: Path, **kwargs: Any) -> Path:
    return write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", members(**kwargs))


def read_member(wheel: Path, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(next(n for n in archive.namelist() if n.endswith(suffix))).decode()


# --- small helpers ------------------------------------------------------------------------------------------


def test_record_hash_is_urlsafe_base64_without_padding() -> None:
    data = b"\xfb\xff" * 100
    expected = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")
    assert record_hash(data) == f"sha256={expected}"
    assert "=" not in record_hash(data).removeprefix("sha256=")


def test_extension_modules_are_so_files_outside_dist_info() -> None:
    assert is_extension_module(SO)
    assert is_extension_module("pkg-1.0.data/platlib/mod.so")
    assert not is_extension_module("pkg.libs/libgomp.so.1")
    assert not is_extension_module(f"{DIST_INFO}/weird.so")


# --- METADATA pinning as text -------------------------------------------------------------------------------


def test_pin_replaces_every_torch_requirement_in_place() -> None:
    text = metadata_text(requires=("einops", "torch>=2.0", "Torch ; extra == 'cuda'", "numpy"))
    pinned = pin_torch_in_metadata(text, "2.14.1")
    headers = pinned.split("\n\n", 1)[0].splitlines()
    assert [h for h in headers if h.startswith("Requires-Dist")] == [
        "Requires-Dist: einops",
        "Requires-Dist: torch==2.14.*",
        "Requires-Dist: numpy",
    ]
    assert (
        pinned.split("\n\n", 1)[1] == text.split("\n\n", 1)[1]
    )  # the body, with its lookalike line, untouched
    assert [str(r) for r in torch_requirements(pinned)] == ["torch==2.14.*"]


def test_pin_is_added_after_the_last_requirement_or_header() -> None:
    pinned = pin_torch_in_metadata(metadata_text(requires=("numpy",)), "2.14.1")
    assert "Requires-Dist: numpy\nRequires-Dist: torch==2.14.*\n\n" in pinned
    bare = pin_torch_in_metadata("Metadata-Version: 2.1\nName: x\nVersion: 1", "2.14")
    assert bare == "Metadata-Version: 2.1\nName: x\nVersion: 1\nRequires-Dist: torch==2.14.*\n"


def test_pin_keeps_crlf_and_folded_headers() -> None:
    text = (
        "Metadata-Version: 2.1\r\nName: x\r\nSummary: a\r\n  folded summary\r\n"
        "Requires-Dist: torch\r\n\r\nbody\r\n"
    )
    pinned = pin_torch_in_metadata(text, "2.14.1")
    assert pinned == (
        "Metadata-Version: 2.1\r\nName: x\r\nSummary: a\r\n  folded summary\r\n"
        "Requires-Dist: torch==2.14.*\r\n\r\nbody\r\n"
    )


def test_pin_is_idempotent() -> None:
    once = pin_torch_in_metadata(metadata_text(requires=("torch",)), "2.14.1")
    assert pin_torch_in_metadata(once, "2.14.1") == once


# --- pin_torch_requirement on a wheel -----------------------------------------------------------------------


def test_pinned_wheel_is_accepted_with_a_valid_record(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, metadata=metadata_text(requires=("torch>=2.0", "einops")))
    assert check_wheel(wheel, **JOB) == [
        "METADATA: torch requirement is 'torch>=2.0', expected exactly 'torch==2.14.*'"
    ]
    pin_torch_requirement(wheel, "2.14.1+cu130")
    assert check_wheel(wheel, **JOB) == []
    with zipfile.ZipFile(wheel) as archive:
        assert record_problems(archive, f"{DIST_INFO}/RECORD") == []
        assert archive.namelist()[-1] == f"{DIST_INFO}/RECORD"
        rows = list(csv.reader(io.StringIO(archive.read(f"{DIST_INFO}/RECORD").decode())))
        metadata = archive.read(f"{DIST_INFO}/METADATA")
    assert [f"{DIST_INFO}/METADATA", record_hash(metadata), str(len(metadata))] in rows
    assert "Requires-Dist: einops" in metadata.decode()


def test_pinning_keeps_names_modes_and_other_bytes_and_dates_members_from_the_epoch(tmp_path: Path) -> None:
    files = members()
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", files, modes={SO: 0o755})
    wheel.chmod(0o640)
    pin_torch_requirement(wheel, "2.14.1", epoch=1704164646)  # 2024-01-02T03:04:06Z
    assert wheel.name == f"factory_demo_ext-{VERSION}-{TAG}.whl"
    assert wheel.stat().st_mode & 0o777 == 0o640
    with zipfile.ZipFile(wheel) as archive:
        info = archive.getinfo(SO)
        assert (info.external_attr >> 16) & 0o777 == 0o755
        assert info.date_time == (2024, 1, 2, 3, 4, 6)
        assert archive.read(SO) == files[SO]
        assert sorted(archive.namelist()) == sorted([*files, f"{DIST_INFO}/RECORD"])
    assert list(tmp_path.iterdir()) == [wheel]  # no temporary file left behind


def test_pinning_drops_record_signatures(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, extra={f"{DIST_INFO}/RECORD.jws": b"{}"})
    pin_torch_requirement(wheel, "2.14.1")
    with zipfile.ZipFile(wheel) as archive:
        assert f"{DIST_INFO}/RECORD.jws" not in archive.namelist()
        assert record_problems(archive, f"{DIST_INFO}/RECORD") == []


def test_pinning_a_wheel_without_record_writes_one(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", members(), record=False)
    pin_torch_requirement(wheel, "2.14.1")
    assert check_wheel(wheel, **JOB) == []


@pytest.mark.parametrize(
    ("files", "torch", "message"),
    [
        ({"pkg/__init__.py": b""}, "2.14.1", "expected one .dist-info directory, found 0"),
        ({"a-1.dist-info/WHEEL": b""}, "2.14.1", "METADATA is missing"),
        (members(), "nightly", "not a PEP 440 version"),
    ],
)
def test_failed_pinning_leaves_the_wheel_untouched(
    tmp_path: Path, files: dict[str, bytes], torch: str, message: str
) -> None:
    wheel = tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    before = wheel.read_bytes()
    with pytest.raises(CheckError, match=message):
        pin_torch_requirement(wheel, torch)
    assert wheel.read_bytes() == before
    assert list(tmp_path.iterdir()) == [wheel]


def test_pinning_something_that_is_not_a_zip_is_one_clear_error(tmp_path: Path) -> None:
    wheel = tmp_path / "x-1-py3-none-any.whl"
    wheel.write_text("not a zip")
    with pytest.raises(CheckError, match=r"^x-1-py3-none-any\.whl: not a readable wheel"):
        pin_torch_requirement(wheel, "2.14.1")


# --- check_wheel: names and tags ----------------------------------------------------------------------------


def test_a_good_wheel_is_accepted(tmp_path: Path) -> None:
    assert check_wheel(good_wheel(tmp_path), **JOB) == []


def test_manylinux_tags_are_accepted(tmp_path: Path) -> None:
    tag = "cp311-cp311-manylinux_2_28_x86_64"
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{tag}.whl", members(wheel=wheel_text(tag)))
    assert check_wheel(wheel, **JOB) == []
    assert check_wheel(wheel, **JOB, glibc="2.28") == []


def test_a_tag_above_the_matrix_glibc_floor_is_refused(tmp_path: Path) -> None:
    tag = "cp311-cp311-manylinux_2_34_x86_64"
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{tag}.whl", members(wheel=wheel_text(tag)))
    problems = check_wheel(wheel, **JOB, glibc="2.28")
    assert problems[0].startswith(
        "filename: platform tag manylinux_2_34_x86_64 needs glibc 2.34, above the matrix's floor "
        "build.glibc 2.28"
    ), problems
    assert check_wheel(wheel, **JOB, glibc="2.34") == check_wheel(wheel, **JOB)


def test_the_renamed_wheel_trap(tmp_path: Path) -> None:
    """A wheel built for another variant, renamed to the job's filename: its insides still say what it is."""
    other = "0.1.0+cu12.8.torch2.14.abi1.sm80.90"
    built = members(dist_info=f"factory_demo_ext-{other}.dist-info", metadata=metadata_text(version=other))
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", built)
    assert check_wheel(wheel, **JOB) == [
        f"factory_demo_ext-{other}.dist-info: version {other} is not the filename's {VERSION}",
        f"METADATA: Version {other} is not the filename's {VERSION}",
    ]


def test_metadata_version_alone_disagreeing_is_caught(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, metadata=metadata_text(version="0.1.0"))
    assert check_wheel(wheel, **JOB) == [f"METADATA: Version 0.1.0 is not the filename's {VERSION}"]


def test_wrong_job_version_and_name(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path)
    assert check_wheel(wheel, **{**JOB, "local_version": "cu12.8.torch2.14.abi1.sm80.90"}) == [
        f"filename: version {VERSION} is not the job's 0.1.0+cu12.8.torch2.14.abi1.sm80.90"
    ]
    problems = check_wheel(wheel, **{**JOB, "name": "flash-attn"})
    assert problems[0] == "filename: project factory-demo-ext is not flash-attn"
    assert f"{DIST_INFO}: project factory_demo_ext is not flash-attn" in problems
    assert "METADATA: Name 'factory-demo-ext' is not 'flash-attn'" in problems


def test_a_missing_local_label_is_a_wrong_version(tmp_path: Path) -> None:
    plain = members(dist_info="factory_demo_ext-0.1.0.dist-info", metadata=metadata_text(version="0.1.0"))
    wheel = write_wheel(tmp_path / f"factory_demo_ext-0.1.0-{TAG}.whl", plain)
    assert check_wheel(wheel, **JOB) == [f"filename: version 0.1.0 is not the job's {VERSION}"]
    assert check_wheel(wheel, **{**JOB, "local_version": ""}) == []


def test_name_normalisation_is_not_a_problem(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, metadata=metadata_text(name="Factory_Demo.Ext"))
    assert check_wheel(wheel, **{**JOB, "name": "factory_demo_ext"}) == []


def test_interpreter_and_platform_tags(tmp_path: Path) -> None:
    tag = "cp312-cp312-macosx_11_0_arm64"
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{tag}.whl", members(wheel=wheel_text(tag)))
    assert check_wheel(wheel, **JOB) == [
        "filename: interpreter tag cp312 is not cp311",
        "filename: platform tag macosx_11_0_arm64 is not a manylinux tag for x86_64 "
        "(auditwheel repair gives the wheel the one its symbols allow)",
    ]
    aarch = "cp311-cp311-manylinux_2_28_aarch64"
    wheel = write_wheel(
        tmp_path / f"factory_demo_ext-{VERSION}-{aarch}.whl", members(wheel=wheel_text(aarch))
    )
    assert check_wheel(wheel, **JOB) == [
        "filename: platform tag manylinux_2_28_aarch64 is not a manylinux tag for x86_64 "
        "(auditwheel repair gives the wheel the one its symbols allow)"
    ]
    assert not [p for p in check_wheel(wheel, **JOB, machine="aarch64") if p.startswith("filename:")]


def test_linux_tags_promise_nothing_and_are_refused(tmp_path: Path) -> None:
    tag = "cp311-cp311-linux_x86_64"
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{tag}.whl", members(wheel=wheel_text(tag)))
    assert check_wheel(wheel, **JOB) == [
        "filename: platform tag linux_x86_64 is not a manylinux tag for x86_64 "
        "(auditwheel repair gives the wheel the one its symbols allow)"
    ]


def test_vendored_torch_libraries_are_refused(tmp_path: Path) -> None:
    vendored = {
        "factory_demo_ext.libs/libc10-1a2b3c4d.so": b"\x7fELF not really",
        "factory_demo_ext.libs/libcudart-5e6f7a8b.so.13": b"\x7fELF not really",
    }
    problems = check_wheel(good_wheel(tmp_path, extra=vendored), **JOB)
    for member in vendored:
        assert (
            f"{member}: a vendored copy of a library torch provides at runtime "
            "(exclude it from auditwheel repair)"
        ) in problems


def test_invalid_filename_is_reported_and_the_rest_still_checked(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / "demo.whl", members(metadata=metadata_text(requires=())))
    problems = check_wheel(wheel, **JOB)
    assert problems[0].startswith("filename: Invalid wheel filename")
    assert "METADATA: torch requirement is none, expected exactly 'torch==2.14.*'" in problems


def test_not_a_zip(tmp_path: Path) -> None:
    wheel = tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl"
    wheel.write_bytes(b"PK\x03\x04 truncated")
    problems = check_wheel(wheel, **JOB)
    assert len(problems) == 1
    assert problems[0].startswith("zip: cannot be opened")


def test_wheel_file_tags_and_purelib(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, wheel=wheel_text("cp311-cp311-manylinux_2_28_x86_64", purelib=True))
    assert check_wheel(wheel, **JOB) == [
        "WHEEL: Root-Is-Purelib is true for a wheel with extension modules",
        f"WHEEL: Tag cp311-cp311-manylinux_2_28_x86_64 does not match the filename's {TAG}",
    ]


def test_two_dist_info_directories(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, extra={"other-1.0.dist-info/METADATA": b"Name: other\n"})
    assert check_wheel(wheel, **JOB) == [
        f"zip: expected one .dist-info directory, found {DIST_INFO}, other-1.0.dist-info"
    ]


# --- check_wheel: METADATA torch pin ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("requires", "shown"),
    [
        ((), "none"),
        (("torch",), "'torch'"),
        (("torch==2.13.*",), "'torch==2.13.*'"),
        (("torch==2.14.1",), "'torch==2.14.1'"),
        (('torch==2.14.*; extra == "cuda"',), "'torch==2.14.*; extra == \"cuda\"'"),
        (("torch==2.14.*", "torch>=2"), "'torch==2.14.*', 'torch>=2'"),
    ],
)
def test_torch_pin_must_be_exact(tmp_path: Path, requires: tuple[str, ...], shown: str) -> None:
    wheel = good_wheel(tmp_path, metadata=metadata_text(requires=requires))
    assert check_wheel(wheel, **JOB) == [
        f"METADATA: torch requirement is {shown}, expected exactly 'torch==2.14.*'"
    ]


# --- check_wheel: RECORD ------------------------------------------------------------------------------------


def test_record_hash_mismatch(tmp_path: Path) -> None:
    files = members()
    stale = record_hash(b"from factory_demo_ext import _C  # older\n")
    edit = {"factory_demo_ext/__init__.py": (stale, str(len(files["factory_demo_ext/__init__.py"])))}
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", files, record_edit=edit)
    [problem] = check_wheel(wheel, **JOB)
    assert problem.startswith("RECORD: factory_demo_ext/__init__.py hash mismatch (RECORD sha256=")


def test_record_size_mismatch_and_weak_hash(tmp_path: Path) -> None:
    files = members()
    init = files["factory_demo_ext/__init__.py"]
    edit = {
        "factory_demo_ext/__init__.py": (record_hash(init), "1"),
        f"{DIST_INFO}/top_level.txt": ("md5=abc", "17"),
    }
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", files, record_edit=edit)
    assert check_wheel(wheel, **JOB) == [
        f"RECORD: factory_demo_ext/__init__.py size mismatch (RECORD 1, file {len(init)})",
        f"RECORD: {DIST_INFO}/top_level.txt has no sha256 (or stronger) hash: 'md5=abc'",
    ]


def test_record_lists_a_missing_file_and_misses_a_present_one(tmp_path: Path) -> None:
    files = members()
    wheel = write_wheel(
        tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl",
        files,
        record_edit={"factory_demo_ext/gone.py": (record_hash(b""), "0")},
    )
    with zipfile.ZipFile(wheel, "a") as archive:
        archive.writestr("factory_demo_ext/sneaked_in.py", b"x = 1\n")
    assert check_wheel(wheel, **JOB) == [
        "RECORD: factory_demo_ext/sneaked_in.py is in the wheel but not listed",
        "RECORD: factory_demo_ext/gone.py is listed but not in the wheel",
    ]


def test_the_build_check_refuses_what_an_installer_would(tmp_path: Path) -> None:
    """The same archive check as publish's (`archive_problems`): no path out of the install directory."""
    files = {**members(), "../escape.py": b"x = 1\n"}
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", files)
    assert check_wheel(wheel, **JOB)[:2] == [
        "zip: '../escape.py' is a '..' path",
        "RECORD line 6: '../escape.py' is a '..' path",
    ]


def test_missing_record(tmp_path: Path) -> None:
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", members(), record=False)
    assert check_wheel(wheel, **JOB) == [f"{DIST_INFO}/RECORD: missing"]


def test_malformed_record_row(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        contents = {n: archive.read(n) for n in archive.namelist()}
    contents[f"{DIST_INFO}/RECORD"] += b"just-a-path\n"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in contents.items():
            archive.writestr(name, data)
    assert check_wheel(wheel, **JOB) == [f"RECORD line {len(members()) + 2}: expected 3 fields, got 1"]


# --- check_wheel: device code -------------------------------------------------------------------------------


def test_missing_and_unexpected_archs(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=fake_so([80, 86]))
    assert check_wheel(wheel, **JOB) == [
        f"{SO}: cubins for sm_80, sm_86, expected sm_80, sm_90 (missing sm_90; unexpected sm_86)"
    ]


def test_any_spelling_of_a_plain_arch_expects_its_generic_cubin(tmp_path: Path) -> None:
    assert check_wheel(good_wheel(tmp_path), **{**JOB, "archs": ("sm_80", "90")}) == []


@pytest.mark.parametrize(
    ("archs", "cubins"),
    [
        (("8.0", "9.0a"), ("sm_80", "sm_90a")),
        (("9.0a",), ("sm_90a",)),
        (("8.0", "10.0f", "12.0"), ("sm_80", "sm_100f", "sm_120")),
        (("9.0a", "10.0a", "12.0f"), ("sm_90a", "sm_100a", "sm_120f")),
        (("9.0", "9.0a"), ("sm_90", "sm_90a")),
    ],
)
def test_suffixed_archs_accept_exactly_their_targets(
    tmp_path: Path, archs: tuple[str, ...], cubins: tuple[str, ...]
) -> None:
    wheel = good_wheel(tmp_path, so=targets_so(*cubins))
    assert check_wheel(wheel, **{**JOB, "archs": archs}) == []


@pytest.mark.parametrize(
    ("archs", "cubins", "detail"),
    [
        # a generic sm_90 cubin lacks the sm_90a-only code (wgmma) the job asked for
        (("8.0", "9.0a"), ("sm_80", "sm_90"), "missing sm_90a; unexpected sm_90"),
        # an sm_90a cubin runs on 9.0 devices only, not on the 9.x a generic job covers
        (("8.0", "9.0"), ("sm_80", "sm_90a"), "missing sm_90; unexpected sm_90a"),
        (("8.0", "10.0f"), ("sm_80", "sm_100"), "missing sm_100f; unexpected sm_100"),
        (("8.0", "10.0f"), ("sm_80", "sm_100a"), "missing sm_100f; unexpected sm_100a"),
        (("8.0", "10.0"), ("sm_80", "sm_100f"), "missing sm_100; unexpected sm_100f"),
        (("9.0", "9.0a"), ("sm_90a",), "missing sm_90"),
        (("9.0a",), ("sm_90", "sm_90a"), "unexpected sm_90"),
    ],
)
def test_a_suffix_is_part_of_the_target(
    tmp_path: Path, archs: tuple[str, ...], cubins: tuple[str, ...], detail: str
) -> None:
    expected = ", ".join(Arch.parse(a).sm for a in sorted(archs, key=Arch.parse))
    wheel = good_wheel(tmp_path, so=targets_so(*cubins))
    assert check_wheel(wheel, **{**JOB, "archs": archs}) == [
        f"{SO}: cubins for {', '.join(cubins)}, expected {expected} ({detail})"
    ]


def test_targets_are_listed_by_arch_not_as_text(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=targets_so("sm_120", "sm_100f", "sm_90a", "sm_90", "sm_80"))
    assert check_wheel(wheel, **{**JOB, "archs": ("8.0",)}) == [
        f"{SO}: cubins for sm_80, sm_90, sm_90a, sm_100f, sm_120, expected sm_80 "
        "(unexpected sm_90, sm_90a, sm_100f, sm_120)"
    ]


def test_a_target_outside_the_arch_grammar_is_still_named(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=fake_so([80, 90, 7]))
    assert check_wheel(wheel, **JOB) == [
        f"{SO}: cubins for sm_80, sm_90, sm_7, expected sm_80, sm_90 (unexpected sm_7)"
    ]


def test_a_job_arch_outside_the_grammar_is_one_check_error(tmp_path: Path) -> None:
    with pytest.raises(CheckError, match=r"'8\.0\+PTX' is not a compute capability"):
        check_wheel(good_wheel(tmp_path), **{**JOB, "archs": ("8.0+PTX",)})


def test_ptx_alone_is_not_enough(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=fake_so([], [80, 90]))
    assert check_wheel(wheel, **JOB) == [
        f"{SO}: no cubins (PTX only: compute_80, compute_90), expected sm_80, sm_90"
    ]
    wheel = good_wheel(tmp_path, so=targets_so("compute_90a"))
    assert check_wheel(wheel, **{**JOB, "archs": ("9.0a",)}) == [
        f"{SO}: no cubins (PTX only: compute_90a), expected sm_90a"
    ]


def test_extra_ptx_next_to_exact_cubins_is_accepted(tmp_path: Path) -> None:
    assert check_wheel(good_wheel(tmp_path, so=fake_so([80, 90], [90])), **JOB) == []
    wheel = good_wheel(tmp_path, so=targets_so("sm_80", "sm_90a", "compute_90a", "compute_80"))
    assert check_wheel(wheel, **{**JOB, "archs": ("8.0", "9.0a")}) == []


def test_extension_without_device_code(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=make_elf({".text": b"\x90"}))
    assert check_wheel(wheel, **JOB) == [f"{SO}: no cubins, expected sm_80, sm_90"]


def test_every_extension_is_checked_and_vendored_libraries_are_not(tmp_path: Path) -> None:
    extra = {
        "factory_demo_ext/_helper.cpython-311-x86_64-linux-gnu.so": fake_so([80]),
        "factory_demo_ext.libs/libgomp-a34b3233.so.1": make_elf({".text": b"\x90"}),
    }
    wheel = good_wheel(tmp_path, extra=extra)
    assert check_wheel(wheel, **JOB) == [
        "factory_demo_ext/_helper.cpython-311-x86_64-linux-gnu.so: cubins for sm_80, expected sm_80, sm_90 "
        "(missing sm_90)"
    ]


VERSION_SO = "factory_demo_ext/_version_cuda.so"
HOST_ONLY = ("factory_demo_ext/_version_*.so",)


def test_a_host_only_module_the_recipe_names_may_carry_no_device_code(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, extra={VERSION_SO: make_elf({".text": b"\x90"})})
    assert check_wheel(wheel, **JOB) == [f"{VERSION_SO}: no cubins, expected sm_80, sm_90"]
    assert check_wheel(wheel, **JOB, host_only=HOST_ONLY) == []


def test_a_host_only_module_with_device_code_is_checked_as_any_other(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, extra={VERSION_SO: fake_so([75])})
    assert check_wheel(wheel, **JOB, host_only=HOST_ONLY) == [
        f"{VERSION_SO}: cubins for sm_75, expected sm_80, sm_90 (missing sm_80, sm_90; unexpected sm_75)"
    ]


def test_host_only_globs_do_not_cross_directories(tmp_path: Path) -> None:
    nested = "factory_demo_ext/sub/_version_cuda.so"
    wheel = good_wheel(tmp_path, extra={nested: make_elf({".text": b"\x90"})})
    assert check_wheel(wheel, **JOB, host_only=HOST_ONLY) == [f"{nested}: no cubins, expected sm_80, sm_90"]
    assert check_wheel(wheel, **JOB, host_only=("factory_demo_ext/*",)) == [
        f"{nested}: no cubins, expected sm_80, sm_90"
    ]


def test_a_wheel_whose_modules_are_all_host_only_is_refused(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=make_elf({".text": b"\x90"}))
    assert check_wheel(wheel, **JOB, host_only=("factory_demo_ext/*.so",)) == [
        "wheel: no extension module with device code (all are host-only)"
    ]


@pytest.mark.parametrize(
    ("member", "pattern", "matches"),
    [
        ("torch_scatter/_version_cuda.so", "torch_scatter/_version_*.so", True),
        ("torch_scatter/_version_cpu.so", "torch_scatter/_version_*.so", True),
        ("torch_scatter/_scatter_cuda.so", "torch_scatter/_version_*.so", False),
        ("torch_scatter/x/_version_cuda.so", "torch_scatter/*.so", False),
        ("torch_scatter/_version_cuda.so", "*/_version_cuda.so", True),
        ("Torch_Scatter/_version_cuda.so", "torch_scatter/_version_*.so", False),
    ],
)
def test_library_glob_matches_segment_by_segment(member: str, pattern: str, matches: bool) -> None:
    assert library_glob_matches(member, pattern) is matches


@pytest.mark.parametrize(
    ("pattern", "problem"),
    [
        ("torch_scatter/_version_*.so", None),
        ("pkg/*", None),
        ("", "must be a non-empty glob"),
        (3, "must be a non-empty glob"),
        ("/abs/x.so", "relative"),
        (" pkg/x.so", "relative"),
        ("pkg\\x.so", "relative"),
        ("pkg/../x.so", "'..'"),
        ("pkg//x.so", "empty"),
        ("pkg/x.py", "end in .so"),
    ],
)
def test_library_glob_problem(pattern: object, problem: str | None) -> None:
    found = library_glob_problem(pattern)
    assert (found is None) if problem is None else (found is not None and problem in found)


def test_a_wheel_without_extension_modules(tmp_path: Path) -> None:
    files = members()
    del files[SO]
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{TAG}.whl", files)
    assert check_wheel(wheel, **JOB) == ["wheel: no extension module (.so) found"]


def test_an_extension_that_is_not_elf(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, so=b"#!/bin/sh\necho not a library\n")
    assert check_wheel(wheel, **JOB) == [f"{SO}: not an ELF file"]


# --- a real nvcc-built extension ----------------------------------------------------------------------------


def compile_nvcc_so(nvcc: str, out: Path, gencodes: list[str]) -> bytes:
    source = out / "k.cu"
    source.write_text(
        "__global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\nvoid go(float* x) { k<<<1, 32>>>(x); }\n"
    )
    command = [
        nvcc,
        "-shared",
        "-nodlink",
        "-Xcompiler",
        "-fPIC",
        *[f"-gencode={g}" for g in gencodes],
        str(source),
        "-o",
        str(out / "k.so"),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return (out / "k.so").read_bytes()


@pytest.fixture(scope="module")
def nvcc_so(toolkit_nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    gencodes = ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"]
    return compile_nvcc_so(toolkit_nvcc, tmp_path_factory.mktemp("nvcc"), gencodes)


@pytest.fixture(scope="module")
def nvcc_90a_so(toolkit_nvcc: str, tmp_path_factory: pytest.TempPathFactory) -> bytes:
    gencodes = ["arch=compute_80,code=sm_80", "arch=compute_90a,code=sm_90a"]
    return compile_nvcc_so(toolkit_nvcc, tmp_path_factory.mktemp("nvcc90a"), gencodes)


def test_a_real_nvcc_extension_is_checked_exactly(tmp_path: Path, nvcc_so: bytes) -> None:
    # As the build runner accepts a wheel: pin torch, then retag, then check.
    built = "cp311-cp311-linux_x86_64"
    files = members(so=nvcc_so, wheel=wheel_text(built), metadata=metadata_text(requires=("torch>=2",)))
    wheel = write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{built}.whl", files)
    pin_torch_requirement(wheel, "2.14.1+cu130")
    assert check_wheel(wheel, **JOB)[0].startswith("filename: platform tag linux_x86_64 is not a manylinux")
    wheel = repair_platform_tag(wheel, tmp_path / "repaired")
    assert wheel.name.startswith(f"factory_demo_ext-{VERSION}-cp311-cp311-manylinux_2_")
    assert check_wheel(wheel, **JOB) == []
    assert check_wheel(wheel, **{**JOB, "archs": ("8.0", "9.0", "12.0")}) == [
        f"{SO}: cubins for sm_80, sm_90, expected sm_80, sm_90, sm_120 (missing sm_120)"
    ]


def test_a_real_sm_90a_cubin_is_only_what_a_9_0a_job_accepts(tmp_path: Path, nvcc_90a_so: bytes) -> None:
    assert device_code(nvcc_90a_so).cubin_targets == {"sm_80", "sm_90a"}
    built = "cp311-cp311-linux_x86_64"
    files = members(so=nvcc_90a_so, wheel=wheel_text(built))
    wheel = repair_platform_tag(
        write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{built}.whl", files), tmp_path / "repaired"
    )
    assert check_wheel(wheel, **{**JOB, "archs": ("8.0", "9.0a")}) == []
    assert check_wheel(wheel, **JOB) == [
        f"{SO}: cubins for sm_80, sm_90a, expected sm_80, sm_90 (missing sm_90; unexpected sm_90a)"
    ]


def test_a_real_generic_sm_90_cubin_does_not_satisfy_a_9_0a_job(tmp_path: Path, nvcc_so: bytes) -> None:
    built = "cp311-cp311-linux_x86_64"
    files = members(so=nvcc_so, wheel=wheel_text(built))
    wheel = repair_platform_tag(
        write_wheel(tmp_path / f"factory_demo_ext-{VERSION}-{built}.whl", files), tmp_path / "repaired"
    )
    assert check_wheel(wheel, **{**JOB, "archs": ("8.0", "9.0a")}) == [
        f"{SO}: cubins for sm_80, sm_90, expected sm_80, sm_90a (missing sm_90a; unexpected sm_90)"
    ]


# --- the in-container import check --------------------------------------------------------------------------


def run_script(script: str, *, cwd: Path, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    if path is not None:
        env["PYTHONPATH"] = str(path)
    return subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A stand-in site-packages with a fake torch (the real one is gigabytes) and an installed module."""
    site = tmp_path / "site"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("__version__ = '2.14.1+cu130'\nfrom torch import version\n")
    (site / "torch" / "version.py").write_text("cuda = '13.0'\n")
    (site / "demo_mod").mkdir()
    (site / "demo_mod" / "__init__.py").write_text("import torch\n__version__ = '0.1.0+x'\n")
    return site


def test_import_check_reports_the_installed_module(tmp_path: Path, site: Path) -> None:
    result = run_script(import_check_script("demo_mod"), cwd=tmp_path, path=site)
    assert result.returncode == 0, result.stderr
    report = parse_import_check(result.stdout)
    assert report == {
        "ok": True,
        "module": "demo_mod",
        "file": str(site / "demo_mod" / "__init__.py"),
        "version": "0.1.0+x",
        "torch": "2.14.1+cu130",
        "cuda": "13.0",
    }
    assert "torch 2.14.1+cu130 cuda 13.0" in result.stdout


def test_import_check_fails_when_the_module_is_missing(tmp_path: Path, site: Path) -> None:
    result = run_script(import_check_script("absent_mod"), cwd=tmp_path, path=site)
    assert result.returncode == 1
    report = parse_import_check(result.stdout)
    assert report is not None
    assert report["ok"] is False
    assert str(report["error"]).startswith("ModuleNotFoundError: No module named 'absent_mod'")


def test_import_check_ignores_a_source_tree_in_the_working_directory(tmp_path: Path, site: Path) -> None:
    (tmp_path / "tree_only").mkdir()
    (tmp_path / "tree_only" / "__init__.py").write_text("")
    result = run_script(import_check_script("tree_only"), cwd=tmp_path, path=site)
    assert result.returncode == 1
    assert "No module named 'tree_only'" in result.stdout


def test_import_check_fails_without_torch(tmp_path: Path) -> None:
    result = run_script(import_check_script("json"), cwd=tmp_path)
    assert result.returncode == 1
    report = parse_import_check(result.stdout)
    assert report is not None
    assert report["error"] == "ModuleNotFoundError: No module named 'torch'"


@pytest.mark.parametrize("name", ["", "flash-attn", "os; import shutil", "a..b", "1abc"])
def test_import_check_refuses_non_module_names(name: str) -> None:
    with pytest.raises(ValueError, match="not a dotted Python module name"):
        import_check_script(name)


def test_parse_import_check_takes_the_last_marker_line() -> None:
    first = json.dumps({"ok": False})
    last = json.dumps({"ok": True})
    assert parse_import_check(f"FACTORY-IMPORT-CHECK {first}\nnoise\nFACTORY-IMPORT-CHECK {last}\n") == {
        "ok": True
    }
    assert parse_import_check("no marker here") is None
    assert parse_import_check("FACTORY-IMPORT-CHECK {broken") is None
    assert parse_import_check("FACTORY-IMPORT-CHECK [1]") is None


def test_the_recipes_extra_requires_go_after_the_pin_replacing_the_same_projects() -> None:
    text = metadata_text(
        requires=("einops", "torch>=2.0", "Torch-Scatter<2 ; python_version < '3.9'", "numpy")
    )
    pinned = pin_torch_in_metadata(text, "2.14.1", requires=("torch-scatter>=2.1", "six"))
    headers = pinned.split("\n\n", 1)[0].splitlines()
    assert [h for h in headers if h.startswith("Requires-Dist")] == [
        "Requires-Dist: einops",
        "Requires-Dist: torch==2.14.*",
        "Requires-Dist: torch-scatter>=2.1",
        "Requires-Dist: six",
        "Requires-Dist: numpy",
    ]
    assert pin_torch_in_metadata(text, "2.14.1", requires=()) == pin_torch_in_metadata(text, "2.14.1")


def test_a_wheel_pinned_with_the_recipes_extra_requires_passes_its_check(tmp_path: Path) -> None:
    wheel = good_wheel(tmp_path, metadata=metadata_text(requires=("torch>=2.0", "einops")))
    pin_torch_requirement(wheel, "2.14.1", requires=("torch-scatter>=2.1",))
    assert check_wheel(wheel, **JOB) == []
    with zipfile.ZipFile(wheel) as archive:
        assert record_problems(archive, f"{DIST_INFO}/RECORD") == []
        metadata = archive.read(f"{DIST_INFO}/METADATA").decode()
    assert (
        "Requires-Dist: torch==2.14.*\nRequires-Dist: torch-scatter>=2.1\nRequires-Dist: einops\n" in metadata
    )


def test_a_module_of_another_machine_is_refused(tmp_path: Path) -> None:
    """An x86_64 extension in a wheel of an aarch64 job (a build that took the wrong compiler): one line."""
    from factory.wheel.checks import machine_problems

    wheel = good_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as zf:
        assert machine_problems(zf, "x86_64") == []
        assert machine_problems(zf, "aarch64") == [f"{SO}: built for x86_64, not for the wheel's aarch64"]
        assert machine_problems(zf, "riscv64") == []  # a machine the table lacks is judged by its tags
