"""The wheel variant format and the variant index layout (factory.publish.wheelvariants), checked against
variantlib, the PEP 825 reference library: labels, variant.json, {name}-{version}-variants.json, file names;
the
rewrite of a factory wheel; the pages as a pure function of their state, and hostile state refused."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
from variantlib.api import VariantDescription, VariantProperty, make_variant_dist_info
from variantlib.constants import VALIDATION_WHEEL_NAME_REGEX
from variantlib.errors import ValidationError
from variantlib.models.variant_info import ProviderInfo, VariantInfo
from variantlib.variant_dist_info import VariantDistInfo
from variantlib.variants_json import VariantsJson

from factory.core.errors import ConfigError, PublishError
from factory.core.variants import VariantKey
from factory.publish import wheelvariants as wv
from factory.publish.index import DamagedState, RecordConflict
from factory.publish.publisher import PublishResult, describe, publish_wheels
from factory.wheel.checks import record_hash, wheel_archive_problems

LABEL = "cu13.0.torch2.14.abi1.sm80.90"


def key(label: str) -> VariantKey:
    return VariantKey.parse_local_version(label)


def vdesc(props: wv.NvidiaProperties) -> VariantDescription:
    return VariantDescription(
        [VariantProperty.from_str(p) for p in props.properties()],
    )


def provider_info() -> VariantInfo:
    return VariantInfo(
        namespace_priorities=["nvidia"],
        providers={"nvidia": ProviderInfo(plugin_api=wv.PLUGIN_API, requires=[wv.PROVIDER_REQUIRES])},
    )


def factory_wheel(directory: Path, label: str = LABEL, *, summary: str = "demo") -> Path:
    """A factory wheel as the build leaves it: a local label, a torch pin, a provenance in its .dist-info."""
    version = f"0.1.0+{label}"
    dist_info = f"demo_ext-{version}.dist-info"
    files = {
        "demo_ext/__init__.py": b"X = 1\n",
        "demo_ext/_C.so": f"\x7fELF fake, code for {label}".encode(),  # each variant's own
        f"{dist_info}/METADATA": (
            f"Metadata-Version: 2.1\nName: demo-ext\nVersion: {version}\nSummary: {summary}\n"
            "Requires-Dist: torch==2.14.*\n\n"
        ).encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: t\n"
        b"Root-Is-Purelib: false\nTag: cp311-cp311-x\n",
        f"{dist_info}/factory-provenance.json": b"{}\n",
    }
    record = "".join(f"{n},{record_hash(d)},{len(d)}\n" for n, d in files.items()) + f"{dist_info}/RECORD,,\n"
    files[f"{dist_info}/RECORD"] = record.encode()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"demo_ext-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for n, d in files.items():
            zf.writestr(zipfile.ZipInfo(n, date_time=(2025, 3, 4, 5, 6, 8)), d)
    return path


# --- properties and labels ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("label", "cuda", "sm"),
    [
        ("cu13.0.torch2.14.abi1.sm80.90", "13.0", ("80_real", "90_real")),
        ("cu12.8.torch2.10.abi1.sm75.80.86.100f.120", "12.8", ("100_real", "120_real", "75_real", "80_real",
                                                                "86_real")),
        ("cu13.0.torch2.14.abi1.sm80.90a", "13.0", ("80_real",)),  # 9.0a: one exact GPU, not claimed
        ("cu12.10.stable2.12.abi0.sm100f", "12.10", ("100_real",)),
    ],
)  # fmt: skip
def test_a_variant_claims_its_cuda_and_the_gpus_its_cubins_run_on(
    label: str, cuda: str, sm: tuple[str]
) -> None:
    props = wv.nvidia_properties(key(label))
    assert (props.cuda, props.sm) == (cuda, sm)
    # the label is the PEP's variant hash, as variantlib computes it
    assert props.label == vdesc(props).hexdigest == VariantDescription(vdesc(props).properties).label


def test_a_variant_of_arch_specific_targets_alone_claims_nothing_and_says_why() -> None:
    with pytest.raises(ValueError, match=r"archs 9\.0a, 10\.0a each run on one exact GPU"):
        wv.nvidia_properties(key("cu13.0.torch2.14.abi1.sm90a.100a"))


def test_groups_split_by_torch_and_abi_only() -> None:
    assert wv.group_of(key("cu13.0.torch2.14.abi1.sm80.90")) == "torch2.14-abi1"
    assert wv.group_of(key("cu12.8.torch2.14.abi1.sm80")) == "torch2.14-abi1"
    assert wv.group_of(key("cu13.0.torch2.14.1.abi0.sm80")) == "torch2.14.1-abi0"
    assert wv.group_of(key("cu13.0.stable2.12.abi1.sm80")) == "stable2.12-abi1"
    assert wv.torch_group("2.14.1+cu130", True) == "torch2.14-abi1"
    assert all(wv.is_group(g) for g in ("torch2.14-abi1", "stable2.12-abi0", "torch2.14.1-abi1"))
    assert not any(wv.is_group(g) for g in ("torch2.14", "../x", "torch2-abi1", "cu130-torch2.14-abi1"))


# --- the format, as variantlib reads and writes it ---------------------------------------------------------


def test_variant_json_is_what_variantlib_writes_and_reads_back() -> None:
    props = wv.nvidia_properties(key(LABEL))
    ours = wv.variants_document({props.label: props})
    assert ours.decode() == make_variant_dist_info(vdesc(props), variant_info=provider_info())
    parsed = VariantDistInfo(ours, props.label)
    assert parsed.variant_label == props.label
    assert {p.to_str() for p in parsed.variant_desc.properties} == set(props.properties())
    with pytest.raises(ValidationError):
        VariantDistInfo(ours, "00000000")  # the file name's label must be the one it describes


def test_a_release_document_is_variantlibs_merge_of_its_variants() -> None:
    labels = ["cu13.0.torch2.14.abi1.sm80.90", "cu12.8.torch2.14.abi1.sm80", "cu13.0.torch2.14.abi1.sm120"]
    every = {p.label: p for p in (wv.nvidia_properties(key(lb)) for lb in labels)}
    merged: VariantsJson | None = None
    for label, props in every.items():
        one = VariantDistInfo(wv.variants_document({label: props}), label)
        if merged is None:
            merged = VariantsJson(one)
        merged.merge(one)
    assert merged is not None
    assert wv.variants_document(every).decode() == merged.to_str()
    assert set(VariantsJson(json.loads(wv.variants_document(every))).variants) == set(every)


def test_a_label_that_is_not_the_hash_of_its_properties_is_refused() -> None:
    props = wv.nvidia_properties(key(LABEL))
    with pytest.raises(ValueError, match="is not the hash"):
        wv.variants_document({"cu130": props})


def test_variant_file_names_are_pep_825s_and_parse_back() -> None:
    canonical = f"demo_ext-2.8.3.post2+{LABEL}-cp311-cp311-manylinux_2_34_x86_64.whl"
    name = wv.variant_filename(canonical, "1a2b3c4d")
    assert name == "demo_ext-2.8.3.post2-cp311-cp311-manylinux_2_34_x86_64-1a2b3c4d.whl"
    match = VALIDATION_WHEEL_NAME_REGEX.fullmatch(name)
    assert match is not None and match["variant_label"] == "1a2b3c4d" and match["ver"] == "2.8.3.post2"
    project, version, label = wv.parse_variant_filename(name)
    assert (project, str(version), label) == ("demo-ext", "2.8.3.post2", "1a2b3c4d")
    assert wv.variants_json_name(project, version) == "demo_ext-2.8.3.post2-variants.json"


@pytest.mark.parametrize(
    "bad",
    [
        "demo_ext-0.1.0-py3-none-any.whl",  # no label
        "demo_ext-0.1.0-py3-none-any-cu130.whl",  # not a hash
        "demo_ext-0.1.0+cu13-py3-none-any-1a2b3c4d.whl",  # a local version
        "Demo_Ext-0.1.0-py3-none-any-1a2b3c4d.whl",  # not the canonical spelling
        "demo_ext-0.1.0-1-py3-none-any-1a2b3c4d.whl",  # a build tag
        "../x-0.1.0-py3-none-any-1a2b3c4d.whl",
        "demo_ext-0.1.0-py3-none-any-1a2b3c4d.zip",
    ],
)
def test_other_names_are_not_variant_wheels(bad: str) -> None:
    with pytest.raises(ValueError):
        wv.parse_variant_filename(bad)


# --- the rewrite of a factory wheel ------------------------------------------------------------------------


def test_a_factory_wheel_becomes_a_variant_wheel_that_installers_accept(tmp_path: Path) -> None:
    source = factory_wheel(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    props = wv.nvidia_properties(key(LABEL))
    made = wv.make_variant_wheel(source, source.name, key(LABEL), out)
    assert made.name == f"demo_ext-0.1.0-cp311-cp311-manylinux_2_34_x86_64-{props.label}.whl"
    assert wheel_archive_problems(made) == []  # RECORD matches, one .dist-info, nothing outside
    with zipfile.ZipFile(made) as zf:
        names = zf.namelist()
        assert "demo_ext-0.1.0.dist-info/variant.json" in names
        assert not [n for n in names if "+" in n]
        metadata = zf.read("demo_ext-0.1.0.dist-info/METADATA").decode()
        document = zf.read("demo_ext-0.1.0.dist-info/variant.json")
        dates = {i.date_time for i in zf.infolist()}
    assert "Version: 0.1.0\n" in metadata and "Requires-Dist: torch==2.14.*" in metadata
    assert VariantDistInfo(document, props.label).variant_desc.properties == vdesc(props).properties
    assert dates == {(2025, 3, 4, 5, 6, 8)}  # the source's date: as reproducible as the wheel it came from
    again = tmp_path / "again"
    again.mkdir()
    assert wv.make_variant_wheel(source, source.name, key(LABEL), again).read_bytes() == made.read_bytes()


def test_a_variant_that_claims_no_gpu_is_not_made(tmp_path: Path) -> None:
    source = factory_wheel(tmp_path, "cu13.0.torch2.14.abi1.sm90a")
    with pytest.raises(ValueError, match="one exact GPU"):
        wv.make_variant_wheel(source, source.name, key("cu13.0.torch2.14.abi1.sm90a"), tmp_path)


# --- the index ---------------------------------------------------------------------------------------------


def vfile(label: str, *, version: str = "0.1.0", sha: str = "a", meta: str = "d") -> wv.VariantFile:
    props = wv.nvidia_properties(key(label))
    return wv.VariantFile(
        filename=f"demo_ext-{version}-py3-none-any-{props.label}.whl",
        sha256=sha * 64,
        size=10,
        properties=props,
        metadata_sha256=(meta * 64)[:64],
        requires_python=">=3.8",
    )


def test_pages_grow_and_refuse_what_would_change_a_release() -> None:
    a, b = vfile("cu13.0.torch2.14.abi1.sm80.90"), vfile("cu12.8.torch2.14.abi1.sm80", sha="b")
    assert wv.merge_files([], [a]) == (a,)
    assert wv.merge_files([a], [a]) is None  # nothing new: no page rewritten
    assert wv.merge_files([a], [b]) == tuple(sorted([a, b]))
    with pytest.raises(RecordConflict, match="already listed with sha256"):
        wv.merge_files([a], [vfile("cu13.0.torch2.14.abi1.sm80.90", sha="c")])
    with pytest.raises(RecordConflict, match="must carry the same core metadata"):
        wv.merge_files([a], [vfile("cu12.8.torch2.14.abi1.sm80", meta="e")])
    # another release may carry other metadata
    assert wv.merge_files([a], [vfile("cu12.8.torch2.14.abi1.sm80", version="0.2.0", meta="e")])


def test_the_site_is_a_pure_function_of_its_state() -> None:
    files = [vfile("cu13.0.torch2.14.abi1.sm80.90"), vfile("cu12.8.torch2.14.abi1.sm80", sha="b")]
    state = {("torch2.14-abi1", "demo-ext"): files}
    site = wv.variant_site(state)
    assert site == wv.variant_site({("torch2.14-abi1", "demo-ext"): list(reversed(files))})
    assert sorted(site) == [
        "variants/groups.json",
        "variants/index.html",
        "variants/torch2.14-abi1/files/demo_ext-0.1.0-variants.json",
        "variants/torch2.14-abi1/simple/demo-ext/index.html",
        "variants/torch2.14-abi1/simple/demo-ext/state.json",
        "variants/torch2.14-abi1/simple/index.html",
        "variants/torch2.14-abi1/simple/projects.json",
    ]
    assert wv.files_from_state(site["variants/torch2.14-abi1/simple/demo-ext/state.json"]) == tuple(
        sorted(files)
    )
    document = site["variants/torch2.14-abi1/files/demo_ext-0.1.0-variants.json"]
    assert set(VariantsJson(json.loads(document)).variants) == {f.properties.label for f in files}
    page = site["variants/torch2.14-abi1/simple/demo-ext/index.html"].decode()
    import hashlib

    assert f"demo_ext-0.1.0-variants.json#sha256={hashlib.sha256(document).hexdigest()}" in page
    for f in files:
        assert f'href="../../files/{f.filename}#sha256={f.sha256}"' in page
    assert wv.groups_from_json(site["variants/groups.json"]) == ("torch2.14-abi1",)


STATE_FILE = {
    "filename": "x-1-py3-none-any.whl",
    "sha256": "0" * 64,
    "metadata_sha256": "0" * 64,
    "size": 1,
    "variant": {},
}


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"\xff", "not UTF-8|not a variant"),
        (b"[]", "not a variant project page's state"),
        (b'{"format": "factory-variants/1", "files": [1]}', "^file 1 must be a mapping$"),
        (b'{"format": "factory-variants/1", "files": [{"sha256": "x"}]}', "^file 1.filename is missing$"),
        (
            json.dumps({"format": "factory-variants/1", "files": [{**STATE_FILE, "size": -1}]}).encode(),
            "^file 1.size -1 is not a byte count$",
        ),
        (
            json.dumps(
                {"format": "factory-variants/1", "files": [{**STATE_FILE, "requires_python": 3}]}
            ).encode(),
            "^file 1.requires_python must be str, not int$",
        ),
        (b'{"format": "factory-variants/1", "files": [], "files": []}', "twice|not a variant"),
        (b" " * (wv.MAX_STATE_BYTES + 1), "over 4 MiB"),
    ],
)
def test_a_damaged_state_is_named_not_trusted(data: bytes, why: str) -> None:
    with pytest.raises(DamagedState, match=why):
        wv.files_from_state(data)


def test_a_state_whose_label_is_not_its_properties_hash_is_refused() -> None:
    good = json.loads(wv.state_json("demo-ext", [vfile(LABEL)]))
    good["files"][0]["variant"]["nvidia"]["sm_arch"] = ["120_real"]  # the file claims another GPU now
    with pytest.raises(DamagedState, match="label is not the hash"):
        wv.files_from_state(json.dumps(good).encode())


# --- consumers and options -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("torch", "abi", "group"),
    [
        ("2.14.1+cu130", True, "torch2.14.1-abi1"),  # a group pinned to the patch wins
        ("2.14.0", True, "torch2.14-abi1"),
        ("2.13.0", True, "stable2.12-abi1"),  # no torch group of its own: the newest covering floor
        ("2.16.0", True, "stable2.15-abi1"),
        ("2.11.0", True, None),  # older than every floor
        ("2.14.0", False, None),  # another C++ ABI
        ("not a version", True, None),
    ],
)
def test_a_host_torch_chooses_its_variant_index(torch: str, abi: bool, group: str | None) -> None:
    groups = ["torch2.14-abi1", "torch2.14.1-abi1", "stable2.12-abi1", "stable2.15-abi1", "torch2.14-abi1"]
    assert wv.choose_group(groups, torch, abi) == group


def test_publish_variants_in_a_matrix_is_a_boolean(tmp_path: Path) -> None:
    from factory.spec.config import load_matrix_file

    base = (
        'package: {name: demo-ext, version: "0.1.0", source: {path: .}}\n'
        "recipe: {name: demo, arch_env: A}\n"
        'matrix: {cuda: ["13.0"], torch: ["2.14"], python: ["3.11"], cxx11_abi: [true], arch: ["8.0"]}\n'
    )
    path = tmp_path / "m.yaml"
    path.write_text(base + "publish: {to: ./idx, variants: true}\n")
    assert load_matrix_file(path).publish.variants is True
    path.write_text(base + "publish: {to: ./idx}\n")
    assert load_matrix_file(path).publish.variants is False
    path.write_text(base + "publish: {to: ./idx, variants: maybe}\n")
    with pytest.raises(ConfigError, match=r"publish\.variants"):
        load_matrix_file(path)


# --- publishing the channel (a local store) ---------------------------------------------------------------


def publish(wheels: list[Path], to: Path) -> PublishResult:
    return publish_wheels(wheels, to=str(to), variants=True)


def test_publishing_twice_writes_nothing_new_and_the_channel_leaves_the_indexes_alone(tmp_path: Path) -> None:
    wheels = [factory_wheel(tmp_path / "w"), factory_wheel(tmp_path / "w", "cu12.8.torch2.14.abi1.sm80")]
    first = publish(wheels, tmp_path / "idx")
    assert [f.status for f in first.variant_files] == ["published", "published"]
    again = publish(wheels, tmp_path / "idx")
    assert [f.status for f in again.variant_files] == ["unchanged", "unchanged"]
    assert not [k for k in again.pages_written if k.startswith("variants/")]
    plain = publish_wheels(wheels, to=str(tmp_path / "plain"))
    assert plain.variant_files == ()
    outside = sorted(
        p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*") if p.is_file()
    )
    assert outside == sorted(
        p.relative_to(tmp_path / "idx")
        for p in (tmp_path / "idx").rglob("*")
        if p.is_file() and p.relative_to(tmp_path / "idx").parts[0] != "variants"
    )
    lines = list(describe(first))
    assert any(line.startswith("published variants/torch2.14-abi1/demo_ext-0.1.0-cp311-") for line in lines)


def test_a_variant_whose_metadata_differs_from_its_release_is_refused(tmp_path: Path) -> None:
    publish([factory_wheel(tmp_path / "a")], tmp_path / "idx")
    other = factory_wheel(tmp_path / "b", "cu12.8.torch2.14.abi1.sm80", summary="something else")
    with pytest.raises(PublishError, match="must carry the same core metadata"):
        publish([other], tmp_path / "idx")
    assert len(list((tmp_path / "idx" / "variants" / "torch2.14-abi1" / "files").glob("*.whl"))) == 1


def test_the_same_variant_from_another_wheel_keeps_the_first_and_says_so(tmp_path: Path) -> None:
    publish([factory_wheel(tmp_path / "a", "cu13.0.torch2.14.abi1.sm80")], tmp_path / "idx")
    result = publish([factory_wheel(tmp_path / "b", "cu13.0.torch2.14.abi1.sm80.90a")], tmp_path / "idx")
    assert result.variant_files == ()
    (note,) = result.variant_notes
    assert note.startswith("demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80.90a-cp311") and "another wheel" in note
    both = [
        factory_wheel(tmp_path / "c", lb)
        for lb in ("cu12.8.torch2.14.abi1.sm80", "cu12.8.torch2.14.abi1.sm80.90a")
    ]
    result = publish(both, tmp_path / "idx2")
    assert [f.status for f in result.variant_files] == ["published"]
    assert "the same variant" in result.variant_notes[0]


def test_a_damaged_state_stops_the_channel_with_one_line_naming_it(tmp_path: Path) -> None:
    publish([factory_wheel(tmp_path / "a")], tmp_path / "idx")
    state = tmp_path / "idx" / "variants" / "torch2.14-abi1" / "simple" / "demo-ext" / "state.json"
    state.write_text("garbage")
    with pytest.raises(PublishError) as caught:
        publish([factory_wheel(tmp_path / "b", "cu12.8.torch2.14.abi1.sm80")], tmp_path / "idx")
    message = str(caught.value)
    assert "variants/torch2.14-abi1/simple/demo-ext/state.json" in message and "\n" not in message
    assert "publish the wheels again with --variants" in message
