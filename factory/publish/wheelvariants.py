"""Wheel variants (PEP 825), an experimental channel beside the per-variant indexes: the one owner of the
variant wheel format and of the variant index's layout, both directions.

A factory wheel becomes a variant wheel by a rewrite (`make_variant_wheel`, through
`wheelcheck.set_version`): its version loses the local label (`2.8.3+cu13.0.torch2.14.abi1.sm80.90` ->
`2.8.3`), since every variant of a release must carry the same core metadata; its .dist-info gains
`variant.json`, which says, in the NVIDIA provider's namespace, the CUDA the driver must run
(`nvidia :: cuda_version_lower_bound :: 13.0`) and the GPUs it runs on (`nvidia :: sm_arch :: 80_real`, one
value per arch, any of which will do); its file name gains the variant label, the PEP's variant hash of those
properties (`demo_ext-0.1.0-cp311-cp311-manylinux_2_34_<machine>-1a2b3c4d.whl`).

What the NVIDIA provider cannot say stays out: the torch a wheel was built against and the C++ ABI. uv has no
variant markers, so a release's variants share one `torch==X.Y.*` (or a stable-ABI wheel's `torch>=F`) only
when the index is split by them: one variant index per group (`group_of`: `torch2.14-abi1`,
`stable2.12-abi1`), inside which the installer picks CUDA and GPU. An arch-specific target (`9.0a`) runs on
one exact GPU, for which `sm_arch` has no value (its `90_real` also means 9.x); it is left out of a wheel's
claims, and a wheel that would claim no GPU at all is not put on the variant index.

Layout, under `variants/` so nothing of the per-variant indexes changes; a pure function of each project
page's state (`variant_site`), as `factory.publish.site` is of the index's:

```
variants/index.html                                  the groups, with the uv command of each
variants/groups.json                                 its state
variants/<group>/simple/index.html                   PEP 503 root of one variant index
variants/<group>/simple/projects.json                its state (factory.publish.index's variant root JSON)
variants/<group>/simple/<project>/index.html         the variant wheels and each release's variants.json
variants/<group>/simple/<project>/state.json         the page's state: each wheel, its label and properties
variants/<group>/files/<variant wheel>               immutable, with <wheel>.metadata (PEP 658)
variants/<group>/files/<name>-<version>-variants.json  every variant of the release, made from the state
```
"""

from __future__ import annotations

import calendar
import hashlib
import html
import json
import re
import zipfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from factory.core import reproducible, strictjson
from factory.core.variants import Arch, VariantKey
from factory.publish.index import DamagedState, RecordConflict, variant_root_json
from factory.publish.installcmd import PREVIEW_FEATURE, Install, uv_command
from factory.wheel.checks import set_version

NAMESPACE = "nvidia"
CUDA_FEATURE = "cuda_version_lower_bound"
SM_FEATURE = "sm_arch"
# The NVIDIA provider plugin as PyTorch's variant wheels name it; uv >= 0.13.6 runs its own copy of it (it
# reads the driver itself, or NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION / _FORCE_SM_ARCH).
PLUGIN_API = "nvidia_variant_provider.plugin:NvidiaVariantPlugin"
PROVIDER_REQUIRES = "nvidia-variant-provider>=0.0.1,<1.0.0"
SCHEMA_URL = "https://variants-schema.wheelnext.dev/v0.2.0.json"  # variantlib 0.2.2's
UV_TESTED = "0.13.10"
PREFIX = "variants/"
GROUPS_STATE = f"{PREFIX}groups.json"
STATE_FORMAT = "factory-variants/1"

_LABEL = re.compile(r"[0-9a-f]{8}")  # the variant hash: sha256 of the sorted properties, 8 hex digits
_VALUE = re.compile(r"[0-9a-z_.]+")
_SM_VALUE = re.compile(r"[1-9]\d?\d_real")
_GROUP = re.compile(r"(?P<kind>torch|stable)(?P<torch>\d+(?:\.\d+){1,2})-abi(?P<abi>[01])")
_SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_STATE_BYTES = 4 << 20


