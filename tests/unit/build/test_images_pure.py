"""Pure parts of factory.build.images: names, suites, mirrors, Dockerfiles and input hashing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from factory.build import images
from factory.core.errors import ConfigError, ImageError
from factory.core.platforms import DEFAULT_PLATFORM, Platform, named
from factory.spec import toolchains
from factory.spec.options import FLAVORS


def test_builder_image_name() -> None:
    assert toolchains.builder_image_name(cuda="13.0", python="3.11", flavor="pypi") == (
        "factory-builder:cu13.0-py3.11-pypi"
    )
    assert toolchains.builder_image_name(cuda="12.8", python="3.12", flavor="devel") == (
        "factory-builder:cu12.8-py3.12-devel"
    )


@pytest.mark.parametrize(
    ("cuda", "python", "flavor"),
    [
        ("13", "3.11", "pypi"),
        ("13.0", "py3.11", "pypi"),
        ("13.0", "3.11", "conda"),
        ("13.0;rm", "3.11", "pypi"),
    ],
)
def test_builder_image_name_rejects_bad_input(cuda: str, python: str, flavor: str) -> None:
    with pytest.raises(ConfigError):
        toolchains.builder_image_name(cuda=cuda, python=python, flavor=flavor)


def test_python_suite_for() -> None:
    assert toolchains.python_suite_for("3.11") == "bookworm"
    for python in ("3.13", "3.14", "3.15"):
        assert toolchains.python_suite_for(python) == "forky"
    assert images.default_base_image("3.13") == "factory-base:forky"


def test_each_python_gets_the_base_whose_suite_ships_it() -> None:
    """A matrix without build.base_image builds 3.11 on bookworm and 3.13 on forky (it used to give every job
    bookworm, whose image build then failed for 3.13: no python3.13 there)."""
    from factory.spec.options import BuildOptions

    default = BuildOptions().base_image
    assert images.base_image_for(cuda="13.0", python="3.11", flavor="pypi", base_image=default) == (
        "factory-base:bookworm"
    )
    assert images.base_image_for(cuda="13.0", python="3.13", flavor="pypi", base_image=default) == (
        "factory-base:forky"
    )
    assert (
        images.base_image_for(cuda="13.0", python="3.13", flavor="pypi", base_image="my/base:1")
        == "my/base:1"
    )
    assert images.base_image_for(cuda="12.8", python="3.11", flavor="devel", base_image=default) == (
        "nvidia/cuda:12.8.1-devel-ubuntu22.04"
    )
    assert (
        images.base_image_for(cuda="12.8", python="3.11", flavor="devel", base_image="my/cuda:1")
        == "my/cuda:1"
    )
    with pytest.raises(ConfigError, match="base image 'my base'"):
        images.base_image_for(cuda="13.0", python="3.11", flavor="pypi", base_image="my base")


def test_python_suite_for_unknown_names_the_version() -> None:
    with pytest.raises(ImageError, match=r"Python 3\.12"):
        toolchains.python_suite_for("3.12")


def test_devel_base_image() -> None:
    assert images.devel_base_image("12.8") == "nvidia/cuda:12.8.1-devel-ubuntu22.04"
    assert images.devel_base_image("12.8.0", os_name="ubuntu24.04") == "nvidia/cuda:12.8.0-devel-ubuntu24.04"
    with pytest.raises(ImageError, match=r"11\.2"):
        images.devel_base_image("11.2")


def test_manylinux_base_image_per_cuda() -> None:
    assert images.manylinux_base_image("12.8") == "pytorch/manylinux2_28-builder:cuda12.8"
    assert images.manylinux_base_image("13.0.1") == "pytorch/manylinux2_28-builder:cuda13.0"
    assert images.base_image_for(cuda="12.6", python="3.11", flavor="manylinux", base_image=None) == (
        "pytorch/manylinux2_28-builder:cuda12.6"
    )
    # build.base_image names another image with the same layout; a factory base is not one.
    assert (
        images.base_image_for(cuda="12.6", python="3.11", flavor="manylinux", base_image="my/ml:1")
        == "my/ml:1"
    )
    assert images.base_image_for(
        cuda="12.6", python="3.11", flavor="manylinux", base_image="factory-base:bookworm"
    ) == ("pytorch/manylinux2_28-builder:cuda12.6")
    with pytest.raises(ConfigError, match="'12'"):
        images.manylinux_base_image("12")


@pytest.mark.parametrize(
    ("python", "path"),
    [
        ("3.11", "/opt/python/cp311-cp311/bin/python"),
        ("3.9", "/opt/python/cp39-cp39/bin/python"),
        ("3.13", "/opt/python/cp313-cp313/bin/python"),  # the GIL build, not cp313-cp313t
    ],
)
def test_manylinux_python(python: str, path: str) -> None:
    assert images.manylinux_python(python) == path
    args = images.build_args(cuda="12.8", python=python, flavor="manylinux", base_image="b:1")
    assert args["PYTHON_BIN"] == path
    assert args["PYTHON"] == python


def test_manylinux_python_rejects_bad_versions() -> None:
    with pytest.raises(ConfigError, match="'3'"):
        images.manylinux_python("3")


def test_manylinux_dockerfile_links_the_chosen_python() -> None:
    text = images.dockerfile_text("manylinux")
    # The driver runs `python3 driver.py` and `uv venv --python python<PYTHON>`: both must be PYTHON_BIN.
    assert 'ln -sf "${PYTHON_BIN}" "/usr/local/bin/python${PYTHON}"' in text
    assert 'ln -sf "${PYTHON_BIN}" /usr/local/bin/python3' in text
    assert "--no-index" in text
    assert "ENV CUDA_HOME=/usr/local/cuda" in text


def test_standin_names() -> None:
    assert images.standin_devel_image("13.0") == "factory-standin:cuda13.0-devel"
    assert toolchains.standin_cuda_of("factory-standin:cuda13.0-devel") == "13.0"
    for other in (
        "factory-standin:13.0",
        "nvidia/cuda:13.0.1-devel-ubuntu22.04",
        "x/factory-standin:cuda13.0-devel",
    ):
        assert toolchains.standin_cuda_of(other) is None
    # The stand-in is the devel flavor's base when the matrix names it.
    standin = images.standin_devel_image("13.0")
    assert images.base_image_for(cuda="13.0", python="3.11", flavor="devel", base_image=standin) == standin


def test_standin_build_args_match_its_dockerfile() -> None:
    text = images.dockerfile_text(images.STANDIN_DEVEL)
    args = images.standin_build_args(cuda="13.0", base_image="factory-base:bookworm")
    assert args == {"BASE_IMAGE": "factory-base:bookworm", "CUDA": "13.0", "CUDA_MAJOR": "13"}
    assert set(args) == images.declared_build_args(text)
    with pytest.raises(ImageError, match="CUDA >= 13"):
        images.standin_build_args(cuda="12.8", base_image="factory-base:bookworm")
    with pytest.raises(ConfigError, match="base image 'a b'"):
        images.standin_build_args(cuda="13.0", base_image="a b")


@pytest.mark.parametrize(
    ("argv", "code", "says"),
    [
        (["--cuda", "12.8"], 1, "error: the PyPI toolkit (flavor pypi, the devel stand-in) needs CUDA >= 13"),
        (["--cuda", "13"], 2, "error: invalid CUDA version '13': expected MAJOR.MINOR"),
        (["--cuda", "13.0", "--base", "a b"], 2, "error: base image 'a b'"),
    ],
)
def test_standin_cli_refuses_bad_values_in_one_line(
    argv: list[str], code: int, says: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    got, output = factory_cli(["images", "standin-devel", *argv])
    assert got == code
    assert output.strip().splitlines() == [output.strip()]
    assert output.startswith(says)


def test_standin_dockerfile_has_the_devel_layout() -> None:
    text = images.dockerfile_text(images.STANDIN_DEVEL)
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert "COPY wheels" not in final_stage
    assert "/usr/local/cuda/bin" in final_stage and "CUDA_HOME" not in final_stage
    assert "apt-get purge" in final_stage  # NVIDIA's devel images ship no Python


def test_devel_dockerfile_keeps_deadsnakes_in_one_step() -> None:
    text = images.dockerfile_text("devel")
    # Each RUN instruction up to the next one (comments included, so the step's heading counts too).
    runs = text.split("\nRUN ")[1:]
    assert [i for i, run in enumerate(runs) if "deadsnakes" in run] == [0]
    assert "ID=ubuntu" in runs[0]


@pytest.mark.parametrize(
    ("flavor", "image", "says"),
    [
        ("manylinux", "pytorch/manylinux2_28-builder:cuda12.8", "build.base_image"),
        ("devel", "nvidia/cuda:12.8.1-devel-ubuntu22.04", "factory images standin-devel"),
        ("pypi", "my/base:1", "factory images bootstrap"),
    ],
)
def test_pull_hint_says_how_to_provide_the_image(flavor: str, image: str, says: str) -> None:
    hint = images.pull_hint(flavor=flavor, image=image)
    assert says in hint
    assert "\n" not in hint
    if flavor != "pypi":
        assert f"docker save {image}" in hint and "docker load" in hint


def test_toolkit_requirements_pin_the_series() -> None:
    reqs = images.toolkit_requirements("13.0")
    assert "nvidia-cuda-nvcc==13.0.*" in reqs
    assert {r.split("==")[0] for r in reqs} == {
        "nvidia-cuda-nvcc",
        "nvidia-cuda-cccl",
        "nvidia-cuda-crt",
        "nvidia-nvvm",
        "nvidia-cuda-runtime",
    }
    assert images.toolkit_requirements("13.1.2")[0] == "nvidia-cuda-nvcc==13.1.*"


def test_toolkit_requirements_refuses_cuda_12() -> None:
    with pytest.raises(ImageError, match="flavor devel"):
        images.toolkit_requirements("12.8")


def test_image_requirements_per_flavor() -> None:
    assert images.image_requirements(cuda="12.8", flavor="devel") == ("ninja", "uv")
    pypi = images.image_requirements(cuda="13.0", flavor="pypi")
    assert "ninja" in pypi and "uv" in pypi and "nvidia-nvvm==13.0.*" in pypi


@pytest.mark.parametrize("flavor", FLAVORS)
def test_build_args_match_the_dockerfile(flavor: str) -> None:
    text = images.dockerfile_text(flavor)
    cuda, python = ("12.8", "3.13") if flavor == "debian" else ("13.0", "3.11")
    args = images.build_args(cuda=cuda, python=python, flavor=flavor, base_image="x:y")
    # Every value we pass is declared (docker warns and ignores undeclared ones) and every ARG gets a value.
    assert set(args) == images.declared_build_args(text)


def test_pypi_dockerfile_shape() -> None:
    text = images.dockerfile_text("pypi")
    assert "--no-index" in text  # installs from the context's wheelhouse only
    assert "libcudart.so" in text
    assert "USER factory" in text
    assert "ENV CUDA_HOME=/opt/toolkit/lib/python${PYTHON}/site-packages/nvidia/cu${CUDA_MAJOR}" in text
    # The wheels stay in the first stage only.
    final_stage = text.rsplit("\nFROM ", 1)[1]
    assert "COPY wheels" not in final_stage


def test_declared_build_args() -> None:
    text = "ARG A\nFROM ${A}\n  ARG B=1\nRUN echo ARG C\n"
    assert images.declared_build_args(text) == {"A", "B"}


def _hash(**overrides: object) -> str:
    kwargs: dict[str, object] = {
        "dockerfile": "FROM x\n",
        "args": {"PYTHON": "3.11"},
        "base_id": "sha256:aa",
        "wheels": ["a-1-py3-none-any.whl", "b-2-py3-none-any.whl"],
    }
    kwargs.update(overrides)
    return images.inputs_hash(**kwargs)  # type: ignore[arg-type]


def test_inputs_hash_is_stable_and_order_free() -> None:
    assert _hash() == _hash(wheels=["b-2-py3-none-any.whl", "a-1-py3-none-any.whl"])


@pytest.mark.parametrize(
    "change",
    [
        {"dockerfile": "FROM y\n"},
        {"args": {"PYTHON": "3.13"}},
        {"base_id": "sha256:bb"},
        {"wheels": ["a-1-py3-none-any.whl", "b-3-py3-none-any.whl"]},
        {"extra": {"requirements": "x"}},
    ],
)
def test_inputs_hash_changes_with_every_input(change: dict[str, object]) -> None:
    assert _hash(**change) != _hash()


def test_toolkit_version() -> None:
    names = [
        "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl",
        "nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl",
    ]
    assert images.toolkit_version(names) == "13.0.88"
    assert images.toolkit_version(names[:1]) is None


DEB822 = """\
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
"""


def test_parse_deb822_sources() -> None:
    sources = images.parse_apt_sources(DEB822, deb822=True)
    assert [s.uri for s in sources] == [
        "http://deb.debian.org/debian",
        "http://deb.debian.org/debian-security",
    ]
    assert sources[0].suites == ("bookworm", "bookworm-updates")
    assert images.pick_mirror(sources) == "http://deb.debian.org/debian"


def test_pick_mirror_skips_security_first() -> None:
    text = (
        DEB822.split("\n\n")[1]
        + "\n\nTypes: deb-src deb\nURIs: http://mirror.example/debian/\nSuites: trixie\n"
    )
    assert images.pick_mirror(images.parse_apt_sources(text, deb822=True)) == "http://mirror.example/debian"


def test_parse_deb822_skips_disabled_and_src() -> None:
    text = (
        "Types: deb-src\nURIs: http://a/\nSuites: bookworm\n\n"
        "Types: deb\nEnabled: no\nURIs: http://b/\nSuites: x\n"
    )
    assert images.parse_apt_sources(text, deb822=True) == []


def test_parse_one_line_sources() -> None:
    text = (
        "# comment\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://sec.example/debian-security bookworm-security main\n"
        "deb http://ftp.example/debian/ bookworm main contrib # trailing\n"
    )
    sources = images.parse_apt_sources(text, deb822=False)
    assert [s.uri for s in sources] == [
        "http://sec.example/debian-security",
        "http://ftp.example/debian/",
    ]
    assert sources[1].components == ("main", "contrib")
    assert images.pick_mirror(sources) == "http://ftp.example/debian"


def test_host_apt_mirror_reads_both_formats(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert images.host_apt_mirror(tmp_path) == "http://deb.debian.org/debian"
    (tmp_path / "sources.list").write_text("deb http://first.example/debian bookworm main\n")
    assert images.host_apt_mirror(tmp_path) == "http://first.example/debian"


def test_host_apt_mirror_none_when_unconfigured(tmp_path: Path) -> None:
    assert images.host_apt_mirror(tmp_path) is None


def test_base_suite_of() -> None:
    assert toolchains.base_suite_of("factory-base:bookworm") == "bookworm"
    assert toolchains.base_suite_of("factory-base:trixie") == "trixie"
    assert toolchains.base_suite_of("debian:bookworm") is None
    assert toolchains.base_suite_of("registry:5000/factory-base:bookworm") is None
    assert toolchains.base_suite_of("factory-base") is None


def test_base_changes_label_the_base() -> None:
    changes = images.base_changes(suite="bookworm", mirror="http://m/debian", include=("g++", "python3"))
    assert f"LABEL {images.LABEL}=base" in changes
    assert f"LABEL {images.LABEL_SUITE}=bookworm" in changes
    assert any(c.startswith("ENV PATH=") for c in changes)
    other = images.base_changes(suite="bookworm", mirror="http://m/debian", include=("python3",))
    assert [c for c in changes if images.LABEL_INPUTS in c] != [c for c in other if images.LABEL_INPUTS in c]


def test_image_labels_are_not_the_container_ownership_labels() -> None:
    # Containers inherit image labels; the factory's container cleanup must not match every builder container.
    keys = {images.LABEL, images.LABEL_INPUTS, images.LABEL_CUDA, images.LABEL_FLAVOR}
    assert "io.wheel-factory" not in keys
    assert "io.wheel-factory.owner" not in keys


# ---------------------------------------------------------------------------------------------- toolchains


def test_the_pythons_of_a_variant_share_the_forky_toolchain_image() -> None:
    """3.13, 3.14 and 3.15 of the pypi flavor run in one image with one compiler; 3.11 keeps its own image."""
    names = {
        p: toolchains.builder_image_for(cuda="13.0", python=p, flavor="pypi", base_image=None)
        for p in ("3.11", "3.13", "3.14", "3.15")
    }
    assert names == {
        "3.11": "factory-builder:cu13.0-py3.11-pypi",
        "3.13": "factory-builder:cu13.0-forky-pypi",
        "3.14": "factory-builder:cu13.0-forky-pypi",
        "3.15": "factory-builder:cu13.0-forky-pypi",
    }
    # The toolchain's own base named in build.base_image is the same choice.
    assert toolchains.builder_image_for(
        cuda="13.0", python="3.14", flavor="pypi", base_image="factory-base:forky"
    ) == ("factory-builder:cu13.0-forky-pypi")


@pytest.mark.parametrize(
    ("python", "flavor", "base_image"),
    [
        ("3.13", "pypi", "my/base:1"),  # someone else's base: the image of its own Python
        ("3.13", "pypi", "factory-base:trixie"),  # a one-Python suite named explicitly
        ("3.13", "devel", None),  # devel and manylinux images share their base's compiler already
        ("3.13", "manylinux", None),
        ("3.12", "pypi", None),  # no suite ships it: the image build says so
    ],
)
def test_other_jobs_get_their_own_pythons_image(python: str, flavor: str, base_image: str | None) -> None:
    assert toolchains.job_toolchain(python=python, flavor=flavor, base_image=base_image) is None
    assert toolchains.builder_image_for(cuda="13.0", python=python, flavor=flavor, base_image=base_image) == (
        toolchains.builder_image_name(cuda="13.0", python=python, flavor=flavor)
    )


def test_toolchain_for_several_pythons() -> None:
    assert toolchains.toolchain_for(["3.13", "3.14"]).suite == "forky"
    assert toolchains.toolchain_for(["3.11"]).suite == "bookworm"
    with pytest.raises(ImageError, match=r"Pythons 3\.11, 3\.13 together"):
        toolchains.toolchain_for(["3.11", "3.13"])
    with pytest.raises(ConfigError, match="'3'"):
        toolchains.toolchain_for(["3"])


def test_toolchain_image_name() -> None:
    assert toolchains.toolchain_image_name(cuda="13.0", suite="forky", flavor="pypi") == (
        "factory-builder:cu13.0-forky-pypi"
    )
    with pytest.raises(ConfigError):
        toolchains.toolchain_image_name(cuda="13.0", suite="Forky;x", flavor="pypi")


def test_the_pinned_gcc_is_one_nvcc_13_accepts() -> None:
    # nvcc 13.0's crt/host_config.h refuses GCC > 15.
    forky = toolchains.toolchain_named("forky")
    assert forky is not None and forky.gcc is not None
    assert 11 <= int(forky.gcc) <= 15


def test_base_include_pins_the_compiler_and_every_python() -> None:
    include = images.base_include("forky")
    for python in ("3.13", "3.14", "3.15"):
        assert {f"python{python}", f"python{python}-dev", f"python{python}-venv"} <= set(include)
    assert "g++-14" in include
    assert "g++" not in include  # the metapackage is forky's newest GCC, which nvcc 13.0 refuses
    assert "python3" in include  # the job driver runs `python3 -m`
    # Suites without a pinned toolchain keep the packages they were always bootstrapped with.
    assert images.base_include("bookworm") == images.DEFAULT_INCLUDE
    assert images.base_include("sid") == images.DEFAULT_INCLUDE


def test_compiler_links_name_every_way_a_build_finds_its_compiler() -> None:
    links = images.compiler_links("14")
    assert links["g++"] == links["c++"] == links["x86_64-linux-gnu-g++"] == "/usr/bin/g++-14"
    assert links["gcc"] == links["cc"] == links["x86_64-linux-gnu-gcc"] == "/usr/bin/gcc-14"
    assert links["cpp"] == "/usr/bin/cpp-14"


def test_missing_toolchain_files(tmp_path: Path) -> None:
    forky = toolchains.toolchain_named("forky")
    assert forky is not None
    missing = images.missing_toolchain_files(tmp_path, forky)
    assert "usr/bin/python3.14" in missing and "usr/bin/g++-14" in missing
    for path in missing:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("")
    assert images.missing_toolchain_files(tmp_path, forky) == []
    (tmp_path / "usr/include/python3.15/Python.h").unlink()
    assert images.missing_toolchain_files(tmp_path, forky) == ["usr/include/python3.15/Python.h"]


def test_debootstrap_script_for_a_suite_it_does_not_know(tmp_path: Path) -> None:
    (tmp_path / "sid").write_text("")
    (tmp_path / "bookworm").write_text("")
    assert images.debootstrap_script("bookworm", tmp_path) is None
    assert images.debootstrap_script("forky", tmp_path) == "sid"
    assert images.debootstrap_script("forky", tmp_path / "absent") is None


def test_base_changes_of_a_pinned_toolchain_label_its_gcc() -> None:
    plain = images.base_changes(suite="forky", mirror="http://m/debian", include=("python3",))
    pinned = images.base_changes(suite="forky", mirror="http://m/debian", include=("python3",), gcc="14")
    assert f"LABEL {images.LABEL_GCC}=14" in pinned
    assert not any(images.LABEL_GCC in c for c in plain)
    assert [c for c in plain if images.LABEL_INPUTS in c] != [c for c in pinned if images.LABEL_INPUTS in c]


def test_bookworm_base_inputs_are_unchanged() -> None:
    """The existing factory-base:bookworm keeps its inputs label (its include list and hash are as before)."""
    import hashlib
    import json

    changes = images.base_changes(suite="bookworm", mirror="m", include=images.base_include("bookworm"))
    digest = hashlib.sha256(json.dumps(["bookworm", sorted(images.DEFAULT_INCLUDE)]).encode()).hexdigest()
    assert f"LABEL {images.LABEL_INPUTS}={digest}" in changes


def _header_script() -> object:
    import importlib.util

    path = images.dockerfile_path("pypi").parent / "cuda-headers-glibc.py"
    spec = importlib.util.spec_from_file_location("cuda_headers_glibc", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The two declarations as CUDA 13.0.88's crt/math_functions.h spells them, between their neighbours.
_MATH_FUNCTIONS_H = """\
#  define __NV_GLIBC_PROVIDES_IEC_60559_FUNCS 0
#endif
extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ float                  rcbrtf(float x);
extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ double                 rsqrt(double x);
/** doc */
extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ float                  rsqrtf(float x);
__func__(double rsqrt(double a));
"""


def test_cuda_headers_get_glibc_2_42s_rsqrt_specifier() -> None:
    script: Any = _header_script()
    out = script.patched(_MATH_FUNCTIONS_H)
    assert "rsqrt(double x) __NV_FACTORY_RSQRT_SPECIFIER;" in out
    assert "rsqrtf(float x) __NV_FACTORY_RSQRT_SPECIFIER;" in out
    assert "__func__(double rsqrt(double a));" in out  # the host emulation is not a glibc declaration
    # The macro is defined once, before its first use, and empty below glibc 2.42 (the header as shipped).
    assert out.count("#define __NV_FACTORY_RSQRT_SPECIFIER __THROW") == 1
    assert out.index("#if __NV_GLIBC_PROVIDES_IEC_60559_FUNCS") < out.index("rsqrt(double x)")
    assert "__GLIBC_PREREQ(2, 42)" in out
    assert script.patched(out) == out  # idempotent
    # A toolkit whose header already carries a specifier (a later CUDA) is left alone.
    fixed = _MATH_FUNCTIONS_H.replace("rsqrt(double x);", "rsqrt(double x) __THROW;").replace(
        "rsqrtf(float x);", "rsqrtf(float x) __THROW;"
    )
    assert script.patched(fixed) == fixed


def test_a_toolchain_image_is_dockerfile_pypi_plus_its_steps() -> None:
    text = images.toolchain_dockerfile_text()
    assert text.startswith(images.dockerfile_text("pypi").rstrip("\n"))
    steps = text[len(images.dockerfile_text("pypi").rstrip("\n")) :]
    assert "COPY cuda-headers-glibc.py" in steps and "include/crt/math_functions.h" in steps
    assert steps.rstrip().endswith("done")  # its checks run last, as the build user
    assert "USER factory" in steps
    assert set(images.toolchain_context_files()) == {"cuda-headers-glibc.py"}
    # The one-Python images keep Dockerfile.pypi alone: factory-builder:cu13.0-py3.11-pypi is not rebuilt.
    assert "cuda-headers-glibc" not in images.dockerfile_text("pypi")


def test_toolchain_build_args() -> None:
    forky = toolchains.toolchain_named("forky")
    assert forky is not None
    args = images.toolchain_build_args(cuda="13.0", toolchain=forky, base_image="factory-base:forky")
    assert args["PYTHON"] == "3.13"  # the toolkit venv's
    assert args["PYTHONS"] == "3.13 3.14 3.15"
    assert args["GCC"] == "14"
    assert args["CUDA_MAJOR"] == "13"
    assert {"PYTHONS", "GCC"} <= images.declared_build_args(images.toolchain_dockerfile_text())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cuda", "13.0", "--python", "3.13", "--python", "3.x"], "invalid Python version '3.x'"),
        (["--cuda", "13", "--python", "3.13", "--python", "3.14"], "invalid CUDA version '13'"),
    ],
)
def test_images_build_checks_every_python_before_the_daemon(
    argv: list[str], message: str, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    code, output = factory_cli(["images", "build", *argv])
    assert code == 2
    assert message in output and "Traceback" not in output


def test_the_housekeeping_image_is_a_tagged_builder() -> None:
    def info(kind: str, *tags: str) -> images.ImageInfo:
        return images.ImageInfo(tags=tags, id="0", kind=kind, labels={}, size=0, created="")

    assert images.housekeeping_image([]) is None
    assert images.housekeeping_image([info("base", "factory-base:forky"), info("builder")]) is None
    found = [info("base", "a:1"), info("builder"), info("builder", "b:1", "b:2"), info("builder", "c:1")]
    assert images.housekeeping_image(found, DEFAULT_PLATFORM) == "b:1"


def test_the_housekeeping_image_is_of_the_hosts_platform_where_there_is_one() -> None:
    """A newer aarch64 builder (a devel or pypi one) is passed over on an x86_64 host, whose containers of it
    run under QEMU, and taken on an Arm host; another platform's is still better than none."""
    aarch64 = named("aarch64")

    def info(tag: str, platform: Platform) -> images.ImageInfo:
        labels = {} if platform == DEFAULT_PLATFORM else {images.LABEL_PLATFORM: platform.name}
        return images.ImageInfo(tags=(tag,), id="0", kind="builder", labels=labels, size=0, created="")

    found = [info("arm:1", aarch64), info("x86:1", DEFAULT_PLATFORM)]
    assert images.housekeeping_image(found, DEFAULT_PLATFORM) == "x86:1"
    assert images.housekeeping_image(found, aarch64) == "arm:1"
    assert images.housekeeping_image(found[:1], DEFAULT_PLATFORM) == "arm:1"


