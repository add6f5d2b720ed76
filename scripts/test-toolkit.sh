#!/usr/bin/env bash
# The CUDA toolkit the tests compile with, from NVIDIA's PyPI wheels into the test venv, as the builder image
# gets it (factory/build/images.py names the wheels, factory/data/docker/Dockerfile.pypi makes the same links), so a machine
# without a CUDA install runs every test and a host's /usr/local/cuda is never the one tested.
# Usage: test-toolkit.sh PYTHON CUDA   (PYTHON: the venv's interpreter; CUDA: major.minor, 13 or newer)
set -euo pipefail
python=$1
cuda=$2
major=${cuda%%.*}

mapfile -t wheels < <("$python" -c \
    'import sys; from factory.build.images import toolkit_requirements; print(*toolkit_requirements(sys.argv[1]), sep="\n")' \
    "$cuda")
# cuobjdump: the fatbin tests' independent reading; its wheels start at 13.2 and read older toolkits' output.
"$python" -m pip install -q "${wheels[@]}" "nvidia-cuda-cuobjdump==${major}.*"

home=$("$python" -c 'import sys, sysconfig; print(sysconfig.get_paths()["purelib"] + "/nvidia/cu" + sys.argv[1])' "$major")
test -x "$home/bin/nvcc" || { echo "test-toolkit: no nvcc in $home after the install" >&2; exit 1; }
# nvcc.profile links from lib64; torch's cpp_extension and `nvcc -lcudart` want the unversioned libcudart.
ln -sfn lib "$home/lib64"
ln -sf "libcudart.so.${major}" "$home/lib/libcudart.so"
echo "test-toolkit: $("$home/bin/nvcc" --version | tail -n 2 | head -n 1) in $home"
