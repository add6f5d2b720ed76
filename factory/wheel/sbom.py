"""A wheel's SBOM: CycloneDX 1.6 JSON at `<dist-info>/sboms/<name>.cdx.json` (PEP 770), made and read with
cyclonedx-python-lib.

It lists the wheel itself, the source it was built from (the sdist with its sha256, a git commit or a path
source's tree digest) and its patches, the torch it was built against, the CUDA toolkit that compiled it and
the libraries its extension modules link that torch or CUDA provide (their DT_NEEDED entries). Like the
provenance it is a pure function of the job: no timestamp, and a serial number derived from its content.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from factory.core.errors import CheckError
from factory.wheel import provenance

MAX_BYTES = 1 << 20  # an SBOM read from a wheel nobody here made (ours are a few KiB)
# The schema's uniqueItems arrays (components, dependencies, ...) cost the validator the square of their
# length (2,000 components: seconds; a 451 KiB SBOM took 55 s): the arrays are bounded before it runs.
MAX_ITEMS = 512  # in any one array (ours list a few dozen components)
MAX_ITEMS_COST = 1 << 20  # the sum of the squares of every array's length
SPEC = "1.6"
# which libraries a wheel expects from torch and which from the CUDA toolkit (or its pip wheels), by soname
_TORCH_LIBS = re.compile(r"^lib(c10|torch|shm)(_[A-Za-z0-9_]+)?\.so(\.\d+)*$")
_CUDA_LIBS = re.compile(
    r"^lib(cuda|cudart|cublas|cublasLt|cusparse|cufft|curand|cusolver|nvrtc|nvToolsExt|nvJitLink|nccl|cudnn"
    r"|nvjpeg|npp[A-Za-z]*|cupti)(_[A-Za-z0-9_]+)?\.so(\.\d+)*$"
)


def provider(soname: str) -> str | None:
    """ "torch" or "cuda" for a library one of them provides; None for the system's (libc, libstdc++)."""
    if _TORCH_LIBS.match(soname):
        return "torch"
    if _CUDA_LIBS.match(soname):
        return "cuda"
    return None


def expected_libraries(needed: Mapping[str, Iterable[str]]) -> dict[str, str]:
    """soname -> provider of every library a module of the wheel links that torch or CUDA provide."""
    out: dict[str, str] = {}
    for libs in needed.values():
        for lib in libs:
            who = provider(lib)
            if who is not None:
                out[lib] = who
    return dict(sorted(out.items()))


def compose(facts: provenance.BuildFacts, needed: Mapping[str, Iterable[str]]) -> bytes:
    """The SBOM's bytes for the wheel of `facts` whose modules link `needed` (module -> sonames)."""
    from cyclonedx.model import HashAlgorithm, HashType, Property
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component, ComponentType
    from cyclonedx.output.json import JsonV1Dot6
    from packageurl import PackageURL

    def pypi(name: str, version: str, **qualifiers: str) -> PackageURL:
        return PackageURL(type="pypi", name=name.lower(), version=version, qualifiers=qualifiers or None)

    def sha256(value: str) -> list[HashType]:
        return [HashType(alg=HashAlgorithm.SHA_256, content=value)]

    def props(**values: str | None) -> list[Property]:
        return [Property(name=f"wheel-factory:{k}", value=v) for k, v in values.items() if v]

    digest = provenance.dumps(provenance.compose(facts))
    serial = uuid.uuid5(uuid.NAMESPACE_URL, "wheel-factory:sbom:" + digest.hex())
    bom = Bom(serial_number=serial)
    bom.metadata.timestamp = None  # type: ignore[assignment]  # a rebuild must give the same bytes
    bom.metadata.tools.components.add(
        Component(name="wheel-factory", version=facts.factory_version, type=ComponentType.APPLICATION)
    )
    wheel = Component(
        name=facts.package,
        version=facts.version,
        type=ComponentType.LIBRARY,
        purl=pypi(facts.package, facts.version),
        bom_ref="wheel",
        properties=props(job=facts.job_id, archs=";".join(facts.archs)),
    )
    bom.metadata.component = wheel
    src = facts.source
    base_version = facts.version.split("+", 1)[0]
    if src.kind == "pypi":
        quals = {"file_name": src.sdist} if src.sdist else {}
        source = Component(
            name=facts.package,
            version=base_version,
            type=ComponentType.LIBRARY,
            bom_ref="source",
            purl=pypi(facts.package, base_version, **quals),
            hashes=sha256(src.sha256) if src.sha256 else [],
            description="the sdist the wheel was built from",
        )
    elif src.kind == "git":
        source = Component(
            name=facts.package,
            version=src.commit or src.git_ref or base_version,
            type=ComponentType.LIBRARY,
            bom_ref="source",
            properties=props(git_url=src.git_url, git_ref=src.git_ref, commit=src.commit),
            description="the git checkout the wheel was built from",
        )
    else:
        source = Component(
            name=facts.package,
            version=base_version,
            type=ComponentType.LIBRARY,
            bom_ref="source",
            properties=props(path=src.path, tree_sha256=src.tree_sha256),
            description="the source directory the wheel was built from",
        )
    patches = [
        Component(
            name=name,
            type=ComponentType.FILE,
            bom_ref=f"patch:{i}:{name}",
            hashes=sha256(digest_),
            description="a patch applied to the source before the build",
        )
        for i, (name, digest_) in enumerate(src.patches)
    ]
    torch = Component(
        name="torch",
        version=facts.torch_version,
        type=ComponentType.FRAMEWORK,
        bom_ref="torch",
        purl=pypi("torch", facts.torch_version),
        description="the torch the wheel was built against",
    )
    toolkit = Component(
        name="cuda-toolkit",
        version=facts.nvcc or facts.toolkit or facts.cuda,
        type=ComponentType.FRAMEWORK,
        bom_ref="cuda-toolkit",
        description="the CUDA toolkit whose nvcc compiled the wheel's device code",
        properties=props(cuda=facts.cuda),
    )
    libs = {
        who: [
            Component(
                name=lib,
                type=ComponentType.LIBRARY,
                bom_ref=f"lib:{lib}",
                properties=props(provided_by=who),
                description=f"a shared library the wheel's modules link, which {who} provides",
            )
            for lib, by in expected_libraries(needed).items()
            if by == who
        ]
        for who in ("torch", "cuda")
    }
    for component in (source, *patches, torch, toolkit, *libs["torch"], *libs["cuda"]):
        bom.components.add(component)
    bom.register_dependency(source, patches)
    bom.register_dependency(torch, libs["torch"])
    bom.register_dependency(toolkit, libs["cuda"])
    bom.register_dependency(wheel, [source, torch, toolkit, *libs["torch"], *libs["cuda"]])
    text = JsonV1Dot6(bom).output_as_string(indent=2)
    # the library's key order is its own; sorted, the bytes depend on the content alone
    return (json.dumps(json.loads(text), sort_keys=True, indent=2) + "\n").encode("utf-8")


