"""`factory.publish.installcmd`, pure: the install commands the factory prints and renders, and the wheel of a
project
page an installer would take for a host."""

from __future__ import annotations

import shlex

import pytest

from factory.publish import index
from factory.publish.installcmd import (
    DEFAULT_INDEX,
    PREVIEW_FEATURE,
    Host,
    Install,
    Torch,
    Wheel,
    candidates,
    choose,
    commands,
    newest_release,
    pip_command,
    uv_command,
    variant_install,
)

SHA = "ab" * 32
VID = "cu126-torch2.10-abi1-sm80.90"
LABEL = "cu12.6.torch2.10.abi1.sm80.90"
FILE = f"flash_attn-2.8.3+{LABEL}-cp311-cp311-manylinux_2_28_x86_64.whl"
URL = f"https://idx.example/files/{VID}/flash_attn-2.8.3%2B{LABEL}-cp311-cp311-manylinux_2_28_x86_64.whl"
CU126 = "https://download.pytorch.org/whl/cu126"
HOST = Host(python="3.11", glibc="2.36", machine="x86_64")
PAGE_URL = f"https://idx.example/simple/{VID}/flash-attn/"


def wheel_install(**kw: object) -> Install:
    fields: dict[str, object] = {
        "project": "flash-attn",
        "torch": Torch(requirement="torch==2.10.*", index=CU126),
        "wheel": Wheel(filename=FILE, url=URL, sha256=SHA),
    }
    fields.update(kw)
    return Install(**fields)  # type: ignore[arg-type]


def test_a_known_wheel_is_installed_by_url_and_hash_and_never_looked_up() -> None:
    pip, uv = commands(wheel_install())
    assert shlex.split(pip) == [
        "pip",
        "install",
        "--only-binary",
        "flash-attn",
        "--index-url",
        DEFAULT_INDEX,
        "--extra-index-url",
        CU126,
        "torch==2.10.*",
        f"flash-attn @ {URL}#sha256={SHA}",
    ]
    assert shlex.split(uv) == [
        "uv",
        "pip",
        "install",
        "--only-binary",
        "flash-attn",
        "--index-strategy",
        "first-index",
        "--index",
        CU126,
        "--default-index",
        DEFAULT_INDEX,
        "torch==2.10.*",
        f"flash-attn @ {URL}#sha256={SHA}",
    ]


def test_a_wheel_variant_install_is_uv_s_with_its_preview_and_the_variant_index_first() -> None:
    url = "https://idx.example/variants/torch2.14-abi1/simple/"
    install = Install(
        project="flash-attn", torch=Torch(requirement="torch==2.14.1"), variant_index=url, wheel_variants=True
    )
    # no file and no label pinned: the variant is uv's to pick; the project from the variant index alone
    assert shlex.split(uv_command(install)) == [
        "uv", "pip", "install", "--preview-features", PREVIEW_FEATURE, "--only-binary", "flash-attn",
        "--index-strategy", "first-index", "--index", url, "--default-index", DEFAULT_INDEX,
        "torch==2.14.1", "flash-attn",
    ]  # fmt: skip
    pinned = Install(
        project="flash-attn", torch=None, variant_index=url, version="2.8.3", wheel_variants=True
    )
    assert uv_command(pinned).endswith(f"--index {url} --default-index {DEFAULT_INDEX} flash-attn==2.8.3")
    with pytest.raises(ValueError, match="pip installs no variant wheels"):
        pip_command(install)
    with pytest.raises(ValueError, match="never a wheel"):
        Install(
            project="flash-attn",
            torch=None,
            wheel=Wheel(filename=FILE, url=URL, sha256=SHA),
            wheel_variants=True,
        )
    with pytest.raises(ValueError, match="names its variant index"):
        Install(project="flash-attn", torch=None, wheel_variants=True)


