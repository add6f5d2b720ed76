"""Hostile input and damaged state against `factory publish` and `factory index repair` (local directory
stores; the S3 side is in test_publish_s3.py): one line, the right exit code, nothing published lost."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from publish_helpers import LABEL_NEW, VID_NEW, make_wheel

from factory.publish import index

pytestmark = pytest.mark.integration
FACTORY = str(Path(sys.executable).with_name("factory"))
PAGE = f"simple/{VID_NEW}/demo-ext/index.json"


def factory(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([FACTORY, *args], capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess[str], code: int) -> str:
    assert proc.returncode == code, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def listed(idx: Path) -> list[str]:
    return [r.filename for r in index.records_from_project_json((idx / PAGE).read_bytes())]


def published(tmp_path: Path) -> tuple[Path, Path]:
    """An index holding demo_ext 0.1.0+<label>, and that wheel."""
    wheel = make_wheel(tmp_path / "wh", name="demo-ext", payload="genuine")
    proc = factory("publish", str(tmp_path / "wh"), "--to", str(tmp_path / "idx"))
    assert proc.returncode == 0, proc.stderr
    return tmp_path / "idx", wheel


def impostor_dir(tmp_path: Path, source: Path, filename: str) -> Path:
    directory = tmp_path / "impostor"
    directory.mkdir(parents=True)
    shutil.copy(source, directory / filename)
    return directory


def test_other_spellings_of_a_published_release_are_refused(tmp_path: Path) -> None:
    idx, wheel = published(tmp_path)
    upper = make_wheel(tmp_path / "evil", name="demo-ext", payload="impostor")
    tag = "py3-none-any"
    spellings = {
        f"Demo_Ext-0.1.0+{LABEL_NEW.upper()}-{tag}.whl": upper,
        f"demo_ext-0.1.0.0+{LABEL_NEW}-{tag}.whl": make_wheel(
            tmp_path / "evil0", name="demo-ext", version="0.1.0.0", payload="impostor"
        ),
        f"demo_ext-0.1.0+{LABEL_NEW}-1-{tag}.whl": upper,  # a build tag outranks no build tag in pip
    }
    before = sorted(p.relative_to(idx) for p in idx.rglob("*") if p.is_file())
    for n, (filename, source) in enumerate(spellings.items()):
        directory = impostor_dir(tmp_path / str(n), source, filename)
        line = one_line_error(factory("publish", str(directory), "--to", str(idx)), 1)
        assert "bump the version" in line, line
    assert listed(idx) == [wheel.name]
    assert sorted(p.relative_to(idx) for p in idx.rglob("*") if p.is_file()) == before
    # what an installer gets for that release is the file published first
    pip = [sys.executable, "-m", "pip", "download", "--isolated", "--no-deps", "--disable-pip-version-check"]
    download = subprocess.run(
        [
            *pip,
            *("--index-url", (idx / "simple" / VID_NEW).as_uri() + "/", "-d", str(tmp_path / "got")),
            f"demo-ext==0.1.0+{LABEL_NEW}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert download.returncode == 0, download.stdout + download.stderr
    assert [p.read_bytes() for p in (tmp_path / "got").iterdir()] == [wheel.read_bytes()]


def test_a_wheel_is_published_under_its_canonical_filename(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "src", name="demo-ext")
    odd = impostor_dir(tmp_path, wheel, wheel.name.replace("demo_ext", "Demo_Ext").replace("cu13", "CU13"))
    proc = factory("publish", str(odd), "--to", str(tmp_path / "idx"))
    assert proc.returncode == 0, proc.stderr
    assert listed(tmp_path / "idx") == [wheel.name]
    assert (tmp_path / "idx" / "files" / VID_NEW / wheel.name).read_bytes() == wheel.read_bytes()
    # the same bytes under either spelling again: nothing to do
    assert factory("publish", str(tmp_path / "src"), "--to", str(tmp_path / "idx")).returncode == 0
    assert listed(tmp_path / "idx") == [wheel.name]


def test_a_wheel_whose_metadata_contradicts_its_filename_is_refused(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / "src", name="demo-ext", version="0.2.0")
    directory = impostor_dir(tmp_path, wheel, wheel.name.replace("0.2.0", "0.1.0"))
    line = one_line_error(factory("publish", str(directory), "--to", str(tmp_path / "idx")), 2)
    assert "METADATA Version" in line and "inconsistent" in line
    assert not (tmp_path / "idx" / "files").exists()


def test_a_bad_report_entry_publishes_nothing(tmp_path: Path) -> None:
    make_wheel(tmp_path / "wh", name="demo-ext")
    report = tmp_path / "report.json"
    job = {"variant_id": VID_NEW, "python": "3.11", "result": "ok"}
    report.write_text(json.dumps({"jobs": [{**job, "wheel": None}, {**job, "wheel": "notes.txt"}]}))
    line = one_line_error(
        factory("publish", str(tmp_path / "wh"), "--to", str(tmp_path / "idx"), "--report", str(report)), 2
    )
    assert "job 2" in line and "notes.txt" in line
    assert not (tmp_path / "idx" / "files").exists()


@pytest.mark.parametrize("to", ["/dev/null/x", "/proc/self/idx"])
def test_a_destination_that_cannot_hold_an_index_is_a_usage_error(tmp_path: Path, to: str) -> None:
    make_wheel(tmp_path / "wh", name="demo-ext")
    line = one_line_error(factory("publish", str(tmp_path / "wh"), "--to", to), 2)
    assert to in line


def damage(idx: Path) -> dict[str, bytes]:
    """Four ways the state files of an index get damaged (each of them a traceback before)."""
    return {
        PAGE: b"\x00garbage{",
        "simple/variants.json": b"[1, 2, 3]\n",
        "matrix.json": json.dumps({"cells": [{"project": 1}]}).encode(),
        f"simple/{VID_NEW}/index.json": b"",
    }


@pytest.mark.parametrize("key", list(damage(Path())))
def test_damaged_state_is_named_and_repair_rebuilds_it(tmp_path: Path, key: str) -> None:
    idx, wheel = published(tmp_path)
    good = (idx / key).read_bytes()
    (idx / key).write_bytes(damage(idx)[key])
    newer = make_wheel(tmp_path / "newer", name="demo-ext", version="0.2.0")
    line = one_line_error(factory("publish", str(tmp_path / "newer"), "--to", str(idx)), 1)
    assert key in line and "damaged" in line and f"factory index repair --to {idx}" in line
    assert not (idx / "files" / VID_NEW / newer.name).exists()  # refused before anything was written

    proc = factory("index", "repair", "--to", str(idx))
    assert proc.returncode == 0, proc.stderr
    assert "1 wheels in 1 variant indexes" in proc.stdout
    if key == PAGE:  # the upload time was only in the damaged page: repair says when it repaired
        assert [{**f, "upload-time": ""} for f in json.loads(good)["files"]] == [
            {**f, "upload-time": ""} for f in json.loads((idx / key).read_bytes())["files"]
        ]
    else:
        assert (idx / key).read_bytes() == good
    assert listed(idx) == [wheel.name]
    assert factory("publish", str(tmp_path / "newer"), "--to", str(idx)).returncode == 0
    assert listed(idx) == sorted([wheel.name, newer.name])


def test_repair_lists_one_file_per_release_and_says_what_it_left_off(tmp_path: Path) -> None:
    idx, wheel = published(tmp_path)
    # files that reached the store by other means than publish (an older factory, a copy by hand)
    files = idx / "files" / VID_NEW
    shutil.copy(wheel, files / wheel.name.replace("demo_ext", "Demo_Ext"))
    zero = make_wheel(tmp_path / "zero", name="demo-ext", version="0.1.0.0", payload="impostor")
    shutil.copy(zero, files / zero.name)
    (idx / PAGE).write_text("{}")
    proc = factory("index", "repair", "--to", str(idx))
    assert proc.returncode == 0, proc.stderr
    assert listed(idx) == [wheel.name]
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("not listed: ")]
    assert len(skipped) == 2 and "canonical" in skipped[0] and "same release" in skipped[1], proc.stdout


def test_repair_of_a_directory_without_an_index_is_a_usage_error(tmp_path: Path) -> None:
    line = one_line_error(factory("index", "repair", "--to", str(tmp_path)), 2)
    assert "not a published index" in line
