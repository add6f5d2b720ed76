# Every target works on a fresh Debian 12 machine as root; `make demo` and `make test` are README's two commands.
VENV ?= .venv
PY := $(VENV)/bin/python
# The CUDA toolkit the tests compile with (NVIDIA's PyPI wheels in the venv: scripts/test-toolkit.sh).
TEST_CUDA ?= 13.0
FACTORY := $(VENV)/bin/factory

.PHONY: install toolkit docker images debian-image floor-image test-floor-builder flash-attn-wheel test test-unit lint demo selector-screenshot preflight preflight-here bench-memory bench-cache bench-shard bench-side-by-side bench-serve bench-new-torch bench-docs real-packages aarch64-demo clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	bash scripts/host-tools.sh
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	touch $@

toolkit: $(VENV)/.toolkit-$(TEST_CUDA)

$(VENV)/.toolkit-$(TEST_CUDA): $(VENV)/.installed scripts/test-toolkit.sh
	bash scripts/test-toolkit.sh $(PY) $(TEST_CUDA)
	touch $@

# dockerd (with debootstrap for making base images) installed and running.
docker:
	bash scripts/ci-docker.sh

# The builder image the demo and the tests use, bootstrapped from the Debian mirror when absent.
images: install docker
	$(FACTORY) images build --cuda 13.0 --python 3.11 --flavor pypi
	$(FACTORY) images build --cuda 13.0 --python 3.13 --python 3.14 --flavor pypi

# The debian flavor's image (Debian trixie's nvidia-cuda-toolkit 12.4, about 5 GB): the CUDA 12 tests use it.
debian-image: install docker
	$(FACTORY) images build --cuda 12.8 --python 3.13 --flavor debian

# The pypi flavor's builder for Python 3.13 on bookworm (glibc 2.36) with a CPython compiled from the Debian
# mirror's source tarball: what a matrix with build.glibc below forky's 2.43 (2.36 to 2.42) gets for 3.13.
# Not among `images`: compiling CPython takes minutes (docs/PUBLISH.md), and `make test` does not need it.
floor-image: install docker
	$(FACTORY) images build --cuda 13.0 --python 3.13 --flavor pypi --glibc 2.36

# The demo extension for Python 3.13 built in that image, its wheel at or below manylinux_2_36, installed and
# imported in a fresh container of the older base (tests/integration/test_floor_builder_image.py), and the
# dependency + dependent pair built there and installed beside torch on that base (test_dependency_build.py's
# floor variant; its forky variant runs in `make test`). Not in CI.
test-floor-builder: install toolkit docker floor-image
	FACTORY_TEST_FLOOR_BUILDER=1 $(PY) -m pytest -ra tests/integration/test_floor_builder_image.py \
		tests/integration/test_dependency_build.py -k "not forky"

# The unit tests are pure and independent: one process per core (pytest-xdist) takes them from ~8 minutes to
# ~3 on two cores. The integration tests run one at a time: their containers' memory limits and parallelism
# are sized to the whole machine.
UNIT_WORKERS ?= auto

test: install toolkit docker images debian-image
	$(PY) -m pytest -ra -n $(UNIT_WORKERS) --dist loadscope tests/unit
	$(PY) -m pytest -ra --durations=25 tests/integration

test-unit: install toolkit
	$(PY) -m pytest -ra -n $(UNIT_WORKERS) --dist loadscope tests/unit

lint: install
	$(VENV)/bin/ruff check factory tests bench
	$(VENV)/bin/ruff format --check factory tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	$(VENV)/bin/actionlint
	$(VENV)/bin/zizmor --offline --quiet .github/workflows
	$(PY) -m bench.docs --check

demo: install docker images
	$(FACTORY) build --matrix examples/demo.yaml --output wheelhouse --publish

# docs/selector.png (README's picture of the index's human page), from a demo index of fake wheels.
selector-screenshot: install
	$(PY) scripts/selector_screenshot.py docs/selector.png

# Before hours of compiling: each variant of the production matrix (its first Python) fetched, patched, its host
# sources and its cheapest kernel for one arch compiled in its real container; pass or the first error per variant.
preflight: install docker images
	$(FACTORY) build --matrix matrix.yaml --preflight --keep-going

