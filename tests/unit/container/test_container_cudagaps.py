"""The venv's CUDA headers and libraries the toolkit lacks, on CPATH and LIBRARY_PATH (container.cudagaps)."""

from __future__ import annotations

from pathlib import Path

from factory.container.cudagaps import (
    fill_gaps,
    header_gaps,
    library_gaps,
    link_dir,
    summary,
    toolkit_home,
    toolkit_lib_dirs,
    venv_nvidia_dirs,
    with_search_path,
)

SITE = "lib/python3.11/site-packages/nvidia"


def touch(root: Path, *names: str) -> Path:
    for name in names:
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(name)
    return root


def pypi_toolkit(tmp: Path) -> Path:
    """The pypi flavor's toolkit: runtime and nvcc headers, no cuSPARSE/cuBLAS; lib64 links to lib."""
    home = tmp / "toolkit" / "nvidia" / "cu13"
    touch(home, "include/cuda_runtime.h", "include/cooperative_groups/details/x.h")
    touch(home, "lib/libcudart.so.13", "lib/libcudart.so")
    (home / "lib64").symlink_to("lib")
    return home


def cu13_venv(tmp: Path) -> Path:
    """CUDA 13 wheels share one nvidia/cu13 tree."""
    venv = tmp / "venv"
    touch(venv / SITE / "cu13", "include/cuda_runtime.h", "include/cusparse.h", "include/cublas_v2.h")
    touch(venv / SITE / "cu13", "include/cooperative_groups/details/x.h")
    touch(venv / SITE / "cu13", "lib/libcudart.so.13", "lib/libcusparse.so.12", "lib/libcublas.so.13")
    return venv


def test_cu13_venv_fills_only_what_the_toolkit_lacks(tmp_path: Path) -> None:
    home, venv = pypi_toolkit(tmp_path), cu13_venv(tmp_path)
    env = {"CUDA_HOME": str(home), "CPATH": "/mine"}
    out, headers, libraries = fill_gaps(env, venv=venv, into=tmp_path / "job" / "cuda-gaps")
    include, lib = tmp_path / "job" / "cuda-gaps" / "include", tmp_path / "job" / "cuda-gaps" / "lib"
    assert out["CPATH"] == f"/mine:{include}" and out["LIBRARY_PATH"] == str(lib)
    assert sorted(p.name for p in include.iterdir()) == ["cublas_v2.h", "cusparse.h"]
    assert (include / "cusparse.h").resolve() == venv / SITE / "cu13" / "include" / "cusparse.h"
    assert sorted(p.name for p in lib.iterdir()) == ["libcublas.so", "libcusparse.so"]
    assert (lib / "libcusparse.so").resolve() == venv / SITE / "cu13" / "lib" / "libcusparse.so.12"
    assert (headers, libraries) == (["cublas_v2.h", "cusparse.h"], ["libcublas.so", "libcusparse.so"])
    assert summary(headers, libraries, most=1) == (
        "factory: from the build venv, what the CUDA toolkit lacks: 2 headers (cublas_v2.h and 1 more); "
        "libraries: libcublas.so, libcusparse.so"
    )
    assert env == {"CUDA_HOME": str(home), "CPATH": "/mine"}  # not changed in place


