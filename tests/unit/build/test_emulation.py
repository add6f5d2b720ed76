"""QEMU user emulation through binfmt_misc: the entry parsed, each way it can be missing one line with what to
run, and the learned profile's key (emulated and native figures apart)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factory.build import emulation
from factory.core.errors import ConfigError
from factory.core.platforms import DEFAULT_PLATFORM, named
from factory.memory import profiles

AARCH64 = named("aarch64")
REGISTERED = (
    "enabled\ninterpreter /usr/libexec/qemu-binfmt/aarch64-binfmt-P\nflags: PF\noffset 0\n"
    "magic 7f454c460201010000000000000000000200b700\nmask ffffffffffffff00fffffffffffffffffeffffff\n"
)


QEMU_10 = "qemu-aarch64 version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright (c) 2003-2025\n"
QEMU_7 = "qemu-aarch64 version 7.2.22 (Debian 1:7.2+dfsg-7+deb12u18+b3)\n"


def says(text: str | None):  # type: ignore[no-untyped-def]
    return lambda interpreter: text


def binfmt(tmp_path: Path, entry: str | None, *, mounted: bool = True) -> Path:
    directory = tmp_path / "binfmt_misc"
    directory.mkdir()
    if mounted:
        (directory / "status").write_text("enabled\n")
        (directory / "register").write_text("")
    if entry is not None:
        (directory / "qemu-aarch64").write_text(entry)
    return directory


def test_parse_entry() -> None:
    entry = emulation.parse_entry(REGISTERED)
    assert entry.enabled and entry.fix_binary
    assert entry.interpreter == "/usr/libexec/qemu-binfmt/aarch64-binfmt-P" and entry.flags == "PF"
    plain = emulation.parse_entry("disabled\ninterpreter /usr/bin/qemu-aarch64\nflags: \n")
    assert not plain.enabled and not plain.fix_binary and plain.flags == ""
    assert not emulation.parse_entry("").enabled


def test_registered_with_fix_binary_is_no_problem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    directory = binfmt(tmp_path, REGISTERED)
    assert (
        emulation.emulation_problem(
            AARCH64, host=DEFAULT_PLATFORM, binfmt_dir=directory, version_of=says(QEMU_10)
        )
        is None
    )
    monkeypatch.setattr(emulation, "host_platform", lambda: DEFAULT_PLATFORM)
    emulation.require([AARCH64, AARCH64], binfmt_dir=directory, version_of=says(QEMU_10))


def test_native_needs_nothing(tmp_path: Path) -> None:
    """The host's own platform runs natively: no entry is read (an aarch64 runner builds aarch64)."""
    empty = binfmt(tmp_path, None, mounted=False)
    assert emulation.emulation_problem(AARCH64, host=AARCH64, binfmt_dir=empty, version_of=says(None)) is None
    assert (
        emulation.emulation_problem(
            DEFAULT_PLATFORM, host=DEFAULT_PLATFORM, binfmt_dir=empty, version_of=says(None)
        )
        is None
    )
    assert not emulation.needs_emulation(AARCH64, AARCH64)
    assert emulation.needs_emulation(AARCH64, DEFAULT_PLATFORM)
    assert emulation.needs_emulation(DEFAULT_PLATFORM, AARCH64)
    assert emulation.needs_emulation(AARCH64, None)  # an unknown host runs nothing of ours natively


@pytest.mark.parametrize(
    ("entry", "mounted", "expected"),
    [
        (None, True, "run `apt-get install qemu-user-static binfmt-support` (it registers qemu-aarch64"),
        (None, False, "binfmt_misc is not mounted: run `mount -t binfmt_misc binfmt_misc"),
        (REGISTERED.replace("enabled", "disabled", 1), True, "run `update-binfmts --enable qemu-aarch64`"),
        (REGISTERED.replace("flags: PF", "flags: P"), True, "without the fix-binary flag (F)"),
    ],
)
def test_missing_emulation_is_one_line_saying_what_to_run(
    tmp_path: Path, entry: str | None, mounted: bool, expected: str
) -> None:
    directory = binfmt(tmp_path, entry, mounted=mounted)
    problem = emulation.emulation_problem(
        AARCH64, host=DEFAULT_PLATFORM, binfmt_dir=directory, version_of=says(QEMU_10)
    )
    assert problem is not None and "\n" not in problem
    assert problem.startswith("aarch64 containers on this x86_64 host need QEMU emulation")
    assert expected in problem


def test_require_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(emulation, "host_platform", lambda: DEFAULT_PLATFORM)
    directory = binfmt(tmp_path, None)
    with pytest.raises(ConfigError, match=r"^aarch64 containers .* qemu-user-static") as caught:
        emulation.require([DEFAULT_PLATFORM, AARCH64], binfmt_dir=directory, version_of=says(QEMU_10))
    assert caught.value.exit_code == 2
    emulation.require(
        [DEFAULT_PLATFORM], binfmt_dir=directory, version_of=says(QEMU_10)
    )  # the host's own: nothing to check


@pytest.mark.parametrize(
    ("said", "shown"), [(QEMU_7, "is QEMU 7.2, older than 10.0"), (None, "is QEMU an unknown version")]
)
def test_a_qemu_that_crashes_importing_torch_is_refused(tmp_path: Path, said: str | None, shown: str) -> None:
    directory = binfmt(tmp_path, REGISTERED)
    problem = emulation.emulation_problem(
        AARCH64, host=DEFAULT_PLATFORM, binfmt_dir=directory, version_of=says(said)
    )
    assert problem is not None and "\n" not in problem
    assert f"/usr/libexec/qemu-binfmt/aarch64-binfmt-P {shown}" in problem
    assert "bookworm-backports" in problem and "update-binfmts --enable qemu-aarch64" in problem


def test_qemu_version() -> None:
    assert emulation.qemu_version(QEMU_10) == (10, 0)
    assert emulation.qemu_version(QEMU_7) == (7, 2)
    assert emulation.qemu_version("qemu-x86_64 version 9.2.0\n") == (9, 2)
    assert emulation.qemu_version("") is None and emulation.qemu_version("version 10.0") is None


def test_an_oversized_entry_is_refused_not_read(tmp_path: Path) -> None:
    directory = binfmt(tmp_path, REGISTERED + "x" * 10_000)
    problem = emulation.emulation_problem(
        AARCH64, host=DEFAULT_PLATFORM, binfmt_dir=directory, version_of=says(QEMU_10)
    )
    assert problem is not None and "cannot read" in problem


def test_profiles_of_emulated_and_native_builds_never_mix(tmp_path: Path) -> None:
    assert emulation.measured_on(DEFAULT_PLATFORM, DEFAULT_PLATFORM) == ""
    assert emulation.measured_on(AARCH64, AARCH64) == "aarch64"
    assert emulation.measured_on(AARCH64, DEFAULT_PLATFORM) == "aarch64-emulated"
    assert emulation.measured_on(DEFAULT_PLATFORM, AARCH64) == "x86_64-emulated"
    keys = {
        profiles.keyed_version("2.8.3", emulation.measured_on(target, host))
        for target in (DEFAULT_PLATFORM, AARCH64)
        for host in (DEFAULT_PLATFORM, AARCH64)
    }
    assert keys == {"2.8.3", "2.8.3@aarch64", "2.8.3@aarch64-emulated", "2.8.3@x86_64-emulated"}
    paths = {profiles.profile_path("flash-attn", key, home=tmp_path) for key in keys}
    assert len(paths) == 4  # four files: nothing measured one way is read for another
    assert profiles.profile_path("flash-attn", "2.8.3", home=tmp_path).name == "2.8.3.json"  # as before
