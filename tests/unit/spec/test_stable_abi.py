"""Stable-ABI recipes: the recipe value, the variant spelling without a torch, the plan's one job for
every torch, the build environment, the torch requirement, the symbol check, and the pages the wheel is
listed on."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import textwrap
import zipfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from factory.core.errors import ConfigError
from factory.core.variants import VariantKey
from factory.plan.plan import matrix_env, plan_matrix
from factory.publish.publisher import publish_wheels, wheel_name_problem
from factory.spec import stable_abi
from factory.spec.config import load_matrix_file
from factory.spec.recipes import load_recipe_dir
from factory.wheel.checks import pin_torch_in_metadata, record_hash, stable_abi_problems, torch_requirements


def matrix_file(
    tmp_path: Path,
    *,
    floor: str = '"2.12"',
    torches: str = '["2.14", "2.12"]',
    pythons: str = '["3.11"]',
    recipe: str = "",
    extra: str = "",
) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: demo-stable, version: "1.0"}}
            recipe:
              name: demo
              stable_abi: {floor}
            {recipe}
            matrix:
              cuda: ["13.0"]
              torch: {torches}
              python: {pythons}
              cxx11_abi: [true]
              arch: ["8.0"]
            """
        )
        + extra
    )
    return path


# -- the recipe value


@pytest.mark.parametrize(
    ("value", "parsed"),
    [("2.12", "2.12"), (" 2.10 ", "2.10"), ("2.12.0", "2.12"), (False, None), (None, None)],
)
def test_parse_stable_abi(value: object, parsed: str | None) -> None:
    assert stable_abi.parse_stable_abi(value) == parsed


@pytest.mark.parametrize("value", [2.12, True, "2", "2.12.1", "v2.12", "2.012", "latest", 212, ""])
def test_parse_stable_abi_refuses(value: object) -> None:
    with pytest.raises(ValueError, match=r"2\.12"):
        stable_abi.parse_stable_abi(value)


def test_an_unquoted_version_in_a_matrix_file_is_one_line_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_matrix_file(matrix_file(tmp_path, floor="2.10"))
    message = str(caught.value)
    assert "\n" not in message
    assert "recipe.stable_abi 2.1 must be a quoted torch version" in message
    assert "m.yaml:" in message


def test_a_bad_value_exits_2_from_the_cli(
    tmp_path: Path, factory_cli: Callable[..., tuple[int, str]]
) -> None:
    code, output = factory_cli(["matrix", "-m", str(matrix_file(tmp_path, floor='"newest"'))])
    assert code == 2
    assert output.strip().endswith(
        "m.yaml:4: recipe.stable_abi 'newest' must be the torch release the package targets, like \"2.12\""
    )
    assert len(output.strip().splitlines()) == 1


def test_recipe_toml_reads_it(tmp_path: Path) -> None:
    directory = tmp_path / "stable"
    directory.mkdir()
    (directory / "recipe.toml").write_text('stable_abi = "2.12"\n')
    assert load_recipe_dir(directory).stable_abi == "2.12"
    (directory / "recipe.toml").write_text("stable_abi = 2.12\n")
    with pytest.raises(ValueError, match=r"recipe.toml: stable_abi 2.12 must be a quoted torch version"):
        load_recipe_dir(directory)


# -- pure helpers


def test_target_version_is_torchs_spelling() -> None:
    # torch/csrc/stable/version.h: TORCH_VERSION_2_12_0 (((0ULL + 2) << 56) | ((0ULL + 12) << 48))
    assert stable_abi.target_version("2.12") == "0x020c000000000000"
    assert int(stable_abi.target_version("2.9"), 16) == (2 << 56) | (9 << 48)


def test_covers_torch() -> None:
    assert stable_abi.covers_torch("2.12", "2.12")
    assert stable_abi.covers_torch("2.12", "2.14.1")
    assert stable_abi.covers_torch("2.12", "3.0")
    assert not stable_abi.covers_torch("2.12", "2.11.5")
    assert not stable_abi.covers_torch("2.12", "2.9")


