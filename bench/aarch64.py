"""`python -m bench.aarch64`: the demo extension (examples/demo-ext, one arch set) for aarch64 on this x86_64
host, built two ways, with the same toolkit release (the PyPI wheels' nvcc 13.0) and GCC 12:

- emulated: in the aarch64 builder image (`factory images build --platform aarch64`), every binary (Python,
  g++, nvcc, cicc, ptxas) run by QEMU: a venv with the aarch64 torch from the aarch64 wheelhouse, then
  `setup.py bdist_wheel`, as the factory's driver does;
- cross: the emulated build's own ninja file replayed on the host, nvcc being the x86_64 toolkit's with
  aarch64-linux-gnu-g++ as its host compiler (`-ccbin`), the host side compiled and linked by
  aarch64-linux-gnu-g++ against the arm64 base's root (`--sysroot`) and the aarch64 torch's headers and
  libraries.

Then the device code of both compared (each object's and the module's `.nv_fatbin` section, byte for byte),
and each module imported beside torch in the aarch64 image (emulated). Writes bench/results/aarch64.json.
Needs: dockerd, QEMU's binfmt entry, the aarch64 builder image and base, g++-aarch64-linux-gnu, the x86_64
toolkit (copied out of the x86_64 pypi builder image) and the aarch64 build wheelhouse.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

from factory.wheel.fatbin import FATBIN_SECTION, elf_section, read_device_code

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results" / "aarch64.json"
DEMO = ROOT / "examples" / "demo-ext"
IMAGE = "factory-builder:cu13.0-py3.11-pypi-aarch64"
X86_IMAGE = "factory-builder:cu13.0-py3.11-pypi"
BASE = "factory-base:bookworm-aarch64"
ARCHS = "9.0"
CROSS = "aarch64-linux-gnu-g++"
VENV = "/tmp/v"
SITE = f"{VENV}/lib/python3.11/site-packages"
TOOLKIT = "/opt/toolkit/lib/python3.11/site-packages/nvidia/cu13"  # the image's CUDA_HOME

# In the emulated container: a venv from the wheelhouse (uv, as the factory's driver), then the build; each
# step's clock printed as `::t <step> <start> <end>`.
EMULATED = f"""
set -eu
now() {{ date +%s.%N; }}
t0=$(now)
uv venv -q --python python3.11 {VENV}
uv pip install -q --python {VENV}/bin/python --no-index --find-links /wh \\
  torch setuptools wheel ninja packaging
