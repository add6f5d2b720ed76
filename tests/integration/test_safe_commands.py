"""Every install command the factory prints (`factory which`, with and without torch, with and without
`--verify-key`) or renders (the index's human page) installs exactly the wheel it chose. Played with real pip
and uv in fresh venvs, each command run exactly as printed through a shell, against a local variant index
holding our (signed) wheel and a second local index, standing in for PyPI, that offers a higher sdist of the
same name (whose build would leave a marker) and a higher impostor wheel: our wheel is installed, nothing is
built, the impostor never is. Then the four ways a signed index used to let pip take unsigned bytes."""

from __future__ import annotations

import html
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from publish_helpers import (
    LABEL_NEW,
    UV,
    VID_NEW,
    file_link,
    fresh_venv,
    make_sdist,
    make_wheel,
    sha256_file,
    static_index,
)
from test_signed_index import STUB_TORCH
from test_which_requests import FAKE_SMI

from factory.publish.index import signature_path
from factory.publish.publisher import publish_wheels
from factory.trust.signing import signer_from, write_key_pair

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory"]


@dataclass
class World:
    tmp: Path
    index: Path  # our variant indexes (a directory), tinyvar 0.1.0 signed
    ours: Path  # the wheel published there
    pypi: str  # the stand-in for PyPI: tinyvar 0.2.0 (sdist), 0.3.0 (impostor wheel), torch 2.14.1
    torch_index: str  # the stand-in for PyTorch's index: torch 2.14.1
    marker: Path  # written by any build of the sdist
    private: Path
    public: Path
    bare: Path  # a python without torch
    stub: Path  # a python whose (stand-in) torch is 2.14.1 for CUDA 13.0


def stub_python(directory: Path) -> Path:
    """An interpreter that imports a stand-in torch (the probe reads only its attributes)."""
    (directory / "stub" / "torch").mkdir(parents=True)
    (directory / "stub" / "torch" / "__init__.py").write_text(STUB_TORCH)
    wrapper = directory / "python"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={directory / "stub"} exec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    tmp = tmp_path_factory.mktemp("safe")
    private = tmp / "key"
    public, _key_id = write_key_pair(private)
    ours = make_wheel(tmp / "ours", label=LABEL_NEW)
    publish_wheels([ours], to=str(tmp / "idx"), signer=signer_from(path=private))
    marker = tmp / "BUILT"
    torch = make_wheel(tmp / "torch", name="torch", version="2.14.1", label="")
    pypi = static_index(
        tmp / "pypi",
        {
            "tinyvar": [
                make_sdist(tmp / "sdist", name="tinyvar", version="0.2.0", marker=marker),
                make_wheel(tmp / "impostor", version="0.3.0", label="", payload="impostor"),
            ],
            "torch": [torch],
        },
    )
    return World(
        tmp=tmp,
        index=tmp / "idx",
        ours=ours,
        pypi=pypi,
        torch_index=static_index(tmp / "torchidx", {"torch": [torch]}),
        marker=marker,
        private=private,
        public=public,
        bare=fresh_venv(tmp / "bare", tool="uv") / "bin" / "python",
        stub=stub_python(tmp / "stubbed"),
    )


def which(
    world: World, python: Path, *args: str, index: Path | None = None, default_index: bool = True
) -> subprocess.CompletedProcess[str]:
    """`factory which` of this checkout, the default index the stand-in PyPI (unless `default_index` is
    false: for what prints no command), with a stand-in nvidia-smi alone on PATH (driver CUDA 13.0, a 9.0
    GPU: VID_NEW fits a host without torch)."""
    tools = world.tmp / "tools"
    if not tools.is_dir():
        tools.mkdir()
        (tools / "nvidia-smi").write_text(FAKE_SMI.format(caps="9.0", driver="580.65.06", cuda="13.0"))
        (tools / "nvidia-smi").chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(tools), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("FACTORY_SIGN_KEY", None)
    command = [
        *FACTORY,
        "which",
        "--index-url",
        str(index or world.index),
        "--python",
        str(python),
        *(["--default-index", world.pypi] if default_index else []),
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)


def printed(proc: subprocess.CompletedProcess[str]) -> dict[str, str]:
    """The pip and the uv command `factory which` printed."""
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    found = {tool: [line for line in lines if line.startswith(f"{tool} ")] for tool in ("pip", "uv")}
    assert [len(v) for v in found.values()] == [1, 1], proc.stdout
    return {tool: commands[0] for tool, commands in found.items()}


@dataclass
class Installed:
    proc: subprocess.CompletedProcess[str]
    label: str
    payload: str


