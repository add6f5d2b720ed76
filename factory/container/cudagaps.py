"""The CUDA headers and libraries a build needs that its toolkit lacks, taken from the build venv.

The pypi flavor's toolkit (NVIDIA's nvcc/cccl/crt/nvvm wheels) has no cuBLAS, cuSPARSE or cuRAND headers, yet
torch's ATen/cuda/CUDAContextLight.h includes them; torch's own dependency wheels put them in the build venv
(site-packages/nvidia/cu13/include on CUDA 13, nvidia/<library>/include on CUDA 12). Only the entries the
toolkit lacks are linked into one directory put on CPATH (LIBRARY_PATH for libraries): CPATH is searched
before the -isystem directories torch's cpp_extension passes, so a whole venv include directory there would
shadow the toolkit's own headers with the venv's copies. The host compiler reads CPATH; nvcc preprocesses
with it.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable, Mapping
from pathlib import Path

_VERSIONED_LIB = re.compile(r"^(lib[^/]+\.so)\.\d+(\.\d+)*$")


def venv_nvidia_dirs(venv: Path, kind: str) -> list[Path]:
    """The venv's site-packages/nvidia/*/<kind> directories (kind: include, lib), in name order."""
    return sorted(p for p in venv.glob(f"lib/python*/site-packages/nvidia/*/{kind}") if p.is_dir())


def header_gaps(toolkit_include: Path, dirs: Iterable[Path]) -> dict[str, Path]:
    """Name -> path of each top-level entry (header or directory) of `dirs` the toolkit's include lacks; the
    first directory with a name wins."""
    gaps: dict[str, Path] = {}
    for directory in dirs:
        for entry in sorted(directory.iterdir()):
            if entry.name not in gaps and not (toolkit_include / entry.name).exists():
                gaps[entry.name] = entry
    return gaps


def library_gaps(toolkit_lib: Path | Iterable[Path], dirs: Iterable[Path]) -> dict[str, Path]:
    """Unversioned name -> versioned file for each library of `dirs` (wheels ship only libfoo.so.N) that the
    toolkit's lib directories lack under any name, so that `-lfoo` finds it; the first directory with a
    name wins."""
    toolkit_libs = [toolkit_lib] if isinstance(toolkit_lib, Path) else list(toolkit_lib)
    gaps: dict[str, Path] = {}
    for directory in dirs:
        for entry in sorted(directory.iterdir()):
            match = _VERSIONED_LIB.fullmatch(entry.name)
            name = match.group(1) if match else entry.name if entry.name.endswith(".so") else None
            if name is None or name in gaps:
                continue
            if not any(any(lib.glob(f"{name}*")) for lib in toolkit_libs):
                gaps[name] = entry
    return gaps


def link_dir(path: Path, links: Mapping[str, Path]) -> Path | None:
    """A fresh directory of symlinks `name -> target`; None (and no directory) when there are none."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    if not links:
        return None
    path.mkdir(parents=True)
    for name, target in links.items():
        (path / name).symlink_to(target)
    return path


def with_search_path(env: Mapping[str, str], name: str, directory: Path | None) -> dict[str, str]:
    """`env` with `directory` after whatever `name` (CPATH, LIBRARY_PATH) already lists."""
    out = dict(env)
    if directory is not None:
        out[name] = os.pathsep.join(p for p in (env.get(name, ""), str(directory)) if p)
    return out


def toolkit_home(env: Mapping[str, str]) -> Path:
    """The toolkit's root: CUDA_HOME (pypi flavor; /usr for Debian's package), else /usr/local/cuda
    (nvidia/cuda images)."""
    return Path(env.get("CUDA_HOME") or env.get("CUDA_PATH") or "/usr/local/cuda")


def toolkit_lib_dirs(home: Path) -> list[Path]:
    """Where the toolkit's libraries are: lib64 or lib under its root, and for a distribution's package in
    the FHS layout (CUDA_HOME=/usr), the multiarch directory the linker searches (lib/<machine>-linux-gnu)."""
    dirs = [home / "lib64"] if (home / "lib64").is_dir() else [home / "lib"]
    dirs += sorted(p for p in (home / "lib").glob("*-linux-gnu") if p.is_dir())
    return dirs


def fill_gaps(
    env: Mapping[str, str], *, venv: Path, into: Path
) -> tuple[dict[str, str], list[str], list[str]]:
    """The build env with the venv's headers and libraries the toolkit lacks on CPATH and LIBRARY_PATH
    (linked under `into`), and the names of the headers and of the libraries it added."""
    home = toolkit_home(env)
    headers = header_gaps(home / "include", venv_nvidia_dirs(venv, "include"))
    libraries = library_gaps(toolkit_lib_dirs(home), venv_nvidia_dirs(venv, "lib"))
    out = with_search_path(env, "CPATH", link_dir(into / "include", headers))
    out = with_search_path(out, "LIBRARY_PATH", link_dir(into / "lib", libraries))
    return out, list(headers), list(libraries)


def summary(headers: list[str], libraries: list[str], *, most: int = 8) -> str:
    """One build-log line: every library, and the first `most` headers."""
    shown = ", ".join(headers[:most]) + (f" and {len(headers) - most} more" if len(headers) > most else "")
    return (
        "factory: from the build venv, what the CUDA toolkit lacks: "
        f"{len(headers)} headers ({shown or 'none'}); libraries: {', '.join(libraries) or 'none'}"
    )
