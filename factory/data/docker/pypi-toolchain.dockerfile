# Appended to Dockerfile.pypi for a builder image carrying every Python of a toolchain (factory/images.py,
# ensure_toolchain_image: factory-builder:cu<cuda>-<suite>-pypi), after its final stage.
ARG PYTHONS
ARG GCC
# The GNU triplet of the target platform (factory/core/platforms.py): setuptools calls <triplet>-g++.
ARG TRIPLET
USER root
# CUDA 13.0's crt/math_functions.h and glibc >= 2.42 (forky) disagree on rsqrt/rsqrtf: see the script.
COPY cuda-headers-glibc.py /tmp/cuda-headers-glibc.py
RUN set -eu; \
    python3 /tmp/cuda-headers-glibc.py "${CUDA_HOME}/include/crt/math_functions.h"; \
    rm /tmp/cuda-headers-glibc.py
USER factory
# Every Python of the toolchain, and its one GCC (when pinned) under each name nvcc, torch and setuptools call.
RUN set -eu; \
    for p in ${PYTHONS}; do "python${p}" -c 'import venv, sysconfig'; "python${p}" --version; done; \
    for c in gcc g++ cc c++ "${TRIPLET}-gcc" "${TRIPLET}-g++"; do \
      [ -z "${GCC}" ] || [ "$("$c" -dumpversion)" = "${GCC}" ] \
        || { echo "factory: $c is GCC $("$c" -dumpversion), not the toolchain's ${GCC}" >&2; exit 1; }; \
    done
