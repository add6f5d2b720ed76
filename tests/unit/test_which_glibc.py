"""`factory which` and manylinux tags: a host whose glibc is older than a project's wheels is told so."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest

from factory import index, installcmd
from factory.errors import FactoryError
from factory.which import Environment, glibc_misfit, which

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
