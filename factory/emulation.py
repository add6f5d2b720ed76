"""Running another platform's containers on this host: QEMU user-mode emulation through binfmt_misc.

An Arm builder image on an Intel host runs every binary of the image (Python, g++, nvcc) through
`qemu-<arch>`, which the kernel starts for each Arm ELF file by its binfmt_misc entry. Inside a
container the interpreter's path names a file of the host, not of the image, so the entry must be registered
with the fix-binary flag (`F`: the kernel opens the interpreter when it is registered, not when a binary
runs). Debian's `qemu-user-static` registers its entries so (through `binfmt-support`), as cibuildwheel's
`tonistiigi/binfmt` does.

The host's platform needs no emulation (an Arm runner builds natively). The check runs before any
container starts; what is missing is one line saying what to run.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from factory import bounded
from factory.errors import ConfigError, FactoryError
from factory.platforms import DEFAULT_PLATFORM, Platform, host_platform

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# An entry is a few lines (interpreter, flags, offset, magic, mask); a bigger file is not one.
MAX_ENTRY_BYTES = 4096
INSTALL = "apt-get install qemu-user-static binfmt-support"


@dataclass(frozen=True, kw_only=True)
class BinfmtEntry:
    """One binfmt_misc entry as /proc/sys/fs/binfmt_misc/<name> shows it."""

    enabled: bool
    interpreter: str
    flags: str

    @property
    def fix_binary(self) -> bool:
        return "F" in self.flags


def parse_entry(text: str) -> BinfmtEntry:
    """The state, interpreter and flags of an entry's text: lines "enabled", "interpreter /usr/...",
    "flags: PF"."""
    enabled = False
    interpreter = ""
    flags = ""
    for line in text.splitlines():
        line = line.strip()
        if line in ("enabled", "disabled"):
            enabled = line == "enabled"
        elif line.startswith("interpreter "):
            interpreter = line.removeprefix("interpreter ").strip()
        elif line.startswith("flags:"):
            flags = line.removeprefix("flags:").strip()
    return BinfmtEntry(enabled=enabled, interpreter=interpreter, flags=flags)


def entry_name(target: Platform) -> str:
    """The binfmt_misc entry that runs `target`'s binaries: "qemu-" and QEMU's name of it."""
    return f"qemu-{target.qemu}"


def needs_emulation(target: Platform, host: Platform | None) -> bool:
    """Whether `target`'s containers run through QEMU here (every platform but the host's own)."""
    return target != host


def emulation_problem(
    target: Platform, *, host: Platform | None = None, binfmt_dir: Path = BINFMT_DIR
) -> str | None:
    """Why `target`'s containers cannot run on this host, with what to run (one line); None when they can:
    the host's own platform, or a QEMU entry registered, enabled and with the fix-binary flag."""
    host = host if host is not None else host_platform()
    if not needs_emulation(target, host):
        return None
    name = entry_name(target)
    here = host.name if host is not None else "this"
    what = f"{target.name} containers on this {here} host need QEMU emulation"
    if not (binfmt_dir / "status").exists():
        return (
            f"{what}, and binfmt_misc is not mounted: run `mount -t binfmt_misc binfmt_misc {binfmt_dir}` "
            f"and `{INSTALL}`"
        )
    try:
        text = bounded.read_file(binfmt_dir / name, max_bytes=MAX_ENTRY_BYTES).decode(errors="replace")
    except FileNotFoundError:
        return f"{what}: run `{INSTALL}` (it registers {name} with binfmt_misc)"
    except (OSError, FactoryError) as exc:
        return f"{what}: cannot read {binfmt_dir / name} ({exc}); run `{INSTALL}`"
    entry = parse_entry(text)
    if not entry.enabled:
        return f"{what}: {name} is registered but disabled; run `update-binfmts --enable {name}`"
    if not entry.fix_binary:
        # without F the kernel looks the interpreter up inside the container, where it is not
        return (
            f"{what}: {name} is registered without the fix-binary flag (F), so containers cannot start "
            f"its interpreter {entry.interpreter or '(none)'}; run `update-binfmts --disable {name}` and "
            f"`{INSTALL}`"
        )
    return None


def measured_on(target: Platform, host: Platform | None = None) -> str:
    """Where a job's compiles are measured, as the learned memory profile's key beside package and
    version: "" for the default platform built natively (the profiles that predate the axis), the platform's
    name for another built natively, "<name>-emulated" under QEMU. Emulation raises a compile's peak (QEMU's
    translation cache and its own heap count against the container) and its time many times over, so
    emulated and native figures never share a profile: admission under emulation plans from emulated peaks,
    and a native build is not slowed by them."""
    host = host if host is not None else host_platform()
    if not needs_emulation(target, host):
        return "" if target == DEFAULT_PLATFORM else target.name
    return f"{target.name}-emulated"


def require(targets: Iterable[Platform], *, binfmt_dir: Path = BINFMT_DIR) -> None:
    """ConfigError (exit 2) with the first platform's problem, before any container of it starts."""
    for target in dict.fromkeys(targets):
        problem = emulation_problem(target, binfmt_dir=binfmt_dir)
        if problem is not None:
            raise ConfigError(problem)


__all__ = [
    "BINFMT_DIR",
    "INSTALL",
    "BinfmtEntry",
    "emulation_problem",
    "entry_name",
    "measured_on",
    "needs_emulation",
    "parse_entry",
    "require",
]