# What of it a host without a registry can preflight (bench/preflight.py records the figures): the CUDA 13
# variants with the pypi flavor (nvcc 13.0 as in NVIDIA's image; forky's Python 3.13), and torch 2.9/2.10 (CUDA
# 12.8 builds) with the debian flavor's CUDA 12.4 for sm_80;sm_90 (examples/flash-attn/cu12-debian.yaml). The
# sm_100/sm_120 of matrix.yaml's CUDA 12.8 variants need a 12.8 toolkit (nvidia/cuda:12.8-devel).
preflight-here: install docker images debian-image
	$(PY) -m bench.preflight

bench-memory: install docker images
	$(PY) -m bench.memory

# One 4-arch flash-attn wheel's compiles sharded over 1, 4 and 8 model runners (deterministic; about a minute).
bench-shard: install
	$(PY) -m bench.shard

# The compile cache: the demo extension and memext for Python 3.13 then 3.14 in the forky image, again from an
# empty $FACTORY_HOME against the same store, cache on/off pairs of memext; the flash-attn model (15-25 minutes
# on 2 busy cores; bench/results/cache.json).
bench-cache: install docker
	$(FACTORY) images build --cuda 13.0 --python 3.13 --python 3.14 --flavor pypi
	$(PY) -m bench.cache --part all

# What a compile beside another costs it, apart from the machine's drift (the host's nvcc; 15-40 minutes).
bench-side-by-side: install
	$(PY) -m bench.side_by_side --first light1 --second light2 --rounds 20
	$(PY) -m bench.side_by_side --first medium1 --second medium2 --rounds 10
	$(PY) -m bench.side_by_side --first heavy1 --second heavy2 --rounds 10

# `factory serve` on loopback under 200 concurrent clients x 2000 requests, every response's bytes checked;
# three runs, each against a fresh server (under a minute).
bench-serve: install
	$(PY) -m bench.serve_load --clients 200 --requests 2000 --repeat 3

# A new torch on a local torch index to its demo wheel published by the next scheduled run, nobody editing the
# matrix (`torch: [">=2.12"]`): run 1 once, then run 2 three times, each from cold wheelhouse and compile
# caches (bench/results/new-torch.json).
bench-new-torch: install docker images
	$(PY) -m bench.new_torch --repeat 3

# docs/BENCHMARKS.md's tables (between its `<!-- bench:NAME -->` markers) rewritten from bench/results/*.json;
# the unit tests fail while the file is not what they render.
bench-docs: install
	$(PY) -m bench.docs

# Real third-party sdists from the configured index, each by its built-in recipe alone, for sm_80 (not CI:
# causal-conv1d's four CUDA files take ~10 minutes on two cores, torch-scatter's more). flash-attn is left
# out: a full build is a day on such a machine.
real-packages: install docker images debian-image
	$(FACTORY) build --matrix examples/real/causal-conv1d.yaml --output wheelhouse/causal-conv1d
	$(FACTORY) build --matrix examples/real/causal-conv1d-cu12.yaml --output wheelhouse/causal-conv1d-cu12
	$(FACTORY) build --matrix examples/real/torch-scatter.yaml --output wheelhouse/torch-scatter

# The demo extension for aarch64 on this x86_64 host, the whole job under QEMU (binfmt_misc; host-tools.sh
# registers it): the arm64 base and builder images, the build beside its x86_64 sibling, the wheel and install
# checks, publishing, pip's install from the index (tests/integration/test_aarch64_demo.py). Not in `make
# test`: warm it takes 4.5-7.5 minutes here, over the ~5 CI's warm budget leaves it (docs/BENCHMARKS.md,
# "aarch64").
aarch64-demo: install docker
	FACTORY_AARCH64_DEMO=1 $(PY) -m pytest -ra tests/integration/test_aarch64_demo.py \
	  tests/integration/test_devel_aarch64.py

clean:
	rm -rf wheelhouse index .pytest_cache

# One whole flash-attn 2.8.3 wheel (every kernel, sm_80, CUDA 13.0, torch 2.14, Python 3.13): eight shard runs
# into a directory cache store, then the final build from it, published to $FACTORY_HOME/flash-attn-wheel/index
# and installed from there. Hours on two cores; resumable: run it again and it goes on where it stopped
# (bench/results/flash-attn-wheel.json; docs/BENCHMARKS.md, "flash-attn, whole").
flash-attn-wheel: install docker images
	$(PY) -m bench.flash_attn_wheel --shards 8
