"""What runs inside build containers: the job driver and the nvcc admission wrapper, with the formats and
decisions they share with the host (`protocol`, `admission`, `cgroup`).

Standard library only, importing nothing outside this package: the container's Python has nothing else.
The runner mounts this directory read-only at PACKAGE_MOUNT and puts IMPORT_ROOT on PYTHONPATH, so that it
imports as `factory.container` there as here; its entry points run with `python3 -m`.
"""

from pathlib import Path

CONTAINER_DIR = Path(__file__).resolve().parent
IMPORT_ROOT = "/opt/factory"
PACKAGE_MOUNT = f"{IMPORT_ROOT}/factory/container"
# PYTORCH_NVCC in a build container: the wrapper's launcher
NVCC_LAUNCHER = f"{PACKAGE_MOUNT}/nvcc"
# CXX in a build container when the compile cache is on: the host compiler through the cache
CXX_LAUNCHER = f"{PACKAGE_MOUNT}/c++"
DRIVER = ("python3", "-m", f"{__name__}.driver")
