"""The wheel variant channel (PEP 825, experimental) for real: `factory publish --variants` of tiny factory
wheels, what it publishes validated with variantlib (each wheel's variant.json, and the release's
variants.json against what variantlib's own generate-index-json makes of the wheels), then installed by real
uv (`--preview-features wheel-variants`) in fresh venvs, from `factory serve` and from the directory.

uv runs its own copy of the NVIDIA provider, which reads NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION and
NV_VARIANT_PROVIDER_FORCE_SM_ARCH in place of the driver and the GPU: so a GPU is stood in for here, and uv
picks a real variant. What this cannot show (the provider reading a real driver) is left to a GPU host
(docs/PUBLISH.md). `factory which`, on a host with (a stand-in) torch, prints the channel's uv command after
the safe ones; run as printed, it installs the variant the stood-in driver and GPU run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from publish_helpers import (
    LABEL_NEW,
    UV,
    fresh_venv,
    installed_label,
    make_wheel,
    pip_install,
    static_index,
    uv_install,
)
from test_safe_commands import run_printed, stub_python
from variantlib.commands.generate_index_json import generate_index_json
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

from factory.publish import wheelvariants
from factory.wheel.checks import wheel_archive_problems

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
FACTORY = [sys.executable, "-m", "factory.cli"]
LABEL_12 = "cu12.8.torch2.14.abi1.sm80"
LABEL_90A = "cu13.0.torch2.14.abi1.sm90a"  # one exact GPU: not on the variant index
GROUP = "torch2.14-abi1"
FORCE_CUDA = "NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION"
FORCE_SM = "NV_VARIANT_PROVIDER_FORCE_SM_ARCH"


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str, str]]:
    """(index directory, `factory publish --variants` output, `factory serve`'s URL of the variant index)."""
    tmp = tmp_path_factory.mktemp("variants")
    for label in (LABEL_NEW, LABEL_12, LABEL_90A):
        make_wheel(tmp / "wh", label=label)
    out = subprocess.run(
        [*FACTORY, "publish", str(tmp / "wh"), "--to", str(tmp / "idx"), "--variants"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    log = (tmp / "serve.log").open("w")
    server = subprocess.Popen(
        [*FACTORY, "serve", str(tmp / "idx"), "--port", "0"], stdout=subprocess.PIPE, stderr=log, text=True
    )
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        assert line.startswith("serving "), line
        root = line.split(" at ", 1)[1].strip().removesuffix("simple/")
        yield tmp / "idx", out.stdout, f"{root}variants/{GROUP}/simple/"
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()


def variant_wheels(index: Path) -> list[Path]:
    return sorted((index / "variants" / GROUP / "files").glob("*.whl"))


def test_publish_says_what_went_to_the_variant_index_and_what_did_not(
    published: tuple[Path, str, str],
) -> None:
    index, output, _url = published
    assert [line.split()[0] for line in output.splitlines() if "variants/" in line] == ["published"] * 2
    assert (
        "not on the variant index: tinyvar-0.1.0+cu13.0.torch2.14.abi1.sm90a-py3-none-any.whl: archs 9.0a "
        "each run on one exact GPU, which the nvidia provider's sm_arch cannot say"
    ) in output
    # the per-variant indexes are as without --variants: every wheel there, nothing of the channel in them
    assert len(list((index / "files").glob("*/*.whl"))) == 3
    assert "variants" not in (index / "simple" / "index.html").read_text()
    check = subprocess.run([*FACTORY, "index", "check", "--to", str(index)], capture_output=True, text=True)
    assert check.returncode == 0 and ", 0 problems" in check.stdout, check.stdout + check.stderr


def test_what_is_published_is_valid_to_variantlib(published: tuple[Path, str, str], tmp_path: Path) -> None:
    index, _output, _url = published
    wheels = variant_wheels(index)
    assert len(wheels) == 2
    metadata = set()
    for wheel in wheels:
        match = VALIDATION_WHEEL_NAME_REGEX.fullmatch(wheel.name)
        assert match is not None and match["variant_label"], wheel.name
        assert wheel_archive_problems(wheel) == []
        with zipfile.ZipFile(wheel) as zf:
            dist_info = VariantDistInfo(
                zf.read("tinyvar-0.1.0.dist-info/variant.json"), match["variant_label"]
            )
            metadata.add(zf.read("tinyvar-0.1.0.dist-info/METADATA"))
        assert {p.namespace for p in dist_info.variant_desc.properties} == {"nvidia"}
        assert (wheel.parent / f"{wheel.name}.metadata").read_bytes() in metadata
    assert len(metadata) == 1  # identical core metadata across the release's variants, as the PEP requires
    # variantlib's own index generator, run on the wheels, makes the variants.json we published
    copy = tmp_path / "files"
    copy.mkdir()
    for wheel in wheels:
        shutil.copy(wheel, copy)
    generate_index_json(["-d", str(copy)])
    ours = (index / "variants" / GROUP / "files" / "tinyvar-0.1.0-variants.json").read_bytes()
    assert json.loads(ours) == json.loads((copy / "tinyvar-0.1.0-variants.json").read_bytes())
    assert set(VariantsJson(json.loads(ours)).variants) == {w.name.rsplit("-", 1)[1][:-4] for w in wheels}
    # pip, which knows nothing of variants, sees no wheel it could take on the variant index
    page = (index / "variants" / GROUP / "simple" / "tinyvar" / "index.html").read_text()
    assert "tinyvar-0.1.0-variants.json#sha256=" in page


def uv_variant_install(
    venv: Path, index_url: str, *, preview: bool = True
) -> subprocess.CompletedProcess[str]:
    args = ["--preview-features", wheelvariants.PREVIEW_FEATURE] if preview else []
    return uv_install(venv, index_url, *args, "--index-strategy", "first-index", "tinyvar==0.1.0")


@pytest.mark.parametrize(
    ("driver", "gpu", "label"),
    [
        ("13.0", "9.0", LABEL_NEW),  # only the cu13 wheel has sm_90
        ("13.0", "8.6", LABEL_NEW),  # both run: the newest CUDA the driver runs first
        ("12.8", "8.6", LABEL_12),  # the driver runs CUDA 12.8, not 13.0
        ("13.0", "7.5", None),  # no wheel has code for a Turing GPU
        ("12.6", "9.0", None),  # nor for a driver older than every CUDA
    ],
)
def test_uv_picks_the_variant_the_driver_and_gpu_run(
    published: tuple[Path, str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    driver: str,
    gpu: str,
    label: str | None,
) -> None:
    _index, _output, url = published
    monkeypatch.setenv(FORCE_CUDA, driver)
    monkeypatch.setenv(FORCE_SM, gpu)
    venv = fresh_venv(tmp_path / "venv", tool="uv")
    proc = uv_variant_install(venv, url)
    if label is None:
        assert proc.returncode != 0
        assert "has only unsupported wheel variants" in proc.stderr, proc.stderr[-2000:]
        return
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert installed_label(venv) == label
    assert "tinyvar-0.1.0.dist-info" in {p.name for p in (venv / "lib").glob("*/site-packages/*")}


def test_the_directory_serves_as_it_is_and_no_gpu_gets_no_wheel(
    published: tuple[Path, str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    index, _output, _url = published
    url = (index / "variants" / GROUP / "simple").as_uri() + "/"
    monkeypatch.setenv(FORCE_CUDA, "12.8")
    monkeypatch.setenv(FORCE_SM, "8.0")
    venv = fresh_venv(tmp_path / "a", tool="uv")
    proc = uv_variant_install(venv, url)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert installed_label(venv) == LABEL_12
    # without the preview, uv takes no variant wheel, and the index has no other: nothing is installed
    no_preview = uv_variant_install(fresh_venv(tmp_path / "b", tool="uv"), url, preview=False)
    assert no_preview.returncode != 0
    # no GPU the provider sees (this host has none, and nothing stands in): no null variant is published, so
    # a host without an NVIDIA driver gets no wheel rather than one it cannot run
    monkeypatch.delenv(FORCE_CUDA)
    monkeypatch.delenv(FORCE_SM)
    if shutil.which("nvidia-smi") is None:
        none = uv_variant_install(fresh_venv(tmp_path / "c", tool="uv"), url)
        assert none.returncode != 0 and "has only unsupported wheel variants" in none.stderr, none.stderr
    # pip ignores variant wheels (the extra name part), so it finds nothing to install there either
    pip = pip_install(fresh_venv(tmp_path / "d", tool="pip"), url, "--no-deps", "tinyvar==0.1.0")
    assert pip.returncode != 0


@pytest.fixture(scope="module")
def which_printed(published: tuple[Path, str, str], tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """What `factory which tinyvar` prints, from `factory serve`'s URL of the index, on a host whose
    (stand-in) torch is 2.14.1 for CUDA 13.0, torch and the rest from a stand-in PyPI, no nvidia-smi."""
    _index, _output, url = published
    tmp = tmp_path_factory.mktemp("which")
    torch = make_wheel(tmp / "torch", name="torch", version="2.14.1", label="")
    pypi = static_index(tmp / "pypi", {"torch": [torch]})
    (tmp / "tools").mkdir()
    root = url.removesuffix(f"variants/{GROUP}/simple/")
    proc = subprocess.run(
        [*FACTORY, "which", "--index-url", root, "--python", str(stub_python(tmp / "stubbed")),
         "--default-index", pypi, "tinyvar"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT), "PATH": str(tmp / "tools")},
    )  # fmt: skip
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    return proc.stdout.splitlines()


@pytest.mark.parametrize(("driver", "gpu", "label"), [("13.0", "9.0", LABEL_NEW), ("12.8", "8.6", LABEL_12)])
def test_which_prints_the_variant_command_after_the_safe_ones_and_it_installs_the_right_variant(
    published: tuple[Path, str, str],
    which_printed: list[str],
    tmp_path: Path,
    driver: str,
    gpu: str,
    label: str,
) -> None:
    _index, _output, url = published
    lines = which_printed
    (experimental,) = [n for n, line in enumerate(lines) if line.startswith("experimental, wheel variants")]
    assert [line.split()[0] for line in lines[experimental - 2 : experimental]] == ["pip", "uv"], lines
    command = lines[experimental + 1]
    assert lines[experimental + 2 :] == [], lines
    assert f"--preview-features {wheelvariants.PREVIEW_FEATURE} " in command and f"--index {url} " in command
    got = run_printed(None, command, "uv", tmp_path, extra_env={FORCE_CUDA: driver, FORCE_SM: gpu})
    assert got.proc.returncode == 0, got.proc.stdout + got.proc.stderr[-3000:]
    assert got.label == label, got.proc.stderr[-3000:]


def test_the_uv_version_is_one_with_wheel_variants() -> None:
    out = subprocess.run([UV, "--version"], capture_output=True, text=True, check=True).stdout.split()
    version = tuple(int(p) for p in out[1].split(".")[:3])
    assert version >= (0, 13, 6), out


def test_on_a_gpu_host_uv_reads_the_driver_and_the_gpu_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check left for a host with an NVIDIA GPU (CI has none, and skips it): with nothing stood in, uv's
    NVIDIA provider reads the driver and the GPU, and takes the wheel built for this GPU's arch over one
    built for another GPU generation."""
    from factory.consume.hostgpu import detect_driver
    from factory.core.variants import Arch
    from factory.publish.publisher import publish_wheels

    driver = detect_driver()
    if driver.cuda is None or not driver.gpus:
        pytest.skip("no NVIDIA driver and GPU here: this is the check for a GPU host (docs/PUBLISH.md)")
    gpu = Arch.parse(driver.gpus[0].strip())
    other = gpu.major - 1 if gpu.major >= 12 else gpu.major + 1
    ours = f"cu{driver.cuda}.torch2.14.abi1.sm{gpu.major}{gpu.minor}"
    wheels = [
        make_wheel(tmp_path / "w", label=ours),
        make_wheel(tmp_path / "w", label=f"cu{driver.cuda}.torch2.14.abi1.sm{other}0"),
    ]
    publish_wheels(wheels, to=str(tmp_path / "idx"), variants=True)
    monkeypatch.delenv(FORCE_CUDA, raising=False)
    monkeypatch.delenv(FORCE_SM, raising=False)
    venv = fresh_venv(tmp_path / "venv", tool="uv")
    proc = uv_variant_install(venv, (tmp_path / "idx" / "variants" / GROUP / "simple").as_uri() + "/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert installed_label(venv) == ours
