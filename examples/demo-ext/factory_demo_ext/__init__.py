"""factory-demo-ext: a tiny torch CUDA extension shaped like flash-attn, for exercising the wheel factory."""

from __future__ import annotations

from importlib import metadata

import torch  # noqa: F401  # loads libtorch and libc10 before the extension that links against them

from factory_demo_ext import _C

try:
    __version__ = metadata.version("factory-demo-ext")
except metadata.PackageNotFoundError:  # imported from a source tree without installing
    __version__ = "0.1.0"

add = _C.add
scale = _C.scale
saxpy = _C.saxpy
relu = _C.relu

__all__ = ["__version__", "add", "relu", "saxpy", "scale"]
