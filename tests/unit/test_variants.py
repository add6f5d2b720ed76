"""Variant ids, PEP 440 local labels (ordering!), and arch-set normalisation."""

from __future__ import annotations

import pytest
from packaging.version import Version

from factory.variants import (
    Variant,
    arch_digits,
    format_arch_list,
    parse_arch_set,
    parse_local_version,
    variant_id_from_local_version,
)


def v(
    cuda: str = "12.8", torch: str = "2.10", abi: bool = True, archs: tuple[str, ...] = ("8.0",)
) -> Variant:
    return Variant(package="flash-attn", version="2.8.3", cuda=cuda, torch=torch, cxx11_abi=abi, archs=archs)


def test_id_and_label_of_the_production_variant() -> None:
    variant = v(archs=("8.0", "9.0", "10.0", "12.0"))
    assert variant.id == "cu128-torch2.10-abi1-sm80.90.100.120"
    assert variant.local_version == "cu12.8.torch2.10.abi1.sm80.90.100.120"
    assert variant.full_version == "2.8.3+cu12.8.torch2.10.abi1.sm80.90.100.120"
    assert variant.arch == "8.0;9.0;10.0;12.0"


def test_abi0_and_full_torch_version() -> None:
    variant = v(torch="2.14.1", abi=False, cuda="13.0", archs=("9.0a",))
    assert variant.id == "cu130-torch2.14.1-abi0-sm90a"
    assert variant.local_version == "cu13.0.torch2.14.1.abi0.sm90a"


def test_labels_are_valid_pep440_local_versions() -> None:
    for variant in (v(), v(torch="2.14.1", archs=("8.0", "9.0a")), v(cuda="13.0", abi=False)):
        parsed = Version(variant.full_version)
        assert parsed.local == variant.local_version


def test_torch_2_10_sorts_above_torch_2_9() -> None:
    assert Version(v(torch="2.10").full_version) > Version(v(torch="2.9").full_version)


def test_cuda_12_10_sorts_above_cuda_12_9() -> None:
    assert Version(v(cuda="12.10").full_version) > Version(v(cuda="12.9").full_version)


def test_cuda_13_sorts_above_cuda_12() -> None:
    assert Version(v(cuda="13.0").full_version) > Version(v(cuda="12.9").full_version)


def test_flash_attn_style_labels_sort_wrongly() -> None:
    # The reason for our format: letters glued to numbers make the segment a string, "7" > "1".
    assert Version("2.8.3+cu12torch2.7cxx11abiTRUE") > Version("2.8.3+cu12torch2.10cxx11abiTRUE")


def test_ids_are_stable_and_distinct() -> None:
    a = v(archs=("8.0", "9.0"))
    assert a.id == v(archs=("8.0", "9.0")).id
    ids = {
        v(cuda=c, torch=t, abi=b).id for c in ("12.8", "13.0") for t in ("2.9", "2.10") for b in (True, False)
    }
    assert len(ids) == 8


@pytest.mark.parametrize(
    "variant",
    [
        v(archs=("8.0", "9.0", "10.0", "12.0")),
        v(cuda="13.0", torch="2.14.1", abi=False, archs=("9.0a", "10.0a", "12.0")),
        v(cuda="12.10", torch="2.9", archs=("12.1",)),
    ],
)
def test_id_from_local_version_is_the_inverse(variant: Variant) -> None:
    assert variant_id_from_local_version(variant.local_version) == variant.id
    assert variant_id_from_local_version(variant.full_version) == variant.id
    parts = parse_local_version(variant.local_version)
    assert parts["archs"] == variant.archs
    assert parts["cuda"] == variant.cuda and parts["torch"] == variant.torch


@pytest.mark.parametrize(
    "label", ["cu12torch2.7cxx11abiTRUE", "cu12.8.torch2.10", "", "cu12.8.torch2.10.abi2.sm80"]
)
def test_foreign_labels_are_rejected(label: str) -> None:
    with pytest.raises(ValueError, match="not a factory local version label"):
        variant_id_from_local_version(label)


def test_arch_sets_are_normalised_and_sorted() -> None:
    assert parse_arch_set("9.0;8.0") == ("8.0", "9.0")
    assert parse_arch_set("12.0;8.0;10.0;9.0;8.0") == ("8.0", "9.0", "10.0", "12.0")
    assert parse_arch_set(" 9.0a ; 9.0 ") == ("9.0", "9.0a")


@pytest.mark.parametrize("bad", ["", "sm_80", "80", "8", "8.0.1", "9.0b", "8.0;x"])
def test_bad_arch_sets(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_arch_set(bad)


def test_arch_formats() -> None:
    archs = ("8.0", "9.0", "10.0", "12.0")
    assert format_arch_list(archs, "flash-attn") == "80;90;100;120"
    assert format_arch_list(archs, "torch") == "8.0;9.0;10.0;12.0"
    assert arch_digits("9.0a") == "90a"
    with pytest.raises(ValueError):
        format_arch_list(archs, "cmake")


def test_inverse_accepts_what_packaging_parses_from_a_wheel_name() -> None:
    from packaging.utils import parse_wheel_filename

    variant = v(cuda="13.0", archs=("9.0a", "12.0"))
    filename = f"flash_attn-{variant.full_version}-cp311-cp311-linux_x86_64.whl"
    _name, version, _build, _tags = parse_wheel_filename(filename)
    assert version.local is not None
    assert variant_id_from_local_version(version.local) == variant.id