def run_printed(
    world: World | None, command: str, tool: str, where: Path, *, extra_env: dict[str, str] | None = None
) -> Installed:
    """Run `command` exactly as printed, through a shell, in a fresh venv of `tool` (pip's own or uv's),
    with this host's pip and uv configuration and caches out of the way (and `extra_env` set)."""
    venv = fresh_venv(where / "venv", tool=tool)
    bin_dir = where / "bin"  # uv alone beside the venv's own tools: no other pip on PATH
    bin_dir.mkdir()
    (bin_dir / "uv").symlink_to(UV)
    env = {
        "PATH": f"{venv / 'bin'}:{bin_dir}:/usr/bin:/bin",
        "VIRTUAL_ENV": str(venv),
        "HOME": str(where),
        "XDG_CACHE_HOME": str(where / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_NO_CONFIG": "1",
        **(extra_env or {}),
    }
    proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=600, env=env)
    show = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import tinyvar; print(tinyvar.LABEL); print(tinyvar.PAYLOAD)"],
        capture_output=True,
        text=True,
    )
    label, payload = [*show.stdout.splitlines(), "", ""][:2] if show.returncode == 0 else ("", "")
    return Installed(proc=proc, label=label, payload=payload)


def assert_ours(world: World, got: Installed) -> None:
    """Our wheel installed; nothing built; neither the sdist nor the impostor taken."""
    out = got.proc.stdout + got.proc.stderr
    assert got.proc.returncode == 0, out
    assert (got.label, got.payload) == (LABEL_NEW, ""), out
    assert not world.marker.exists(), out
    assert "0.2.0" not in out and "0.3.0" not in out and "impostor" not in out, out
    assert not re.search(r"Building wheel|Built |Preparing metadata", out), out


_PRINTED: dict[tuple[bool, bool], dict[str, str]] = {}


def printed_by_which(world: World, *, torch: bool, key: bool) -> dict[str, str]:
    """What `factory which tinyvar` prints on a host with torch or without (the driver's choice), with
    `--verify-key` or without; asked once per case."""
    if (torch, key) not in _PRINTED:
        args = ["--verify-key", str(world.public)] if key else []
        proc = which(world, world.stub if torch else world.bare, *args, "tinyvar")
        if key:
            assert f"signed: {world.ours.name} (key " in proc.stdout, proc.stdout + proc.stderr
        _PRINTED[(torch, key)] = printed(proc)
    return _PRINTED[(torch, key)]


# Every command `which` prints, each run once: the pip command with torch and --verify-key is run by
# test_a_higher_release_on_the_default_index_is_never_taken below.
CASES = [
    pytest.param(torch, key, tool, id=f"{'torch' if torch else 'driver'}-{'key' if key else 'nokey'}-{tool}")
    for torch in (True, False)
    for key in (False, True)
    for tool in ("pip", "uv")
    if (torch, key, tool) != (True, True, "pip")
]


@pytest.mark.parametrize(("torch", "key", "tool"), CASES)
def test_which_commands_install_our_wheel_and_nothing_else(
    world: World, tmp_path: Path, tool: str, key: bool, torch: bool
) -> None:
    command = printed_by_which(world, torch=torch, key=key)[tool]
    # the file itself by URL and hash, never the project by name from an index; torch pinned
    words = shlex.split(command)
    wheel_url = f"{world.index.resolve().as_uri()}/files/{VID_NEW}/{quote(world.ours.name)}"
    assert words[-1] == f"tinyvar @ {wheel_url}#sha256={sha256_file(world.ours)}"
    assert words[-2] == ("torch==2.14.1" if torch else "torch==2.14.*")
    assert "--only-binary" in words
    assert_ours(world, run_printed(world, command, tool, tmp_path))


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_the_human_pages_commands_install_our_wheel_and_nothing_else(
    world: World, tmp_path: Path, tool: str
) -> None:
    page = (world.index / "index.html").read_text()
    codes = [html.unescape(c) for c in re.findall(r'<code data-index="[^"]*">([^<]*)</code>', page)]
    (command,) = [c for c in codes if c.startswith(f"{tool} ")]
    assert f"tinyvar==0.1.0+{LABEL_NEW}" in shlex.split(command)
    # what the page's script does in a browser (the relative index completed with the page's own URL), and
    # the two public indexes it names played by the local stand-ins
    command = command.replace(f"simple/{VID_NEW}/", f"{world.index.resolve().as_uri()}/simple/{VID_NEW}/")
    command = command.replace("https://download.pytorch.org/whl/cu130", world.torch_index)
    command = command.replace("https://pypi.org/simple", world.pypi)
    assert_ours(world, run_printed(world, command, tool, tmp_path))