# ---------------------------------------------------------------------------------------------- debian flavor


@pytest.mark.parametrize("cuda", ["12.4", "12.6", "12.8", "12.9"])
def test_debian_flavor_builds_cuda_12_variants_with_trixies_toolkit(cuda: str) -> None:
    toolchain = toolchains.debian_toolchain(cuda=cuda, python="3.13")
    assert (toolchain.suite, toolchain.cuda, toolchain.gcc) == ("trixie", "12.4", "13")
    assert toolchains.toolkit_cuda(cuda=cuda, python="3.13", flavor="debian") == "12.4"
    # one image for every CUDA 12 variant, named by its toolkit, on the suite's own base
    name = toolchains.builder_image_for(cuda=cuda, python="3.13", flavor="debian", base_image=None)
    assert name == "factory-builder:cu12.4-trixie-debian"
    base = images.base_image_for(cuda=cuda, python="3.13", flavor="debian", base_image="factory-base:forky")
    assert base == "factory-base:trixie"


@pytest.mark.parametrize(
    ("cuda", "python"),
    [
        ("13.0", "3.13"),  # another major: torch's extension builder refuses it
        ("12.2", "3.13"),  # a toolkit newer than the variant's CUDA
        ("12.8", "3.11"),  # trixie ships Python 3.13 only
    ],
)
def test_debian_flavor_refuses_what_no_suite_toolkit_builds(cuda: str, python: str) -> None:
    with pytest.raises(ImageError) as err:
        toolchains.debian_toolchain(cuda=cuda, python=python)
    message = str(err.value)
    assert f"CUDA {cuda} for Python {python}" in message
    assert "trixie: CUDA 12.4, Python 3.13" in message and "flavor pypi" in message
    assert "\n" not in message


