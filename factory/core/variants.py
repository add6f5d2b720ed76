"""Variants: what one wheel is built for, its stable id and its PEP 440 local version label.

A variant is (package version, CUDA, torch, C++11 ABI, arch set); Python is only a wheel tag inside a variant.
This module owns every spelling of a variant and of a GPU arch, both directions: composing them and parsing
them back (`VariantKey.parse_id`, `VariantKey.parse_local_version`, `Arch.parse`).

The local label keeps every number in its own dot-separated segment because PEP 440 compares a segment with
letters as text: flash-attn's `+cu12torch2.7` sorts above `+cu12torch2.10`, while our `torch2.10` splits into
`torch2` and `10`, and `10 > 7` numerically.

A stable-ABI variant (a recipe's `stable_abi`, factory.spec.stable_abi) names no torch it was built with but
the oldest torch its one wheel serves, after the word `stable`: `cu130-stable2.12-abi1-sm80`, label
`cu13.0.stable2.12.abi1.sm80`. Its wheel is listed on the page of every torch variant it covers
(`VariantKey.covers`): same CUDA, ABI and arch set, a torch at or after the floor.

The variant id spells CUDA the way PyTorch's indexes do (`cu128` for 12.8) while the minor is one digit; a
minor of 10 or more keeps its dot (`cu12.10`), since `cu1210` could be 12.10 or 121.0. The compact form takes
a one- or two-digit major only, so `cu1210` is no id at all rather than a misread CUDA 121.0.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal, cast

ArchSuffix = Literal["", "a", "f"]

# Numbers without leading zeros: PEP 440 drops them from a local label ("12.08" comes back as "12.8").
_N = r"(?:0|[1-9]\d*)"
CUDA_VERSION = re.compile(rf"^(?P<major>[1-9]\d?)\.(?P<minor>{_N})$")
TORCH_VERSION = re.compile(rf"^{_N}(?:\.{_N}){{1,2}}$")
# A compute capability has a one-digit minor (8.6, 10.3, 12.1): that makes "100" readable as 10.0.
_ARCH_DOTTED = re.compile(r"^(?P<major>[1-9]\d?)\.(?P<minor>\d)(?P<suffix>[af]?)$")
_ARCH_DIGITS = re.compile(r"^(?:sm_?)?(?P<major>[1-9]\d?)(?P<minor>\d)(?P<suffix>[af]?)$")
_SM_LIST = r"(?P<archs>[1-9]\d?\d[af]?(?:\.[1-9]\d?\d[af]?)*)"
_ID = re.compile(
    r"^cu(?:(?P<major>[1-9]\d?)(?P<minor>\d)|(?P<dmajor>[1-9]\d?)\.(?P<dminor>[1-9]\d+))"
    rf"-(?P<kind>torch|stable)(?P<torch>[^-]+)-abi(?P<abi>[01])-sm{_SM_LIST}$"
)
_LABEL = re.compile(
    rf"^cu(?P<cuda>[^.]+\.[^.]+)\.(?P<kind>torch|stable)(?P<torch>.+)\.abi(?P<abi>[01])\.sm{_SM_LIST}$"
)


@dataclass(frozen=True, order=True)
class Arch:
    """A GPU target: a compute capability, optionally architecture-specific ("a": sm_90a, runs only on that
    exact capability) or family-specific ("f": sm_100f, runs on the family's same or later minors)."""

    major: int
    minor: int
    suffix: ArchSuffix = ""

    @classmethod
    def parse(cls, text: str) -> Arch:
        """ "9.0a", "90a", "sm_90a" and "sm90a" are all Arch(9, 0, "a"); ValueError for anything else."""
        value = text.strip()
        match = _ARCH_DOTTED.fullmatch(value) or _ARCH_DIGITS.fullmatch(value)
        if match is None:
            raise ValueError(
                f"arch {text!r} is not a compute capability like 8.0, 9.0a, 10.0f, 90a or sm_90a"
            )
        return cls(int(match["major"]), int(match["minor"]), cast(ArchSuffix, match["suffix"]))

    @classmethod
    def parse_dotted(cls, text: str) -> Arch:
        """Only torch's spelling "9.0a", the one a matrix file's `arch` axis is written in."""
        match = _ARCH_DOTTED.fullmatch(text.strip())
        if match is None:
            raise ValueError(
                f"arch {text!r} is not a compute capability like 8.0 or 9.0a (10.0f for a family target)"
            )
        return cls(int(match["major"]), int(match["minor"]), cast(ArchSuffix, match["suffix"]))

    @property
    def dotted(self) -> str:
        """torch's spelling (TORCH_CUDA_ARCH_LIST, the `arch` axis): "9.0a"."""
        return f"{self.major}.{self.minor}{self.suffix}"

    @property
    def digits(self) -> str:
        """nvcc's number without the prefix (ids, labels, FLASH_ATTN_CUDA_ARCHS): "90a"."""
        return f"{self.major}{self.minor}{self.suffix}"

    @property
    def sm(self) -> str:
        """nvcc's cubin target: "sm_90a"."""
        return f"sm_{self.digits}"

    @property
    def sm_number(self) -> int:
        """The SM number a cubin carries in its fatbin entry, suffix aside: 90 for sm_90a."""
        return self.major * 10 + self.minor

    def runs_on(self, gpu: Arch) -> bool:
        """Does a cubin for this target run on a GPU of compute capability `gpu`?

        Plain and family ("f") code runs on the same major at the same or a later minor (sm_80 on 8.6,
        sm_100f on 10.3); architecture-specific ("a") code only on exactly its capability.
        """
        if self.suffix == "a":
            return (self.major, self.minor) == (gpu.major, gpu.minor)
        return self.major == gpu.major and self.minor <= gpu.minor


def parse_arch(text: str) -> str:
    """Any spelling of one arch ("90a", "sm_90a", " 9.0a") -> its canonical dotted spelling "9.0a"."""
    return Arch.parse(text).dotted


def arch_key(arch: str) -> Arch:
    """Sort key of an arch in any spelling: 9.0 before 9.0a before 9.0f before 10.0."""
    return Arch.parse(arch)


def parse_arch_set(value: str) -> tuple[str, ...]:
    """ "9.0;8.0" -> ("8.0", "9.0"): sorted and de-duplicated; ValueError on bad syntax or no arch."""
    parts = [p for p in re.split(r"[;\s,]+", value.strip()) if p]
    if not parts:
        raise ValueError("arch set is empty")
    return tuple(a.dotted for a in sorted({Arch.parse_dotted(p) for p in parts}))


def arch_set_str(archs: tuple[str, ...]) -> str:
    """The canonical ";"-joined spelling of an arch set (the `arch` value in JSON output)."""
    return ";".join(archs)


def format_arch_list(archs: tuple[str, ...], style: str) -> str:
    """Arch list for a build env var: style "flash-attn" -> "80;90", "torch" -> "8.0;9.0"."""
    if style == "flash-attn":
        return ";".join(Arch.parse(a).digits for a in archs)
    if style == "torch":
        return ";".join(Arch.parse(a).dotted for a in archs)
    raise ValueError(f"unknown arch format {style!r} (use 'flash-attn' or 'torch')")


@dataclass(frozen=True, kw_only=True, order=True)
class VariantKey:
    """What a variant id and a local label say: CUDA, torch, ABI and the arch set (dotted, sorted); `stable`:
    a stable-ABI variant, whose `torch` is the oldest torch its wheel serves.

    Built only from valid parts (ValueError otherwise), so its id and label always parse back to it."""

    cuda: str  # "12.8", "12.10"
    torch: str  # "2.10" or "2.14.1"
    cxx11_abi: bool
    archs: tuple[str, ...]  # "8.0", "9.0a", "10.0f"
    stable: bool = False

    def __post_init__(self) -> None:
        if not CUDA_VERSION.fullmatch(self.cuda):
            raise ValueError(f"CUDA version {self.cuda!r} is not like 12.8 or 12.10")
        if not TORCH_VERSION.fullmatch(self.torch):
            raise ValueError(f"torch version {self.torch!r} is not like 2.10 or 2.14.1")
        if not self.archs:
            raise ValueError("arch set is empty")
        if self.archs != tuple(a.dotted for a in sorted({Arch.parse(a) for a in self.archs})):
            raise ValueError(f"arch set {self.archs!r} is not sorted, de-duplicated dotted archs")

    @property
    def cuda_tag(self) -> str:
        """ "12.8" -> "cu128" as PyTorch spells it; "12.10" -> "cu12.10", unambiguous (see the module doc)."""
        major, minor = self.cuda.split(".")
        return f"cu{major}{minor}" if len(minor) == 1 else f"cu{major}.{minor}"

    @property
    def _sm(self) -> str:
        return ".".join(Arch.parse(a).digits for a in self.archs)

    @property
    def id(self) -> str:
        """ "cu128-torch2.10-abi1-sm80.90.100.120": the variant's index directory name."""
        return f"{self.cuda_tag}-{self._kind}{self.torch}-abi{int(self.cxx11_abi)}-sm{self._sm}"

    @property
    def _kind(self) -> str:
        return "stable" if self.stable else "torch"

    @property
    def local_version(self) -> str:
        """ "cu12.8.torch2.10.abi1.sm80.90.100.120": the PEP 440 local label, every number its own segment."""
        return f"cu{self.cuda}.{self._kind}{self.torch}.abi{int(self.cxx11_abi)}.sm{self._sm}"

    def covers(self, other: VariantKey) -> bool:
        """May a page of variant `other` list this variant's wheel? Its own page; and a stable-ABI
        variant's wheel the page of every torch variant of its CUDA, ABI and archs whose torch is at or after
        its floor."""
        if other == self:
            return True
        if not self.stable or other.stable:
            return False
        same = (other.cuda, other.cxx11_abi, other.archs) == (self.cuda, self.cxx11_abi, self.archs)
        return same and version_tuple(other.torch) >= version_tuple(self.torch)

    def with_torch(self, torch: str) -> VariantKey:
        """The torch variant of this CUDA, ABI and arch set for `torch` (a stable variant's covered page)."""
        return VariantKey(cuda=self.cuda, torch=torch, cxx11_abi=self.cxx11_abi, archs=self.archs)

    @classmethod
    def _from_match(cls, cuda: str, match: re.Match[str]) -> VariantKey | None:
        try:
            return cls(
                cuda=cuda,
                torch=match["torch"],
                cxx11_abi=match["abi"] == "1",
                archs=tuple(Arch.parse(d).dotted for d in match["archs"].split(".")),
                stable=match["kind"] == "stable",
            )
        except ValueError:
            return None

    @classmethod
    def parse_id(cls, variant_id: str) -> VariantKey:
        """The inverse of `id`; ValueError for a name that is not exactly a variant id this module makes."""
        match = _ID.fullmatch(variant_id)
        key = None
        if match is not None:
            major = match["major"] or match["dmajor"]
            minor = match["minor"] or match["dminor"]
            key = cls._from_match(f"{major}.{minor}", match)
        if key is None or key.id != variant_id:  # one spelling per variant: "sm90.80" is not an id
            raise ValueError(
                f"{variant_id!r} is not a variant id (expected like cu128-torch2.10-abi1-sm80.90 "
                "or cu12.10-torch2.10-abi1-sm90a.100f)"
            )
        return key

    @classmethod
    def parse_local_version(cls, label: str) -> VariantKey:
        """The inverse of `local_version`, with or without a leading "VERSION+"; ValueError for a label the
        factory did not make. Takes packaging's normalised form as well as the label as written."""
        local = label.split("+", 1)[1] if "+" in label else label
        match = _LABEL.fullmatch(local)
        key = None if match is None else cls._from_match(match["cuda"], match)
        if key is None or key.local_version != local:
            raise ValueError(
                f"{label!r} is not a factory local version label "
                "(expected like cu12.8.torch2.10.abi1.sm80.90)"
            )
        return key


def variant_id_from_local_version(label: str) -> str:
    """ "cu12.8.torch2.10.abi1.sm80.90.100.120" -> "cu128-torch2.10-abi1-sm80.90.100.120".

    Raises ValueError for a label the factory did not make."""
    return VariantKey.parse_local_version(label).id


def is_variant_id(text: str) -> bool:
    """Whether `text` is exactly a variant id the factory makes."""
    try:
        VariantKey.parse_id(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True, kw_only=True, order=True)
class Variant:
    """One wheel flavour of one package version; every Python of a job list shares it."""

    package: str
    version: str
    cuda: str
    torch: str
    cxx11_abi: bool
    archs: tuple[str, ...]
    # A stable-ABI variant (factory.spec.stable_abi): the oldest torch its one wheel serves; `torch` is then
    # the
    # torch it is built against, which its id and label do not name.
    stable_abi: str | None = None

    @property
    def key(self) -> VariantKey:
        if self.stable_abi is not None:
            return VariantKey(
                cuda=self.cuda, torch=self.stable_abi, cxx11_abi=self.cxx11_abi, archs=self.archs, stable=True
            )
        return VariantKey(cuda=self.cuda, torch=self.torch, cxx11_abi=self.cxx11_abi, archs=self.archs)

    @property
    def id(self) -> str:
        return self.key.id

    @property
    def local_version(self) -> str:
        return self.key.local_version

    @property
    def full_version(self) -> str:
        """The wheel's version: "2.8.3+cu12.8.torch2.10.abi1.sm80.90"."""
        return f"{self.version}+{self.local_version}"

    @property
    def arch(self) -> str:
        """Canonical ";"-joined arch set."""
        return arch_set_str(self.archs)


def torch_minor(torch: str) -> str:
    """ "2.14.1" -> "2.14": compatibility data is kept per torch minor release."""
    return ".".join(torch.split(".")[:2])


def version_tuple(version: str) -> tuple[int, ...]:
    """ "12.10" -> (12, 10): numeric comparison of CUDA/torch/Python versions (ValueError if not numeric)."""
    return tuple(int(p) for p in version.split("."))