def test_torch_from_the_default_index_and_another_default_index() -> None:
    install = wheel_install(
        torch=Torch(requirement="torch==2.14.1"), default_index="https://m.example/simple"
    )
    assert shlex.split(pip_command(install))[4:] == [
        "--index-url",
        "https://m.example/simple",
        "torch==2.14.1",
        f"flash-attn @ {URL}#sha256={SHA}",
    ]
    assert "--index " not in uv_command(install)
    assert "download.pytorch.org" not in pip_command(install) + uv_command(install)


def test_a_release_from_its_variant_index_alone() -> None:
    install = Install(
        project="flash-attn",
        torch=Torch(requirement="torch==2.10.*", index=CU126),
        version=f"2.8.3+{LABEL}",
        variant_index=f"simple/{VID}/",
    )
    pip, uv = commands(install)
    assert pip == (
        f"pip install --only-binary flash-attn --index-url simple/{VID}/ --extra-index-url {CU126} "
        f"--extra-index-url {DEFAULT_INDEX} 'torch==2.10.*' flash-attn==2.8.3+{LABEL}"
    )
    # uv: the variant index first, so that it is the only one uv reads flash-attn from
    assert uv == (
        "uv pip install --only-binary flash-attn --index-strategy first-index "
        f"--index simple/{VID}/ --index {CU126} --default-index {DEFAULT_INDEX} 'torch==2.10.*' "
        f"flash-attn==2.8.3+{LABEL}"
    )


def test_an_install_names_a_wheel_or_a_release_never_both_nor_neither() -> None:
    with pytest.raises(ValueError):
        Install(project="x", torch=None)
    with pytest.raises(ValueError):
        wheel_install(version="1", variant_index="simple/v/")


def test_commands_are_shell_quoted() -> None:
    hostile = "https://idx.example/a b;rm -rf ~/$(id)/x.whl"
    install = wheel_install(
        project="x;rm", wheel=Wheel(filename=FILE, url=hostile, sha256=SHA), default_index="http://h/$(id)"
    )
    for command in commands(install):
        words = shlex.split(command)
        assert words[-1] == f"x;rm @ {hostile}#sha256={SHA}" and "http://h/$(id)" in words


def test_variant_install_for_the_human_page() -> None:
    install = variant_install("flash-attn", version=f"2.8.3+{LABEL}", variant_id=VID, variant_index="s/")
    assert install is not None
    assert install.torch == Torch(requirement="torch==2.10.*", index=CU126)
    assert install.requirement == f"flash-attn==2.8.3+{LABEL}"
    assert variant_install("x", version="1", variant_id="not-a-variant", variant_index="s/") is None
    assert variant_install("x", version="1; rm", variant_id=VID, variant_index="s/") is None


def test_newest_release() -> None:
    assert newest_release([FILE, FILE.replace("2.8.3", "2.8.10"), "junk", "x-1.tar.gz"]) == f"2.8.10+{LABEL}"
    assert newest_release(["junk"]) is None


def page(*links: str) -> str:
    return "".join(links)


def link(filename: str, *, attrs: str = "", sha: str = SHA, href: str | None = None) -> str:
    target = href if href is not None else f"../../../files/{VID}/{filename.replace('+', '%2B')}"
    return f'<a href="{target}#sha256={sha}" {attrs}>{filename}</a>'


def test_the_newest_wheel_for_this_host_first() -> None:
    newer = FILE.replace("2.8.3", "2.8.4")
    abi3 = FILE.replace("cp311-cp311", "cp39-abi3")
    text = page(
        link(FILE), link(newer), link(abi3.replace("2.8.3", "2.8.4")), link(FILE.replace("cp311", "cp312"))
    )
    found = candidates(text, page_url=PAGE_URL, project="flash-attn", host=HOST)
    assert [w.filename for w in found] == [newer, abi3.replace("2.8.3", "2.8.4"), FILE]
    assert found[0].url == f"https://idx.example/files/{VID}/{newer.replace('+', '%2B')}"
    assert found[0].sha256 == SHA and found[0].pinned_url.endswith(f"#sha256={SHA}")
    assert [
        w.filename
        for w in candidates(
            text, page_url=PAGE_URL, project="flash-attn", host=Host(python="3.12", machine="x86_64")
        )
    ] == [
        abi3.replace("2.8.3", "2.8.4"),
        FILE.replace("cp311", "cp312"),
    ]


