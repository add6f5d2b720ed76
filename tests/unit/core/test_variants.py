"""Variant ids, PEP 440 local labels (ordering!), the arch grammar, and that every spelling parses back."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from packaging.version import Version

from factory.core.variants import (
    Arch,
    Variant,
    VariantKey,
    format_arch_list,
    parse_arch,
    parse_arch_set,
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
    assert VariantKey.parse_local_version(variant.local_version) == variant.key
    assert VariantKey.parse_id(variant.id) == variant.key


@pytest.mark.parametrize(
    "label",
    [
        "cu12torch2.7cxx11abiTRUE",
        "cu12.8.torch2.10",
        "",
        "cu12.8.torch2.10.abi2.sm80",
        "cu12.08.torch2.10.abi1.sm80",  # PEP 440 would give it back as cu12.8
        "cu12.8.torch2.10.abi1.sm90.80",  # not sorted: two spellings of one variant
        "cu12.8.torch2.10.abi1.sm80.80",
        "cu12.8.torch2.10.abi1.sm8",
        "cu12.8.torch2.10.abi1.sm90b",
        "cu128.torch2.10.abi1.sm80",
    ],
)
def test_foreign_labels_are_rejected(label: str) -> None:
    with pytest.raises(ValueError, match="not a factory local version label"):
        variant_id_from_local_version(label)


def test_arch_sets_are_normalised_and_sorted() -> None:
    assert parse_arch_set("9.0;8.0") == ("8.0", "9.0")
    assert parse_arch_set("12.0;8.0;10.0;9.0;8.0") == ("8.0", "9.0", "10.0", "12.0")
    assert parse_arch_set(" 9.0a ; 9.0 ") == ("9.0", "9.0a")


def test_arch_sets_keep_suffixes_apart() -> None:
    assert parse_arch_set("9.0a;8.0, 10.0f 10.0a") == ("8.0", "9.0a", "10.0a", "10.0f")


@pytest.mark.parametrize(
    "bad", ["", "8", "8.0.1", "9.0b", "8.0;x", "8.10", "0.8", "08.0", "sm_8", "8.0+PTX", "sm_80", "80"]
)
def test_bad_arch_sets(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_arch_set(bad)


@pytest.mark.parametrize(
    ("text", "arch"),
    [
        ("9.0a", Arch(9, 0, "a")),
        ("90a", Arch(9, 0, "a")),
        ("sm_90a", Arch(9, 0, "a")),
        ("sm90a", Arch(9, 0, "a")),
        ("10.0f", Arch(10, 0, "f")),
        ("sm_100f", Arch(10, 0, "f")),
        ("sm_120f", Arch(12, 0, "f")),
        ("100", Arch(10, 0)),
        ("10.3", Arch(10, 3)),
        (" 8.6 ", Arch(8, 6)),
    ],
)
def test_arch_spellings(text: str, arch: Arch) -> None:
    assert Arch.parse(text) == arch
    assert Arch.parse(arch.dotted) == Arch.parse(arch.digits) == Arch.parse(arch.sm) == arch


def test_arch_specific_and_family_targets_are_distinct() -> None:
    assert len({Arch.parse(t) for t in ("10.0", "10.0a", "10.0f")}) == 3
    assert parse_arch("sm_100a") == "10.0a" and parse_arch("sm_100f") == "10.0f"
    assert sorted(["10.0f", "9.0a", "10.0", "9.0", "10.0a"], key=Arch.parse) == [
        "9.0", "9.0a", "10.0", "10.0a", "10.0f",
    ]  # fmt: skip
    assert Arch.parse("10.0f").sm_number == Arch.parse("10.0a").sm_number == 100


@pytest.mark.parametrize(
    ("target", "gpu", "ok"),
    [
        ("8.0", "8.6", True),
        ("8.6", "8.0", False),
        ("8.0", "9.0", False),
        ("9.0a", "9.0", True),
        ("10.0a", "10.3", False),  # arch-specific: that capability only
        ("10.0f", "10.3", True),  # family: the family's same or later minors
        ("10.3f", "10.0", False),
        ("12.0f", "12.1", True),
        ("12.0f", "10.0", False),
    ],
)
def test_runs_on(target: str, gpu: str, ok: bool) -> None:
    assert Arch.parse(target).runs_on(Arch.parse(gpu)) is ok


def test_arch_formats() -> None:
    archs = ("8.0", "9.0", "10.0", "12.0")
    assert format_arch_list(archs, "flash-attn") == "80;90;100;120"
    assert format_arch_list(archs, "torch") == "8.0;9.0;10.0;12.0"
    assert format_arch_list(("9.0a", "10.0f"), "flash-attn") == "90a;100f"
    with pytest.raises(ValueError):
        format_arch_list(archs, "cmake")


def test_inverse_accepts_what_packaging_parses_from_a_wheel_name() -> None:
    from packaging.utils import parse_wheel_filename

    variant = v(cuda="13.0", archs=("9.0a", "12.0"))
    filename = f"flash_attn-{variant.full_version}-cp311-cp311-linux_x86_64.whl"
    _name, version, _build, _tags = parse_wheel_filename(filename)
    assert version.local is not None
    assert variant_id_from_local_version(version.local) == variant.id


# --- round trips --------------------------------------------------------------------------------------------

_numbers = st.integers(min_value=0, max_value=30)
_archs = st.builds(
    Arch,
    st.integers(min_value=1, max_value=99),
    st.integers(min_value=0, max_value=9),
    st.sampled_from(["", "a", "f"]),
)
_keys = st.builds(
    VariantKey,
    cuda=st.builds(lambda a, b: f"{a}.{b}", st.integers(min_value=1, max_value=99), _numbers),
    torch=st.builds(lambda parts: ".".join(map(str, parts)), st.lists(_numbers, min_size=2, max_size=3)),
    cxx11_abi=st.booleans(),
    archs=st.sets(_archs, min_size=1, max_size=6).map(lambda s: tuple(a.dotted for a in sorted(s))),
)


@given(_archs)
def test_every_arch_spelling_round_trips(arch: Arch) -> None:
    for spelling in (arch.dotted, arch.digits, arch.sm):
        assert Arch.parse(spelling) == arch


@given(_keys)
def test_variant_id_round_trips(key: VariantKey) -> None:
    assert VariantKey.parse_id(key.id) == key


@given(_keys)
def test_local_label_round_trips_through_pep440(key: VariantKey) -> None:
    assert VariantKey.parse_local_version(key.local_version) == key
    local = Version(f"1.0+{key.local_version}").local  # what a wheel filename gives back
    assert local == key.local_version
    assert variant_id_from_local_version(f"1.0+{local}") == key.id


@given(_keys, _keys)
def test_distinct_variants_have_distinct_ids_and_labels(a: VariantKey, b: VariantKey) -> None:
    if a != b:
        assert a.id != b.id and a.local_version != b.local_version


@pytest.mark.parametrize(
    ("cuda", "tag"), [("12.8", "cu128"), ("13.0", "cu130"), ("12.10", "cu12.10"), ("13.1", "cu131")]
)
def test_cuda_spelling_in_ids(cuda: str, tag: str) -> None:
    key = VariantKey(cuda=cuda, torch="2.10", cxx11_abi=True, archs=("10.0", "10.3", "12.0"))
    assert key.id == f"{tag}-torch2.10-abi1-sm100.103.120"
    assert VariantKey.parse_id(key.id).cuda == cuda


def test_cuda_12_10_is_not_read_as_121_0() -> None:
    key = VariantKey.parse_local_version("cu12.10.torch2.10.abi1.sm80")
    assert key.cuda == "12.10" and key.id == "cu12.10-torch2.10-abi1-sm80"
    # What an older factory wrote for 12.10: not an id, rather than CUDA 121.0.
    with pytest.raises(ValueError, match="not a variant id"):
        VariantKey.parse_id("cu1210-torch2.10-abi1-sm80")


@pytest.mark.parametrize(
    "bad",
    [
        "cu1-torch2.14-abi1-sm80",
        "cu12.8-torch2.10-abi1-sm80",  # a one-digit minor is written cu128
        "cu12.08-torch2.10-abi1-sm80",
        "cu128-torch2-abi1-sm80",
        "cu128-torch2.10-abi2-sm80",
        "cu128-torch2.10-abi1-sm90.80",
        "cu128-torch2.10-abi1-sm8",
        "cu128-torch2.10-abi1-sm80-py311",
        "cu128-torch2.10-abi1-sm80; curl x | sh",
        "demo-ext; curl x | sh",
        "",
    ],
)
def test_foreign_ids_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="not a variant id"):
        VariantKey.parse_id(bad)


@pytest.mark.parametrize(
    ("field", "value"),
    [("cuda", "12"), ("cuda", "12.08"), ("torch", "2"), ("archs", ("9.0", "8.0")), ("archs", ())],
)
def test_keys_refuse_parts_that_would_not_parse_back(field: str, value: object) -> None:
    fields: dict[str, object] = {"cuda": "12.8", "torch": "2.10", "cxx11_abi": True, "archs": ("8.0",)}
    with pytest.raises(ValueError):
        VariantKey(**{**fields, field: value})  # type: ignore[arg-type]
