"""Memory and CPU limits of the cgroup a process runs in (v1 and v2), read from files under a root directory.

Standard library only: the nvcc wrapper reads them in build containers, the host for its planner.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

# The kernel writes PAGE_COUNTER_MAX * page size (9223372036854771712) for "no limit" in v1; anything this
# large is
# more memory than any machine has.
_UNLIMITED_AT = 1 << 60


@dataclass(frozen=True)
class CgroupInfo:
    version: int  # 1 or 2; 0 when no cgroup files were found
    memory_limit: int | None  # bytes; None = unlimited
    memory_usage: int | None
    memory_peak: int | None
    cpus: float | None  # CPU quota in cores; None = unlimited
    inactive_file: int = 0
    active_file: int = 0
    mapped_file: int = 0

    @property
    def working_set(self) -> int | None:
        """Usage less inactive page cache, as docker stats and the kubelet count it."""
        if self.memory_usage is None:
            return None
        return max(0, self.memory_usage - self.inactive_file)

    @property
    def in_use(self) -> int | None:
        """Usage less all page cache no process maps: what the kernel cannot reclaim before an OOM kill.

        Compiles read the same headers over and over, so active page cache is large but gives way under the
        limit; counting it would keep compiles waiting for memory that is in fact free.
        """
        if self.memory_usage is None:
            return None
        cache = self.inactive_file + self.active_file - self.mapped_file
        return max(0, self.memory_usage - max(0, cache))


def parse_memory_value(text: str) -> int | None:
    text = text.strip()
    if not text or text == "max":
        return None
    value = int(text)
    return None if value < 0 or value >= _UNLIMITED_AT else value


def parse_cpu_max(text: str) -> float | None:
    """v2 `cpu.max`: "QUOTA PERIOD" or "max PERIOD"."""
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100_000
    return int(parts[0]) / period if period > 0 else None


def parse_cfs(quota_text: str, period_text: str) -> float | None:
    """v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`; quota -1 means unlimited."""
    quota = int(quota_text.strip())
    period = int(period_text.strip())
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_stat(text: str) -> dict[str, int]:
    stats: dict[str, int] = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            stats[parts[0]] = int(parts[1])
    return stats


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """`/proc/self/cgroup` as {controller: path}; the v2 entry is keyed ""."""
    paths: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        for controller in parts[1].split(",") if parts[1] else [""]:
            paths[controller] = parts[2]
    return paths


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _controller_dir(root: Path, names: list[str], own_path: str | None) -> Path | None:
    """The directory of this process's cgroup for a v1 controller.

    Inside a container the mount shows only the container's own cgroup, while /proc/self/cgroup names the
    path on
    the host, so the named path is tried first and the mount point itself second.
    """
    for name in names:
        mount = root / name
        if not mount.is_dir():
            continue
        if own_path and own_path != "/":
            candidate = mount / own_path.lstrip("/")
            if candidate.is_dir():
                return candidate
        return mount
    return None


def read_cgroup(
    root: Path | str = "/sys/fs/cgroup", proc_cgroup: Path | str = "/proc/self/cgroup"
) -> CgroupInfo:
    root = Path(root)
    own = parse_proc_cgroup(_read(Path(proc_cgroup)) or "")
    mem_dir = _controller_dir(root, ["memory"], own.get("memory"))
    if mem_dir is not None and (mem_dir / "memory.limit_in_bytes").exists():
        return _read_v1(root, mem_dir, own)
    if (root / "cgroup.controllers").exists():
        return _read_v2(root, own.get(""))
    return CgroupInfo(version=0, memory_limit=None, memory_usage=None, memory_peak=None, cpus=None)


def _value(path: Path) -> int | None:
    text = _read(path)
    return parse_memory_value(text) if text is not None else None


def _read_v1(root: Path, mem_dir: Path, own: dict[str, str]) -> CgroupInfo:
    stat = parse_memory_stat(_read(mem_dir / "memory.stat") or "")
    cpus: float | None = None
    cpu_dir = _controller_dir(root, ["cpu", "cpu,cpuacct", "cpuacct,cpu"], own.get("cpu"))
    if cpu_dir is not None:
        quota = _read(cpu_dir / "cpu.cfs_quota_us")
        period = _read(cpu_dir / "cpu.cfs_period_us")
        if quota is not None and period is not None:
            cpus = parse_cfs(quota, period)
    return CgroupInfo(
        version=1,
        memory_limit=_value(mem_dir / "memory.limit_in_bytes"),
        memory_usage=_value(mem_dir / "memory.usage_in_bytes"),
        memory_peak=_value(mem_dir / "memory.max_usage_in_bytes"),
        cpus=cpus,
        inactive_file=stat.get("total_inactive_file", stat.get("inactive_file", 0)),
        active_file=stat.get("total_active_file", stat.get("active_file", 0)),
        mapped_file=stat.get("total_mapped_file", stat.get("mapped_file", 0)),
    )


def _read_v2(root: Path, own_path: str | None) -> CgroupInfo:
    base = root
    if own_path and own_path != "/":
        candidate = root / own_path.lstrip("/")
        if (candidate / "memory.max").exists():
            base = candidate
    stat = parse_memory_stat(_read(base / "memory.stat") or "")
    cpu_text = _read(base / "cpu.max")
    return CgroupInfo(
        version=2,
        memory_limit=_value(base / "memory.max"),
        memory_usage=_value(base / "memory.current"),
        memory_peak=_value(base / "memory.peak"),
        cpus=parse_cpu_max(cpu_text) if cpu_text is not None else None,
        inactive_file=stat.get("inactive_file", 0),
        active_file=stat.get("active_file", 0),
        mapped_file=stat.get("file_mapped", 0),
    )


def effective_cpus(info: CgroupInfo) -> float:
    """CPUs this process may use: the cgroup quota, else its affinity mask."""
    try:
        available = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        available = float(os.cpu_count() or 1)
    return min(available, info.cpus) if info.cpus else available
