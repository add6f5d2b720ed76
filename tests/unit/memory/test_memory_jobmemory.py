"""A job's view of memory: the wrapper environment carries the recipe's per-file figures and the learned
profile."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

from factory.container import admission, predictor, protocol
from factory.container.protocol import ProfileEntry
from factory.memory import jobmemory, profiles
from factory.spec import measured
from factory.spec.options import Recipe
from factory.spec.recipes import FLASH_ATTN

GIB = 2**30


def plan(recipe: Recipe, tmp_path: Path) -> jobmemory.Parallelism:
    return jobmemory.initial_parallelism(
        recipe=recipe, archs=4, limit_bytes=256 * GIB, cpus=32, package="p", version="1", home=tmp_path
    )


def test_wrapper_env_carries_the_per_file_table_in_bytes(tmp_path: Path) -> None:
    recipe = Recipe(name="r", compile_gib_per_arch=6.0, compile_gib_by_file=(("fwd_*", 3.5), ("bwd_*", 6.5)))
    env = jobmemory.wrapper_env(plan(recipe, tmp_path), recipe=recipe, job_dir="/job", memory_limit=256 * GIB)
    assert env["FACTORY_EST_PER_ARCH_BYTES"] == str(6 * GIB)
    assert json.loads(env["FACTORY_EST_BY_FILE"]) == [["fwd_*", int(3.5 * GIB)], ["bwd_*", int(6.5 * GIB)]]
    # what the wrapper reads back is the table wrapper_env wrote
    assert protocol.parse_by_file(env["FACTORY_EST_BY_FILE"]) == (
        ("fwd_*", int(3.5 * GIB)),
        ("bwd_*", int(6.5 * GIB)),
    )


def test_wrapper_env_without_a_table_sets_none(tmp_path: Path) -> None:
    recipe = Recipe(name="r", compile_gib_per_arch=2.0)
    env = jobmemory.wrapper_env(plan(recipe, tmp_path), recipe=recipe, job_dir="/job", memory_limit=256 * GIB)
    assert "FACTORY_EST_BY_FILE" not in env


def test_a_raised_plan_raises_the_per_file_table(tmp_path: Path) -> None:
    recipe = Recipe(name="r", compile_gib_per_arch=4.0, compile_gib_by_file=(("a*", 2.0),))
    raised = replace(plan(recipe, tmp_path), per_arch_bytes=6 * GIB)  # e.g. after an OOM retry
    env = jobmemory.wrapper_env(raised, recipe=recipe, job_dir="/job", memory_limit=256 * GIB)
    assert json.loads(env["FACTORY_EST_BY_FILE"]) == [["a*", 3 * GIB]]


# The hand-run measurements the recipe shipped before the factory measured a whole wheel: fixed rows for the
# derivation rules (the shipped CSV changes whenever the factory measures more).
HAND_ROWS = measured.parse_rows(
    (Path(__file__).resolve().parents[3] / "bench" / "data" / "flash-attn-hand-compiles.csv").read_text()
)


def test_the_recipe_s_tables_are_derived_from_the_shipped_measurements() -> None:
    assert FLASH_ATTN.compile_gib_by_file == measured.flash_attn_file_estimates()
    assert FLASH_ATTN.compile_seconds_by_file == measured.flash_attn_file_seconds()
    assert FLASH_ATTN.compile_after_peak == measured.measured_after_peak()
    assert FLASH_ATTN.compile_gib_per_arch == measured.measured_compile_gib()
    # the shipped CSV holds the factory's own measurements of a whole sm_80 wheel: one row per kernel file
    factory_rows = {r["tu"] for r in measured.compile_rows() if r.get("source", "").startswith("run/")}
    assert len(factory_rows) == 72
    assert max(FLASH_ATTN.compile_gib_by_file, key=lambda kv: kv[1])[0] == "flash_bwd_hdim256_*"


def test_flash_attn_recipe_table_from_the_measured_compiles() -> None:
    table = dict(measured.flash_attn_file_estimates(HAND_ROWS))
    assert len(table) == 3 * 6  # forward, backward and split-KV forward files at every head dimension
    # a measured file gets its own figure with a few percent on top: forward hdim64 3.68 GiB (twice), backward
    # hdim256 6.64 GiB (the worst of its rows)
    assert 3.68 < table["flash_fwd_hdim64_*"] <= 3.68 * 1.06
    assert 6.64 < table["flash_bwd_hdim256_*"] <= 6.64 * 1.06
    # between two measured head dimensions, the larger neighbour (forward 128 measured above 64); beyond the
    # measured ones of a kind, its largest (split-KV measured at 128 and 256 only)
    assert table["flash_fwd_hdim96_*"] == table["flash_fwd_hdim128_*"] > table["flash_fwd_hdim64_*"]
    split = [table[f"flash_fwd_split_hdim{h}_*"] for h in (32, 64, 96)]
    assert split == [max(table["flash_fwd_split_hdim128_*"], table["flash_fwd_split_hdim256_*"])] * 3
    assert max(table.values()) == table["flash_bwd_hdim256_*"]
    assert measured.measured_compile_gib(rows=HAND_ROWS) == 6.64  # the fallback for any other file
    by_file = jobmemory.file_estimate_bytes(FLASH_ATTN)
    shipped = dict(FLASH_ATTN.compile_gib_by_file)
    assert admission.file_per_arch_bytes("/x/flash_fwd_hdim64_fp16_causal_sm80.cu", by_file, 0) == (
        math.ceil(round(shipped["flash_fwd_hdim64_*"] * GIB, 3))
    )
    assert admission.file_per_arch_bytes("/x/flash_api.cpp", by_file, 1) == 1


def test_wrapper_env_carries_the_after_peak_fraction(tmp_path: Path) -> None:
    env = jobmemory.wrapper_env(plan(FLASH_ATTN, tmp_path), recipe=FLASH_ATTN, job_dir="/j", memory_limit=GIB)
    assert float(env["FACTORY_AFTER_PEAK"]) == FLASH_ATTN.compile_after_peak
    plain = Recipe(name="r")
    assert "FACTORY_AFTER_PEAK" not in jobmemory.wrapper_env(
        plan(plain, tmp_path), recipe=plain, job_dir="/j", memory_limit=GIB
    )


def test_wrapper_env_carries_the_recipe_s_seconds_by_file(tmp_path: Path) -> None:
    env = jobmemory.wrapper_env(plan(FLASH_ATTN, tmp_path), recipe=FLASH_ATTN, job_dir="/j", memory_limit=GIB)
    table = protocol.parse_seconds_by_file(env["FACTORY_SECONDS_BY_FILE"])
    assert table == FLASH_ATTN.compile_seconds_by_file
    plain = Recipe(name="r")
    assert "FACTORY_SECONDS_BY_FILE" not in jobmemory.wrapper_env(
        plan(plain, tmp_path), recipe=plain, job_dir="/j", memory_limit=GIB
    )


def test_flash_attn_seconds_by_file_from_the_measured_courses() -> None:
    table = dict(measured.flash_attn_file_seconds(HAND_ROWS))
    # a measured file: its own CPU seconds (backward hdim256: 372 s of CPU, not 986 s of a shared run's wall)
    assert table["flash_bwd_hdim256_*"] == 372.0
    # between two measured head dimensions, linear (forward 64: 233 s, 128: 333 s); beyond them, the nearest
    assert table["flash_fwd_hdim96_*"] == 283.0
    assert table["flash_fwd_split_hdim32_*"] == table["flash_fwd_split_hdim128_*"] == 410.0
    assert max(table, key=lambda k: table[k]) == "flash_fwd_split_hdim256_*"
    assert len(table) == 3 * 6  # three kinds x six head dimensions, as the per-file GiB table


def test_flash_attn_after_peak_fraction_from_the_measured_courses() -> None:
    seen = [float(r["after_peak"]) for r in HAND_ROWS if r["after_peak"]]
    assert len(seen) == 10  # one per measured course
    # the worst course (backward hdim256 held 64% of its peak after falling to 3/4 of it), with its margin
    assert max(seen) == 0.638
    assert measured.measured_after_peak(HAND_ROWS) == 0.71


def flash_attn_sized_profile(home: Path) -> profiles.Profile:
    """72 compiles, each course at the current resolution, saved where a job looks for it."""
    course = tuple(6 * GIB - i * 2**20 for i in range(admission.ENVELOPE_POINTS))
    entries = {
        f"flash_fwd_hdim{i}_fp16_sm80.cu|compute_80,compute_90|4": ProfileEntry(
            peak_bytes=6 * GIB, wall_s=300.0 + i, samples=1500, envelope=course, rise=course[::-1]
        )
        for i in range(72)
    }
    learned = profiles.Profile(package="p", version="1", entries=entries)
    profiles.save_profile(learned, profiles.profile_path("p", "1", home=home))
    return learned


def test_a_large_profile_reaches_the_wrapper_in_a_file(tmp_path: Path) -> None:
    learned = flash_attn_sized_profile(tmp_path / "home")
    assert len(json.dumps(learned.to_json())) > jobmemory.INLINE_PROFILE_MAX  # too large for one env string
    snapshot = tmp_path / "job-profile"
    snapshot.mkdir()
    env = jobmemory.wrapper_env(
        plan(FLASH_ATTN, tmp_path), recipe=FLASH_ATTN, job_dir="/j", memory_limit=GIB, package="p",
        version="1", home=tmp_path / "home", profile_dir=snapshot,
    )  # fmt: skip
    assert env["FACTORY_PROFILE_IN"] == f"{jobmemory.PROFILE_DIR}/{jobmemory.PROFILE_FILE}"
    assert "FACTORY_PROFILE_JSON" not in env
    written = snapshot / jobmemory.PROFILE_FILE
    assert written.stat().st_mode & 0o777 == 0o644  # the container's unprivileged user reads it
    # what the wrapper reads from it is the whole profile
    read = predictor.read_profile(str(written))
    assert read == learned.to_json()["entries"]
    # without a snapshot directory a profile this large would not reach the wrappers at all
    without = jobmemory.wrapper_env(
        plan(FLASH_ATTN, tmp_path), recipe=FLASH_ATTN, job_dir="/j", memory_limit=GIB, package="p",
        version="1", home=tmp_path / "home",
    )  # fmt: skip
    assert "FACTORY_PROFILE_JSON" not in without and "FACTORY_PROFILE_IN" not in without


def test_a_small_profile_without_a_snapshot_directory_goes_inline(tmp_path: Path) -> None:
    entry = ProfileEntry(peak_bytes=GIB, wall_s=3.0, samples=15, envelope=(GIB,), rise=(GIB,))
    learned = profiles.Profile(package="p", version="1", entries={"a.cu|compute_80|1": entry})
    profiles.save_profile(learned, profiles.profile_path("p", "1", home=tmp_path))
    env = jobmemory.wrapper_env(
        plan(FLASH_ATTN, tmp_path), recipe=FLASH_ATTN, job_dir="/j", memory_limit=GIB, package="p",
        version="1", home=tmp_path,
    )  # fmt: skip
    assert json.loads(env["FACTORY_PROFILE_JSON"])["entries"] == learned.to_json()["entries"]