@dataclass(frozen=True, order=True)
class NvidiaProperties:
    """What a variant wheel claims in the `nvidia` namespace: the oldest CUDA the driver must run, and the
    GPUs (`80_real`: compute capability 8.0 and the later minors of major 8) any one of which it runs on."""

    cuda: str
    sm: tuple[str, ...]

    def __post_init__(self) -> None:
        if not _VALUE.fullmatch(self.cuda) or not self.sm or sorted(set(self.sm)) != list(self.sm):
            raise ValueError(f"not nvidia variant properties: cuda {self.cuda!r}, sm_arch {self.sm!r}")
        if not all(_SM_VALUE.fullmatch(v) for v in self.sm):
            raise ValueError(f"sm_arch {self.sm!r}: each value is like 80_real")

    def properties(self) -> list[str]:
        """`namespace :: feature :: value` of each property, sorted as the variant hash takes them."""
        props = [(NAMESPACE, CUDA_FEATURE, self.cuda), *((NAMESPACE, SM_FEATURE, v) for v in self.sm)]
        return [" :: ".join(p) for p in sorted(props)]

    @property
    def label(self) -> str:
        """PEP 825's default variant label: the first 8 hex digits of sha256 over "property\\n" each."""
        text = "".join(f"{p}\n" for p in self.properties())
        return hashlib.sha256(text.encode()).hexdigest()[:8]

    def as_json(self) -> dict[str, dict[str, list[str]]]:
        return {NAMESPACE: {CUDA_FEATURE: [self.cuda], SM_FEATURE: list(self.sm)}}


def sm_value(arch: Arch) -> str | None:
    """The `sm_arch` value of a cubin target: 8.0 and 10.0f -> "80_real", "100_real" (the provider gives a
    GPU of 8.6 every value from 86_real down to 80_real, as such code runs there); None for an
    arch-specific target (9.0a runs on 9.0 alone, which no value says)."""
    return None if arch.suffix == "a" else f"{arch.major}{arch.minor}_real"


def nvidia_properties(key: VariantKey) -> NvidiaProperties:
    """A factory variant's claims; ValueError (the reason) when it would claim no GPU."""
    values = {v for a in key.archs if (v := sm_value(Arch.parse(a))) is not None}
    if not values:
        raise ValueError(
            f"archs {', '.join(key.archs)} each run on one exact GPU, which the nvidia provider's sm_arch "
            "cannot say"
        )
    return NvidiaProperties(cuda=key.cuda, sm=tuple(sorted(values)))


def group_of(key: VariantKey) -> str:
    """The variant index a factory variant goes to: its torch (or stable-ABI floor) and C++ ABI, which every
    variant of a release on one index shares (`torch2.14-abi1`, `stable2.12-abi1`)."""
    return f"{'stable' if key.stable else 'torch'}{key.torch}-abi{int(key.cxx11_abi)}"


def is_group(text: str) -> bool:
    return _GROUP.fullmatch(text) is not None


# ---------------------------------------------------------------------------------------------- the format


def variants_document(variants: Mapping[str, NvidiaProperties]) -> bytes:
    """`*.dist-info/variant.json` (one variant) and `{name}-{version}-variants.json` (every variant of a
    release): variantlib's serialisation (sorted keys, four-space indent), so its reader takes them as is."""
    for label, props in variants.items():
        if label != props.label:
            raise ValueError(f"variant label {label!r} is not the hash {props.label!r} of its properties")
    doc = {
        "$schema": SCHEMA_URL,
        "default-priorities": {"namespace": [NAMESPACE]},
        "providers": {NAMESPACE: {"plugin-api": PLUGIN_API, "requires": [PROVIDER_REQUIRES]}},
        "variants": {label: props.as_json() for label, props in sorted(variants.items())},
    }
    return json.dumps(doc, indent=4, sort_keys=True).encode()


def variant_filename(filename: str, label: str) -> str:
    """A factory wheel's canonical file name as a variant wheel's: the public version, the label last
    (`demo_ext-0.1.0+cu13.0…-py3-none-any.whl` -> `demo_ext-0.1.0-py3-none-any-1a2b3c4d.whl`)."""
    name, version, build, _tags = parse_wheel_filename(filename)
    if build:
        raise ValueError(f"{filename}: a build tag has no place in a variant wheel's name")
    tags = filename.removesuffix(".whl").split("-")[-3:]
    return f"{name.replace('-', '_')}-{version.public}-{'-'.join(tags)}-{label}.whl"


def parse_variant_filename(filename: str) -> tuple[str, Version, str]:
    """(project, version, label) of a variant wheel's file name; ValueError for any other name."""
    stem, dot, ext = filename.rpartition(".")
    parts = stem.split("-")
    if ext != "whl" or not dot or len(parts) != 6 or not _LABEL.fullmatch(parts[5]):
        raise ValueError(f"{filename[:120]!r} is not a variant wheel's file name")
    try:
        name, version, _build, _tags = parse_wheel_filename("-".join(parts[:5]) + ".whl")
    except InvalidWheelFilename:
        raise ValueError(f"{filename[:120]!r} is not a variant wheel's file name") from None
    if version.local is not None or variant_filename("-".join(parts[:5]) + ".whl", parts[5]) != filename:
        raise ValueError(f"{filename[:120]!r} is not a variant wheel's canonical file name")
    return str(name), version, parts[5]