def test_cu12_wheels_have_one_directory_per_library(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    touch(venv / SITE / "cusparse", "include/cusparse.h", "lib/libcusparse.so.12")
    touch(venv / SITE / "cublas", "include/cublas_v2.h", "include/cusparse.h", "lib/libcublas.so.12")
    touch(venv / SITE / "cuda_runtime", "include/cuda_runtime.h", "lib/libcudart.so.12")
    touch(venv / SITE / "cudnn", "lib/libcudnn.so.9")  # no include directory
    found = [p.parent.name for p in venv_nvidia_dirs(venv, "include")]
    assert found == ["cublas", "cuda_runtime", "cusparse"]
    home = pypi_toolkit(tmp_path)
    gaps = header_gaps(home / "include", venv_nvidia_dirs(venv, "include"))
    assert gaps == {
        "cublas_v2.h": venv / SITE / "cublas" / "include" / "cublas_v2.h",
        "cusparse.h": venv / SITE / "cublas" / "include" / "cusparse.h",  # the first directory wins
    }
    libs = library_gaps(home / "lib", venv_nvidia_dirs(venv, "lib"))
    assert sorted(libs) == ["libcublas.so", "libcudnn.so", "libcusparse.so"]


def test_a_complete_toolkit_needs_nothing(tmp_path: Path) -> None:
    """nvidia/cuda devel images: /usr/local/cuda has every header, CUDA_HOME is unset."""
    home = touch(tmp_path / "cuda", "include/cuda_runtime.h", "include/cusparse.h", "include/cublas_v2.h")
    touch(home, "include/cooperative_groups/details/x.h", "lib64/libcusparse.so.12", "lib64/libcublas.so.13")
    touch(home, "lib64/libcudart.so.13")
    venv = cu13_venv(tmp_path)
    out, headers, libraries = fill_gaps({"CUDA_PATH": str(home)}, venv=venv, into=tmp_path / "gaps")
    assert headers == libraries == [] and out == {"CUDA_PATH": str(home)}
    assert not (tmp_path / "gaps").exists()


def test_a_venv_without_nvidia_wheels(tmp_path: Path) -> None:
    env = {"CUDA_HOME": str(pypi_toolkit(tmp_path))}
    out, headers, libraries = fill_gaps(env, venv=tmp_path / "v", into=tmp_path / "g")
    assert headers == libraries == [] and "CPATH" not in out and "LIBRARY_PATH" not in out


def test_link_dir_starts_afresh(tmp_path: Path) -> None:
    target = touch(tmp_path, "a.h") / "a.h"
    touch(tmp_path, "gaps/stale.h")
    assert link_dir(tmp_path / "gaps", {"a.h": target}) == tmp_path / "gaps"
    assert [p.name for p in (tmp_path / "gaps").iterdir()] == ["a.h"]
    assert link_dir(tmp_path / "gaps", {}) is None and not (tmp_path / "gaps").exists()


def test_with_search_path_and_toolkit_home() -> None:
    assert with_search_path({}, "CPATH", Path("/g")) == {"CPATH": "/g"}
    assert with_search_path({"CPATH": ""}, "CPATH", Path("/g")) == {"CPATH": "/g"}
    assert with_search_path({"CPATH": "/a"}, "CPATH", None) == {"CPATH": "/a"}
    assert toolkit_home({}) == Path("/usr/local/cuda")
    assert toolkit_home({"CUDA_HOME": "/opt/t"}) == Path("/opt/t")


def test_a_distribution_toolkits_multiarch_libraries_are_not_gaps(tmp_path: Path) -> None:
    # Debian's nvidia-cuda-toolkit: CUDA_HOME=/usr, libcudart.so in /usr/lib/x86_64-linux-gnu; the venv's
    # CUDA 12.8 copy must not be put before it on LIBRARY_PATH, while a library Debian lacks still is.
    home = tmp_path / "usr"
    multiarch = home / "lib" / "x86_64-linux-gnu"
    multiarch.mkdir(parents=True)
    (multiarch / "libcudart.so").touch()
    venv_lib = tmp_path / "venv" / "lib" / "python3.13" / "site-packages" / "nvidia" / "cuda_runtime" / "lib"
    venv_lib.mkdir(parents=True)
    (venv_lib / "libcudart.so.12").touch()
    (venv_lib / "libcufile.so.0").touch()
    assert toolkit_lib_dirs(home) == [home / "lib", multiarch]
    gaps = library_gaps(toolkit_lib_dirs(home), venv_nvidia_dirs(tmp_path / "venv", "lib"))
    assert list(gaps) == ["libcufile.so"]
