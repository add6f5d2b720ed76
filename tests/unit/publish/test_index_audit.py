"""`factory index audit` (factory.publish.indexaudit) on small indexes made by publishing hand-zipped
extension wheels: device code from test_fatbin.py's ELF builder, provenance from test_provenance.py's facts,
the
wheel's torch pin and provenance written by the factory's own rewrite (`wheelcheck.pin_torch_requirement`)."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import random
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.build.rebuild import RebuildResult
from factory.core import bounded
from factory.core.errors import ConfigError
from factory.core.tags import canonical_wheel_filename
from factory.core.variants import VariantKey
from factory.plan.plan import plan_matrix
from factory.publish import index
from factory.publish.indexaudit import (
    CHECKS,
    Audit,
    audit_index,
    content_checks,
    label_of,
    plan_index,
    planned_job,
    provenance_label_problems,
    torch_pin_problem,
)
from factory.publish.publisher import publish_wheels
from factory.publish.stores import LocalStore
from factory.spec.config import load_matrix_file
from factory.trust import signing
from factory.wheel import embedded, sbom
from factory.wheel.checks import pin_torch_requirement
from factory.wheel.wheeldiff import Difference


def _load_sibling(name: str) -> ModuleType:
    """Import a helper test module by path: works whatever pytest's import mode."""
    path = next(Path(__file__).parents[1].rglob(name))  # another package's test module, by its unique name
    module_name = f"_factory_test_helpers_{path.stem}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


_fatbin = _load_sibling("test_fatbin.py")
_prov = _load_sibling("test_provenance.py")
_wc = _load_sibling("test_wheelcheck.py")

LABEL = "cu13.0.torch2.14.abi1.sm80"  # the memext fixture's one job
VID = "cu130-torch2.14-abi1-sm80"
TAG = "cp311-cp311-manylinux_2_17_x86_64"
SO = "factory_memext/_C.cpython-311-x86_64-linux-gnu.so"
FIXTURES = Path(__file__).parents[2] / "fixtures"


def ext_wheel(
    directory: Path,
    *,
    label: str = LABEL,
    cubins: tuple[int, ...] = (80,),
    so: bytes | None = None,
    torch: str = "2.14.1",
    stable_abi: str | None = None,
    **facts: Any,
) -> Path:
    """The memext job's wheel as the factory finishes it: its module's device code, torch pinned, its
    provenance and SBOM inside (facts changed by `facts`)."""
    version = f"0.1.0+{label}"
    dist = f"factory_memext-{version}.dist-info"
    files = {
        "factory_memext/__init__.py": b"",
        SO: _fatbin.fake_so(list(cubins)) if so is None else so,
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: factory-memext\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": f"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: {TAG}\n".encode(),
    }
    directory.mkdir(parents=True, exist_ok=True)
    wheel = _wc.write_wheel(directory / f"factory_memext-{version}-{TAG}.whl", files)
    found = _prov.make_facts(version=version, **facts)
    extra = embedded.files(found, {SO: ("libc10.so", "libcudart.so.13")})
    pin_torch_requirement(wheel, torch, stable_abi=stable_abi, extra=extra)
    return wheel


@dataclasses.dataclass
class Index:
    root: Path
    store: LocalStore
    key: Ed25519PrivateKey

    @property
    def public(self) -> Any:
        return self.key.public_key()

    def publish(self, *wheels: Path, signed: bool = True) -> None:
        signer = signing.make_signer(self.key, source="test") if signed else None
        publish_wheels(list(wheels), to=str(self.root), signer=signer)

    def audit(self, **kw: Any) -> Audit:
        kw.setdefault("key", self.public)
        return audit_index(to=str(self.root), store=self.store, **kw)

    def path(self, key: str) -> Path:
        return self.root / key


@pytest.fixture
def idx(tmp_path: Path) -> Index:
    root = tmp_path / "index"
    root.mkdir()
    return Index(root=root, store=LocalStore(root), key=Ed25519PrivateKey.generate())


def lines(audit: Audit) -> list[str]:
    return [p.line() for p in audit.problems]


def key_of(wheel: Path, variant_id: str = VID) -> str:
    return index.files_path(variant_id, canonical_wheel_filename(wheel.name))


# --- a clean index ------------------------------------------------------------------------------------------