def variants_json_name(project: str, version: Version) -> str:
    return f"{canonicalize_name(project).replace('-', '_')}-{version}-variants.json"


def _epoch_of(wheel: Path) -> int:
    """The newest member date of the wheel (its SOURCE_DATE_EPOCH), so its variant is as reproducible."""
    with zipfile.ZipFile(wheel) as archive:
        dates = [i.date_time for i in archive.infolist()]
    if not dates:
        return reproducible.DEFAULT_EPOCH
    return reproducible.clamp(calendar.timegm((*max(dates), 0, 0, 0)))


def make_variant_wheel(wheel: Path, filename: str, key: VariantKey, out_dir: Path) -> Path:
    """Write the variant wheel of factory wheel `wheel` (canonical name `filename`, variant `key`) into
    `out_dir`: the public version, `variant.json` in its .dist-info, RECORD anew, the same member dates;
    ValueError when the variant claims no GPU (`nvidia_properties`)."""
    props = nvidia_properties(key)
    _name, version, _build, _tags = parse_wheel_filename(filename)
    target = out_dir / variant_filename(filename, props.label)
    document = variants_document({props.label: props})
    set_version(
        wheel, target, Version(version.public), extra={"variant.json": document}, epoch=_epoch_of(wheel)
    )
    return target


# ---------------------------------------------------------------------------------------------- the index


@dataclass(frozen=True, kw_only=True, order=True)
class VariantFile:
    """One variant wheel as its project page's state describes it."""

    filename: str
    sha256: str
    size: int
    properties: NvidiaProperties
    metadata_sha256: str
    requires_python: str | None = None

    def __post_init__(self) -> None:
        _project, _version, label = parse_variant_filename(self.filename)
        if not _SHA256.fullmatch(self.sha256) or not _SHA256.fullmatch(self.metadata_sha256):
            raise ValueError(f"{self.filename}: a hash is not a sha256")
        if label != self.properties.label:
            raise ValueError(f"{self.filename}: its label is not the hash of its properties")

    @property
    def release(self) -> tuple[str, Version]:
        project, version, _label = parse_variant_filename(self.filename)
        return project, version


def project_dir(group: str, project: str) -> str:
    return f"{PREFIX}{group}/simple/{canonicalize_name(project)}/"


def state_key(group: str, project: str) -> str:
    return f"{project_dir(group, project)}state.json"


def files_key(group: str, filename: str) -> str:
    return f"{PREFIX}{group}/files/{filename}"


def root_dir(group: str) -> str:
    return f"{PREFIX}{group}/simple/"


def projects_key(group: str) -> str:
    return f"{root_dir(group)}projects.json"


def merge_files(
    existing: Iterable[VariantFile], new: Iterable[VariantFile]
) -> tuple[VariantFile, ...] | None:
    """Grow-only union of a project page's wheels, None when nothing is new. RecordConflict for a listed
    file name with other bytes, and for a wheel whose core metadata differs from its release's other
    variants (PEP 825: an installer reads one variant's metadata for all)."""
    by_name = {f.filename: f for f in existing}
    metadata = {f.release: f.metadata_sha256 for f in by_name.values()}
    changed = False
    for f in new:
        old = by_name.get(f.filename)
        if old is not None:
            if old.sha256 != f.sha256:
                raise RecordConflict(
                    f"{f.filename} is already listed with sha256 {old.sha256}, not {f.sha256}"
                )
            continue
        if metadata.setdefault(f.release, f.metadata_sha256) != f.metadata_sha256:
            project, version = f.release
            raise RecordConflict(
                f"{f.filename}: its METADATA differs from that of the other variants of {project} {version}, "
                "and every variant of a release must carry the same core metadata"
            )
        by_name[f.filename] = f
        changed = True
    return tuple(sorted(by_name.values())) if changed else None


def state_json(project: str, files: Iterable[VariantFile]) -> str:
    doc = {
        "format": STATE_FORMAT,
        "project": str(canonicalize_name(project)),
        "files": [
            {
                "filename": f.filename,
                "sha256": f.sha256,
                "size": f.size,
                "variant": f.properties.as_json(),
                "metadata_sha256": f.metadata_sha256,
                "requires_python": f.requires_python,
            }
            for f in sorted(files)
        ],
    }
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


_BYTE_COUNT = "byte count"
_VARIANT = "variant"  # its properties: `_properties`
# one file of a state object, as `state_json` writes it (`strictjson.shape_problem`)
_FILE_SHAPE: dict[str, object] = {
    "filename": str,
    "sha256": str,
    "metadata_sha256": str,
    "size": _BYTE_COUNT,
    "requires_python?": (str, None),
    "variant": _VARIANT,
}


