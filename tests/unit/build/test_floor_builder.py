"""The pypi flavor's builder for a glibc floor below forky's: bookworm with a CPython compiled from the source
tarball the Debian mirror serves (toolchains.pypi_toolchain, images.ensure_cpython_base,
factory/build/cpythonsrc.py)."""

from __future__ import annotations

import hashlib
import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.build import cpythonsrc, facts, images
from factory.core.errors import ImageError
from factory.plan import glibcfloor
from factory.plan.plan import plan_matrix
from factory.spec import toolchains
from factory.spec.config import load_matrix_file
from factory.spec.options import BuildOptions
from factory.wheel import provenance

SOURCE_BUILT = "factory-builder:cu13.0-bookworm-cpython-pypi"
FORKY = "factory-builder:cu13.0-forky-pypi"


@pytest.mark.parametrize(
    ("floor", "image", "glibc"),
    [
        (None, FORKY, "2.43"),  # no floor declared: forky, as before
        ("2.43", FORKY, "2.43"),
        ("2.50", FORKY, "2.43"),
        ("2.42", SOURCE_BUILT, "2.36"),  # forky is above it: bookworm with a source-built 3.13
        ("2.36", SOURCE_BUILT, "2.36"),
        ("2.28", SOURCE_BUILT, "2.36"),  # none meets it: the closest (the plan refuses it, naming it)
    ],
)
def test_a_python_313_job_gets_the_builder_of_its_floor(floor: str | None, image: str, glibc: str) -> None:
    kw = {"cuda": "13.0", "python": "3.13", "flavor": "pypi", "base_image": None, "floor": floor}
    assert toolchains.builder_image_for(**kw) == image
    assert toolchains.builder_glibc(**kw) == glibc


def test_the_source_built_toolchain_is_bookworms_glibc_with_its_own_base() -> None:
    toolchain = toolchains.pypi_toolchain("3.13", base_image=None, floor="2.36")
    assert toolchain is not None
    assert (toolchain.name, toolchain.suite, toolchain.glibc, toolchain.source_built) == (
        "bookworm-cpython",
        "bookworm",
        "2.36",
        True,
    )
    assert toolchain.own_image and not toolchain.multi
    assert toolchains.job_toolchain(python="3.13", flavor="pypi", base_image=None, floor="2.36") == toolchain
    assert toolchains.toolchain_named("bookworm-cpython") == toolchain
    assert toolchains.toolchain_named("bookworm") == toolchains.TOOLCHAINS[0]  # the debootstrapped one, 3.11
    assert images.base_image_for(
        cuda="13.0", python="3.13", flavor="pypi", base_image=None, floor="2.36"
    ) == ("factory-base:bookworm-cpython")
    # its base named in build.base_image is the same choice, whatever the floor; its glibc is the suite's
    named = {
        "cuda": "13.0",
        "python": "3.13",
        "flavor": "pypi",
        "base_image": "factory-base:bookworm-cpython",
    }
    assert toolchains.builder_image_for(**named) == SOURCE_BUILT
    assert toolchains.builder_glibc(**named) == "2.36"


@pytest.mark.parametrize("python", ["3.11", "3.14", "3.15"])
def test_other_pythons_keep_their_builder_whatever_the_floor(python: str) -> None:
    """Only 3.13 has a pinned source (the mirror serves no python3.14 pool here); 3.11 is bookworm's own."""
    kw = {"cuda": "13.0", "python": python, "flavor": "pypi", "base_image": None}
    assert toolchains.builder_image_for(**kw, floor="2.36") == toolchains.builder_image_for(**kw)


def test_the_default_builders_are_unchanged() -> None:
    """No floor: every existing image keeps its name and base, so its inputs (and identity) are as before."""
    assert toolchains.python_suite_for("3.13") == "forky"
    assert toolchains.toolchain_for(["3.13"]).suite == "forky"
    assert images.default_base_image("3.13") == "factory-base:forky"
    for flavor in ("devel", "manylinux"):
        kw = {"cuda": "13.0", "python": "3.13", "flavor": flavor, "base_image": None}
        assert toolchains.builder_image_for(**kw, floor="2.36") == toolchains.builder_image_for(**kw)


def test_the_cpython_dockerfile_takes_the_args_given() -> None:
    toolchain = toolchains.toolchain_named("bookworm-cpython")
    assert toolchain is not None
    args = images.cpython_build_args(toolchain)
    assert args == {"BASE_IMAGE": "factory-base:bookworm", "PYTHONS": "3.13"}
    text = (images.dockerfile_path("pypi").parent / images.CPYTHON_DOCKERFILE).read_text()
    assert images.declared_build_args(text) == set(args)
    # every Python is checked for what pip and torch import, and for its headers
    assert "import ssl, zlib, ctypes, bz2, lzma, venv, ensurepip, sysconfig" in text
    assert "Python.h" in text
    with pytest.raises(ImageError, match="no source-built Python"):
        images.ensure_cpython_base(None, toolchains.TOOLCHAINS[1])


def test_every_source_built_python_has_a_pinned_source() -> None:
    for toolchain in toolchains.TOOLCHAINS:
        if toolchain.source_built:
            for python in toolchain.pythons:
                source = cpythonsrc.source_for(python)
                assert source.version.startswith(python + ".")
                assert source.file_name == f"python{python}_{source.version}.orig.tar.xz"
                assert len(source.sha256) == 64
    with pytest.raises(ImageError, match=r"no CPython source is pinned for Python 3\.9 \(pinned: 3\.13\)"):
        cpythonsrc.source_for("3.9")


