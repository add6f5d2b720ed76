"""Variants: what one wheel is built for, its stable id and its PEP 440 local version label.

A variant is (package version, CUDA, torch, C++11 ABI, arch set); Python is only a wheel tag inside a variant.
The local label keeps every number in its own dot-separated segment because PEP 440 compares a segment with
letters as text: flash-attn's `+cu12torch2.7` sorts above `+cu12torch2.10`, while our `torch2.10` splits into
`torch2` and `10`, and `10 > 7` numerically.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# "8.0", "10.0", "9.0a" (arch-specific features); the "a" form is only meaningful from Hopper on.
_ARCH = re.compile(r"^(\d{1,2})\.(\d)(a?)$")
_LABEL = re.compile(
    r"^cu(?P<cuda>\d+\.\d+)\.torch(?P<torch>\d+(?:\.\d+)*)\.abi(?P<abi>[01])\.sm(?P<archs>\d+a?(?:\.\d+a?)*)$"
)


def arch_key(arch: str) -> tuple[int, int, str]:
    """Numeric sort key of a compute capability ("10.0" after "9.0a" after "9.0")."""
    match = _ARCH.match(arch)
    if match is None:
        raise ValueError(f"arch {arch!r} is not a compute capability like 8.0 or 9.0a")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def parse_arch_set(value: str) -> tuple[str, ...]:
    """ "9.0;8.0" -> ("8.0", "9.0"), sorted and de-duplicated; ValueError on bad syntax or an empty set."""
    parts = [p.strip() for p in re.split(r"[;\s,]+", value.strip()) if p.strip()]
    if not parts:
        raise ValueError("arch set is empty")
    for part in parts:
        arch_key(part)
    return tuple(sorted(set(parts), key=arch_key))


def arch_set_str(archs: tuple[str, ...]) -> str:
    """The canonical ";"-joined spelling of an arch set (the `arch` value in JSON output)."""
    return ";".join(archs)


def arch_digits(arch: str) -> str:
    """ "8.0" -> "80", "10.0" -> "100", "9.0a" -> "90a" (nvcc's sm_XX spelling without the prefix)."""
    major, minor, suffix = arch_key(arch)
    return f"{major}{minor}{suffix}"


def format_arch_list(archs: tuple[str, ...], style: str) -> str:
    """Arch list for a build env var: style "flash-attn" -> "80;90", "torch" -> "8.0;9.0"."""
    if style == "flash-attn":
        return ";".join(arch_digits(a) for a in archs)
    if style == "torch":
        return ";".join(archs)
    raise ValueError(f"unknown arch format {style!r} (use 'flash-attn' or 'torch')")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


@dataclass(frozen=True, kw_only=True, order=True)
class Variant:
    """One wheel flavour of one package version; every Python of a job list shares it."""

    package: str
    version: str
    cuda: str
    torch: str
    cxx11_abi: bool
    archs: tuple[str, ...]

    @property
    def cuda_tag(self) -> str:
        """ "12.8" -> "cu128", the spelling PyTorch's own indexes use."""
        return "cu" + self.cuda.replace(".", "")

    @property
    def id(self) -> str:
        abi = "abi1" if self.cxx11_abi else "abi0"
        sm = ".".join(arch_digits(a) for a in self.archs)
        return f"{self.cuda_tag}-torch{self.torch}-{abi}-sm{sm}"

    @property
    def local_version(self) -> str:
        abi = "abi1" if self.cxx11_abi else "abi0"
        sm = ".".join(arch_digits(a) for a in self.archs)
        return f"cu{self.cuda}.torch{self.torch}.{abi}.sm{sm}"

    @property
    def full_version(self) -> str:
        """The wheel's version: "2.8.3+cu12.8.torch2.10.abi1.sm80.90"."""
        return f"{self.version}+{self.local_version}"

    @property
    def arch(self) -> str:
        """Canonical ";"-joined arch set."""
        return arch_set_str(self.archs)


def parse_local_version(label: str) -> dict[str, object]:
    """Split a label (with or without a leading "VERSION+") into cuda, torch, cxx11_abi and archs."""
    local = label.split("+", 1)[1] if "+" in label else label
    match = _LABEL.match(local)
    if match is None:
        raise ValueError(
            f"{label!r} is not a factory local version label (expected like cu12.8.torch2.10.abi1.sm80.90)"
        )
    archs = []
    for digits in match.group("archs").split("."):
        suffix = "a" if digits.endswith("a") else ""
        num = digits.rstrip("a")
        archs.append(f"{num[:-1]}.{num[-1]}{suffix}")
    return {
        "cuda": match.group("cuda"),
        "torch": match.group("torch"),
        "cxx11_abi": match.group("abi") == "1",
        "archs": tuple(archs),
    }


def variant_id_from_local_version(label: str) -> str:
    """ "cu12.8.torch2.10.abi1.sm80.90.100.120" -> "cu128-torch2.10-abi1-sm80.90.100.120".

    Raises ValueError for a label the factory did not make."""
    parts = parse_local_version(label)
    variant = Variant(
        package="",
        version="",
        cuda=str(parts["cuda"]),
        torch=str(parts["torch"]),
        cxx11_abi=bool(parts["cxx11_abi"]),
        archs=tuple(parts["archs"]),  # type: ignore[arg-type]
    )
    return variant.id


def torch_minor(torch: str) -> str:
    """ "2.14.1" -> "2.14": compatibility data is kept per torch minor release."""
    return ".".join(torch.split(".")[:2])


def version_tuple(version: str) -> tuple[int, ...]:
    """ "12.10" -> (12, 10): numeric comparison of CUDA/torch/Python versions (ValueError if not numeric)."""
    return _version_key(version)