@dataclass(frozen=True, kw_only=True)
class Summary:
    """What `factory inspect` shows of an SBOM."""

    spec: str
    serial: str
    subject: str
    components: tuple[tuple[str, str, str], ...]  # (type, name, version) each


def _arrays_problem(document: object) -> str | None:
    """Why the document's arrays are too long to validate (MAX_ITEMS, MAX_ITEMS_COST), or None."""
    cost = 0
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            if len(node) > MAX_ITEMS:
                return f"an array of {len(node)} items, over {MAX_ITEMS}"
            cost += len(node) ** 2
            if cost > MAX_ITEMS_COST:
                return f"arrays too long together (the sum of their squared lengths is over {MAX_ITEMS_COST})"
            stack.extend(node)
    return None


def parse(data: bytes, *, where: str = "sbom") -> Summary:
    """Read an SBOM as CycloneDX does: its JSON schema (the library's strict validator), then the library's
    own deserialiser; any failure a CheckError of one line naming `where`."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    if len(data) > MAX_BYTES:
        raise CheckError(f"{where}: {len(data)} bytes, over the {MAX_BYTES >> 20} MiB an SBOM may have")
    try:
        text = data.decode("utf-8")
        document: Any = json.loads(text)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else repr(exc)
        raise CheckError(f"{where}: not valid JSON ({reason})") from None
    if not isinstance(document, dict) or document.get("bomFormat") != "CycloneDX":
        raise CheckError(f"{where}: not a CycloneDX document")
    if document.get("specVersion") != SPEC:
        raise CheckError(f"{where}: CycloneDX {document.get('specVersion')!r}, not {SPEC}")
    if problem := _arrays_problem(document):
        raise CheckError(f"{where}: {problem}; not an SBOM this factory reads")
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(text)
    if error is not None:
        raise CheckError(f"{where}: not valid CycloneDX {SPEC}: {str(error).splitlines()[0][:200]}")
    try:
        bom = Bom.from_json(document)  # type: ignore[attr-defined]
    except Exception as exc:  # the library's deserialiser raises what it raises
        raise CheckError(f"{where}: CycloneDX cannot read it ({type(exc).__name__}: {exc})"[:300]) from None
    subject = bom.metadata.component
    return Summary(
        spec=SPEC,
        serial=str(bom.serial_number),
        subject=f"{subject.name} {subject.version}" if subject is not None else "",
        components=tuple(
            sorted((str(c.type.value), str(c.name), str(c.version or "")) for c in bom.components)
        ),
    )