t1=$(now); echo "::t venv $t0 $t1"
cp -r /src /tmp/src
cd /tmp/src
DEMO_CUDA_ARCHS={ARCHS} MAX_JOBS=2 {VENV}/bin/python setup.py bdist_wheel -d /out/wheel > /out/build.log 2>&1
t2=$(now); echo "::t build $t1 $t2"
cp build/temp.*/build.ninja /out/
cp -r build/temp.* /out/objects
"""

# Import check: the module next to the aarch64 torch, in the aarch64 image (no GPU: CUDA is not initialised).
IMPORT = f"""
set -eu
uv venv -q --python python3.11 {VENV}
uv pip install -q --python {VENV}/bin/python --no-index --find-links /wh torch
cd /tmp
{VENV}/bin/python -c "import sys, torch; sys.path.insert(0, '/mod'); import factory_demo_ext._C as m; \\
print('::import', torch.__version__, m.__file__)"
"""


def run(cmd: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd[0]} failed: {proc.stderr.strip()[-3000:]}")
    return proc


def docker_run(image: str, script: str, mounts: dict[Path, tuple[str, str]]) -> tuple[float, str]:
    args = ["docker", "run", "--rm", "--network", "none", "--user", "root"]
    for host, (inside, mode) in mounts.items():
        args += ["-v", f"{host}:{inside}:{mode}"]
    start = time.monotonic()
    proc = subprocess.run([*args, image, "bash", "-c", script], text=True, capture_output=True, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"{image}: exit {proc.returncode}: {proc.stderr.strip()[-2000:]}")
    return wall, proc.stdout


def steps(stdout: str) -> dict[str, float]:
    found = re.finditer(r"^::t (\w+) ([\d.]+) ([\d.]+)$", stdout, re.MULTILINE)
    return {m[1]: round(float(m[3]) - float(m[2]), 1) for m in found}


def emulated(work: Path, wheelhouse: Path) -> dict[str, object]:
    out = work / "emulated"
    done = work / "emulated.json"
    if done.exists():  # --work given again: the slow half is kept while the cross half is worked on
        return dict(json.loads(done.read_text()))
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    mounts = {DEMO: ("/src", "ro"), wheelhouse: ("/wh", "ro"), out: ("/out", "rw")}
    wall, stdout = docker_run(IMAGE, EMULATED, mounts)
    result = {"wall_s": round(wall, 1), "steps_s": steps(stdout)}
    done.write_text(json.dumps(result))
    return result


def unpack_torch(wheelhouse: Path, dest: Path) -> Path:
    (wheel,) = wheelhouse.glob("torch-*-manylinux_2_28_aarch64.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if n.startswith(("torch/include/", "torch/lib/"))])
    (runtime,) = wheelhouse.glob("nvidia_cuda_runtime-*aarch64*.whl")
    with zipfile.ZipFile(runtime) as zf:
        zf.extractall(dest, [n for n in zf.namelist() if "/lib/" in n])
    # as the builder image does: torch's extensions link `-lcudart` from CUDA_HOME/lib64
    lib = dest / "nvidia" / "cu13" / "lib"
    (lib / "libcudart.so").symlink_to("libcudart.so.13")
    (lib.parent / "lib64").symlink_to("lib")
    return dest


def cross(work: Path, wheelhouse: Path, x86_toolkit: Path, sysroot: Path) -> dict[str, object]:
    """The emulated build's ninja file and link line, replayed with the x86_64 nvcc and the cross g++."""
    # the source at the emulated build's own path: nvcc names an anonymous namespace's kernels by a hash of
    # the file's path (`_GLOBAL__N__fe13871f_6_add_cu_...`), so another path is another cubin
    src = Path("/tmp/src")
    if src.exists():
        raise SystemExit(f"{src} exists: the cross build compiles at the emulated build's path, and needs it")
    shutil.copytree(DEMO, src)
    try:
        return _cross(work, wheelhouse, x86_toolkit, sysroot)
    finally:
        shutil.rmtree(src, ignore_errors=True)


def _cross(work: Path, wheelhouse: Path, x86_toolkit: Path, sysroot: Path) -> dict[str, object]:
    arm = unpack_torch(wheelhouse, work / "arm-site")
    build = work / "cross-build"
    build.mkdir()
    ninja_text = (work / "emulated" / "build.ninja").read_text()
    nvcc = f"{x86_toolkit}/bin/nvcc -ccbin {CROSS} -Xcompiler --sysroot={sysroot}"
    swaps = [
        (f"{TOOLKIT}/bin/nvcc", nvcc),
        (TOOLKIT, str(x86_toolkit)),  # the headers: the same release's
        (f"{SITE}/torch", f"{arm}/torch"),
        ("/usr/include/python3.11", f"{sysroot}/usr/include/python3.11"),
    ]
    ninja_text = swapped(ninja_text, swaps, build)
    ninja_text = re.sub(r"^cxx = .*$", f"cxx = {CROSS} --sysroot={sysroot}", ninja_text, flags=re.MULTILINE)
    (build / "build.ninja").write_text(ninja_text)
    ninja = shutil.which("ninja") or str(Path(sys.executable).parent / "ninja")
    start = time.monotonic()
    proc = subprocess.run([ninja, "-C", str(build), "-j", "2"], text=True, capture_output=True, check=False)
    compile_s = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"cross compile failed: {proc.stdout[-3000:]}{proc.stderr[-2000:]}")
    module = work / "cross-module" / "factory_demo_ext" / "_C.cpython-311-aarch64-linux-gnu.so"
    module.parent.mkdir(parents=True)
    # setuptools' own link line of the emulated build, its compiler and paths swapped
    log = (work / "emulated" / "build.log").read_text()
    (line,) = [x for x in log.splitlines() if " -shared " in x and "_C.cpython-311" in x]
    args = shlex.split(swapped(line, [(f"{TOOLKIT}/lib", f"{arm}/nvidia/cu13/lib"), *swaps], build))
    out_at = args.index("-o") + 1
    args[out_at] = str(module)
    start = time.monotonic()
    run([CROSS, f"--sysroot={sysroot}", *args[1:]])
    link_s = time.monotonic() - start
    return {"compile_s": round(compile_s, 1), "link_s": round(link_s, 1), "module": str(module)}