# ------------------------------------------------------------------ --verify-key: pip takes no unsigned file


def signed_and_unsigned(world: World, where: Path, newer: Path) -> Path:
    """An index with `newer` published signed and an older tinyvar 0.1.0 published unsigned."""
    publish_wheels([newer], to=str(where), signer=signer_from(path=world.private))
    publish_wheels([make_wheel(where.parent / "old", label=LABEL_NEW, payload="unsigned")], to=str(where))
    assert (where / signature_path(VID_NEW, newer.name)).is_file()
    return where


def project_page(index: Path) -> Path:
    return index / "simple" / VID_NEW / "tinyvar" / "index.html"


def refused_unsigned(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "unsigned" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert "install" not in proc.stdout


def test_a_yanked_signed_wheel_does_not_vouch_for_the_unsigned_one_pip_takes(
    world: World, tmp_path: Path
) -> None:
    newer = make_wheel(tmp_path / "new", version="0.2.0", label=LABEL_NEW)
    index = signed_and_unsigned(world, tmp_path / "idx", newer)
    page = project_page(index)
    text = page.read_text()
    anchor = f">{newer.name}</a>"
    assert text.count(anchor) == 1
    page.write_text(text.replace(anchor, f' data-yanked="withdrawn"{anchor}'))
    refused_unsigned(
        which(
            world, world.stub, "--verify-key", str(world.public), "tinyvar", index=index, default_index=False
        )
    )


def test_a_signed_wheel_this_python_cannot_take_does_not_vouch_for_the_unsigned_one(
    world: World, tmp_path: Path
) -> None:
    newer = make_wheel(tmp_path / "new", version="0.2.0", label=LABEL_NEW, requires_python=">=3.99")
    index = signed_and_unsigned(world, tmp_path / "idx", newer)
    assert 'data-requires-python="&gt;=3.99"' in project_page(index).read_text()
    refused_unsigned(
        which(
            world, world.stub, "--verify-key", str(world.public), "tinyvar", index=index, default_index=False
        )
    )


def with_stand_in_pypi(world: World, command: str) -> str:
    """A command printed for PyPI, with the stand-in in its place (as the human page's test does): so
    that these tests print what a consumer gets by default, and fail for what they test on the main
    this started from, whose `factory which` has no --default-index."""
    return command.replace("https://pypi.org/simple", world.pypi)


def test_an_unsigned_sdist_of_a_higher_version_on_the_same_page_is_never_built(
    world: World, tmp_path: Path
) -> None:
    index = tmp_path / "idx"
    publish_wheels([world.ours], to=str(index), signer=signer_from(path=world.private))
    sdist = make_sdist(index / "files" / VID_NEW, name="tinyvar", version="0.9.0", marker=world.marker)
    page = project_page(index)
    page.write_text(
        page.read_text().replace("</body>", file_link(sdist, f"../../../files/{VID_NEW}/{sdist.name}"))
    )
    proc = which(
        world, world.stub, "--verify-key", str(world.public), "tinyvar", index=index, default_index=False
    )
    for tool, command in printed(proc).items():
        assert_ours(world, run_printed(world, with_stand_in_pypi(world, command), tool, tmp_path / tool))


def test_a_higher_release_on_the_default_index_is_never_taken(world: World, tmp_path: Path) -> None:
    # the stand-in PyPI offers tinyvar 0.3.0, a wheel, which pip and uv would take by name
    proc = which(world, world.stub, "--verify-key", str(world.public), "tinyvar", default_index=False)
    assert f"signed: {world.ours.name} (key " in proc.stdout, proc.stdout + proc.stderr
    command = with_stand_in_pypi(world, printed(proc)["pip"])
    assert_ours(world, run_printed(world, command, "pip", tmp_path))


@pytest.mark.parametrize("tool", ["pip", "uv"])
def test_the_stand_in_pypi_does_take_over_the_old_unpinned_command(
    world: World, tmp_path: Path, tool: str
) -> None:
    """The control: the command the factory printed before (the project by name, PyPI as the extra index)
    installs the impostor with pip and with uv, so the tests above would see it if it were taken."""
    variant = f"{world.index.resolve().as_uri()}/simple/{VID_NEW}/"
    old = f"install --index-url {variant} --extra-index-url {world.pypi} tinyvar"
    got = run_printed(world, f"pip {old}" if tool == "pip" else f"uv pip {old}", tool, tmp_path)
    assert got.proc.returncode == 0, got.proc.stdout + got.proc.stderr
    assert got.payload == "impostor"
