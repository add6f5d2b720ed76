"""Build script for factory-demo-ext, shaped like flash-attn's: CUDAExtension + BuildExtension (ninja).

Environment (all optional):
  DEMO_CUDA_ARCHS     "8.0;9.0" (torch format; falls back to TORCH_CUDA_ARCH_LIST, then "8.0"). Cubins only,
                      no PTX: the extension holds device code for exactly these archs.
  DEMO_LOCAL_VERSION  PEP 440 local label: the version becomes 0.1.0+<label>.
  MAX_JOBS            parallel ninja compile jobs (read by torch's BuildExtension).
  NVCC_THREADS        nvcc --threads N (parallel per-arch compilation inside one nvcc).
  DEMO_FAIL_COMPILE   "1" makes csrc/scale.cu fail with #error (for failure-path tests).
  DEMO_FAIL_HOST      "1" makes csrc/bindings.cpp, the host compiler's file, fail (an undeclared name).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

BASE_VERSION = "0.1.0"
HERE = Path(__file__).resolve().parent
ARCH_RE = re.compile(r"^(\d+)\.(\d+)([af]?)$")


def fail(message: str) -> None:
    sys.stderr.write(f"factory-demo-ext setup: {message}\n")
    raise SystemExit(2)


def parse_archs(text: str, source: str) -> list[str]:
    """Normalise "8.0;9.0a" to ["8.0", "9.0a"]; +PTX is refused: the wheel holds cubins for exactly these."""
    archs: list[str] = []
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        match = ARCH_RE.match(item)
        if match is None:
            fail(f"{source}={text!r}: {item!r} is not an arch like 8.0, 9.0a or 12.0 (+PTX is not supported)")
        arch = f"{int(match[1])}.{match[2]}{match[3]}"
        if arch not in archs:
            archs.append(arch)
    if not archs:
        fail(f"{source} is empty")
    return archs


def selected_archs() -> list[str]:
    for name in ("DEMO_CUDA_ARCHS", "TORCH_CUDA_ARCH_LIST"):
        value = os.environ.get(name, "").strip()
        if value:
            return parse_archs(value, name)
    return ["8.0"]


ARCHS = selected_archs()
# torch reads TORCH_CUDA_ARCH_LIST itself (adding +PTX defaults without it); keep it in step with our list,
# even though the explicit -gencode flags below already make torch skip its own arch flags.
os.environ["TORCH_CUDA_ARCH_LIST"] = ";".join(ARCHS)

import torch  # noqa: E402  # must follow the TORCH_CUDA_ARCH_LIST assignment
from setuptools import setup  # noqa: E402
from torch.utils.cpp_extension import BuildExtension, CUDAExtension  # noqa: E402


def version() -> str:
    label = os.environ.get("DEMO_LOCAL_VERSION", "").strip()
    if not label:
        return BASE_VERSION
    if not re.fullmatch(r"[A-Za-z0-9]+([._-][A-Za-z0-9]+)*", label):
        fail(f"DEMO_LOCAL_VERSION={label!r} is not a PEP 440 local version label")
    return f"{BASE_VERSION}+{label}"


def cxx_standard() -> str:
    # torch >= 2.14 headers need C++20; older torch is built and tested against C++17.
    major, minor = (int(p) for p in re.findall(r"\d+", torch.__version__)[:2])
    return "-std=c++20" if (major, minor) >= (2, 14) else "-std=c++17"


def failing(name: str) -> bool:
    return os.environ.get(name, "").strip() in {"1", "true", "TRUE", "yes"}


def cxx_flags() -> list[str]:
    return ["-O3", cxx_standard(), *(["-DDEMO_FAIL_HOST"] if failing("DEMO_FAIL_HOST") else [])]


def nvcc_flags() -> list[str]:
    flags = ["-O3", cxx_standard()]
    sms = [arch.replace(".", "") for arch in ARCHS]
    flags += [f"-gencode=arch=compute_{sm},code=sm_{sm}" for sm in sms]
    threads = os.environ.get("NVCC_THREADS", "").strip()
    if threads:
        if not threads.isdigit():
            fail(f"NVCC_THREADS={threads!r} is not a whole number")
        flags += ["--threads", threads]
    if failing("DEMO_FAIL_COMPILE"):
        flags.append("-DDEMO_FAIL_COMPILE")
    return flags


setup(
    name="factory-demo-ext",
    version=version(),
    description="Tiny torch CUDA extension for exercising the wheel factory",
    packages=["factory_demo_ext"],
    python_requires=">=3.9",
    # Pinned to the build's torch by the factory after the build; the extension links against its C++ ABI.
    install_requires=["torch"],
    ext_modules=[
        CUDAExtension(
            name="factory_demo_ext._C",
            sources=[
                "csrc/bindings.cpp",
                "csrc/add.cu",
                "csrc/scale.cu",
                "csrc/saxpy.cu",
                "csrc/relu.cu",
            ],
            include_dirs=[str(HERE / "csrc")],
            extra_compile_args={"cxx": cxx_flags(), "nvcc": nvcc_flags()},
        )
    ],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
