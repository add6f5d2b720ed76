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

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from factory.core import bounded
from factory.core.errors import ConfigError, FactoryError
from factory.core.platforms import DEFAULT_PLATFORM, Platform, host_platform

BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
# The oldest QEMU that runs what the factory runs: Debian bookworm's 7.2 crashes in torch 2.14's module init
# (`import torch` in an Arm container: SIGSEGV after oneDNN's CPU probe), so no extension's setup.py runs;
# 10.0 (trixie, bookworm-backports) imports it. Releases between were not measured, so they are not taken.
MIN_QEMU = (10, 0)
_QEMU_VERSION = re.compile(r"^qemu-\S+ version (\d+)\.(\d+)", re.MULTILINE)
# An entry is a few lines (interpreter, flags, offset, magic, mask); a bigger file is not one.
MAX_ENTRY_BYTES = 4096
INSTALL = "apt-get install qemu-user-static binfmt-support"
# What installs a QEMU of at least MIN_QEMU on bookworm (scripts/host-tools.sh does it); trixie's own is one.
UPGRADE = (
    "scripts/host-tools.sh (on Debian bookworm: qemu-user-static from bookworm-backports), then "
    "`update-binfmts --disable {name} && update-binfmts --enable {name}`"
)


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


def qemu_version(text: str) -> tuple[int, int] | None:
    """(10, 0) of `qemu-<arch> --version`'s "qemu-<arch> version 10.0.2 (Debian ...)"; None otherwise."""
    match = _QEMU_VERSION.search(text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def interpreter_version(interpreter: str) -> str | None:
    """What the registered interpreter says to --version (bounded: 64 KiB within 30 s); None if it cannot.
    Debian registers a `<arch>-binfmt-P` link, which refuses to run but from binfmt_misc: its target is
    asked."""
    return bounded.run_output([os.path.realpath(interpreter), "--version"], max_bytes=65536, seconds=30)


def emulation_problem(
    target: Platform,
    *,
    host: Platform | None = None,
    binfmt_dir: Path | None = None,
    version_of: Callable[[str], str | None] = interpreter_version,
) -> str | None:
    """Why `target`'s containers cannot run on this host, with what to run (one line); None when they can:
    the host's own platform, or a QEMU entry registered, enabled, with the fix-binary flag and of at least
    MIN_QEMU (the interpreter's --version; the kernel holds the file it opened at registration, so after an
    upgrade the entry must be registered again, as the message says)."""
    host = host if host is not None else host_platform()
    if not needs_emulation(target, host):
        return None
    binfmt_dir = binfmt_dir or BINFMT_DIR
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
    said = version_of(entry.interpreter) if entry.interpreter else None
    version = qemu_version(said or "")
    if version is None or version < MIN_QEMU:
        shown = "an unknown version" if version is None else f"{version[0]}.{version[1]}"
        wanted = f"{MIN_QEMU[0]}.{MIN_QEMU[1]}"
        return (
            f"{what}: {entry.interpreter or name} is QEMU {shown}, older than {wanted} (7.2 crashes "
            f"importing torch); run {UPGRADE.format(name=name)}"
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


def require(
    targets: Iterable[Platform],
    *,
    binfmt_dir: Path | None = None,
    version_of: Callable[[str], str | None] = interpreter_version,
) -> None:
    """ConfigError (exit 2) with the first platform's problem, before any container of it starts."""
    for target in dict.fromkeys(targets):
        problem = emulation_problem(target, binfmt_dir=binfmt_dir, version_of=version_of)
        if problem is not None:
            raise ConfigError(problem)


__all__ = [
    "BINFMT_DIR",
    "INSTALL",
    "MIN_QEMU",
    "BinfmtEntry",
    "emulation_problem",
    "entry_name",
    "measured_on",
    "needs_emulation",
    "parse_entry",
    "qemu_version",
    "require",
]