def _mirror(tmp_path: Path, payload: bytes) -> tuple[str, cpythonsrc.CPythonSource]:
    pool = "pool/main/p/python3.13/python3.13_3.13.99.orig.tar.xz"
    (tmp_path / "mirror" / pool).parent.mkdir(parents=True)
    (tmp_path / "mirror" / pool).write_bytes(payload)
    source = cpythonsrc.CPythonSource(
        python="3.13",
        version="3.13.99",
        pool_path=pool,
        sha256=hashlib.sha256(b"the pinned bytes").hexdigest(),
        size=16,
    )
    return (tmp_path / "mirror").as_uri(), source


def test_the_source_is_kept_only_with_its_pinned_sha256(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mirror, source = _mirror(tmp_path, b"the pinned bytes")
    path = cpythonsrc.fetch(source, mirror=mirror)
    assert path.read_bytes() == b"the pinned bytes" and path == cpythonsrc.cache_path(source)
    # a cached, verified copy is used without the mirror
    (tmp_path / "mirror" / source.pool_path).unlink()
    assert cpythonsrc.fetch(source, mirror=mirror) == path
    # a cached copy that changed is fetched again, and the mirror no longer has it: the error says which
    path.write_bytes(b"changed")
    with pytest.raises(ImageError, match=r"cannot fetch CPython 3\.13\.99's source .*python3\.13_3\.13\.99"):
        cpythonsrc.fetch(source, mirror=mirror)


def test_a_mirror_handing_over_other_bytes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    mirror, source = _mirror(tmp_path, b"other bytes")
    with pytest.raises(ImageError, match=r"sha256 [0-9a-f]{64}, not the pinned .*the file is not used"):
        cpythonsrc.fetch(source, mirror=mirror)
    assert not cpythonsrc.cache_path(source).exists()
    assert list(cpythonsrc.cache_path(source).parent.iterdir()) == []  # no partial file left


def _floor_matrix(tmp_path: Path, glibc: str = '"2.36"') -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: demo-ext, version: "0.1.0"}}
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.11", "3.13"]
              cxx11_abi: [true]
              arch: ["8.0"]
            build:
              flavor: pypi
              glibc: {glibc}
            """
        )
    )
    return path


def test_a_floor_below_forky_plans_python_313_on_the_source_built_builder(tmp_path: Path) -> None:
    mf = load_matrix_file(_floor_matrix(tmp_path))
    plan = plan_matrix(mf)
    assert [(j.python, j.glibc) for j in plan.jobs] == [("3.11", "2.36"), ("3.13", "2.36")]
    shown = {
        j.python: glibcfloor.shown(mf.build, j.glibc, cuda="13.0", python=j.python, torch_floor="2.28")
        for j in plan.jobs
    }
    assert shown == {
        "3.11": "2.36 (factory-builder:cu13.0-py3.11-pypi, glibc 2.36)",
        "3.13": f"2.36 ({SOURCE_BUILT}, glibc 2.36)",
    }
    # the install check's container is that builder: it takes tags up to its glibc
    assert glibcfloor.check_platform(mf.build, cuda="13.0", python="3.13", floor="2.36") == (
        "manylinux_2_36_x86_64"
    )
    assert glibcfloor.check_platform(BuildOptions(flavor="pypi"), cuda="13.0", python="3.13") == (
        "manylinux_2_43_x86_64"
    )


def test_a_rebuild_keeps_the_floor_that_picked_the_builder(tmp_path: Path) -> None:
    """`factory rebuild` plans from the wheel's own matrix document: without the floor there, a
    Python 3.13 job would build on forky and its bytes could not match."""
    mf = load_matrix_file(_floor_matrix(tmp_path))
    job = next(j for j in plan_matrix(mf).jobs if j.python == "3.13")
    source = provenance.SourceFacts(kind="path", path="demo-ext", tree_sha256="0" * 64)
    document, _ = facts.rebuild_matrix(mf, job, source, facts.recipe_facts(mf))
    assert document["build"]["glibc"] == "2.36"
    assert provenance.rebuild_matrix_problem(document) is None
    rebuilt = tmp_path / "rebuilt"
    (rebuilt / "demo-ext").mkdir(parents=True)
    (rebuilt / "m.yaml").write_text(json.dumps(document))
    again = plan_matrix(load_matrix_file(rebuilt / "m.yaml"))
    (only,) = again.jobs
    assert (
        toolchains.builder_image_for(
            cuda="13.0", python="3.13", flavor="pypi", base_image=None, floor=only.glibc
        )
        == SOURCE_BUILT
    )


@pytest.mark.parametrize(
    ("glibc", "message"),
    [
        ("torch", "--glibc: name a version (build.glibc's `torch` depends on each job's torch)"),
        ("2.3", "'2.3' is not a glibc version like 2.28"),
    ],
)
def test_images_build_takes_a_floor_as_a_version_only(
    glibc: str, message: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["images", "build", "--cuda", "13.0", "--python", "3.13", "--glibc", glibc])
    assert code == 2
    assert message in output and "Traceback" not in output