def test_other_flavors_compile_with_the_variants_cuda() -> None:
    for flavor in ("devel", "pypi", "manylinux"):
        assert toolchains.toolkit_cuda(cuda="12.8", python="3.11", flavor=flavor) == "12.8"


def test_the_pypi_flavors_python_313_keeps_forky() -> None:
    # trixie is listed for the debian flavor; the pypi flavor's 3.13 stays on forky's multi-Python toolchain
    assert toolchains.python_suite_for("3.13") == "forky"


def test_trixie_base_pins_the_gcc_cuda_12_4_accepts() -> None:
    include = images.base_include("trixie")
    assert "g++-13" in include and "python3.13-dev" in include and "python3.13-venv" in include
    assert "g++" not in include


def test_debian_dockerfile_checks_its_toolkit_and_compiler() -> None:
    text = images.dockerfile_text("debian")
    assert "nvidia-cuda-toolkit" in text and "non-free" in text
    assert '"${version}" = "${TOOLKIT}"' in text  # the label's toolkit is the nvcc in the image
    assert '-dumpversion)" = "${GCC}"' in text
    assert "--no-index" in text  # ninja and uv from the host's wheelhouse
    assert images.image_requirements(cuda="12.8", flavor="debian") == ("ninja", "uv")


@pytest.mark.parametrize(("cuda", "flavor"), [("13.0", "pypi"), ("12.8", "debian")])
def test_an_image_no_registry_serves_names_the_flavor_that_needs_none(cuda: str, flavor: str) -> None:
    hint = images.pull_hint(flavor="devel", image=images.devel_base_image(cuda), cuda=cuda)
    assert hint.startswith(
        f"set `build.flavor: {flavor}` in the matrix file (it needs no registry, CUDA {cuda})"
    )
    assert "\n" not in hint
