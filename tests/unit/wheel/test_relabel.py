"""Giving a built wheel the variant's local version (`wheelcheck.set_local_version`), on wheels zipped by
hand: file name, .dist-info and .data names, METADATA and RECORD set together; pip then installs it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest
from packaging.version import Version

from factory.core.errors import CheckError
from factory.wheel.checks import (
    check_wheel,
    labelled_version,
    relabelled_name,
    set_local_version,
    set_metadata_version,
    wheel_archive_problems,
)


def _load_sibling(path: Path) -> ModuleType:
    name = f"_factory_test_helpers_{path.stem}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


helpers = _load_sibling(Path(__file__).with_name("test_wheelcheck.py"))
LABEL, TAG, JOB = helpers.LABEL, helpers.TAG, helpers.JOB
PLAIN = "factory_demo_ext-0.1.0"


def unlabelled_wheel(
    tmp_path: Path, *, version: str = "0.1.0", extra: dict[str, bytes] | None = None
) -> Path:
    """What a setup.py that reads no label builds: version 0.1.0 everywhere, a .data script too."""
    stem = f"factory_demo_ext-{version}"
    files = helpers.members(
        dist_info=f"{stem}.dist-info",
        metadata=helpers.metadata_text(version=version),
        extra={f"{stem}.data/scripts/demo-tool": b"#!python\nprint('hi')\n", **(extra or {})},
    )
    return helpers.write_wheel(tmp_path / f"{stem}-{TAG}.whl", files)


def contents(wheel: Path) -> dict[str, bytes]:
    with zipfile.ZipFile(wheel) as archive:
        return {n: archive.read(n) for n in archive.namelist()}


def test_the_label_is_set_in_name_dist_info_data_metadata_and_record(tmp_path: Path) -> None:
    wheel = unlabelled_wheel(tmp_path)
    before = contents(wheel)
    labelled = set_local_version(wheel, LABEL)
    assert labelled is not None and labelled.name == f"factory_demo_ext-0.1.0+{LABEL}-{TAG}.whl"
    assert not wheel.exists() and [p.name for p in tmp_path.iterdir()] == [labelled.name]  # no temporaries
    assert wheel_archive_problems(labelled) == []  # RECORD: every path renamed, every hash right
    after = contents(labelled)
    new = f"factory_demo_ext-0.1.0+{LABEL}"
    assert sorted(after) == sorted(
        n.replace(f"{PLAIN}.dist-info/", f"{new}.dist-info/").replace(f"{PLAIN}.data/", f"{new}.data/")
        for n in before
    )
    assert f"Version: 0.1.0+{LABEL}" in after[f"{new}.dist-info/METADATA"].decode().splitlines()
    assert after[f"{new}.dist-info/WHEEL"] == before[f"{PLAIN}.dist-info/WHEEL"]  # untouched
    assert after[helpers.SO] == before[helpers.SO]
    assert after[f"{new}.data/scripts/demo-tool"] == before[f"{PLAIN}.data/scripts/demo-tool"]
    record = after[f"{new}.dist-info/RECORD"].decode()
    assert PLAIN + "." not in record and f"{new}.dist-info/RECORD,," in record.splitlines()
    # the body of METADATA (its long description) is left as it was
    assert (
        after[f"{new}.dist-info/METADATA"]
        .decode()
        .endswith(before[f"{PLAIN}.dist-info/METADATA"].decode().split("\n\n", 1)[1])
    )
    assert check_wheel(labelled, **JOB) == []


def test_pip_installs_the_relabelled_wheel_and_its_metadata_has_the_label(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    labelled = set_local_version(unlabelled_wheel(tmp_path / "w"), LABEL)
    assert labelled is not None
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
         "--ignore-requires-python", str(labelled)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    shown = subprocess.run(
        [sys.executable, "-I", "-c", "import importlib.metadata as m, sys; sys.path.insert(0, sys.argv[1]); "
         "print(m.version('factory-demo-ext'))", str(target)],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    assert shown == f"0.1.0+{LABEL}"


def test_a_wheel_with_the_label_is_left_as_it_is(tmp_path: Path) -> None:
    wheel = helpers.good_wheel(tmp_path)
    before = wheel.read_bytes()
    assert set_local_version(wheel, LABEL) is None
    assert wheel.read_bytes() == before


def test_a_wheel_with_another_local_version_is_refused_in_one_line(tmp_path: Path) -> None:
    wheel = unlabelled_wheel(tmp_path, version="0.1.0+pt214cu130")
    with pytest.raises(CheckError) as caught:
        set_local_version(wheel, LABEL)
    assert "\n" not in str(caught.value)
    assert "carries the local version pt214cu130, not the variant's" in str(caught.value)
    assert wheel.exists()


@pytest.mark.parametrize(
    ("extra", "why"),
    [
        ({"../evil.py": b"x"}, "'..' path"),
        ({"/etc/evil": b"x"}, "an absolute path"),
    ],
)
def test_a_hostile_wheel_is_refused_and_nothing_is_written(
    tmp_path: Path, extra: dict[str, bytes], why: str
) -> None:
    wheel = unlabelled_wheel(tmp_path, extra=extra)
    with pytest.raises(CheckError, match=why):
        set_local_version(wheel, LABEL)
    assert [p.name for p in tmp_path.iterdir()] == [wheel.name]


def test_a_record_that_lies_is_refused(tmp_path: Path) -> None:
    stem = "factory_demo_ext-0.1.0"
    files = helpers.members(dist_info=f"{stem}.dist-info", metadata=helpers.metadata_text(version="0.1.0"))
    wheel = helpers.write_wheel(
        tmp_path / f"{stem}-{TAG}.whl", files, record_edit={helpers.SO: ("sha256=AAAA", "3")}
    )
    with pytest.raises(CheckError, match="RECORD"):
        set_local_version(wheel, LABEL)


def test_versions_keep_epoch_pre_post_and_dev_parts() -> None:
    assert labelled_version(Version("1!2.0rc1.post2.dev3"), LABEL) == Version(f"1!2.0rc1.post2.dev3+{LABEL}")
    assert labelled_version(Version(f"0.1+{LABEL}"), LABEL) is None
    renamed = relabelled_name(f"a_b-0.1-1build-{TAG}.whl", Version(f"0.1+{LABEL}"))
    assert renamed == f"a_b-0.1+{LABEL}-1build-{TAG}.whl"


def test_metadata_gets_one_version_header_set_and_nothing_else_changed() -> None:
    text = "Metadata-Version: 2.1\r\nName: x\r\nVersion: 0.1\r\nSummary: s\r\n\r\nVersion: in the body\r\n"
    assert set_metadata_version(text, Version("0.1+a.b")) == text.replace(
        "Version: 0.1\r\n", "Version: 0.1+a.b\r\n", 1
    )
    with pytest.raises(CheckError, match="2 Version headers"):
        set_metadata_version("Name: x\nVersion: 1\nVersion: 2\n", Version("1"))