def _file_leaf(value: object, shape: object, where: str) -> str | None:
    if shape == _BYTE_COUNT:
        ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
        return None if ok else f"{where} {json.dumps(value)[:40]} is not a byte count"
    return None  # _VARIANT: `_properties`


def _properties(value: object, where: str) -> NvidiaProperties:
    features = value.get(NAMESPACE) if isinstance(value, dict) and set(value) == {NAMESPACE} else None
    if not isinstance(features, dict) or set(features) != {CUDA_FEATURE, SM_FEATURE}:
        raise DamagedState(f"{where}: the variant is not nvidia's {CUDA_FEATURE} and {SM_FEATURE}")
    cuda, sm = features[CUDA_FEATURE], features[SM_FEATURE]
    if not (isinstance(cuda, list) and len(cuda) == 1 and isinstance(sm, list)):
        raise DamagedState(f"{where}: the variant has not one CUDA and a list of archs")
    if not all(isinstance(v, str) for v in [*cuda, *sm]):
        raise DamagedState(f"{where}: the variant's values are not strings")
    try:
        return NvidiaProperties(cuda=cuda[0], sm=tuple(sm))
    except ValueError as exc:
        raise DamagedState(f"{where}: {exc}") from None


def files_from_state(data: bytes) -> tuple[VariantFile, ...]:
    """The wheels of a state object `state_json` wrote; DamagedState (one line) for anything else."""
    if len(data) > MAX_STATE_BYTES:
        raise DamagedState(f"over {MAX_STATE_BYTES >> 20} MiB, not a variant project page's state")
    try:
        doc = strictjson.loads(data)
    except strictjson.StrictJSONError as exc:
        raise DamagedState(f"{exc}, not a variant project page's state") from None
    if (
        not isinstance(doc, dict)
        or doc.get("format") != STATE_FORMAT
        or not isinstance(doc.get("files"), list)
    ):
        raise DamagedState(f"not a variant project page's state (format {STATE_FORMAT})")
    out = []
    for n, entry in enumerate(doc["files"], 1):
        where = f"file {n}"
        problem = strictjson.shape_problem(entry, _FILE_SHAPE, where, leaf=_file_leaf)
        if problem:
            raise DamagedState(problem)
        try:
            out.append(
                VariantFile(
                    filename=entry["filename"],
                    sha256=entry["sha256"],
                    size=entry["size"],
                    properties=_properties(entry["variant"], where),
                    metadata_sha256=entry["metadata_sha256"],
                    requires_python=entry.get("requires_python"),
                )
            )
        except ValueError as exc:
            raise DamagedState(f"{where}: {exc}") from None
    return tuple(sorted(out))


def release_documents(files: Iterable[VariantFile]) -> dict[str, bytes]:
    """`{name}-{version}-variants.json` of each release among `files`: file name -> bytes."""
    releases: dict[tuple[str, Version], dict[str, NvidiaProperties]] = {}
    for f in files:
        releases.setdefault(f.release, {})[f.properties.label] = f.properties
    return {variants_json_name(p, v): variants_document(labels) for (p, v), labels in releases.items()}


def _page(title: str, lines: Sequence[str]) -> str:
    body = "\n".join(f"    {line}" for line in lines)
    return (
        '<!DOCTYPE html>\n<html>\n  <head>\n    <meta name="pypi:repository-version" content="1.0">\n'
        f"    <title>{html.escape(title)}</title>\n  </head>\n  <body>\n    <h1>{html.escape(title)}</h1>\n"
        f"{body}\n  </body>\n</html>\n"
    )


def _href(name: str) -> str:
    return f"../../files/{quote(name, safe='')}"


def project_html(project: str, files: Iterable[VariantFile]) -> str:
    """PEP 503 page of one project of a variant index: each variant wheel (with its PEP 658 metadata) and
    each release's variants.json, which PEP 825 asks every page listing the wheels to link."""
    files = sorted(files)
    links = []
    for name, body in sorted(release_documents(files).items()):
        digest = hashlib.sha256(body).hexdigest()
        links.append(f'<a href="{html.escape(_href(name))}#sha256={digest}">{html.escape(name)}</a><br>')
    for f in files:
        attrs = [f'href="{html.escape(_href(f.filename))}#sha256={f.sha256}"']
        if f.requires_python:
            attrs.append(f'data-requires-python="{html.escape(f.requires_python)}"')
        attrs.append(f'data-core-metadata="sha256={f.metadata_sha256}"')
        links.append(f"<a {' '.join(attrs)}>{html.escape(f.filename)}</a><br>")
    return _page(f"Links for {canonicalize_name(project)}", links)


