"""GPU names and their compute capabilities: the one table that turns "H100" or "RTX 5090" into the arch a
wheel must carry code for (NVIDIA's CUDA GPUs list, developer.nvidia.com/cuda-gpus). The index's human page
offers these names in its GPU picker and matches them with the same rule (`capability`); a name not listed
is typed as its compute capability ("9.0", "sm_90"). Add rows as GPUs come out; keep the names as NVIDIA
writes them. Also the minimum driver of each CUDA release (`DRIVER_CUDA`), which the consumer's driver probe
(`factory.consume.hostgpu`) and the human page's driver picker read.
"""

from __future__ import annotations

from factory.core.variants import Arch

GPUS: tuple[tuple[str, str], ...] = (
    ("V100", "7.0"),
    ("T4", "7.5"),
    ("RTX 2080 Ti", "7.5"),
    ("A100", "8.0"),
    ("A30", "8.0"),
    ("A10", "8.6"),
    ("A40", "8.6"),
    ("RTX A6000", "8.6"),
    ("RTX 3090", "8.6"),
    ("Jetson AGX Orin", "8.7"),
    ("L4", "8.9"),
    ("L40S", "8.9"),
    ("RTX 6000 Ada", "8.9"),
    ("RTX 4090", "8.9"),
    ("H100", "9.0"),
    ("H200", "9.0"),
    ("GH200", "9.0"),
    ("B200", "10.0"),
    ("GB200", "10.0"),
    ("B300", "10.3"),
    ("GB300", "10.3"),
    ("Jetson Thor", "11.0"),
    ("RTX 5090", "12.0"),
    ("RTX 5080", "12.0"),
    ("RTX PRO 6000 Blackwell", "12.0"),
    ("DGX Spark", "12.1"),
)


def _key(name: str) -> str:
    """How a typed name is compared: case and spaces do not matter ("rtx5090" is "RTX 5090")."""
    return "".join(name.split()).lower()


_BY_NAME = {_key(name): cc for name, cc in GPUS}


def capability(text: str) -> Arch | None:
    """The compute capability a typed GPU means: a name of GPUS, or a capability itself ("9.0", "90",
    "sm_90"); None for anything else. A GPU is a plain capability, never an "a"/"f" target."""
    cc = _BY_NAME.get(_key(text))
    if cc is not None:
        return Arch.parse(cc)
    try:
        arch = Arch.parse(text)
    except ValueError:
        return None
    return None if arch.suffix else arch


# The minimum Linux driver of each CUDA toolkit release (NVIDIA's CUDA Toolkit release notes, table
# "CUDA Toolkit and Corresponding Driver Versions"), newest first: a driver at or above one runs that CUDA
# and, by minor version compatibility, every CUDA of the same major. A driver newer than the first row
# runs at least that CUDA; add rows as CUDA releases come out.
DRIVER_CUDA: tuple[tuple[str, str], ...] = (
    ("590.44.01", "13.1"),
    ("580.65.06", "13.0"),
    ("575.51.03", "12.9"),
    ("570.26", "12.8"),
    ("560.28.03", "12.6"),
    ("555.42.02", "12.5"),
    ("550.54.14", "12.4"),
    ("545.23.06", "12.3"),
    ("535.54.03", "12.2"),
    ("530.30.02", "12.1"),
    ("525.60.13", "12.0"),
    ("520.61.05", "11.8"),
    ("515.43.04", "11.7"),
    ("510.39.01", "11.6"),
    ("495.29.05", "11.5"),
    ("470.42.01", "11.4"),
    ("465.19.01", "11.3"),
    ("460.27.03", "11.2"),
    ("455.23", "11.1"),
    ("450.36.06", "11.0"),
)
