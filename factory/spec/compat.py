"""Compatibility knowledge (factory/data/compat.json) and the pruning of jobs it rules out.

Three outcomes for a combination: dropped (the data rules it out, with the reason), trimmed (archs its
CUDA cannot compile are removed from the set, with a note), or kept; a kept job the data knows nothing about
is marked unknown rather than dropped, because missing knowledge is not evidence of incompatibility.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from factory.core.resources import read_data
from factory.core.variants import Arch, arch_key, torch_minor, version_tuple

TOP_KEYS = ("cuda_versions", "archs", "torch", "recipes")
ARCH_KEYS = ("min_cuda", "max_cuda", "why")
# default_cuda: the CUDA of the release's default build, the one PyPI serves (and so the one a job whose
# build.torch_index is `default` gets from an index that mirrors PyPI)
# glibc: the oldest glibc torch's wheels install on, their manylinux tag ("2.28"; build.glibc: torch)
TORCH_KEYS = ("cuda", "default_cuda", "python", "cxx11_abi", "cxx_std", "complete", "glibc")
RECIPE_KEYS = ("min_arch", "cxx_std")


def builtin_data() -> dict[str, Any]:
    text = read_data("compat.json")
    data = json.loads(text)
    data.pop("_comment", None)
    return data


def merge(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else (lists included) replaces."""
    out = copy.deepcopy(dict(base))
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


@dataclass(frozen=True, kw_only=True)
class Verdict:
    """What the data says about one combination."""

    archs: tuple[str, ...]  # the archs left after trimming
    notes: tuple[str, ...] = ()
    dropped: str | None = None  # reason, when the combination is ruled out
    known: bool = True
    unknown: tuple[str, ...] = field(default=())  # what the data did not know


@dataclass(frozen=True, kw_only=True)
class CompatData:
    """The built-in data merged with a matrix file's `compat:` overrides."""

    data: Mapping[str, Any]

    @classmethod
    def load(cls, overrides: Mapping[str, Any] | None = None) -> CompatData:
        data = builtin_data()
        return cls(data=merge(data, overrides) if overrides else data)

    @property
    def known_archs(self) -> tuple[str, ...]:
        return tuple(sorted(self.data.get("archs", {}), key=arch_key))

    def cuda_archs(self, cuda: str) -> tuple[str, ...]:
        """Every known arch the given CUDA's nvcc can compile for."""
        return tuple(a for a in self.known_archs if self.arch_problem(a, cuda) is None)

    def arch_problem(self, arch: str, cuda: str) -> str | None:
        """Why `cuda` cannot compile for `arch`, or None when it can (or nothing is known)."""
        rule = self.data.get("archs", {}).get(arch)
        if rule is None:
            return None
        cu = version_tuple(cuda)
        sm = Arch.parse(arch).sm
        if "min_cuda" in rule and cu < version_tuple(rule["min_cuda"]):
            return f"CUDA {cuda} cannot target {sm} (needs CUDA >= {rule['min_cuda']})"
        if "max_cuda" in rule and cu > version_tuple(rule["max_cuda"]):
            why = f"; {rule['why']}" if rule.get("why") else ""
            return f"CUDA {cuda} cannot target {sm} (last supported by CUDA {rule['max_cuda']}{why})"
        return None

    def torch_entry(self, torch: str) -> Mapping[str, Any] | None:
        return self.data.get("torch", {}).get(torch_minor(torch))

    def required_cxx_std(self, torch: str) -> str | None:
        """The C++ standard torch's headers need ("20" for torch >= 2.14), None when unknown."""
        entry = self.torch_entry(torch)
        return None if entry is None else entry.get("cxx_std")

    def torch_glibc(self, torch: str) -> str | None:
        """The oldest glibc torch's own wheels install on ("2.28", their manylinux tag), None when unknown."""
        entry = self.torch_entry(torch)
        value = None if entry is None else entry.get("glibc")
        return None if value is None else str(value)

    def recipe_limit(self, recipe: str, key: str) -> str | None:
        return self.data.get("recipes", {}).get(recipe, {}).get(key)

    def judge(
        self,
        *,
        cuda: str,
        torch: str,
        python: str,
        cxx11_abi: bool,
        archs: tuple[str, ...],
        recipe: str,
        min_arch: str | None = None,
        cxx_std: str | None = None,
        default_index: bool = False,
    ) -> Verdict:
        """Prune one combination. The recipe's own `min_arch`/`cxx_std` win over the data's. `default_index`:
        torch comes from the host's pip configuration (`build.torch_index: default`), whose one build of a
        release is its default one (PyPI's), so another CUDA cannot be had there."""
        unknown: list[str] = []
        entry = self.torch_entry(torch)
        tm = torch_minor(torch)

        def ruled_out(reason: str) -> Verdict:
            return Verdict(archs=archs, dropped=reason, known=True)

        if entry is None:
            unknown.append(f"torch {tm}")
        else:
            complete = entry.get("complete", True)
            shipped = entry.get("cuda")
            if shipped is None:
                unknown.append(f"CUDA builds of torch {tm}")
            elif cuda not in shipped:
                if complete:
                    return ruled_out(f"torch {tm} ships no CUDA {cuda} build (only {', '.join(shipped)})")
                unknown.append(f"torch {tm} with CUDA {cuda}")
            default_cuda = entry.get("default_cuda")
            if default_index and default_cuda is not None and cuda != default_cuda:
                return ruled_out(
                    f"torch {tm} on the default index is a CUDA {default_cuda} build, not {cuda} "
                    f"(build.torch_index {cuda}: default)"
                )
            pythons = entry.get("python")
            if pythons is None:
                unknown.append(f"Pythons of torch {tm}")
            elif python not in pythons:
                if complete:
                    return ruled_out(
                        f"torch {tm} has no wheels for Python {python} (only {', '.join(pythons)})"
                    )
                unknown.append(f"torch {tm} on Python {python}")
            abis = entry.get("cxx11_abi")
            if abis is None:
                unknown.append(f"C++11 ABI of torch {tm}")
            elif cxx11_abi not in abis:
                want = "true" if abis == [True] else "false"
                return ruled_out(f"torch {tm} wheels use cxx11_abi: {want} only")
        needed = entry.get("cxx_std") if entry is not None else None
        compiles = cxx_std or self.recipe_limit(recipe, "cxx_std")
        if needed and compiles and int(compiles) < int(needed):
            return ruled_out(
                f"{recipe} compiles as C++{compiles} but torch {tm} headers need C++{needed} "
                f"(patch the source and set the recipe's cxx_std)"
            )
        if cuda not in self.data.get("cuda_versions", []):
            unknown.append(f"CUDA {cuda}")

        floor = min_arch or self.recipe_limit(recipe, "min_arch")
        kept: list[str] = []
        notes: list[str] = []
        for arch in archs:
            problem = self.arch_problem(arch, cuda)
            if problem is None and floor is not None and arch_key(arch) < arch_key(floor):
                problem = f"{recipe} needs {Arch.parse(floor).sm} or newer"
            if problem is None:
                kept.append(arch)
            else:
                notes.append(f"arch {arch} trimmed: {problem}")
        if unknown:
            notes.append("unknown: compat data knows nothing about " + ", ".join(unknown))
        if not kept:
            return Verdict(
                archs=(),
                notes=tuple(notes),
                dropped="no arch left: "
                + "; ".join(n.removeprefix("arch ") for n in notes if "trimmed" in n),
                known=not unknown,
                unknown=tuple(unknown),
            )
        return Verdict(archs=tuple(kept), notes=tuple(notes), known=not unknown, unknown=tuple(unknown))
