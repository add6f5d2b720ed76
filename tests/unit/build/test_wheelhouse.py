"""Pure parts of factory.build.wheelhouse: platform expansion, the pip command line, cache keys, error
lines."""

from __future__ import annotations

import hashlib
import os
import zipfile
from pathlib import Path

import pytest

from factory.build import wheelhouse
from factory.core.errors import ConfigError, FactoryError
from factory.core.units import format_size


def test_compatible_platforms_manylinux_2_28() -> None:
    tags = wheelhouse.compatible_platforms("manylinux_2_28_x86_64")
    assert tags[0] == "manylinux_2_28_x86_64"
    for tag in (
        "manylinux_2_27_x86_64",  # triton, numpy
        "manylinux_2_17_x86_64",
        "manylinux2014_x86_64",  # nvidia-* wheels
        "manylinux2010_x86_64",
        "manylinux_2_5_x86_64",
        "manylinux1_x86_64",
    ):
        assert tag in tags
    assert "manylinux_2_29_x86_64" not in tags
    assert "linux_x86_64" not in tags
    assert len(tags) == len(set(tags))


def test_compatible_platforms_legacy_alias_and_arch() -> None:
    tags = wheelhouse.compatible_platforms("manylinux2014_aarch64")
    assert tags[0] == "manylinux_2_17_aarch64"
    assert "manylinux2014_aarch64" in tags
    assert all(t.endswith("_aarch64") for t in tags)


def test_compatible_platforms_other_platform_is_kept() -> None:
    assert wheelhouse.compatible_platforms("linux_x86_64") == ("linux_x86_64",)


@pytest.mark.parametrize("bad", ["manylinux_2_x_x86_64", "manylinux_3_1_x86_64", "manylinux_2_28"])
def test_compatible_platforms_rejects_bad_tags(bad: str) -> None:
    with pytest.raises(ConfigError):
        wheelhouse.compatible_platforms(bad)


def test_pip_download_args() -> None:
    args = wheelhouse.pip_download_args(
        ["torch==2.14.1", "ninja"],
        Path("/w"),
        python="3.11",
        index_url="https://idx/simple",
        extra_index_urls=["https://more/simple"],
    )
    assert args[:3] == ["-m", "pip", "download"]
    assert args[args.index("--dest") + 1] == "/w"
    assert args[args.index("--python-version") + 1] == "3.11"
    assert "--only-binary=:all:" in args
    platforms = [args[i + 1] for i, a in enumerate(args) if a == "--platform"]
    assert platforms == list(wheelhouse.compatible_platforms("manylinux_2_28_x86_64"))
    assert args[args.index("--index-url") + 1] == "https://idx/simple"
    assert args[args.index("--extra-index-url") + 1] == "https://more/simple"
    assert args[-2:] == ["torch==2.14.1", "ninja"]


def test_pip_download_args_without_only_binary_targets_the_host() -> None:
    args = wheelhouse.pip_download_args(["x"], Path("/w"), python="3.11", only_binary=False)
    assert "--platform" not in args and "--python-version" not in args
    assert "--index-url" not in args


def test_wheelhouse_key() -> None:
    base = wheelhouse.wheelhouse_key(["a", "b"], python="3.11")
    assert base == wheelhouse.wheelhouse_key(["b", "a"], python="3.11")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.12")
    assert base != wheelhouse.wheelhouse_key(["a", "b", "c"], python="3.11")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", platform="manylinux_2_17_x86_64")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", index_url="https://x/simple")
    assert base != wheelhouse.wheelhouse_key(["a", "b"], python="3.11", only_binary=False)


def test_last_error_line() -> None:
    out = (
        "Looking in indexes: x\n"
        "ERROR: Could not find a version that satisfies the requirement nope (from versions: none)\n"
        "ERROR: No matching distribution found for nope\n"
        "\n"
    )
    assert wheelhouse.last_error_line(out) == "ERROR: No matching distribution found for nope"
    assert wheelhouse.last_error_line("a\nlast words\n\n") == "last words"
    assert wheelhouse.last_error_line("") == "pip gave no output"


