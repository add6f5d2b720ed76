"""The real configured index: torch 2.14.1's real filenames and metadata, and the C++ standard read from its
real ATen.h by HTTP range requests (a few MiB of a ~550 MB wheel, never the whole of it)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from conftest import require
from packaging.version import Version

from factory.plan.pipindex import IndexClient, read_pip_settings
from factory.plan.torchindex import TorchFile, TorchIndex, TorchSource, _RangeFile, facts_of_zip

pytestmark = pytest.mark.integration

WHEEL = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"


@pytest.fixture(scope="module")
def real_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[TorchIndex, TorchFile]:
    pip = read_pip_settings()
    index = TorchIndex(http=IndexClient(pip), home=tmp_path_factory.mktemp("home"))
    remote = [i for i in pip.indexes if i.startswith(("http://", "https://"))]
    found = [
        f
        for url in remote
        for f in index.files(TorchSource(pages=(url.rstrip("/") + "/torch/",), label=url))
        if f.filename == WHEEL
    ]
    require(bool(found), f"{WHEEL} on an http(s) index of the pip configuration ({', '.join(remote)})")
    return index, found[0]


def test_real_filename_says_pythons_platform_and_glibc(real_file: tuple[TorchIndex, TorchFile]) -> None:
    _, f = real_file
    assert f.version == Version("2.14.1") and f.label_build is None  # PyPI's default build has no label
    assert f.pythons == ("3.11",) and f.glibc == (2, 28) and f.runs_on()
    assert f.digest is not None and f.digest[0] == "sha256"


def test_real_metadata_and_header_by_range_requests(real_file: tuple[TorchIndex, TorchFile]) -> None:
    index, f = real_file
    remote = _RangeFile(index.http, index.http.bare(f.url), seconds=120)
    assert remote.size > 400 * 2**20
    with zipfile.ZipFile(remote) as zf:
        facts = facts_of_zip(zf)
    assert facts.build == ("cuda", "13.0")  # torch/version.py
    assert facts.cuda_major == 13  # METADATA's nvidia-*-cu13 and cuda-toolkit==13.0.* requirements
    assert facts.cxx_std == "20"  # ATen.h: #if __cplusplus < 202002L / #error C++20 or later ...
    assert remote.fetched < 16 * 2**20 and remote.requests <= 10


def test_real_facts_are_cached_by_url_and_sha256(
    real_file: tuple[TorchIndex, TorchFile], tmp_path: Path
) -> None:
    index, f = real_file
    facts = index.facts(f)
    assert (facts.build, facts.cxx_std) == (("cuda", "13.0"), "20")
    assert f.digest is not None
    assert (index.cache / "wheels" / f"{index._facts_key(f)}.json").is_file()