def test_a_published_wheel_passes_every_check(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    audit = idx.audit()
    assert lines(audit) == [] and audit.ok
    (audited,) = audit.wheels
    assert (
        audited.key == key_of(wheel) and audited.sha256 == _wc.hashlib.sha256(wheel.read_bytes()).hexdigest()
    )
    assert set(audited.checks) == set(CHECKS) - {"index", "stable-abi", "matrix", "rebuild"}
    doc = audit.to_json()
    assert doc["ok"] is True and doc["signatures"]["checked"] is True and doc["wheels"] == 1


def test_an_empty_index_is_clean(idx: Index) -> None:
    audit = idx.audit()
    assert audit.ok and audit.wheels == ()


# --- what it finds ------------------------------------------------------------------------------------------


def test_tampered_bytes_are_found_by_hashing_them_and_said_once(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    stored = idx.path(key_of(wheel))
    data = bytearray(stored.read_bytes())
    data[100] ^= 0xFF
    stored.write_bytes(bytes(data))
    found = lines(idx.audit())
    key = key_of(wheel)
    assert [line.split(": ")[1] for line in found] == ["page", "signature"], found
    assert found[0].startswith(f"{key}: page: sha256 ") and "not the file published" in found[0]
    assert "changed after it was signed" in found[1]


def test_a_missing_signature_is_a_problem_with_a_key_and_none_without(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel, signed=False)
    key = key_of(wheel)
    assert lines(idx.audit()) == [f"{key}: signature: no signature ({key}.sig.json is missing)"]
    unsigned = idx.audit(key=None)
    assert unsigned.ok and unsigned.key_id is None and "signature" not in unsigned.wheels[0].checks


def test_a_signature_by_another_key_or_too_large_is_a_problem(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    other = Ed25519PrivateKey.generate().public_key()
    (line,) = lines(idx.audit(key=other))
    assert ": signature: signed by key " in line
    idx.path(key_of(wheel) + ".sig.json").write_bytes(b" " * (signing.MAX_SIGNATURE_BYTES + 10))
    (line,) = lines(idx.audit())
    sig = key_of(wheel) + ".sig.json"
    assert line == (
        f"{key_of(wheel)}: signature: {sig}: {signing.MAX_SIGNATURE_BYTES + 10} bytes, over the "
        f"{bounded.size_text(signing.MAX_SIGNATURE_BYTES)} it may have"
    )


def test_device_code_for_other_archs_than_the_label(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w", cubins=(90,))
    idx.publish(wheel)
    assert lines(idx.audit()) == [
        f"{key_of(wheel)}: device-code: {SO}: cubins for sm_90, expected sm_80 "
        "(missing sm_80; unexpected sm_90)"
    ]


def test_a_wheel_with_no_device_code_at_all_is_a_problem(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w", cubins=())
    idx.publish(wheel)
    assert lines(idx.audit()) == [
        f"{key_of(wheel)}: device-code: wheel: no extension module with device code (all are host-only)"
    ]


def test_a_pin_to_another_torch_than_the_label(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w", torch="2.13.0")
    idx.publish(wheel)
    assert lines(idx.audit()) == [
        f"{key_of(wheel)}: torch-pin: METADATA requires torch 'torch==2.13.*'; its label (torch 2.14) needs "
        "exactly 'torch==2.14.*'"
    ]


def test_a_provenance_of_another_variant_than_the_label(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w", archs=("9.0",), torch_version="2.13.1")
    idx.publish(wheel)
    assert lines(idx.audit()) == [
        f"{key_of(wheel)}: provenance: provenance: job.variant.archs is ['9.0'], the label's is ['8.0']",
        f"{key_of(wheel)}: provenance: provenance: torch.version is '2.13.1', the variant's torch is '2.14'",
    ]


def test_the_published_provenance_and_metadata_files_must_be_the_wheels(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    key = key_of(wheel)
    idx.path(key + ".provenance.json").write_bytes(b'{"format": 1}\n')
    meta = idx.path(key + ".metadata")
    meta.write_bytes(meta.read_bytes().replace(b"Name: factory-memext", b"Name: factory-memext "))
    assert lines(idx.audit()) == [
        f"{key}: metadata: {key}.metadata is not the wheel's METADATA",
        f"{key}: metadata: {key}.metadata does not have the sha256 its page lists",
        f"{key}: provenance: {key}.provenance.json is not the provenance inside the wheel",
    ]
    idx.path(key + ".provenance.json").unlink()
    assert f"{key}: provenance: {key}.provenance.json is missing" in "\n".join(lines(idx.audit()))


def test_the_published_sbom_must_be_the_wheels(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    key = key_of(wheel)
    published = idx.path(key + ".sbom.cdx.json")
    assert published.read_bytes() == embedded.sbom_bytes(wheel)
    assert lines(idx.audit()) == []
    published.write_bytes(published.read_bytes().replace(b"factory", b"fact0ry"))
    assert lines(idx.audit()) == [f"{key}: provenance: {key}.sbom.cdx.json is not the SBOM inside the wheel"]
    published.unlink()
    assert lines(idx.audit()) == [
        f"{key}: provenance: {key}.sbom.cdx.json is missing (publishing writes the wheel's SBOM beside it)"
    ]
    published.write_bytes(b"x" * (sbom.MAX_BYTES + 1))
    (line,) = lines(idx.audit())
    assert line.startswith(f"{key}: provenance: {key}.sbom.cdx.json: ") and "over the 1 MiB" in line


def test_a_file_larger_than_its_page_says_is_read_no_further(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    stored = idx.path(key_of(wheel))
    with stored.open("ab") as fh:
        fh.write(b"\0" * (4 << 20))
    audit = idx.audit()
    (audited,) = audit.wheels
    assert audited.sha256 is None
    assert lines(audit) == [
        f"{key_of(wheel)}: page: holds more than the {wheel.stat().st_size} bytes its page lists"
    ]


def test_a_wheel_on_no_page_is_the_index_checks_problem(idx: Index, tmp_path: Path) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    other = ext_wheel(tmp_path / "o", label="cu13.0.torch2.14.abi1.sm90", cubins=(90,))
    planted = idx.path(key_of(other, "cu130-torch2.14-abi1-sm90"))
    planted.parent.mkdir(parents=True)
    planted.write_bytes(other.read_bytes())
    audit = idx.audit()
    assert [p.check for p in audit.problems] == ["index"]
    assert lines(audit) == [f"{key_of(other, 'cu130-torch2.14-abi1-sm90')}: index: on no page"]


# --- against the matrix; rebuilds ---------------------------------------------------------------------------


def test_with_the_matrix_each_wheel_is_its_jobs(idx: Index, tmp_path: Path) -> None:
    mf = load_matrix_file(FIXTURES / "memext.yaml")
    jobs = list(plan_matrix(mf).jobs)
    good = ext_wheel(tmp_path / "w")
    idx.publish(good)
    audit = idx.audit(jobs=jobs, project=mf.package.name)
    assert audit.ok and audit.wheels[0].job_id == jobs[0].id and "matrix" in audit.wheels[0].checks
    sm90 = "cu13.0.torch2.14.abi1.sm90"
    other_job = ext_wheel(tmp_path / "x", label=sm90, cubins=(90,), job_id="elsewhere", archs=("9.0",))
    idx.publish(other_job)
    audit = idx.audit(jobs=jobs, project=mf.package.name)
    assert audit.ok and audit.unplanned == (key_of(other_job, "cu130-torch2.14-abi1-sm90"),)
    wrong = ext_wheel(tmp_path / "y", label=LABEL, job_id="not-the-job")
    fresh = Index(root=tmp_path / "i2", store=LocalStore(tmp_path / "i2"), key=idx.key)
    fresh.root.mkdir()
    fresh.publish(wrong)
    assert lines(fresh.audit(jobs=jobs, project=mf.package.name)) == [
        f"{key_of(wrong)}: matrix: provenance: job.id is 'not-the-job', the matrix job's is '{jobs[0].id}'"
    ]


def test_each_platforms_wheel_is_its_own_platforms_job(tmp_path: Path) -> None:
    """One variant page lists an x86_64 and an aarch64 wheel of the same Python: each is held to the job of
    its own platform, and neither stands for the other's job."""
    text = (
        (FIXTURES / "memext.yaml").read_text().replace("{path: memext}", f"{{path: {FIXTURES / 'memext'}}}")
    )
    assert "  cxx11_abi:" in text
    matrix = tmp_path / "memext.yaml"
    matrix.write_text(text.replace("  cxx11_abi:", "  platform: [x86_64, aarch64]\n  cxx11_abi:", 1))
    mf = load_matrix_file(matrix, trust_paths=True)
    jobs = list(plan_matrix(mf).jobs)
    x86, arm = sorted(jobs, key=lambda j: j.platform.name != "x86_64")
    assert (x86.platform.name, arm.platform.name) == ("x86_64", "aarch64")
    planned = plan_index(jobs)
    key = VariantKey.parse_id(VID)
    for tag, job in ((TAG, x86), (TAG.replace("manylinux_2_17_x86_64", "manylinux_2_28_aarch64"), arm)):
        filename = f"factory_memext-0.1.0+{LABEL}-{tag}.whl"
        found = planned_job(filename, key, planned, mf.package.name)
        assert found is not None and found.id == job.id, (filename, found)
        only_other = {VID: [j for j in jobs if j is not job]}
        assert planned_job(filename, key, only_other, mf.package.name) is None


def _result(wheel: Path, *, differs: bool) -> RebuildResult:
    diff = Difference(member=SO, what="section .text differs") if differs else None
    return RebuildResult(wheel=wheel.name, job_id="j", sha256="s", rebuilt=None, rebuilt_sha256="r",
                         difference=diff)  # fmt: skip


def test_n_distinct_wheels_are_rebuilt_and_a_difference_is_a_problem(idx: Index, tmp_path: Path) -> None:
    a = ext_wheel(tmp_path / "a")
    b = ext_wheel(tmp_path / "b", label="cu13.0.torch2.14.abi1.sm90", cubins=(90,), archs=("9.0",))
    idx.publish(a, b)
    rebuilt: list[str] = []

    def rebuilder(path: Path) -> RebuildResult:
        assert path.read_bytes() in (a.read_bytes(), b.read_bytes())  # the bytes the page lists
        rebuilt.append(path.name)
        return _result(path, differs="sm90" in path.name)

    assert idx.audit(rebuild=0, rebuilder=rebuilder).rebuilt == () and rebuilt == []
    one = idx.audit(rebuild=1, rebuilder=rebuilder, rng=random.Random(1))
    assert len(rebuilt) == 1 and len(one.rebuilt) == 1
    rebuilt.clear()
    both = idx.audit(rebuild=5, rebuilder=rebuilder)
    assert sorted(rebuilt) == sorted([a.name, b.name])
    assert [p.check for p in both.problems] == ["rebuild"]
    assert "the rebuild differs" in lines(both)[0] and "sm90" in lines(both)[0]


def test_a_wheel_that_cannot_be_rebuilt_is_a_problem(idx: Index, tmp_path: Path) -> None:
    idx.publish(ext_wheel(tmp_path / "a"))

    def rebuilder(path: Path) -> RebuildResult:
        raise ConfigError("the wheel was built from a source directory (memext): give it with --source DIR")

    (line,) = lines(idx.audit(rebuild=1, rebuilder=rebuilder))
    assert ": rebuild: cannot be rebuilt: the wheel was built from a source directory" in line


# --- the pure parts -----------------------------------------------------------------------------------------


def test_the_pin_a_label_asks_for() -> None:
    key = VariantKey.parse_local_version(LABEL)
    assert torch_pin_problem("Name: x\nRequires-Dist: torch==2.14.*\n", key) is None
    assert "none" in (torch_pin_problem("Name: x\n", key) or "")
    assert torch_pin_problem("Requires-Dist: torch\nRequires-Dist: torch==2.14.*\n", key) == (
        "METADATA requires torch 'torch', 'torch==2.14.*'; its label (torch 2.14) needs exactly "
        "'torch==2.14.*'"
    )
    stable = VariantKey.parse_local_version("cu13.0.stable2.12.abi1.sm80")
    assert torch_pin_problem("Requires-Dist: torch>=2.12\n", stable) is None
    assert torch_pin_problem("Requires-Dist: torch==2.14.*\n", stable) == (
        "METADATA requires torch 'torch==2.14.*'; its stable-ABI label (torch 2.12 on) needs exactly "
        "'torch>=2.12'"
    )


def test_a_label_that_names_no_variant() -> None:
    with pytest.raises(ValueError, match="no local label"):
        label_of("x-1.0-cp311-cp311-linux_x86_64.whl")
    with pytest.raises(ValueError, match="not a factory local version label"):
        label_of("x-1.0+cu12torch2.7-cp311-cp311-linux_x86_64.whl")


def test_a_stable_label_is_held_to_the_symbol_rule_and_its_floor(tmp_path: Path) -> None:
    bad = _load_sibling("test_stable_abi.py").shared_object(tmp_path, stable_only=False)
    label = "cu13.0.stable2.12.abi1.sm80"
    wheel = ext_wheel(tmp_path / "w", label=label, so=bad.read_bytes(), stable_abi="2.12")
    content = content_checks(wheel, wheel.name, VariantKey.parse_local_version(label))
    found = {(p.check, p.message.split(":")[0]) for p in content.found.problems}
    assert ("stable-abi", SO) in found  # uses at::get_num_threads
    assert ("device-code", "wheel") in found  # and no module has device code
    assert not [p for p in content.found.problems if p.check in ("torch-pin", "provenance")]
    doc = content.document
    assert doc is not None
    older = json.loads(json.dumps(doc))
    older["job"]["variant"]["torch"] = "2.11"
    older["torch"]["version"] = "2.11.0"
    (line,) = provenance_label_problems(older, wheel.name, VariantKey.parse_local_version(label))
    assert line == "provenance: job.variant.torch is '2.11', the stable-ABI label's floor is '>=2.12'"


def test_a_wheel_that_is_no_zip_is_one_line(tmp_path: Path) -> None:
    wheel = tmp_path / f"factory_memext-0.1.0+{LABEL}-{TAG}.whl"
    wheel.write_bytes(b"not a zip")
    content = content_checks(wheel, wheel.name, VariantKey.parse_local_version(LABEL))
    assert [p.check for p in content.found.problems] == ["metadata", "archive"]
    with zipfile.ZipFile(ext_wheel(tmp_path / "w")) as zf:
        assert any(n.endswith("factory-provenance.json") for n in zf.namelist())


# --- the command --------------------------------------------------------------------------------------------


def test_the_command_exits_0_clean_1_on_a_problem_2_for_usage(
    idx: Index, tmp_path: Path, factory_cli: Any
) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    pub = tmp_path / "key.pub"
    pub.write_bytes(signing.generate_key()[1])  # another key: every signature is then a problem
    own = tmp_path / "own.pub"
    from cryptography.hazmat.primitives import serialization

    own.write_bytes(
        idx.public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    )
    code, out = factory_cli(["index", "audit", "--to", str(idx.root), "--key", str(own)])
    assert code == 0, out
    assert out.strip().endswith(f"1 wheels, 0 problems; signatures checked with {signing.key_id(idx.public)}")
    report = tmp_path / "audit.json"
    code, out = factory_cli(
        ["index", "audit", "--to", str(idx.root), "--key", str(pub), "--report", str(report)]
    )
    assert code == 1, out
    assert f"problem: {key_of(wheel)}: signature: signed by key" in out
    doc = json.loads(report.read_text())
    assert doc["ok"] is False and [p["check"] for p in doc["problems"]] == ["signature"]
    code, out = factory_cli(["index", "audit", "--to", str(idx.root), "--json"])
    assert code == 0 and json.loads(out)["audited"][0]["key"] == key_of(wheel)
    for argv, says in [
        (["index", "audit"], "--to or --matrix names the index to audit"),
        (["index", "audit", "--to", str(tmp_path / "none")], "no such index directory"),
        (["index", "audit", "--to", str(idx.root), "--rebuild", "-1"], "--rebuild -1"),
        (["index", "audit", "--to", str(idx.root), "--key", str(tmp_path / "nokey")], "cannot read"),
    ]:
        code, out = factory_cli(argv)
        assert code == 2 and says in out and "Traceback" not in out, out


def test_a_name_a_page_lists_is_read_only_when_it_is_a_canonical_wheel_filename(
    idx: Index, tmp_path: Path
) -> None:
    wheel = ext_wheel(tmp_path / "w")
    idx.publish(wheel)
    page = idx.path(index.project_page(VID, "factory-memext").state_key)
    doc = json.loads(page.read_text())
    spelt = "Factory.Memext" + doc["files"][0]["filename"].removeprefix("factory_memext")
    doc["files"][0]["filename"] = spelt
    page.write_text(json.dumps(doc))
    audit = idx.audit()
    (audited,) = audit.wheels
    assert audited.sha256 is None
    assert (
        f"{index.files_path(VID, spelt)}: page: lists a name that is no canonical wheel filename; not read"
        in (lines(audit))
    )
