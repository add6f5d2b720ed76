"""`factory which` and the experimental wheel-variant channel (PEP 825): the uv variant command after the safe
commands where the index has the channel, exactly today's output where it has not, and no command (one note
at most, never a traceback) for whatever else the index hands back."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path

import pytest
from test_which import NEW, PROBED, env, fake_python, local_index, pinned_commands

from factory.consume.which import result_lines, which
from factory.publish import index, wheelvariants
from factory.publish.installcmd import DEFAULT_INDEX, PREVIEW_FEATURE

GROUP = "torch2.14-abi1"
LABEL_LINE = (
    f"experimental, wheel variants (PEP 825; tested with uv {wheelvariants.UV_TESTED}): uv picks the build "
    "for this host's NVIDIA driver and GPU:"
)


def channel(root: Path, groups: list[str], projects: dict[str, list[str]]) -> None:
    """The variant channel's state objects under `root`, written by their own writers."""
    (root / "variants").mkdir(parents=True, exist_ok=True)
    (root / wheelvariants.GROUPS_STATE).write_text(wheelvariants.groups_json(groups))
    for group, names in projects.items():
        path = root / wheelvariants.projects_key(group)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(index.variant_root_json(names))


def variant_command(root_url: str, group: str = GROUP, project: str = "flash-attn") -> str:
    return shlex.join(
        [
            "uv", "pip", "install", "--preview-features", PREVIEW_FEATURE, "--only-binary", project,
            "--index-strategy", "first-index", "--index", f"{root_url}/variants/{group}/simple/",
            "--default-index", DEFAULT_INDEX, "torch==2.14.1", project,
        ]
    )  # fmt: skip


