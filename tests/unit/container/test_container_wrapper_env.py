"""The wrapper's environment (`protocol.WrapperEnv`): what the host writes reads back in the container, and
a value that is not one of its variable's is said, naming both."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from factory.container import environ, protocol
from factory.container.protocol import WrapperEnv
from factory.memory import jobmemory
from factory.memory.planner import Parallelism
from factory.spec.recipes import FLASH_ATTN

GIB = 2**30

FULL = WrapperEnv(
    state_dir="/j/memory-state",
    profile_in="/opt/factory-profile/profile.json",
    profile_json='{"entries": {}}',
    profile_out="/j/m.jsonl",
    mem_limit=64 * GIB,
    est_per_arch_bytes=6 * GIB,
    est_base_bytes=0,
    est_by_file=(("fwd_*", 3 * GIB), ("bwd_*", 7 * GIB)),
    after_peak=0.42,
    seconds_by_file=(("bwd_*", 240.5), ("*", 60)),
    headroom_bytes=GIB,
    cpus=3.5,
    poll_s=0.25,
    sample_s=0.05,
    admission=False,
    real_nvcc="/usr/local/cuda/bin/nvcc",
    real_cxx="g++-13",
    cgroup_root="/sys/fs/cgroup",
    quiet=True,
    shard_sources=("csrc/a.cu", "csrc/b.cu"),
    preflight=("csrc/a.cu",),
    cache_dir="/cache",
    cache_out="/cache-out",
    cache_check_hits=2,
    job_dir="/j",
)


def test_every_field_reads_back_from_its_variable() -> None:
    env = FULL.to_env()
    assert set(env) == set(WrapperEnv.NAMES)  # no field at its default: every variable written
    assert all(name.startswith("FACTORY_") for name in env)
    assert WrapperEnv.from_env(env) == FULL
    # and each one alone: no field reads another's variable
    for f in dataclasses.fields(WrapperEnv):
        one = WrapperEnv(**{f.name: getattr(FULL, f.name)})
        assert len(one.to_env()) == 1 and WrapperEnv.from_env(one.to_env()) == one


def test_the_variables_keep_their_names() -> None:
    # the images' scripts and matrices' env name them: a renamed variable would be silently unset
    env = FULL.to_env()
    assert env["FACTORY_STATE_DIR"] == "/j/memory-state"
    assert env["FACTORY_MEM_LIMIT"] == str(64 * GIB)
    assert json.loads(env["FACTORY_EST_BY_FILE"]) == [["fwd_*", 3 * GIB], ["bwd_*", 7 * GIB]]
    assert env["FACTORY_AFTER_PEAK"] == "0.42"
    assert env["FACTORY_ADMISSION"] == "off" and env["FACTORY_WRAPPER_QUIET"] == "1"
    assert json.loads(env["FACTORY_SHARD_SOURCES"]) == ["csrc/a.cu", "csrc/b.cu"]
    assert env["FACTORY_CACHE_CHECK"] == "2"


def test_defaults_are_not_written_and_unset_or_empty_reads_as_default() -> None:
    assert WrapperEnv().to_env() == {}
    assert WrapperEnv.from_env({}) == WrapperEnv()
    assert WrapperEnv.from_env(dict.fromkeys(WrapperEnv.NAMES, "")) == WrapperEnv()
    assert WrapperEnv.from_env({"PATH": "/bin", "FACTORY_HOME": "/h"}) == WrapperEnv()


def test_numbers_as_the_wrapper_always_read_them() -> None:
    env = WrapperEnv.from_env(
        {"FACTORY_MEM_LIMIT": "6e9", "FACTORY_EST_BASE_BYTES": "0", "FACTORY_CPUS": "8"}
    )
    assert (env.mem_limit, env.est_base_bytes, env.cpus) == (6_000_000_000, 0, 8.0)
    assert WrapperEnv.from_env({"FACTORY_ADMISSION": "on"}).admission


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("FACTORY_MEM_LIMIT", "lots", "not a number of bytes"),
        ("FACTORY_MEM_LIMIT", "-1", "not a whole number of bytes, 0 or more"),
        ("FACTORY_EST_PER_ARCH_BYTES", "1.5", "not a whole number of bytes"),
        ("FACTORY_HEADROOM_BYTES", "inf", "not a whole number of bytes"),
        ("FACTORY_CPUS", "0", "not a number above 0"),
        ("FACTORY_POLL_S", "nan", "not a number above 0"),
        ("FACTORY_SAMPLE_S", "soon", "not a number"),
        ("FACTORY_AFTER_PEAK", "1.5", r"not a fraction in \(0, 1\]"),
        ("FACTORY_AFTER_PEAK", "0", "not a number above 0"),
        ("FACTORY_ADMISSION", "no", 'not "on" or "off"'),
        ("FACTORY_WRAPPER_QUIET", "yes", 'not "0" or "1"'),
        ("FACTORY_EST_BY_FILE", "fwd_*=3G", "not JSON"),
        ("FACTORY_EST_BY_FILE", '{"a*": 5}', "not a JSON list"),
        ("FACTORY_SECONDS_BY_FILE", '[["a*", 5], ["b*", -1], ["c*"]]', r"2 item\(s\) not \[glob, positive"),
        ("FACTORY_SHARD_SOURCES", '{"a": 1}', "not a JSON list of paths"),
        ("FACTORY_PREFLIGHT", "a.cu", "not a JSON list of paths"),
        ("FACTORY_CACHE_CHECK", "all", "not a number of bytes"),
    ],
)  # fmt: skip
def test_a_bad_value_is_said_with_its_name(name: str, value: str, why: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(f'{name}={value!r}: ')}{why}"):
        WrapperEnv.from_env({name: value})
    problems: list[str] = []
    tolerant = WrapperEnv.from_env({name: value}, problems=problems)
    assert len(problems) == 1 and problems[0].startswith(f"{name}={value!r}: ")
    if name != "FACTORY_SECONDS_BY_FILE":
        assert tolerant == WrapperEnv()


def test_a_table_with_bad_items_keeps_its_good_ones_when_tolerated() -> None:
    problems: list[str] = []
    env = WrapperEnv.from_env(
        {"FACTORY_EST_BY_FILE": '[["a*", 5], ["b*", true], ["c*", 2.5]]'}, problems=problems
    )
    assert env.est_by_file == (("a*", 5), ("c*", 2)) and len(problems) == 1


def test_a_long_bad_value_is_cut_in_the_message() -> None:
    with pytest.raises(ValueError) as err:
        WrapperEnv.from_env({"FACTORY_EST_BY_FILE": "x" * 5000})
    assert len(str(err.value)) < 200 and "...': not JSON" in str(err.value)


def test_the_host_cannot_describe_what_the_wrapper_would_refuse() -> None:
    with pytest.raises(ValueError, match=r"FACTORY_AFTER_PEAK='2': not a fraction"):
        WrapperEnv(after_peak=2.0)
    with pytest.raises(ValueError, match="FACTORY_MEM_LIMIT='-5'"):
        WrapperEnv(mem_limit=-5)
    with pytest.raises(ValueError, match="FACTORY_SECONDS_BY_FILE"):
        WrapperEnv(seconds_by_file=(("a*", 0.0),))


def test_the_container_side_says_a_bad_value_and_goes_on(capsys: pytest.CaptureFixture[str]) -> None:
    env = environ.settings({"FACTORY_POLL_S": "fast", "FACTORY_MEM_LIMIT": str(GIB)})
    assert env.poll_s == WrapperEnv().poll_s and env.mem_limit == GIB
    assert "factory-nvcc: ignored FACTORY_POLL_S='fast': not a number" in capsys.readouterr().err


def test_the_job_s_wrapper_env_reads_back_as_the_plan_and_recipe_say(tmp_path: Path) -> None:
    parallel = Parallelism(
        max_jobs=4, nvcc_threads=2, per_compile_bytes=8 * GIB, reason="", per_arch_bytes=6 * GIB
    )
    env = jobmemory.wrapper_env(
        parallel, recipe=FLASH_ATTN, job_dir="/j", memory_limit=64 * GIB, home=tmp_path
    )
    read = WrapperEnv.from_env(env)
    assert read.state_dir == "/j/memory-state" and read.profile_out == f"/j/{jobmemory.MEASUREMENTS_FILE}"
    assert (read.mem_limit, read.est_per_arch_bytes) == (64 * GIB, 6 * GIB)
    assert read.after_peak == FLASH_ATTN.compile_after_peak
    assert read.seconds_by_file == FLASH_ATTN.compile_seconds_by_file
    assert read.est_by_file == jobmemory.file_estimate_bytes(FLASH_ATTN, per_arch_bytes=6 * GIB)
    # the rest is not the wrapper's: the plan's ninja and nvcc settings, and the launcher
    assert set(env) - set(WrapperEnv.NAMES) == {"PYTORCH_NVCC", "MAX_JOBS", "NVCC_THREADS"}


def test_the_driver_s_variables_are_named_once() -> None:
    names = [v for k, v in vars(protocol).items() if k.startswith("ENV_") or k.endswith("_ENV")]
    assert len(names) == len(set(names)) and all(n.startswith("FACTORY_") for n in names)
    assert set(WrapperEnv.NAMES) <= set(names)