def test_requirement_is_a_floor_not_a_pin() -> None:
    text = "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\nRequires-Dist: torch\nRequires-Dist: numpy\n\n"
    pinned = pin_torch_in_metadata(text, "2.14.1+cu130", stable_abi="2.12")
    assert [str(r) for r in torch_requirements(pinned)] == ["torch>=2.12"]
    assert "Requires-Dist: numpy" in pinned
    assert [str(r) for r in torch_requirements(pin_torch_in_metadata(text, "2.14.1"))] == ["torch==2.14.*"]
    for torch in ("2.12.1", "2.13.0", "2.14.1"):
        assert Requirement("torch>=2.12").specifier.contains(torch)


# -- the variant spelling


def stable_key(**kw: object) -> VariantKey:
    values: dict[str, object] = {"cuda": "13.0", "torch": "2.12", "cxx11_abi": True, "archs": ("8.0",)}
    values.update(kw)
    return VariantKey(stable=True, **values)  # type: ignore[arg-type]


def test_a_stable_variant_names_its_floor_not_a_torch() -> None:
    key = stable_key(archs=("8.0", "9.0"))
    assert key.id == "cu130-stable2.12-abi1-sm80.90"
    assert key.local_version == "cu13.0.stable2.12.abi1.sm80.90"
    assert VariantKey.parse_id(key.id) == key
    assert VariantKey.parse_local_version(key.local_version) == key
    assert VariantKey.parse_local_version("0.1.0+" + key.local_version) == key
    # PEP 440 keeps the numbers apart: the label sorts by the floor's numbers, not as text
    from packaging.version import Version

    assert Version("1.0+cu13.0.stable2.9.abi1.sm80") < Version("1.0+cu13.0.stable2.12.abi1.sm80")
    assert Version("1.0+" + key.local_version).local == key.local_version


def test_torch_variants_are_spelt_as_before() -> None:
    key = VariantKey(cuda="12.8", torch="2.10", cxx11_abi=True, archs=("8.0",))
    assert (key.id, key.local_version, key.stable) == (
        "cu128-torch2.10-abi1-sm80",
        "cu12.8.torch2.10.abi1.sm80",
        False,
    )
    assert VariantKey.parse_id(key.id) == key


@pytest.mark.parametrize(
    "text", ["cu130-stable-abi1-sm80", "cu130-Stable2.12-abi1-sm80", "cu130-stable2.12-torch2.14-abi1-sm80"]
)
def test_malformed_stable_ids_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        VariantKey.parse_id(text)


def test_a_stable_variant_covers_later_torch_variants_of_its_cuda_abi_and_archs() -> None:
    key = stable_key()
    assert key.covers(key.with_torch("2.12")) and key.covers(key.with_torch("2.14"))
    assert key.covers(key)
    assert not key.covers(key.with_torch("2.11"))
    other = VariantKey(cuda="12.8", torch="2.14", cxx11_abi=True, archs=("8.0",))
    assert not key.covers(other)
    assert not key.covers(VariantKey(cuda="13.0", torch="2.14", cxx11_abi=True, archs=("8.0", "9.0")))
    assert not key.with_torch("2.14").covers(key)  # a torch wheel serves its own page only


# -- the plan


def test_one_job_for_every_torch_built_with_the_newest(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path)))
    [job] = plan.jobs
    assert job.id == "cu130-stable2.12-abi1-sm80-py311"
    assert (job.variant.torch, job.variant.stable_abi, job.torches) == ("2.14", "2.12", ("2.12", "2.14"))
    assert job.variant.local_version == "cu13.0.stable2.12.abi1.sm80"
    data = job.to_json()
    assert (data["torch"], data["stable_abi"], data["torches"]) == ("2.14", "2.12", ["2.12", "2.14"])
    assert matrix_env(load_matrix_file(matrix_file(tmp_path)), job)["TORCH_TARGET_VERSION"] == (
        "0x020c000000000000"
    )


def test_a_torch_older_than_the_floor_is_dropped_with_the_reason(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, floor='"2.14"')))
    [job] = plan.jobs
    assert job.torches == ("2.14",)
    reasons = [d.reason for d in plan.dropped]
    assert reasons == ["torch 2.12 is older than the recipe's stable ABI target (torch 2.14)"]


