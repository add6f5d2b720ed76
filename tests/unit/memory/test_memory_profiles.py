"""Learned profiles: merging raises peaks, files round-trip, shipped profiles import, wrapper log lines
parse."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.memory import profiles
from factory.memory.profiles import Measurement, Profile


def test_merge_raises_peak_and_averages_time() -> None:
    p = profiles.merge(Profile(package="flash-attn", version="2.8.3"), [
        Measurement(key="a", peak_bytes=100, wall_s=10.0, envelope=(100, 10)),
        Measurement(key="a", peak_bytes=80, wall_s=20.0, envelope=(80, 40)),
        Measurement(key="a", peak_bytes=150, wall_s=99.0, rc=137),  # killed: raises the peak, not the time
    ])  # fmt: skip
    e = p.entries["a"]
    assert e.peak_bytes == 150
    assert e.wall_s == 15.0
    assert e.samples == 3
    assert e.envelope == (100, 40)


def test_save_load_round_trip_and_paths(tmp_path: Path) -> None:
    path = profiles.profile_path("Flash_Attn", "2.8.3", home=tmp_path)
    assert path == tmp_path / "profiles" / "flash-attn" / "2.8.3.json"
    p = profiles.merge(
        Profile(package="flash-attn", version="2.8.3"), [Measurement(key="k", peak_bytes=5, wall_s=1)]
    )
    profiles.save_profile(p, path)
    assert profiles.load_profile(path) == p
    assert profiles.load_profile(tmp_path / "missing.json", package="x", version="1").entries == {}


def test_read_measurements_from_jsonl_and_log(tmp_path: Path) -> None:
    rec = {"key": "k", "peak_bytes": 7, "wall_s": 1.5, "rc": 0, "envelope": [7]}
    log = tmp_path / "build.log"
    log.write_text(f'[1/9] nvcc ...\n::factory-compile:: {json.dumps(rec)}\n::factory-compile:: {{"key": \n')
    assert profiles.read_measurements(log) == [Measurement(key="k", peak_bytes=7, wall_s=1.5, envelope=(7,))]


def test_record_export_import(tmp_path: Path) -> None:
    measurements = tmp_path / "m.jsonl"
    measurements.write_text(json.dumps({"key": "k", "peak_bytes": 9, "wall_s": 2.0}) + "\n")
    profiles.record("flash-attn", "2.8.3", measurements, home=tmp_path / "a")
    shipped = profiles.export_profile("flash-attn", "2.8.3", tmp_path / "index", home=tmp_path / "a")
    assert shipped is not None and shipped.name == "flash-attn-2.8.3.compile-profile.json"
    merged = profiles.import_profile(shipped, home=tmp_path / "b")
    assert merged.entries["k"].peak_bytes == 9
    assert profiles.export_profile("nothing", "1", tmp_path / "index", home=tmp_path / "a") is None


def test_bad_profile_is_config_error(tmp_path: Path) -> None:
    bad = tmp_path / "p.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"p\.json"):
        profiles.load_profile(bad)
    bad.write_text(json.dumps({"entries": {"k": {"wall_s": 1}}}))
    with pytest.raises(ConfigError, match="bad profile entry"):
        profiles.load_profile(bad)


def test_raised_per_arch() -> None:
    p = profiles.merge(Profile(package="p", version="1"), [Measurement(key="f.cu|compute_80,compute_90|4",
                                                                       peak_bytes=20, wall_s=1)])  # fmt: skip
    assert profiles.raised_per_arch(3, p, base_bytes=0) == 10
    assert profiles.raised_per_arch(30, p, base_bytes=0) == 30


def test_rise_is_kept_merged_and_read_back(tmp_path: Path) -> None:
    a = Measurement(key="k", peak_bytes=9, wall_s=10.0, envelope=(9, 2), rise=(1, 9))
    b = Measurement(key="k", peak_bytes=8, wall_s=12.0, envelope=(8, 3), rise=(8, 8))
    p = profiles.merge(Profile(package="x", version="1"), [a, b])
    assert p.entries["k"].rise == (8, 9)  # the earliest each level was seen: the safe course to plan with
    path = tmp_path / "p.json"
    profiles.save_profile(p, path)
    assert profiles.load_profile(path).entries["k"].rise == (8, 9)


def test_profile_summaries_one_line_each_or_none(tmp_path: Path) -> None:
    assert profiles.profile_summaries(home=tmp_path) == [f"no profiles in {tmp_path / 'profiles'}"]
    m = Measurement(key="a.cu|sm_80|1", peak_bytes=3 * 2**30, wall_s=10.0)
    learned = profiles.merge(Profile(package="flash-attn", version="2.8.3"), [m])
    profiles.save_profile(learned, profiles.profile_path("flash-attn", "2.8.3", home=tmp_path))
    lines = ["flash-attn 2.8.3: 1 compiles, worst peak 3.0 GiB"]
    assert profiles.profile_summaries(home=tmp_path) == lines
    assert profiles.profile_summaries("Flash_Attn", home=tmp_path) == lines  # by its canonical name
    assert profiles.profile_summaries("other", home=tmp_path) == [f"no profiles in {tmp_path / 'profiles'}"]


def test_a_complete_builds_compile_count_is_the_next_ones_expected_total(tmp_path: Path) -> None:
    assert profiles.load_compile_total("torch-x", "1.0", home=tmp_path) == 0
    profiles.save_compile_total("Torch_X", "1.0", 42, home=tmp_path)
    assert profiles.load_compile_total("torch-x", "1.0", home=tmp_path) == 42
    assert profiles.load_compile_total("torch-x", "1.1", home=tmp_path) == 0
    profiles.compile_total_path("torch-x", "1.0", home=tmp_path).write_text('{"compiles": true}')
    assert profiles.load_compile_total("torch-x", "1.0", home=tmp_path) == 0  # not a count: none known
