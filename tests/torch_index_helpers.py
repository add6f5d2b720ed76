"""Small torch wheels that look like the real ones, where it matters to the factory's reading of an index: the
filename (local label, cp tags, manylinux_2_28 tag), the dist-info METADATA with torch's CUDA requirements,
torch/version.py, and torch/include/ATen/ATen.h with its C++ standard guard (the text of torch's own), in a
PEP 503 index with sha256 fragments and, for plain versions, PEP 658 metadata files."""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

GUARD = {
    std: f"#if !defined(_MSC_VER) && __cplusplus < {value}L\n"
    f"#error C++{std} or later compatible compiler is required to use ATen.\n#endif\n"
    for std, value in (("17", 201703), ("20", 202002))
}
CUDA_REQUIRES = {
    "13.0": (
        'cuda-toolkit[cublas,cudart,cufft]==13.0.3; platform_system == "Linux"',
        'nvidia-cudnn-cu13==9.24.0.43; platform_system == "Linux"',
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
    ),
    "12.8": (
        'nvidia-cuda-runtime-cu12==12.8.90; platform_system == "Linux"',
        'nvidia-cudnn-cu12==9.10.2.21; platform_system == "Linux"',
    ),
}


@dataclass(frozen=True)
class TorchWheel:
    version: str  # "2.14.1", "2.13.0+cpu", "2.13.0+cu130"
    cuda: str | None  # the build's CUDA; None for a CPU build
    cxx_std: str = "17"
    pythons: Sequence[str] = ("3.11", "3.12")
    platform: str = "manylinux_2_28_x86_64"
    bulk: int = 0  # bytes of a stored (uncompressed) library, so that a reader's ranges are a small part

    def filenames(self) -> list[str]:
        return [
            f"torch-{self.version}-cp{p.replace('.', '')}-cp{p.replace('.', '')}-{self.platform}.whl"
            for p in self.pythons
        ]

    def metadata(self) -> str:
        lines = [
            "Metadata-Version: 2.4",
            "Name: torch",
            f"Version: {self.version}",
            "Requires-Python: >=3.10",
        ]
        lines += ["Requires-Dist: filelock", "Requires-Dist: sympy>=1.13.3"]
        lines += [f"Requires-Dist: {r}" for r in CUDA_REQUIRES.get(self.cuda or "", ())]
        lines += ['Requires-Dist: optree>=0.13.0; extra == "optree"']
        return "\n".join(lines) + "\n\n"


def write_wheel(path: Path, wheel: TorchWheel, tag: str) -> None:
    cuda = repr(wheel.cuda)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"torch-{wheel.version}.dist-info/METADATA", wheel.metadata())
        zf.writestr(f"torch-{wheel.version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        zf.writestr(
            "torch/version.py",
            "from typing import Optional\n\n__all__ = ['__version__', 'cuda']\n"
            f"__version__ = '{wheel.version}'\ndebug = False\ncuda: Optional[str] = {cuda}\nhip = None\n",
        )
        zf.writestr(
            "torch/include/ATen/ATen.h",
            "#if !defined(TORCH_STABLE_ONLY) && !defined(TORCH_TARGET_VERSION)\n#pragma once\n\n"
            + GUARD[wheel.cxx_std]
            + "\n#include <ATen/Context.h>\n#include <ATen/Device.h>\n#endif\n",
        )
        if wheel.bulk:
            bulk = hashlib.sha256(wheel.version.encode()).digest() * (wheel.bulk // 32)
            zf.writestr("torch/lib/libtorch_cuda.so", bulk, compress_type=zipfile.ZIP_STORED)


def make_index(root: Path, wheels: Sequence[TorchWheel], *, metadata: bool = True) -> Path:
    """A PEP 503 index under `root` (root/simple/torch/index.html, the files beside it); its simple/ URL's
    directory. Plain versions get a PEP 658 metadata file when `metadata`."""
    page = root / "simple" / "torch"
    page.mkdir(parents=True, exist_ok=True)
    links = []
    for wheel in wheels:
        for filename in wheel.filenames():
            tag = filename.removesuffix(".whl").split("-", 2)[2]
            target = page / filename
            write_wheel(target, wheel, tag)
            digest = hashlib.sha256(target.read_bytes()).hexdigest()
            attrs = ""
            if metadata and "+" not in wheel.version:
                (page / f"{filename}.metadata").write_text(wheel.metadata())
                meta_digest = hashlib.sha256(wheel.metadata().encode()).hexdigest()
                attrs = f' data-dist-info-metadata="sha256={meta_digest}"'
                attrs += f' data-core-metadata="sha256={meta_digest}"'
            links.append(f'<a href="{filename}#sha256={digest}"{attrs}>{filename}</a>')
    (page / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "<br/>\n".join(links) + "\n</body></html>\n"
    )
    return root / "simple"


def pip_conf(path: Path, index: Path, *, find_links: Path | None = None) -> Path:
    """A pip.conf whose only index is `index` (PIP_CONFIG_FILE; the host's PIP_* and constraint cleared by the
    caller's environment)."""
    text = f"[global]\nindex-url = {index.as_uri()}\n"
    if find_links is not None:
        text += f"find-links = {find_links}\n"
    path.write_text(text)
    return path