def test_one_job_per_python_unless_abi3_too(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, pythons='["3.11", "3.12"]')))
    assert [j.id for j in plan.jobs] == [
        "cu130-stable2.12-abi1-sm80-py311",
        "cu130-stable2.12-abi1-sm80-py312",
    ]
    both = matrix_file(tmp_path, pythons='["3.11", "3.12"]', recipe="  py_limited_api: true")
    [job] = plan_matrix(load_matrix_file(both)).jobs
    assert (job.id, job.limited_api, job.covers, job.torches) == (
        "cu130-stable2.12-abi1-sm80-py311",
        "cp311",
        ("3.12",),
        ("2.12", "2.14"),
    )


def test_a_torch_with_its_own_env_is_not_covered(tmp_path: Path) -> None:
    extra = '  include:\n    - torch: "2.12"\n      env: {SPECIAL: "1"}\n'
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, extra=extra)))
    [job] = plan.jobs
    assert job.torches == ("2.14",)
    assert "which builds the one stable-ABI wheel (torch>=2.12)" in plan.dropped[0].reason


def test_without_the_key_every_torch_is_a_job(tmp_path: Path) -> None:
    plan = plan_matrix(load_matrix_file(matrix_file(tmp_path, floor="false")))
    assert sorted(j.id for j in plan.jobs) == [
        "cu130-torch2.12-abi1-sm80-py311",
        "cu130-torch2.14-abi1-sm80-py311",
    ]
    mf = load_matrix_file(matrix_file(tmp_path, floor="false"))
    assert all(j.torches == () and "TORCH_TARGET_VERSION" not in matrix_env(mf, j) for j in plan.jobs)


def test_an_include_entry_cannot_set_what_the_plan_computes(tmp_path: Path) -> None:
    extra = '  include:\n    - torch: "2.14"\n      torches: ["2.12"]\n'
    with pytest.raises(ConfigError, match="'torches' is computed by the factory"):
        load_matrix_file(matrix_file(tmp_path, extra=extra))


# -- the symbol check


@pytest.mark.parametrize(
    "symbol",
    [
        "_ZN2at15get_num_threadsEv",  # at::get_num_threads()
        "_ZNK2at10TensorBase8data_ptrEv",  # const member function
        "_ZN3c106detail14torchCheckFailEPKcS2_jRKNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE",
        "_ZN3c1019UndefinedTensorImpl10_singletonE",  # a static data member
        "_ZTIN3c105ErrorE",  # typeinfo for c10::Error
        "_ZTVN3c1011StorageImplE",  # vtable
        "_ZTSN3c1010TensorImplE",  # typeinfo name
        "_ZThn16_N3c1010TensorImplD0Ev",  # a thunk
        "_ZN5torch8autograd12VariableInfoC1ERKN2at6TensorE",  # a constructor
        "_ZN6caffe28TypeMeta21_typeMetaDataInstanceIfEEPKNS_6detail12TypeMetaDataEv",  # a template
        "_ZN2at4_ops10empty_like4callERKNS_6TensorESt8optionalIN3c1010ScalarTypeEE",
        "_Z16THPVariable_WrapRKN2at10TensorBaseE",  # libtorch_python
    ],
)
def test_torch_cxx_symbols_break_the_claim(symbol: str) -> None:
    assert stable_abi.is_non_stable(symbol)


@pytest.mark.parametrize(
    "symbol",
    [
        "aoti_torch_get_numel",
        "torch_call_dispatcher",
        "torch_library_impl",
        "aoti_torch_get_current_cuda_stream",
        "cudaLaunchKernel",
        "__cxa_throw",
        "_ZSt9terminatev",
        "_ZNKSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE7compareEPKc",
        "_ZNSt6vectorIiSaIiEE2atEm",  # std::vector<int>::at: a member named `at`, not namespace at
        "_ZN12atomic_thing3fooEv",  # a namespace whose name starts with "at"
        "_Z3fooRKN2at6TensorE",  # a global function of the package's: its parameter types do not matter
        "_ZTISt9exception",
        "PyModule_Create2",
    ],
)
def test_the_c_shim_std_and_other_symbols_keep_it(symbol: str) -> None:
    assert not stable_abi.is_non_stable(symbol)


MODULE_CPP = """\
extern "C" int aoti_torch_get_numel(void*, long*);
namespace at { int get_num_threads(); }
extern "C" long stable(void* t) { long n = 0; aoti_torch_get_numel(t, &n); return n; }
%s
"""