def test_an_index_without_the_channel_prints_what_it_printed_before(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    result = which(str(tmp_path), env=env())
    assert (result.variant_installs, result.variant_note) == ((), None)
    assert result_lines(result) == ["variant: " + NEW, *pinned_commands(root)]


def test_the_variant_command_follows_the_safe_commands_labelled_experimental(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    channel(tmp_path, [GROUP, "torch2.10-abi1"], {GROUP: ["flash-attn", "other-ext"]})
    lines = result_lines(which(str(tmp_path), env=env()))
    # the variant index first (uv takes the project from it alone), torch pinned as installed, no version:
    # the variant and the release are uv's to pick
    assert lines == ["variant: " + NEW, *pinned_commands(root), LABEL_LINE, variant_command(root)]


def test_the_variant_index_of_the_hosts_torch_and_abi(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    stable = "stable2.12-abi1"
    channel(tmp_path, ["torch2.14-abi0", stable], {"torch2.14-abi0": ["flash-attn"], stable: ["flash-attn"]})
    # no torch2.14-abi1: the stable-ABI one whose floor 2.14.1 covers; the ABI of torch, not the other one
    assert which(str(tmp_path), env=env()).variant_commands == (variant_command(root, stable),)
    # torch's ABI unknown: the chosen per-variant index's (abi1)
    assert which(str(tmp_path), env=env(cxx11_abi=None)).variant_commands == (variant_command(root, stable),)


@pytest.mark.parametrize(
    ("groups", "projects"),
    [
        (["torch2.10-abi1", "stable2.15-abi1"], {}),  # no variant index serves torch 2.14.1
        ([GROUP], {GROUP: ["other-ext"]}),  # the project is not on the host's variant index
        ([], {}),
    ],
)
def test_no_variant_index_for_this_host_or_project_prints_nothing_more(
    tmp_path: Path, groups: list[str], projects: dict[str, list[str]]
) -> None:
    root = local_index(tmp_path)
    channel(tmp_path, groups, projects)
    result = which(str(tmp_path), env=env())
    assert (result.variant_installs, result.variant_note) == ((), None)
    assert result_lines(result) == ["variant: " + NEW, *pinned_commands(root)]


def test_a_host_without_torch_and_an_index_without_projects_get_no_variant_command(tmp_path: Path) -> None:
    local_index(tmp_path)
    channel(tmp_path, [GROUP], {GROUP: ["flash-attn"]})
    no_torch = which(str(tmp_path), env=env(torch=None, cuda=None, cxx11_abi=None, driver_cuda="13.0"))
    assert no_torch.installs and no_torch.variant_installs == () and no_torch.variant_note is None
    (tmp_path / "simple" / NEW / "index.html").write_text(index.variant_root_html([]))
    empty = which(str(tmp_path), env=env())
    assert (empty.installs, empty.variant_installs, empty.variant_note) == ((), (), None)
    assert which(str(tmp_path), env=env(), wheel_variants=False).variant_installs == ()


HOSTILE_GROUPS = {
    "not json": b"\x00\xff garbage",
    "a list": b"[]",
    "another format": json.dumps({"format": "x/1", "groups": [GROUP]}).encode(),
    "a path for a group": json.dumps({"format": "factory-variants/1", "groups": ["../../x"]}).encode(),
    "a duplicate key": b'{"format": "factory-variants/1", "groups": [], "groups": ["torch2.14-abi1"]}',
    "nested deep": b"[" * 200_000,
    "a huge number": b'{"format": "factory-variants/1", "groups": [], "n": ' + b"9" * 5000 + b"}",
    "over the cap": json.dumps(
        {"format": "factory-variants/1", "groups": [GROUP], "pad": "x" * (4 << 20)}
    ).encode(),
}
HOSTILE_PROJECTS = {
    "not json": b"{",
    "a shell word for a name": json.dumps({"projects": [{"name": "flash-attn; reboot"}]}).encode(),
    "not a list": json.dumps({"projects": {"name": "flash-attn"}}).encode(),
    "a huge number": b'{"projects": [{"name": "flash-attn", "n": ' + b"9" * 5000 + b"}]}",
    "nested deep": b'{"projects": ' + b"[" * 200_000,
}


@pytest.mark.parametrize(
    ("what", "which_file"),
    [(k, "groups") for k in HOSTILE_GROUPS]
    + [(k, "projects") for k in HOSTILE_PROJECTS]
    + [("absent", "projects")],
)
def test_what_the_channel_hands_back_that_is_not_its_format_is_one_note_and_no_command(
    tmp_path: Path, what: str, which_file: str
) -> None:
    root = local_index(tmp_path)
    channel(tmp_path, [GROUP], {GROUP: ["flash-attn"]})
    if which_file == "groups":
        (tmp_path / wheelvariants.GROUPS_STATE).write_bytes(HOSTILE_GROUPS[what])
    elif what == "absent":  # the group is named, its listing is not there
        (tmp_path / wheelvariants.projects_key(GROUP)).unlink()
    else:
        (tmp_path / wheelvariants.projects_key(GROUP)).write_bytes(HOSTILE_PROJECTS[what])
    result = which(str(tmp_path), env=env())
    assert result.variant_installs == ()
    lines = result_lines(result)
    assert lines[:-1] == ["variant: " + NEW, *pinned_commands(root)]
    note = lines[-1]
    assert note.startswith("note: no wheel-variant command: variants/") and len(note) < 400, note
    assert note.isprintable()  # what the index said, quoted at most: never in a command


def test_groups_json_that_cannot_be_read_is_no_channel(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    (tmp_path / wheelvariants.GROUPS_STATE).mkdir(parents=True)  # a directory where the file would be
    assert result_lines(which(str(tmp_path), env=env())) == ["variant: " + NEW, *pinned_commands(root)]


def test_the_which_command_prints_the_variant_command_last(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    root = local_index(tmp_path / "index")
    channel(tmp_path / "index", [GROUP], {GROUP: ["flash-attn"]})
    python = fake_python(tmp_path, json.dumps(PROBED))
    code, output = factory_cli(["which", "--index-url", str(tmp_path / "index"), "--python", python])
    assert code == 0, output
    lines = output.splitlines()
    assert lines[1:] == ["variant: " + NEW, *pinned_commands(root), LABEL_LINE, variant_command(root)]
    # a damaged channel: the same safe commands, exit 0, one note
    (tmp_path / "index" / wheelvariants.GROUPS_STATE).write_bytes(b"{")
    code, output = factory_cli(["which", "--index-url", str(tmp_path / "index"), "--python", python])
    assert code == 0 and "Traceback" not in output, output
    assert output.splitlines()[1:-1] == ["variant: " + NEW, *pinned_commands(root)]
    assert output.splitlines()[-1].startswith("note: no wheel-variant command: variants/groups.json: ")
