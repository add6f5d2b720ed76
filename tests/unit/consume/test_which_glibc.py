"""`factory which` and manylinux tags: a host whose glibc is older than a project's wheels is told so."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from factory.consume.which import (
    Environment,
    glibc_misfit,
    machine_misfit,
    project_misfit,
    python_misfit,
    result_lines,
    which,
)
from factory.core.errors import FactoryError
from factory.publish import index, installcmd

VARIANT = "cu130-torch2.14-abi1-sm80.90"
LABEL = "cu13.0.torch2.14.abi1.sm80.90"


def wheel(project: str, platform: str, python: str = "cp311") -> str:
    return f"{project}-0.1.0+{LABEL}-{python}-{python}-{platform}.whl"


def env(glibc: str | None) -> Environment:
    return Environment(python="3.11", torch="2.14.1", cuda="13.0", cxx11_abi=True, gpus=("9.0",), glibc=glibc)


@pytest.mark.parametrize(
    ("platforms", "glibc", "misfit"),
    [
        (["manylinux_2_34_x86_64"], "2.36", None),
        (["manylinux_2_34_x86_64"], "2.34", None),
        (
            ["manylinux_2_34_x86_64"],
            "2.31",
            "its wheels for Python 3.11 need glibc 2.34 or newer (manylinux_2_34_x86_64); "
            "this host has glibc 2.31",
        ),
        (["manylinux_2_17_x86_64.manylinux2014_x86_64"], "2.17", None),
        (
            ["manylinux2014_x86_64"],
            "2.12",
            "its wheels for Python 3.11 need glibc 2.17 or newer "
            "(manylinux_2_17_x86_64); this host has glibc 2.12",
        ),
        # The oldest requirement among several wheels is the one named.
        (
            ["manylinux_2_35_x86_64", "manylinux_2_28_x86_64"],
            "2.27",
            "its wheels for Python 3.11 need "
            "glibc 2.28 or newer (manylinux_2_28_x86_64); this host has glibc 2.27",
        ),
        (["manylinux_2_35_x86_64", "manylinux_2_28_x86_64"], "2.28", None),
        # linux_x86_64 promises nothing, so pip installs it anywhere: not the host's problem to report.
        (["linux_x86_64"], "2.17", None),
        ([], "2.17", None),
    ],
)
def test_glibc_misfit(platforms: list[str], glibc: str, misfit: str | None) -> None:
    assert glibc_misfit([wheel("demo", p) for p in platforms], python="3.11", glibc=glibc) == misfit


def test_other_pythons_and_unknown_glibc_are_not_counted() -> None:
    files = [wheel("demo", "manylinux_2_17_x86_64", "cp312"), wheel("demo", "manylinux_2_34_x86_64"), "x.txt"]
    assert glibc_misfit(files, python="3.11", glibc="2.31") is not None
    assert glibc_misfit(files, python="3.12", glibc="2.31") is None
    assert glibc_misfit(files, python="3.11", glibc="unknown") is None


def local_index(root: Path, files: dict[str, list[str]]) -> Path:
    simple = root / "simple"
    (simple / VARIANT).mkdir(parents=True)
    (simple / "index.html").write_text(index.top_root_html([VARIANT]))
    (simple / VARIANT / "index.html").write_text(index.variant_root_html(files))
    for project, names in files.items():
        records = [index.FileRecord(filename=n, sha256="0" * 64, size=1, upload_time="") for n in names]
        page = simple / VARIANT / project
        page.mkdir()
        (page / "index.html").write_text(index.project_html(project, records, variant_id=VARIANT))
    return root


def test_which_leaves_out_projects_this_glibc_cannot_install(tmp_path: Path) -> None:
    root = local_index(
        tmp_path,
        {
            "new-ext": [wheel("new_ext", "manylinux_2_34_x86_64")],
            "old-ext": [wheel("old_ext", "manylinux_2_17_x86_64.manylinux2014_x86_64")],
        },
    )
    old = wheel("old_ext", "manylinux_2_17_x86_64.manylinux2014_x86_64")
    url = f"{tmp_path.resolve().as_uri()}/files/{VARIANT}/{quote(old)}"
    result = which(str(root), env=env("2.31"))
    chosen = installcmd.Wheel(filename=old, url=url, sha256="0" * 64)
    torch = installcmd.Torch(requirement="torch==2.14.1")
    assert result.commands == (
        installcmd.commands(installcmd.Install(project="old-ext", torch=torch, wheel=chosen)),
    )
    assert result.choice.notes == (
        "new-ext left out: its wheels for Python 3.11 need glibc 2.34 or newer (manylinux_2_34_x86_64); "
        "this host has glibc 2.31",
    )
    with pytest.raises(FactoryError, match=r"^new-ext in .*: its wheels for Python 3\.11 need glibc 2\.34"):
        which(str(root), env=env("2.31"), project="new-ext")
    both = which(str(root), env=env("2.36"))
    assert both.projects == ("new-ext", "old-ext") and both.choice.notes == ()
    # Without a known glibc (not probed), every manylinux wheel is taken.
    assert which(str(root), env=env(None)).projects == ("new-ext", "old-ext")


def test_why_a_project_does_not_fit_python_machine_then_glibc() -> None:
    files = [wheel("demo", "manylinux_2_34_x86_64", "cp312"), wheel("demo", "manylinux_2_34_x86_64", "cp311")]
    host = installcmd.Host(python="3.13", glibc="2.36", machine="x86_64")
    assert python_misfit(files, python="3.13") == (
        "its wheels are for cp311, cp312, none for Python 3.13 (cp313), this host's"
    )
    assert project_misfit(files, host) == python_misfit(files, python="3.13")
    assert project_misfit(files, installcmd.Host(python="3.12", glibc="2.36", machine="x86_64")) is None
    arm = [wheel("demo", "manylinux_2_28_aarch64")]
    assert machine_misfit(arm, python="3.11", machine="x86_64") == (
        "its wheels for Python 3.11 are for aarch64; this host is x86_64"
    )
    assert machine_misfit([*arm, wheel("demo", "linux_x86_64")], python="3.11", machine="x86_64") is None
    assert machine_misfit(arm, python="3.11", machine="aarch64") is None
    old = installcmd.Host(python="3.11", glibc="2.31", machine="x86_64")
    assert project_misfit(arm, old) == "its wheels for Python 3.11 are for aarch64; this host is x86_64"
    new = [wheel("demo", "manylinux_2_39_x86_64")]
    assert project_misfit(new, old) == (
        "its wheels for Python 3.11 need glibc 2.39 or newer (manylinux_2_39_x86_64); "
        "this host has glibc 2.31"
    )
    assert project_misfit(new, installcmd.Host(python="3.11", glibc=None, machine="x86_64")) is None


def test_a_variant_whose_projects_all_misfit_says_why_not_none_published(tmp_path: Path) -> None:
    root = local_index(
        tmp_path,
        {
            "new-ext": [wheel("new_ext", "manylinux_2_39_x86_64")],
            "py312-ext": [wheel("py312_ext", "manylinux_2_28_x86_64", "cp312")],
        },
    )
    result = which(str(root), env=env("2.36"))
    assert result.commands == ()
    lines = result_lines(result)
    assert lines[1:] == [
        "note: new-ext left out: its wheels for Python 3.11 need glibc 2.39 or newer "
        "(manylinux_2_39_x86_64); this host has glibc 2.36",
        "note: py312-ext left out: its wheels are for cp312, none for Python 3.11 (cp311), this host's",
        f"index: {root.resolve().as_uri()}/simple/{VARIANT}/: no install command: none of its 2 projects "
        "fit this host (the notes say why)",
    ]


def probe(glibc: str) -> str:
    answer = {"python": "3.11", "torch": "2.14.1", "cuda": "13.0", "abi": True, "gpus": ["9.0"]}
    return json.dumps({**answer, "gpu_source": "torch", "glibc": glibc, "machine": "x86_64"})


def fake_python(tmp_path: Path, prints: str) -> str:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{prints}\nEOF\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize(
    ("files", "last"),
    [
        (
            {"new-ext": [wheel("new_ext", "manylinux_2_39_x86_64")]},
            "no install command: its project does not fit this host (the notes say why)",
        ),
        ({}, "no install command: no projects published there yet"),
    ],
)
def test_factory_which_without_a_command_exits_non_zero(
    tmp_path: Path,
    factory_cli: Callable[[list[str]], tuple[int, str]],
    files: dict[str, list[str]],
    last: str,
) -> None:
    root = local_index(tmp_path / "idx", files)
    code, out = factory_cli(
        ["which", "--index-url", str(root), "--python", fake_python(tmp_path, probe("2.36"))]
    )
    assert code == 1, out
    lines = out.strip().splitlines()
    assert lines[0].startswith("python 3.11, torch 2.14.1")
    assert lines[-1].startswith("error: index: ") and lines[-1].endswith(last), lines[-1]
    assert ("note: new-ext left out: its wheels for Python 3.11 need glibc 2.39" in out) == bool(files)
    assert "pip install" not in out
    code, out = factory_cli(
        ["which", "--index-url", str(root), "--python", fake_python(tmp_path, probe("2.39"))]
    )
    assert code == (0 if files else 1), out
    assert ("pip install" in out) == bool(files)


def probed_on(machine: str, glibc: str = "2.39") -> str:
    """The probe's answer of a host whose `platform.machine()` is `machine`: `factory which` takes the
    machine from the probe of the target interpreter, never from this process."""
    return probe(glibc).replace('"machine": "x86_64"', f'"machine": "{machine}"')


def test_factory_which_on_an_aarch64_host_installs_the_aarch64_wheel(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    """One variant index lists both platforms' wheels: an aarch64 host (GH200, DGX Spark) is given the
    command that installs the aarch64 wheel by URL and hash, an x86_64 host the x86_64 one."""
    x86, arm = wheel("demo_ext", "manylinux_2_28_x86_64"), wheel("demo_ext", "manylinux_2_28_aarch64")
    root = local_index(tmp_path / "idx", {"demo-ext": [x86, arm]})
    files = f"{root.resolve().as_uri()}/files/{VARIANT}/"
    for machine, chosen, other in (("aarch64", arm, x86), ("arm64", arm, x86), ("x86_64", x86, arm)):
        python = fake_python(tmp_path, probed_on(machine))
        code, out = factory_cli(["which", "--index-url", str(root), "--python", python])
        assert code == 0, out
        pip = next(line for line in out.splitlines() if line.startswith("pip install"))
        assert f"demo-ext @ {files}{quote(chosen)}#sha256={'0' * 64}" in pip, pip
        assert quote(other) not in out
    # the machine named on the first line where it is not the default platform's
    assert out.splitlines()[0].startswith("python 3.11, torch 2.14.1")
    python = fake_python(tmp_path, probed_on("aarch64"))
    assert factory_cli(["which", "--index-url", str(root), "--python", python])[1].startswith(
        "python 3.11 on aarch64, torch 2.14.1"
    )


def test_factory_which_on_an_aarch64_host_with_only_x86_64_wheels_says_so(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    root = local_index(tmp_path / "idx", {"demo-ext": [wheel("demo_ext", "manylinux_2_28_x86_64")]})
    python = fake_python(tmp_path, probed_on("aarch64"))
    code, out = factory_cli(["which", "--index-url", str(root), "--python", python])
    assert code == 1 and "Traceback" not in out, out
    lines = out.strip().splitlines()
    assert "note: demo-ext left out: its wheels for Python 3.11 are for x86_64; this host is aarch64" in lines
    assert lines[-1].endswith("no install command: its project does not fit this host (the notes say why)")
    assert "pip install" not in out
    # asked for that project: one line, naming the platforms it has and this host's
    code, out = factory_cli(["which", "demo-ext", "--index-url", str(root), "--python", python])
    assert code == 1, out
    (line,) = [x for x in out.strip().splitlines() if x.startswith("error: ")]
    assert line.endswith(": its wheels for Python 3.11 are for x86_64; this host is aarch64"), line