@pytest.mark.parametrize(
    ("skipped", "why"),
    [
        (link(FILE.replace("2.8.3", "2.9.0"), attrs="data-yanked"), "yanked"),
        (link(FILE.replace("2.8.3", "2.9.0"), attrs='data-yanked="broken"'), "yanked with a reason"),
        (link(FILE.replace("2.8.3", "2.9.0"), attrs='data-requires-python="&gt;=3.12"'), "Requires-Python"),
        (link(FILE.replace("2.8.3", "2.9.0"), attrs='data-requires-python="garbage"'), "unreadable"),
        (link("flash_attn-2.9.0.tar.gz"), "an sdist"),
        (link(FILE.replace("2.8.3", "2.9.0").replace("_2_28_", "_2_39_")), "a newer glibc"),
        (link(FILE.replace("2.8.3", "2.9.0").replace("x86_64", "aarch64")), "another machine"),
        (link(FILE.replace("2.8.3", "2.9.0"), sha="zz" * 32), "no sha256"),
        (link(FILE.replace("2.8.3", "2.9.0"), sha=""), "no hash"),
        (link(FILE.replace("flash_attn", "other").replace("2.8.3", "2.9.0")), "another project"),
        (link(FILE.replace("2.8.3", "2.9.0rc1")), "a pre-release"),
        (link("x", href="javascript:alert(1)//" + FILE.replace("2.8.3", "2.9.0")), "javascript"),
        (link("x", href="file:///etc/" + FILE.replace("2.8.3", "2.9.0")), "a local file from a remote page"),
    ],
)
def test_what_pip_would_not_take_is_never_chosen(skipped: str, why: str) -> None:
    chosen = choose(page(link(FILE), skipped), page_url=PAGE_URL, project="flash-attn", host=HOST)
    assert chosen is not None and chosen.filename == FILE, why


def test_the_filename_is_the_links_not_the_anchors_text() -> None:
    text = page(link(FILE.replace("2.8.3", "9.9.9")).replace(f">{FILE.replace('2.8.3', '9.9.9')}<", ">x<"))
    chosen = choose(text, page_url=PAGE_URL, project="flash-attn", host=HOST)
    assert chosen is not None and chosen.filename == FILE.replace("2.8.3", "9.9.9")
    text = page(f'<a href="../../../files/{VID}/junk.whl#sha256={SHA}">{FILE}</a>')
    assert choose(text, page_url=PAGE_URL, project="flash-attn", host=HOST) is None


def test_only_pre_releases_are_taken_when_there_is_nothing_else() -> None:
    rc = FILE.replace("2.8.3", "2.9.0rc1")
    chosen = choose(page(link(rc)), page_url=PAGE_URL, project="flash-attn", host=HOST)
    assert chosen is not None and chosen.filename == rc


def test_unknown_glibc_takes_any_manylinux_and_a_published_page_reads_back() -> None:
    records = [
        index.FileRecord(filename=FILE.replace("_2_28_", "_2_39_"), sha256=SHA, size=1, upload_time="")
    ]
    text = index.project_html("flash-attn", records, variant_id=VID)
    assert choose(text, page_url=PAGE_URL, project="flash-attn", host=HOST) is None
    chosen = choose(text, page_url=PAGE_URL, project="flash-attn", host=Host(python="3.11", machine="x86_64"))
    assert chosen is not None and chosen.url.startswith(
        f"https://idx.example/files/{VID}/flash_attn-2.8.3%2B"
    )
