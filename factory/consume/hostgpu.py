"""The NVIDIA driver of a host without torch: the newest CUDA it runs, and its GPUs' compute capabilities.

Three sources, first that answers wins: `nvidia-smi`'s header ("CUDA Version: 13.0"), libcuda's
`cuDriverGetVersion` (13000), and /proc/driver/nvidia/version's driver version mapped through
`factory.core.gpus.DRIVER_CUDA`. Parsing is pure; `detect_driver` runs the tools.
"""

from __future__ import annotations

import ctypes
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from factory.core import bounded
from factory.core.gpus import DRIVER_CUDA

_SMI_CUDA = re.compile(r"CUDA Version:\s*([1-9][0-9]?\.[0-9]{1,2})\b", re.ASCII)
_DRIVER_VERSION = re.compile(r"[1-9][0-9]{2,3}\.[0-9]{1,3}(?:\.[0-9]{1,3})?", re.ASCII)
_TIMEOUT_S = 60
_MAX_OUTPUT = 1 << 20  # nvidia-smi's table of a 64-GPU host is a few tens of KiB


@dataclass(frozen=True, kw_only=True)
class Driver:
    cuda: str | None  # the newest CUDA the driver runs, "13.0"; None without a driver
    source: str  # "nvidia-smi", "libcuda", "/proc/driver/nvidia/version" or "none"
    gpus: tuple[str, ...] = ()  # raw compute capabilities from nvidia-smi, parsed by `factory.consume.which`


def parse_smi_header(output: str) -> str | None:
    """`nvidia-smi`'s table -> the CUDA its header names ("13.0"), or None."""
    match = _SMI_CUDA.search(output)
    return match[1] if match else None


def parse_proc_version(text: str) -> str | None:
    """/proc/driver/nvidia/version -> the driver version ("580.65.06") on its NVRM line, or None."""
    for line in text.splitlines():
        if line.startswith("NVRM version:"):
            for word in line.split():
                if _DRIVER_VERSION.fullmatch(word):
                    return word
    return None


def driver_cuda(driver_version: str) -> str | None:
    """The newest CUDA a driver version runs (`DRIVER_CUDA`), or None when it is older than CUDA 11."""
    try:
        have = Version(driver_version)
    except InvalidVersion:
        return None
    for minimum, cuda in DRIVER_CUDA:
        if have >= Version(minimum):
            return cuda
    return None


def cuda_from_driver_api(value: int) -> str | None:
    """`cuDriverGetVersion`'s integer (13000, 12080) -> "13.0", "12.8"; None for what no driver says."""
    major, minor = value // 1000, (value % 1000) // 10
    return f"{major}.{minor}" if 1 <= major <= 99 else None


def run_tool(args: list[str]) -> str | None:
    """The tool's output, when it answers within _TIMEOUT_S with at most _MAX_OUTPUT (a table of a few
    KiB): a tool that prints without end is killed, not read whole."""
    return bounded.run_output(args, max_bytes=_MAX_OUTPUT, seconds=_TIMEOUT_S)


def _libcuda() -> str | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        value = ctypes.c_int(0)
        if lib.cuDriverGetVersion(ctypes.byref(value)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return cuda_from_driver_api(value.value)


def _proc(path: Path = Path("/proc/driver/nvidia/version")) -> str | None:
    try:
        with path.open("rb") as fh:
            text = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    version = parse_proc_version(text)
    return driver_cuda(version) if version else None


def detect_driver(*, which: Callable[[str], str | None] = shutil.which) -> Driver:
    """The host's driver and GPUs, from the first source that answers (module doc)."""
    gpus: tuple[str, ...] = ()
    if which("nvidia-smi"):
        caps = run_tool(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"])
        gpus = tuple(caps.splitlines()) if caps else ()
        header = run_tool(["nvidia-smi"])
        cuda = parse_smi_header(header) if header else None
        if cuda is not None:
            return Driver(cuda=cuda, source="nvidia-smi", gpus=gpus)
    cuda = _libcuda()
    if cuda is not None:
        return Driver(cuda=cuda, source="libcuda", gpus=gpus)
    cuda = _proc()
    if cuda is not None:
        return Driver(cuda=cuda, source="/proc/driver/nvidia/version", gpus=gpus)
    return Driver(cuda=None, source="none", gpus=gpus)
