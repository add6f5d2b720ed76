"""The formats that cross the container boundary read back what they write, and nothing else."""

from __future__ import annotations

import json

import pytest

from factory.container import protocol
from factory.container.protocol import Measurement, ProfileEntry


def test_a_progress_mark_reads_back_and_notes_are_no_marks() -> None:
    line = protocol.mark_line(phase="build", objects_kept=3)
    assert protocol.is_marked(line)
    assert protocol.parse_mark(line) == {"phase": "build", "objects_kept": 3}
    note = protocol.note_line("attempt 1: MAX_JOBS=4")
    assert protocol.is_marked(note) and protocol.parse_mark(note) is None
    for other in ("[1/9] nvcc -c a.cu", "::factory::{}", '::factory:: ["a"]', "::factory-compile:: {}"):
        assert protocol.parse_mark(other) is None


def test_a_measurement_reads_back_from_its_file_line_and_its_log_line() -> None:
    record = {"key": "a.cu|compute_80|1", "peak_bytes": 5, "wall_s": 2.0, "rc": 0, "envelope": [5, 1],
              "rise": [1, 5], "cpu_s": 1.5, "mem_s": 7, "waited_s": 0.1}  # fmt: skip
    want = Measurement(key="a.cu|compute_80|1", peak_bytes=5, wall_s=2.0, envelope=(5, 1), rise=(1, 5),
                       cpu_s=1.5, mem_s=7.0)  # fmt: skip
    assert protocol.parse_measurement(protocol.measurement_json(record)) == want
    assert protocol.parse_measurement("[3/9] " + protocol.measurement_line(record)) == want
    cut = protocol.measurement_json(record)[:20]
    for other in (cut, "[1/9] nvcc -c a.cu", protocol.mark_line(phase="build"), '{"key": "a"}'):
        assert protocol.parse_measurement(other) is None


def test_a_profile_reads_back_and_a_bad_one_is_said() -> None:
    entries = {"a.cu|compute_80|1": ProfileEntry(peak_bytes=5, wall_s=None, samples=2, envelope=(5,))}
    data = json.loads(json.dumps(protocol.profile_json("flash-attn", "2.8.3", entries)))
    assert data["format"] == protocol.PROFILE_FORMAT
    assert protocol.parse_profile(data) == ("flash-attn", "2.8.3", entries)
    with pytest.raises(ValueError, match="no 'entries' object"):
        protocol.parse_profile([])
    with pytest.raises(ValueError, match="bad profile entry 'k'"):
        protocol.parse_profile({"entries": {"k": {"wall_s": 1.0}}})


def test_a_compile_key_reads_back() -> None:
    key = protocol.compile_key("/build/src/flash_fwd.cu", ["compute_90", "compute_80"], 2)
    assert key == "flash_fwd.cu|compute_80,compute_90|2"
    assert protocol.parse_compile_key(key) == ("flash_fwd.cu", ("compute_80", "compute_90"), 2)
    assert protocol.parse_compile_key("not a key") is None


def test_owner_files() -> None:
    assert protocol.parse_owner(protocol.owner_json(42, "vm")) == (42, "vm")
    for bad in ("", "[]", "{}", '{"pid": "x", "host": "vm"}', "not json"):
        assert protocol.parse_owner(bad) is None


def test_job_listing_round_trip_and_bad_entries() -> None:
    dirs = [
        protocol.JobDir(name="demo-py3.11-aaaaaaaaaaaa", owner=protocol.owner_json(1, "h"), idle_s=0.0),
        protocol.JobDir(name="old-bbbbbbbbbbbb", owner=None, idle_s=7200.5),
    ]
    out = "\n".join(["noise", protocol.job_listing_line(dirs), protocol.mark_line(phase="x")])
    assert protocol.parse_job_listing(out) == dirs
    bad = protocol.mark_line(
        jobs=[
            {"name": "../etc", "owner": None, "idle_s": 1},
            {"name": "a/b", "owner": None, "idle_s": 1},
            {"name": "x", "owner": 3, "idle_s": 1},
            {"name": "y", "owner": None},
            "z",
            {"name": "ok", "owner": None, "idle_s": "2"},
        ]
    )
    assert protocol.parse_job_listing(bad) == [protocol.JobDir(name="ok", owner=None, idle_s=2.0)]
    assert not protocol.is_job_dir_name("..") and not protocol.is_job_dir_name("")


def test_removed_job_dirs() -> None:
    lines = [protocol.removed_line("a-1"), "x", protocol.mark_line(removed=3), protocol.removed_line("b-2")]
    out = "\n".join(lines)
    assert protocol.parse_removed(out) == ["a-1", "b-2"]
