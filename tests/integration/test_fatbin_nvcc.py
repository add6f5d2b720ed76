"""factory.wheel.fatbin against shared objects compiled by a real nvcc (the test venv's CUDA toolkit), read
back by
the toolkit's cuobjdump as well."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from factory.wheel.fatbin import read_device_code

pytestmark = pytest.mark.integration

KERNELS = r"""
__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
__global__ void shift(float* x, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] += b;
}
void launch(float* x, int n) {
  scale<<<(n + 255) / 256, 256>>>(x, 2.0f, n);
  shift<<<(n + 255) / 256, 256>>>(x, 1.0f, n);
}
"""

SECOND_TU = r"""
__global__ void zero(float* x) { x[threadIdx.x] = 0.0f; }
void launch_zero(float* x) { zero<<<1, 32>>>(x); }
"""


def compile_so(
    nvcc: str, out: Path, gencodes: list[str], *, sources: tuple[str, ...] = (KERNELS,), suffix: str = ".cu"
) -> Path:
    paths = []
    for index, text in enumerate(sources):
        path = out.parent / f"{out.stem}_{index}{suffix}"
        path.write_text(text)
        paths.append(str(path))
    flags = [f"-gencode={g}" for g in gencodes]
    # -nodlink: torch extensions are linked by the host compiler, with no nvcc device-link fatbin of its own.
    command = [nvcc, "-shared", "-nodlink", "-Xcompiler", "-fPIC", *flags, *paths, "-o", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, f"nvcc failed:\n{result.stderr}"
    return out


def listed(cuobjdump: str, path: Path) -> set[str]:
    """The targets cuobjdump prints ("arch = sm_100f" under "Fatbin elf code:"), PTX spelled compute_*.

    Its --list-elf names are no help here: they drop the family suffix (an sm_100f cubin is listed as
    "....sm_100.cubin")."""
    result = subprocess.run([cuobjdump, str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    blocks = re.findall(r"^Fatbin (elf|ptx) code:\n=+\narch = sm_(\d+[af]?)$", result.stdout, re.MULTILINE)
    return {f"{'sm' if kind == 'elf' else 'compute'}_{arch}" for kind, arch in blocks}


@pytest.mark.parametrize(
    ("gencodes", "cubins", "ptx", "targets"),
    [
        (
            ["arch=compute_80,code=sm_80", "arch=compute_90,code=sm_90"],
            {80, 90},
            set(),
            {"sm_80", "sm_90"},
        ),
        (["arch=compute_120,code=sm_120"], {120}, set(), {"sm_120"}),
        (
            ["arch=compute_80,code=sm_80", "arch=compute_90,code=compute_90"],
            {80},
            {90},
            {"sm_80", "compute_90"},
        ),
        (
            ["arch=compute_90a,code=sm_90a", "arch=compute_100,code=[sm_100,compute_100]"],
            {90, 100},
            {100},
            {"sm_90a", "sm_100", "compute_100"},
        ),
        (
            ["arch=compute_100f,code=sm_100f", "arch=compute_120a,code=[sm_120a,compute_120a]"],
            {100, 120},
            {120},
            {"sm_100f", "sm_120a", "compute_120a"},
        ),
    ],
    ids=["sm80-sm90", "sm120", "sm80-ptx90", "sm90a-sm100-ptx100", "sm100f-sm120a-ptx120a"],
)
def test_archs_of_real_nvcc_output(
    toolkit_nvcc: str,
    cuda_home: Path,
    tmp_path: Path,
    gencodes: list[str],
    cubins: set[int],
    ptx: set[int],
    targets: set[str],
) -> None:
    so = compile_so(toolkit_nvcc, tmp_path / "kernels.so", gencodes)
    code = read_device_code(so)
    assert code.cubin_archs == cubins
    assert code.ptx_archs == ptx
    assert code.targets == targets
    assert code.cubin_targets == {t for t in targets if t.startswith("sm_")}
    assert code.ptx_targets == {t for t in targets if t.startswith("compute_")}

    # an independent reading of the same file
    assert listed(str(cuda_home / "bin" / "cuobjdump"), so) == targets


def test_several_translation_units_make_several_containers(toolkit_nvcc: str, tmp_path: Path) -> None:
    so = compile_so(
        toolkit_nvcc,
        tmp_path / "two.so",
        ["arch=compute_80,code=sm_80", "arch=compute_120,code=sm_120"],
        sources=(KERNELS, SECOND_TU),
    )
    assert read_device_code(so).cubin_archs == {80, 120}


def test_host_only_code_has_no_device_code(toolkit_nvcc: str, tmp_path: Path) -> None:
    so = compile_so(
        toolkit_nvcc, tmp_path / "host.so", [], sources=("int answer() { return 42; }\n",), suffix=".cpp"
    )
    assert read_device_code(so).empty


def test_a_cu_file_without_kernels_still_carries_default_arch_code(toolkit_nvcc: str, tmp_path: Path) -> None:
    # nvcc embeds default-arch code even for a .cu without kernels, so a stray TU compiled without the job's
    # flags is visible to the exact-arch check.
    so = compile_so(toolkit_nvcc, tmp_path / "stray.so", [], sources=("int answer() { return 42; }\n",))
    code = read_device_code(so)
    assert code.cubin_archs
    assert code.cubin_archs.isdisjoint({80, 90, 100, 120})