def test_wheel_files_ignores_other_files(tmp_path: Path) -> None:
    (tmp_path / "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl").write_bytes(b"")
    (tmp_path / "broken.whl").write_bytes(b"")
    (tmp_path / "pkg-1.0.tar.gz").write_bytes(b"")
    (tmp_path / "inputs.json").write_text("{}")
    assert [p.name for p in wheelhouse.wheel_files(tmp_path)] == [
        "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl"
    ]


def test_download_wheelhouse_needs_requirements(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        wheelhouse.download_wheelhouse([], tmp_path, python="3.11")


CUDA_WHEEL = "nvidia_cufile-1.15.1.6-py3-none-manylinux_2_17_x86_64.whl"
T311 = "torch-2.14.1-cp311-cp311-linux_x86_64.whl"
T313 = "torch-2.14.1-cp313-cp313-linux_x86_64.whl"


def _house(root: Path, name: str, wheels: dict[str, bytes]) -> Path:
    house = root / name
    house.mkdir(parents=True)
    for filename, data in wheels.items():
        (house / filename).write_bytes(data)
    return house


def test_pool_makes_identical_wheels_of_two_wheelhouses_one_file(tmp_path: Path) -> None:
    pool = tmp_path / wheelhouse.POOL
    a = _house(tmp_path, "a", {CUDA_WHEEL: b"cuda" * 100, T311: b"311"})
    b = _house(tmp_path, "b", {CUDA_WHEEL: b"cuda" * 100, T313: b"313"})
    assert wheelhouse.pool_wheels(a, pool) == 0
    assert wheelhouse.pool_wheels(b, pool) == 400
    assert (a / CUDA_WHEEL).stat().st_ino == (b / CUDA_WHEEL).stat().st_ino
    assert (b / CUDA_WHEEL).read_bytes() == b"cuda" * 100
    assert (a / T311).read_bytes() == b"311"
    assert len(list(pool.iterdir())) == 3
    assert not [p for p in b.iterdir() if p.name.startswith(".")]  # no staged link left


def test_pool_keeps_a_same_named_wheel_with_other_bytes_apart(tmp_path: Path) -> None:
    pool = tmp_path / wheelhouse.POOL
    a = _house(tmp_path, "a", {CUDA_WHEEL: b"one"})
    b = _house(tmp_path, "b", {CUDA_WHEEL: b"two"})
    wheelhouse.pool_wheels(a, pool)
    assert wheelhouse.pool_wheels(b, pool) == 0
    assert (a / CUDA_WHEEL).read_bytes() == b"one"
    assert (b / CUDA_WHEEL).read_bytes() == b"two"
    assert (a / CUDA_WHEEL).stat().st_ino != (b / CUDA_WHEEL).stat().st_ino


def test_pool_never_links_to_a_planted_symlink(tmp_path: Path) -> None:
    pool = tmp_path / wheelhouse.POOL
    pool.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(b"cuda")
    a = _house(tmp_path, "a", {CUDA_WHEEL: b"cuda"})
    (pool / wheelhouse._sha256(a / CUDA_WHEEL)).symlink_to(secret)
    assert wheelhouse.pool_wheels(a, pool) == 0
    assert not (a / CUDA_WHEEL).is_symlink()
    assert (a / CUDA_WHEEL).stat().st_ino != secret.stat().st_ino


@pytest.mark.parametrize("planted", ["other bytes", "a host file linked in", "a fifo", "a directory"])
def test_a_file_planted_under_a_wheels_hash_is_never_linked_and_is_replaced(
    tmp_path: Path, planted: str
) -> None:
    pool = tmp_path / wheelhouse.POOL
    pool.mkdir()
    data = b"cuda" * 100
    host = tmp_path / "host-file"
    a = _house(tmp_path, "a", {CUDA_WHEEL: data})
    twin = pool / hashlib.sha256(data).hexdigest()
    if planted == "other bytes":  # the same size: only its hash tells
        twin.write_bytes(b"evil" * 100)
    elif planted == "a host file linked in":  # the wheel's bytes, but a file that changes with the host's
        host.write_bytes(data)
        os.link(host, twin)
    elif planted == "a fifo":
        os.mkfifo(twin)
    else:
        twin.mkdir()
    assert wheelhouse.pool_wheels(a, pool) == 0
    assert (a / CUDA_WHEEL).read_bytes() == data
    if host.exists():
        assert (a / CUDA_WHEEL).stat().st_ino != host.stat().st_ino
        assert host.stat().st_nlink == 1 and host.read_bytes() == data  # the host's file left as it was
    assert not [p for p in a.iterdir() if p.name.startswith(".")]  # no staged link left
    if planted != "a directory":  # the pool now holds the downloaded bytes, for the next wheelhouse
        assert twin.stat().st_ino == (a / CUDA_WHEEL).stat().st_ino
        b = _house(tmp_path, "b", {CUDA_WHEEL: data})
        assert wheelhouse.pool_wheels(b, pool) == len(data)
        assert (b / CUDA_WHEEL).stat().st_ino == (a / CUDA_WHEEL).stat().st_ino


def test_the_pool_keeps_sharing_across_many_wheelhouses(tmp_path: Path) -> None:
    """Its file's links are the wheelhouses': counted, they never read as a link from outside."""
    pool = tmp_path / wheelhouse.POOL
    houses = [_house(tmp_path, name, {CUDA_WHEEL: b"cuda" * 100, T311: b"311"}) for name in "abcd"]
    assert [wheelhouse.pool_wheels(h, pool) for h in houses] == [0, 403, 403, 403]
    assert len({(h / CUDA_WHEEL).stat().st_ino for h in houses}) == 1
    assert (houses[0] / CUDA_WHEEL).stat().st_nlink == 5


def test_a_link_in_the_pools_place_is_never_written_through(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / wheelhouse.POOL).symlink_to(elsewhere)
    a = _house(tmp_path, "a", {CUDA_WHEEL: b"cuda"})
    assert wheelhouse.pool_wheels(a, tmp_path / wheelhouse.POOL) == 0
    assert list(elsewhere.iterdir()) == []


def test_prune_pool_drops_what_no_wheelhouse_links(tmp_path: Path) -> None:
    pool = tmp_path / wheelhouse.POOL
    a = _house(tmp_path, "a", {CUDA_WHEEL: b"kept"})
    b = _house(tmp_path, "b", {"other-1.0-py3-none-any.whl": b"gone"})
    wheelhouse.pool_wheels(a, pool)
    wheelhouse.pool_wheels(b, pool)
    (b / "other-1.0-py3-none-any.whl").unlink()
    dropped = wheelhouse.prune_pool(pool)
    assert [p.name for p in dropped] == [hashlib.sha256(b"gone").hexdigest()]
    assert [p.name for p in pool.iterdir()] == [wheelhouse._sha256(a / CUDA_WHEEL)]


def test_pool_never_links_a_symlink_found_in_a_wheelhouse(tmp_path: Path) -> None:
    pool = tmp_path / wheelhouse.POOL
    secret = tmp_path / "secret"
    secret.write_bytes(b"not a wheel")
    house = tmp_path / "a"
    house.mkdir()
    (house / CUDA_WHEEL).symlink_to(secret)
    assert wheelhouse.pool_wheels(house, pool) == 0
    assert list(pool.iterdir()) == []
    assert (house / CUDA_WHEEL).is_symlink()


@pytest.mark.parametrize(
    ("torch_wheel", "cuda", "foreign"),
    [
        ("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "13.0", "2.13.0+cpu"),
        ("torch-2.9.1+cu126-cp311-cp311-manylinux_2_28_x86_64.whl", "13.0", "2.9.1+cu126"),
        ("torch-2.9.1+cu126-cp311-cp311-manylinux_2_28_x86_64.whl", "12.8", None),
        ("torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl", "13.0", None),
        ("torch-2.13.0-cp311-cp311-manylinux_2_28_x86_64.whl", "13.0", None),  # plain: the index's default
    ],
)
def test_foreign_torch_names_a_build_for_no_cuda_or_another_major(
    tmp_path: Path, torch_wheel: str, cuda: str, foreign: str | None
) -> None:
    (tmp_path / torch_wheel).write_bytes(b"")
    (tmp_path / "numpy-2.0.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"")  # not torch
    assert wheelhouse.foreign_torch(tmp_path, cuda=cuda) == foreign


def test_without_version_refuses_exactly_that_build() -> None:
    from packaging.requirements import Requirement

    requirement = Requirement(wheelhouse.without_version("torch==2.13.*", "2.13.0+cpu"))
    assert not requirement.specifier.contains("2.13.0+cpu")
    assert requirement.specifier.contains("2.13.0")
    assert requirement.specifier.contains("2.13.1+cpu")  # only the one pip took: it is asked again


# -- what pip is doing, and what it need not download again --------------------------------------------------


def test_download_progress_counts_wheels_of_the_requirements_collected_so_far() -> None:
    seen = wheelhouse.DownloadProgress()
    lines = [
        "Looking in indexes: https://pypi.org/simple",
        "Collecting torch==2.14.*",
        "  Downloading torch-2.14.1+cu130-cp311-cp311-manylinux_2_28_x86_64.whl (915.7 MB)",
        "Collecting nvidia-cublas==13.1.*",
        "  Downloading nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl.metadata (1.7 kB)",
        "Collecting ninja",
        "Processing /var/seen/ninja-1.13.2-py3-none-manylinux2014_x86_64.whl",
    ]
    changed = [seen.feed(line) for line in lines]
    assert changed == [False, True, True, True, False, True, True]  # a .metadata fetch is no wheel
    assert seen.size == 915_700_000
    assert seen.describe() == (
        f"downloading 2 of 3 wheels so far ({format_size(seen.size)}, 1 reused): "
        "ninja-1.13.2-py3-none-manylinux2014_x86_64.whl"
    )
    seen.feed("  Downloading nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl (1.2 GB)")
    assert seen.size == 2_115_700_000
    assert seen.describe().startswith("downloading 3 of 3 wheels so far (")
    assert seen.describe().endswith(": nvidia_cublas-13.1.0.3-py3-none-manylinux_2_27_x86_64.whl")


def _wheel(directory: Path, name: str, version: str) -> Path:
    dist = f"{name.replace('-', '_')}-{version}"
    path = directory / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(
            f"{dist}.dist-info/METADATA", f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
        )
        zf.writestr(
            f"{dist}.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: t\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        zf.writestr(f"{dist}.dist-info/RECORD", "")
    return path


def _index(root: Path, projects: dict[str, list[Path]]) -> str:
    """A PEP 503 index of local files, as a file:// URL pip reads."""
    for project, files in projects.items():
        page = root / "simple" / project
        page.mkdir(parents=True, exist_ok=True)
        links = "".join(f'<a href="{f.as_uri()}">{f.name}</a>\n' for f in files)
        (page / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return (root / "simple").as_uri() + "/"


def test_a_new_requirement_list_takes_the_wheels_already_downloaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Changing extra_build_requires makes another wheelhouse; its torch (here fpw-big) is not downloaded
    again: the index no longer has it, and the download still succeeds, from the wheelhouse already here."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # the host's indexes and find-links stay out of it
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    files = tmp_path / "files"
    files.mkdir()
    big, small = _wheel(files, "fpw-big", "1.0"), _wheel(files, "fpw-small", "2.0")
    root = tmp_path / "houses"
    url = _index(tmp_path / "one", {"fpw-big": [big]})
    first = wheelhouse.download_wheelhouse(["fpw-big"], root, python="3.11", index_url=url)
    assert [p.name for p in wheelhouse.wheel_files(first)] == [big.name]

    assert _index(tmp_path / "one", {"fpw-big": [], "fpw-small": [small]}) == url  # fpw-big is gone
    told: list[str] = []
    second = wheelhouse.download_wheelhouse(
        ["fpw-big", "fpw-small"], root, python="3.11", index_url=url, progress=told.append
    )
    assert second != first
    assert [p.name for p in wheelhouse.wheel_files(second)] == [big.name, small.name]
    assert any("1 reused" in line for line in told), told
    assert not [p for p in root.iterdir() if p.name.startswith(".seen.")]  # the links went with the download
    # a wheelhouse for another Python (or another index) lends nothing: that download needs the index
    with pytest.raises(FactoryError, match=r"pip download for Python 3\.12"):
        wheelhouse.download_wheelhouse(["fpw-big"], root, python="3.12", index_url=url)