def swapped(text: str, swaps: list[tuple[str, str]], build: Path) -> str:
    text = re.sub(r"/tmp/src/build/temp\.[^/ :$]+", str(build), text)
    for old, new in swaps:
        text = text.replace(old, new)
    return text


def fatbin_digest(path: Path) -> str | None:
    data = path.read_bytes()
    extent = elf_section(data, FATBIN_SECTION, where=str(path))
    if extent is None:
        return None
    offset, size = extent
    return hashlib.sha256(data[offset : offset + size]).hexdigest()


def compare(work: Path, cross_module: Path) -> dict[str, object]:
    emulated_objects = {p.name: p for p in (work / "emulated" / "objects").rglob("*.o")}
    cross_objects = {p.name: p for p in (work / "cross-build").rglob("*.o")}
    per_object = {}
    for name in sorted(emulated_objects):
        a, b = fatbin_digest(emulated_objects[name]), fatbin_digest(cross_objects[name])
        if a is None and b is None:
            continue
        per_object[name] = {"emulated": a, "cross": b, "same": a == b}
    with zipfile.ZipFile(next((work / "emulated" / "wheel").glob("*.whl"))) as zf:
        (member,) = [n for n in zf.namelist() if n.endswith(".so")]
        emulated_module = work / "emulated-module" / member
        emulated_module.parent.mkdir(parents=True)
        emulated_module.write_bytes(zf.read(member))
    return {
        "objects": per_object,
        "module_fatbin_same": fatbin_digest(emulated_module) == fatbin_digest(cross_module),
        "targets": {
            "emulated": sorted(read_device_code(emulated_module).targets),
            "cross": sorted(read_device_code(cross_module).targets),
        },
        "emulated_module": str(emulated_module),
    }


def import_check(module: Path, wheelhouse: Path) -> dict[str, object]:
    package = module.parent
    wall, stdout = docker_run(IMAGE, IMPORT, {package.parent: ("/mod", "ro"), wheelhouse: ("/wh", "ro")})
    line = next((x for x in stdout.splitlines() if x.startswith("::import")), "")
    return {"imported": bool(line), "line": line, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--wheelhouse", type=Path, required=True, help="the aarch64 build wheelhouse")
    parser.add_argument("--x86-toolkit", type=Path, required=True, help="nvidia/cu13 of the x86_64 image")
    parser.add_argument("--sysroot", type=Path, required=True, help="the arm64 base's root filesystem")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, help="keep each run's files here (its emulated build is reused)")
    args = parser.parse_args()
    runs = []
    for number in range(1, args.runs + 1):
        with tempfile.TemporaryDirectory(prefix="bench-aarch64-") as tmp:
            work = Path(tmp) if args.work is None else args.work / f"run{number}"
            if args.work is not None:
                work.mkdir(parents=True, exist_ok=True)
                for made in ("arm-site", "cross-build", "cross-module", "emulated-module"):
                    shutil.rmtree(work / made, ignore_errors=True)
            result: dict[str, object] = {"run": number, "emulated": emulated(work, args.wheelhouse)}
            crossed = cross(work, args.wheelhouse, args.x86_toolkit.resolve(), args.sysroot.resolve())
            result["cross"] = crossed
            compared = compare(work, Path(str(crossed["module"])))
            result["device_code"] = {k: v for k, v in compared.items() if k != "emulated_module"}
            result["import_cross"] = import_check(Path(str(crossed["module"])), args.wheelhouse)
            result["import_emulated"] = import_check(Path(str(compared["emulated_module"])), args.wheelhouse)
            runs.append(result)
            print(json.dumps(result, indent=1), flush=True)
    args.out.write_text(json.dumps({"archs": ARCHS, "image": IMAGE, "runs": runs}, indent=1) + "\n")


if __name__ == "__main__":
    main()