def shared_object(tmp_path: Path, *, stable_only: bool) -> Path:
    """A real shared object (the host's C++ compiler) whose undefined symbols are the C shim's and, unless
    `stable_only`, one at:: function."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    source = tmp_path / "module.cpp"
    source.write_text(
        MODULE_CPP % ("" if stable_only else 'extern "C" int bad() { return at::get_num_threads(); }')
    )
    module = tmp_path / ("good.so" if stable_only else "bad.so")
    subprocess.run([compiler, "-shared", "-fPIC", str(source), "-o", str(module)], check=True)
    return module


def test_the_elf_reader_finds_what_nm_finds(tmp_path: Path) -> None:
    module = shared_object(tmp_path, stable_only=False)
    with module.open("rb") as fh:
        found = stable_abi.undefined_symbols(fh)
    assert "aoti_torch_get_numel" in found and "_ZN2at15get_num_threadsEv" in found
    nm = shutil.which("nm")
    if nm is not None:
        listed = subprocess.run(
            [nm, "-D", "--undefined-only", str(module)], capture_output=True, text=True
        ).stdout
        names = {line.split()[-1].split("@")[0] for line in listed.splitlines() if line.strip()}
        assert set(found) == names


def test_a_module_names_its_first_offending_symbol(tmp_path: Path) -> None:
    good, bad = shared_object(tmp_path, stable_only=True), shared_object(tmp_path, stable_only=False)
    with good.open("rb") as fh:
        assert stable_abi.module_problem("pkg/_C.so", fh) is None
    with bad.open("rb") as fh:
        assert stable_abi.module_problem("pkg/_C.so", fh) == (
            "pkg/_C.so: uses _ZN2at15get_num_threadsEv, outside torch's stable ABI (a stable-ABI wheel may "
            "call only the C shim, aoti_torch_*/torch_*)"
        )
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.write(good, "pkg/_A.so")
        zf.write(bad, "pkg/_B.so")
    with zipfile.ZipFile(wheel) as zf:
        assert [p.split(":")[0] for p in stable_abi_problems(zf)] == ["pkg/_B.so"]


def elf_header(*, shoff: int) -> bytes:
    """An ELF64 little-endian header with one section header at `shoff` and nothing else."""
    data = bytearray(64)
    data[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<Q", data, 0x28, shoff)
    struct.pack_into("<HH", data, 0x3A, 64, 1)
    return bytes(data)


def huge_section_table() -> bytes:
    data = bytearray(elf_header(shoff=64))
    struct.pack_into("<HH", data, 0x3A, 2048, 65535)
    return bytes(data)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "truncated file"),
        (elf_header(shoff=64), "truncated file"),
        (b"MZ" + bytes(100), "not an ELF file"),
        (b"\x7fELF\x01\x01" + bytes(100), "not a 64-bit little-endian ELF file"),
        (elf_header(shoff=1 << 40), "truncated file"),  # section headers past the end
        (huge_section_table(), "malformed section headers"),  # 128 MiB of headers: not read at all
    ],
)
def test_what_is_no_elf_is_a_problem_not_a_crash(data: bytes, why: str) -> None:
    assert stable_abi.module_problem("pkg/_C.so", BytesIO(data)) == (
        f"pkg/_C.so: its dynamic symbols cannot be read ({why})"
    )


# -- publishing

PAGES = ("cu130-torch2.12-abi1-sm80", "cu130-torch2.14-abi1-sm80")


def stable_wheel(directory: Path) -> Path:
    version = "1.0+cu13.0.stable2.12.abi1.sm80"
    metadata = (
        f"Metadata-Version: 2.1\nName: demo-ext\nVersion: {version}\nRequires-Dist: torch>=2.12\n\n".encode()
    )
    dist_info = f"demo_ext-{version}.dist-info"
    record = f"{dist_info}/METADATA,{record_hash(metadata)},{len(metadata)}\n{dist_info}/RECORD,,\n"
    path = directory / f"demo_ext-{version}-cp311-cp311-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{dist_info}/METADATA", metadata)
        zf.writestr(f"{dist_info}/RECORD", record)
    return path


def test_the_wheel_is_listed_on_the_page_of_every_torch_it_covers(tmp_path: Path) -> None:
    wheel = stable_wheel(tmp_path)
    report = tmp_path / "report.json"
    job = {
        "variant_id": "cu130-stable2.12-abi1-sm80",
        "python": "3.11",
        "result": "ok",
        "package": "demo-ext",
        "wheel": wheel.name,
        "torches": ["2.12", "2.14"],
    }
    report.write_text(json.dumps({"jobs": [job]}))
    result = publish_wheels([wheel], to=str(tmp_path / "index"), report=report)
    assert result.variant_ids == ("cu130-torch2.12-abi1-sm80", "cu130-torch2.14-abi1-sm80")
    for vid in result.variant_ids:
        page = json.loads((tmp_path / "index" / "simple" / vid / "demo-ext" / "index.json").read_text())
        assert [f["filename"] for f in page["files"]] == [wheel.name]
        assert (tmp_path / "index" / "files" / vid / wheel.name).is_file()
    variants = (tmp_path / "index" / "simple" / "index.html").read_text()
    assert "stable2.12" not in variants  # no page of its own: installers find it on the torch pages
    assert wheel_name_problem(wheel.name, "cu130-torch2.14-abi1-sm80") is None
    assert wheel_name_problem(wheel.name, "cu130-torch2.11-abi1-sm80") == (
        "its local label names variant cu130-stable2.12-abi1-sm80, not cu130-torch2.11-abi1-sm80"
    )


def test_without_a_report_naming_its_torches_it_is_not_published(tmp_path: Path) -> None:
    wheel = stable_wheel(tmp_path)
    with pytest.raises(ConfigError, match="listed on the page of each torch its build covers"):
        publish_wheels([wheel], to=str(tmp_path / "index"))
    assert not (tmp_path / "index" / "files").exists()


def test_the_job_counts_as_published_once_every_covered_torch_page_lists_it(tmp_path: Path) -> None:
    from factory.build.pipeline import job_pages, unpublished
    from factory.publish.stores import open_store

    path = matrix_file(tmp_path)
    text = path.read_text().replace('name: demo-stable, version: "1.0"', 'name: demo-ext, version: "1.0"')
    path.write_text(text)
    mf = load_matrix_file(path)
    [job] = plan_matrix(mf).jobs
    assert job_pages(job) == ("cu130-torch2.12-abi1-sm80", "cu130-torch2.14-abi1-sm80")
    wheel = stable_wheel(tmp_path)
    report = tmp_path / "report.json"
    entry = {"variant_id": job.variant.id, "python": "3.11", "result": "ok", "wheel": wheel.name}
    store = tmp_path / "index"
    report.write_text(json.dumps([{**entry, "torches": ["2.12"]}]))
    publish_wheels([wheel], to=str(store), report=report)
    said: list[str] = []
    assert unpublished(open_store(str(store)), mf, [job], said.append) == [job]  # not on torch 2.14's page
    report.write_text(json.dumps([{**entry, "torches": ["2.12", "2.14"]}]))
    publish_wheels([wheel], to=str(store), report=report)
    assert unpublished(open_store(str(store)), mf, [job], said.append) == []
    assert said == [f"{job.id}: already published as {wheel.name}; skipped (--rebuild builds it again)"]


def test_repair_rebuilds_every_covered_page_from_the_files(tmp_path: Path) -> None:
    from factory.publish.publisher import repair_index

    wheel = stable_wheel(tmp_path)
    report = tmp_path / "report.json"
    entry = {
        "variant_id": "cu130-stable2.12-abi1-sm80",
        "python": "3.11",
        "result": "ok",
        "wheel": wheel.name,
    }
    report.write_text(json.dumps([{**entry, "torches": ["2.12", "2.14"]}]))
    store = tmp_path / "index"
    publish_wheels([wheel], to=str(store), report=report)
    pages = [store / "simple" / vid / "demo-ext" / "index.json" for vid in PAGES]
    before = [p.read_bytes() for p in pages]
    for page in pages:
        page.unlink()
    result = repair_index(to=str(store))
    assert not result.skipped
    assert [json.loads(p.read_text())["files"][0]["filename"] for p in pages] == [wheel.name, wheel.name]

    def files(text: str | bytes) -> list[dict[str, object]]:
        return [{k: v for k, v in f.items() if k != "upload-time"} for f in json.loads(text)["files"]]

    assert [files(p.read_text()) for p in pages] == [files(b) for b in before]


def test_the_oldest_torch_gets_its_own_inputs_before_the_build(tmp_path: Path) -> None:
    from factory.build.acceptance import oldest_torch_job

    [job] = plan_matrix(load_matrix_file(matrix_file(tmp_path))).jobs
    oldest = oldest_torch_job(job)
    assert oldest is not None
    assert (oldest.variant.torch, oldest.variant.id, oldest.id) == ("2.12", job.variant.id, job.id)
    [only] = plan_matrix(load_matrix_file(matrix_file(tmp_path, torches='["2.14"]'))).jobs
    assert oldest_torch_job(only) is None  # it builds with the one torch it serves
    [plain] = plan_matrix(load_matrix_file(matrix_file(tmp_path, floor="false", torches='["2.14"]'))).jobs
    assert oldest_torch_job(plain) is None


# -- the hint


STABLE_SOURCE = (
    b"#include <torch/csrc/stable/library.h>\n"
    b'STABLE_TORCH_LIBRARY(ext, m) { m.def("f(Tensor x) -> Tensor"); }\n'
)


@pytest.mark.parametrize(
    ("sources", "hinted"),
    [
        ([("csrc/a.cpp", STABLE_SOURCE), ("csrc/k.cu", b"__global__ void k() {}\n")], True),
        ([("csrc/a.cpp", b"#include <torch/csrc/stable/tensor.h>\n")], True),
        ([("csrc/a.cpp", STABLE_SOURCE), ("csrc/b.cu", b"#include <ATen/ATen.h>\n")], False),
        ([("csrc/a.cpp", STABLE_SOURCE), ("csrc/b.cpp", b"#include <c10/cuda/CUDAStream.h>\n")], False),
        ([("csrc/a.cpp", STABLE_SOURCE + b"TORCH_LIBRARY_IMPL(ext, CUDA, m) {}\n")], False),
        ([("csrc/a.cpp", b"#include <torch/extension.h>\n")], False),
        ([("csrc/a.cpp", b"int main() {}\n")], False),
    ],
)
def test_a_source_written_against_the_stable_abi_gets_a_hint(
    sources: list[tuple[str, bytes]], hinted: bool
) -> None:
    hint = stable_abi.detect(sources)
    assert (hint is not None) == hinted
    if hint is not None:
        assert hint.startswith("the source looks written against torch's stable ABI (csrc/a.cpp;")
        assert 'set recipe.stable_abi to the oldest torch it targets (like "2.12")' in hint


def test_source_files_reads_cxx_and_cuda_files_without_following_links(tmp_path: Path) -> None:
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "a.cpp").write_bytes(STABLE_SOURCE)
    (tmp_path / "csrc" / "k.cu").write_bytes(b"x" * (stable_abi.MAX_SOURCE_BYTES + 10))
    (tmp_path / "setup.py").write_text("STABLE_TORCH_LIBRARY(\n")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.h"
    outside.write_bytes(b"#include <ATen/ATen.h>\n")
    (tmp_path / "csrc" / "evil.h").symlink_to(outside)
    found = dict(stable_abi.source_files(tmp_path))
    assert sorted(found) == ["csrc/a.cpp", "csrc/k.cu"]
    assert len(found["csrc/k.cu"]) == stable_abi.MAX_SOURCE_BYTES
    assert stable_abi.detect(stable_abi.source_files(tmp_path)) is not None


def test_matrix_check_says_the_hint_for_a_local_source(
    tmp_path: Path, factory_cli: Callable[..., tuple[int, str]]
) -> None:
    source = tmp_path / "src"
    (source / "csrc").mkdir(parents=True)
    (source / "csrc" / "a.cpp").write_bytes(STABLE_SOURCE)
    (source / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='demo-stable', version='1.0')\n"
    )
    path = matrix_file(tmp_path, floor="false")
    path.write_text(
        path.read_text().replace('version: "1.0"}', f'version: "1.0", source: {{path: {source}}}}}')
    )
    code, output = factory_cli(["matrix", "--trust-paths", "--check", "-m", str(path)])
    assert code == 0, output
    assert "; hint: the source looks written against torch's stable ABI (csrc/a.cpp;" in output