def root_html(projects: Iterable[str]) -> str:
    names = sorted({canonicalize_name(p) for p in projects})
    return _page("Simple index", [f'<a href="{quote(n)}/">{html.escape(n)}</a><br>' for n in names])


def groups_json(groups: Iterable[str]) -> str:
    return json.dumps({"format": STATE_FORMAT, "groups": sorted(set(groups))}, indent=2) + "\n"


def groups_from_json(data: bytes) -> tuple[str, ...]:
    try:
        doc = strictjson.loads(data[: MAX_STATE_BYTES + 1])
    except strictjson.StrictJSONError as exc:
        raise DamagedState(f"{exc}, not the list of variant indexes") from None
    groups = doc.get("groups") if isinstance(doc, dict) and doc.get("format") == STATE_FORMAT else None
    if not isinstance(groups, list) or not all(isinstance(g, str) and is_group(g) for g in groups):
        raise DamagedState(f"not the list of variant indexes (format {STATE_FORMAT})")
    return tuple(sorted(set(groups)))


def groups_html(groups: Iterable[str]) -> str:
    """The human page of the variant channel: each variant index and the command that installs from it."""
    lines = [
        "<p>Experimental: wheel variants (PEP 825), for uv with "
        f"<code>--preview-features {PREVIEW_FEATURE}</code> (tested with uv {UV_TESTED}). The installer "
        "picks the wheel whose CUDA the driver runs and whose archs cover the GPU.</p>",
    ]
    for g in sorted(set(groups)):
        install = Install(
            project="PROJECT", torch=None, variant_index=f"INDEX_URL/{root_dir(g)}", wheel_variants=True
        )
        command = uv_command(install)
        lines.append(f'<h2><a href="{quote(g)}/simple/">{html.escape(g)}</a></h2>')
        lines.append(f"<pre>{html.escape(command)}</pre>")
    return _page("Wheel variant indexes", lines)


def variant_site(state: Mapping[tuple[str, str], Iterable[VariantFile]]) -> dict[str, bytes]:
    """Every object of the variant channel from the state of its project pages ((group, project) -> its
    wheels): the pure function publishing converges the store to."""
    out: dict[str, bytes] = {}
    projects: dict[str, set[str]] = {}
    for (group, project), files in sorted(state.items()):
        files = tuple(sorted(files))
        projects.setdefault(group, set()).add(project)
        for name, body in release_documents(files).items():
            out[files_key(group, name)] = body
        out[state_key(group, project)] = state_json(project, files).encode()
        out[f"{project_dir(group, project)}index.html"] = project_html(project, files).encode()
    for group, names in projects.items():
        out[projects_key(group)] = variant_root_json(names).encode()
        out[f"{root_dir(group)}index.html"] = root_html(names).encode()
    out[GROUPS_STATE] = groups_json(projects).encode()
    out[f"{PREFIX}index.html"] = groups_html(projects).encode()
    return out


# ---------------------------------------------------------------------------------------------- consumers


def torch_group(torch_version: str, cxx11_abi: bool) -> str:
    """The group of a host's torch ("2.14.1+cu130" -> "torch2.14-abi1")."""
    try:
        release = Version(torch_version).release
    except InvalidVersion:
        raise ValueError(f"torch version {torch_version!r} is not a PEP 440 version") from None
    return f"torch{release[0]}.{(*release, 0)[1]}-abi{int(cxx11_abi)}"


def choose_group(groups: Iterable[str], torch_version: str, cxx11_abi: bool) -> str | None:
    """The variant index for a host's torch among `groups` (`groups_from_json` of `variants/groups.json`):
    its own torch's (`torch2.14.1-abi1` for exactly 2.14.1 first, then `torch2.14-abi1`), else the stable-ABI
    one with the newest floor at or below it; None when none serves it."""
    try:
        release = Version(torch_version).release
    except InvalidVersion:
        return None
    abi = int(cxx11_abi)
    wanted = [f"torch{'.'.join(map(str, release[:3]))}-abi{abi}", torch_group(torch_version, cxx11_abi)]
    present = set(groups)
    for group in wanted:
        if group in present:
            return group
    floors = []
    for group in present:
        match = _GROUP.fullmatch(group)
        if match and match["kind"] == "stable" and match["abi"] == str(abi):
            floor = tuple(int(p) for p in match["torch"].split("."))
            if floor <= release[: len(floor)]:
                floors.append((floor, group))
    return max(floors)[1] if floors else None
