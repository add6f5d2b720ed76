"""cgroup v1/v2 parsing from fixture trees shaped like the kernel's files."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.container import cgroup

V1_UNLIMITED = "9223372036854771712\n"


def write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.mark.parametrize(
    ("text", "want"),
    [("max\n", None), ("", None), (V1_UNLIMITED, None), ("2147483648\n", 2 * 2**30), ("-1", None)],
)
def test_parse_memory_value(text: str, want: int | None) -> None:
    assert cgroup.parse_memory_value(text) == want


@pytest.mark.parametrize(
    ("text", "want"), [("max 100000", None), ("200000 100000", 2.0), ("150000 100000\n", 1.5), ("50000", 0.5)]
)
def test_parse_cpu_max(text: str, want: float | None) -> None:
    assert cgroup.parse_cpu_max(text) == want


def test_parse_cfs() -> None:
    assert cgroup.parse_cfs("-1\n", "100000\n") is None
    assert cgroup.parse_cfs("400000", "100000") == 4.0


def test_v1_inside_container(tmp_path: Path) -> None:
    # docker on cgroup v1: the mount shows the container's own cgroup, /proc/self/cgroup names the host path
    write(tmp_path, {
        "sys/memory/memory.limit_in_bytes": "4294967296\n",
        "sys/memory/memory.usage_in_bytes": "1073741824\n",
        "sys/memory/memory.max_usage_in_bytes": "2147483648\n",
        "sys/memory/memory.stat": "cache 10\ntotal_inactive_file 104857600\ntotal_active_file 52428800\n"
                                  "total_mapped_file 10485760\n",
        "sys/cpu,cpuacct/cpu.cfs_quota_us": "200000\n",
        "sys/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
        "proc": "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n",
    })  # fmt: skip
    info = cgroup.read_cgroup(tmp_path / "sys", tmp_path / "proc")
    assert info.version == 1
    assert info.memory_limit == 4 * 2**30
    assert info.memory_usage == 2**30
    assert info.memory_peak == 2 * 2**30
    assert info.cpus == 2.0
    assert info.working_set == 2**30 - 100 * 2**20
    assert info.in_use == 2**30 - (100 + 50 - 10) * 2**20


def test_v1_host_path_and_unlimited(tmp_path: Path) -> None:
    # on a host (or a nested cgroup) the process's own directory lies below the mount
    write(tmp_path, {
        "sys/memory/memory.limit_in_bytes": V1_UNLIMITED,
        "sys/memory/build/memory.limit_in_bytes": "1000\n",
        "sys/memory/build/memory.usage_in_bytes": "10\n",
        "sys/memory/build/memory.max_usage_in_bytes": "20\n",
        "sys/cpu/cpu.cfs_quota_us": "-1\n",
        "sys/cpu/cpu.cfs_period_us": "100000\n",
        "proc": "4:memory:/build\n2:cpu:/\n",
    })  # fmt: skip
    info = cgroup.read_cgroup(tmp_path / "sys", tmp_path / "proc")
    assert (info.version, info.memory_limit, info.memory_usage, info.memory_peak, info.cpus) == (
        1,
        1000,
        10,
        20,
        None,
    )


def test_v2(tmp_path: Path) -> None:
    write(tmp_path, {
        "sys/cgroup.controllers": "cpu memory\n",
        "sys/memory.max": "8589934592\n",
        "sys/memory.current": "4294967296\n",
        "sys/memory.peak": "5368709120\n",
        "sys/memory.stat": "anon 1\ninactive_file 1073741824\nactive_file 0\nfile_mapped 0\n",
        "sys/cpu.max": "300000 100000\n",
        "proc": "0::/\n",
    })  # fmt: skip
    info = cgroup.read_cgroup(tmp_path / "sys", tmp_path / "proc")
    assert (info.version, info.memory_limit, info.memory_usage, info.memory_peak, info.cpus) == (
        2, 8 * 2**30, 4 * 2**30, 5 * 2**30, 3.0,
    )  # fmt: skip
    assert info.working_set == 3 * 2**30


def test_v2_unlimited(tmp_path: Path) -> None:
    write(tmp_path, {"sys/cgroup.controllers": "", "sys/memory.max": "max\n", "sys/cpu.max": "max 100000\n",
                     "proc": "0::/\n"})  # fmt: skip
    info = cgroup.read_cgroup(tmp_path / "sys", tmp_path / "proc")
    assert info.version == 2
    assert info.memory_limit is None
    assert info.cpus is None
    assert info.memory_usage is None


def test_no_cgroup(tmp_path: Path) -> None:
    info = cgroup.read_cgroup(tmp_path, tmp_path / "none")
    assert info.version == 0
    assert info.memory_limit is None


def test_effective_cpus_caps_by_quota() -> None:
    info = cgroup.CgroupInfo(version=2, memory_limit=None, memory_usage=None, memory_peak=None, cpus=0.5)
    assert cgroup.effective_cpus(info) == 0.5
