"""A stable-ABI recipe for real: the fixture tests/fixtures/stableext (a CPU operator and a CUDA kernel,
registered with STABLE_TORCH_LIBRARY, every torch call through the C shim) built once for sm_80 with Python
3.11 in the PyPI builder image against torch 2.14 with TORCH_TARGET_VERSION 2.12; its wheel requires
`torch>=2.12`, passes the symbol check, installs and imports in fresh venvs with torch 2.12.1 and 2.14.1
(CUDA 13.0 builds), and is published on both torch variants' pages, where pip finds it. The same module
calling one libtorch C++ function (at::get_num_threads, sm_86 job) is refused in one line naming the symbol.
The same wheel published for torch 2.12 alone is then reused for 2.14 with no compile (one install check),
and refused, nothing published, when the stored file is not what its page lists, or (publishing signed) when
a store writer swapped it and rewrote its page to match: its signature no longer vouches for it. Published as
a wheel variant (PEP 825, experimental), real uv takes it for a stood-in GPU it runs on and not for one it
does not.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
import zipfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from factory.build.wheelhouse import compatible_platforms
from factory.publish import index as index_mod
from factory.publish.publisher import publish_wheels
from factory.trust.signing import Signer, load_private_key, make_signer, write_key_pair

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "stableext"
FACTORY = [sys.executable, "-m", "factory.cli"]
GOOD = "cu130-stable2.12-abi1-sm80-py311"
BAD = "cu130-stable2.12-abi1-sm86-py311"
LABEL = "cu13.0.stable2.12.abi1.sm80"
PAGES = ("cu130-torch2.12-abi1-sm80", "cu130-torch2.14-abi1-sm80")


def stable_matrix(tmp: Path, *, index: Path) -> Path:
    path = tmp / "matrix.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package:
              name: factory-stableext
              version: "0.1.0"
              source: {{path: {FIXTURE}}}
            recipe:
              name: stableext
              arch_env: STABLEEXT_CUDA_ARCHS
              local_version_env: STABLEEXT_LOCAL_VERSION
              import_name: factory_stableext
              compile_gib_per_arch: 1.0
              stable_abi: "2.12"
            matrix:
              cuda: ["13.0"]
              torch: ["2.14", "2.12"]
              python: ["3.11"]
              cxx11_abi: [true]
              arch: ["8.0", "8.6"]
              include:
                - arch: "8.6"
                  env: {{STABLEEXT_NON_STABLE: "1"}}
            build:
              flavor: pypi
              cpus: 2
              memory: 6GiB
              torch_index: {{"13.0": default}}
            publish:
              to: {index}
            """
        )
    )
    return path


@pytest.fixture(scope="module")
def stable_build(tmp_path_factory: pytest.TempPathFactory, docker_client: Any) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("stable-build")
    matrix = stable_matrix(tmp, index=tmp / "index")
    from publish_helpers import plan_and_build

    return plan_and_build(matrix, index=tmp / "index")


def test_one_job_serves_both_torches_and_is_checked_with_each(stable_build: dict[str, Any]) -> None:
    plan = stable_build["plan"]
    assert plan.returncode == 0, plan.stderr
    jobs = json.loads(plan.stdout)["jobs"]
    assert [(j["job_id"], j["torch"], j["torches"]) for j in jobs] == [
        (GOOD, "2.14", ["2.12", "2.14"]),
        (BAD, "2.14", ["2.12", "2.14"]),
    ]
    proc = stable_build["proc"]
    assert proc.returncode == 1, proc.stderr[-3000:]  # the sm86 job's wheel is refused (below)
    job = stable_build["jobs"][GOOD]
    assert job["result"] == "ok", (job["reason"], job["log_tail"])
    assert job["torches"] == ["2.12", "2.14"]
    assert job["checked_torches"] == ["2.14", "2.12"]  # the newest (it built it), then the oldest
    log = Path(job["log"]).read_text()
    assert "-DTORCH_TARGET_VERSION=0x020c000000000000ULL" in log
    assert "install check with torch 2.12, which the stable-ABI wheel (torch>=2.12) covers" in log
    assert log.count('"phase": "done"') == 2


def test_the_wheel_names_no_torch_and_requires_the_floor(stable_build: dict[str, Any]) -> None:
    job = stable_build["jobs"][GOOD]
    wheel = stable_build["out"] / job["wheel"]
    assert wheel.name.startswith(f"factory_stableext-0.1.0+{LABEL}-cp311-cp311-manylinux_2_"), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        metadata = zf.read(f"factory_stableext-0.1.0+{LABEL}.dist-info/METADATA").decode()
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    assert requires == ["Requires-Dist: torch>=2.12"]


def test_published_on_every_covered_torch_page_where_pip_finds_it(
    stable_build: dict[str, Any], tmp_path: Path
) -> None:
    job = stable_build["jobs"][GOOD]
    index = stable_build["index"]
    platforms = [a for p in compatible_platforms("manylinux_2_36_x86_64") for a in ("--platform", p)]
    for page in PAGES:
        assert [f.name for f in (index / "files" / page).glob("*.whl")] == [job["wheel"]]
        dest = tmp_path / page
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
             "3.11", "--implementation", "cp", "--abi", "cp311", *platforms,
             "--index-url", (index / "simple" / page).as_uri() + "/", "-d", str(dest), "factory-stableext"],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        assert [p.name for p in dest.iterdir()] == [job["wheel"]]
    variants = (index / "simple" / "index.html").read_text()
    assert "stable" not in variants  # no page of its own: installers ask for their torch's page


def test_as_a_wheel_variant_uv_takes_the_one_wheel_for_the_gpu_it_runs_on(
    stable_build: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The stable-ABI wheel on the experimental variant channel (docs/PUBLISH.md): one URL for every torch
    it covers, its variant.json valid to variantlib, picked by real uv for a stood-in sm_86 GPU on a CUDA 13.0
    driver and for nothing on an sm_75 GPU (NV_VARIANT_PROVIDER_FORCE_*, read by uv's NVIDIA provider)."""
    from publish_helpers import fresh_venv, uv_install
    from variantlib.variant_dist_info import VariantDistInfo

    from factory.publish import wheelvariants

    job = stable_build["jobs"][GOOD]
    index = tmp_path / "index"
    result = publish_wheels(
        [stable_build["out"] / job["wheel"]], to=str(index), report=stable_build["out"] / "report.json",
        variants=True,
    )  # fmt: skip
    assert result.variant_notes == ()
    (variant,) = (index / "variants" / "stable2.12-abi1" / "files").glob("*.whl")
    label = variant.name.removesuffix(".whl").rsplit("-", 1)[1]
    with zipfile.ZipFile(variant) as zf:
        described = VariantDistInfo(zf.read("factory_stableext-0.1.0.dist-info/variant.json"), label)
        metadata = zf.read("factory_stableext-0.1.0.dist-info/METADATA").decode()
    assert {p.to_str() for p in described.variant_desc.properties} == {
        "nvidia :: cuda_version_lower_bound :: 13.0",
        "nvidia :: sm_arch :: 80_real",
    }
    assert "Requires-Dist: torch>=2.12" in metadata.splitlines()
    url = (index / "variants" / "stable2.12-abi1" / "simple").as_uri() + "/"
    for gpu, installs in (("8.6", True), ("7.5", False)):
        monkeypatch.setenv("NV_VARIANT_PROVIDER_FORCE_CUDA_DRIVER_VERSION", "13.0")
        monkeypatch.setenv("NV_VARIANT_PROVIDER_FORCE_SM_ARCH", gpu)
        venv = fresh_venv(tmp_path / f"venv{gpu}", tool="uv")
        proc = uv_install(
            venv, url, "--preview-features", wheelvariants.PREVIEW_FEATURE, "--no-deps", "factory-stableext"
        )
        assert (proc.returncode == 0) == installs, proc.stderr[-3000:]
        installed = list((venv / "lib").glob("python3.11/site-packages/factory_stableext-0.1.0.dist-info"))
        assert len(installed) == int(installs)


def test_a_module_using_a_libtorch_cxx_function_is_refused_naming_it(stable_build: dict[str, Any]) -> None:
    job = stable_build["jobs"][BAD]
    assert (job["result"], job["wheel"], job["checked_torches"]) == ("failed", None, [])
    reason = job["reason"]
    module = "factory_stableext/_C.cpython-311-x86_64-linux-gnu.so"
    assert reason.startswith(f"wheel check failed: {module}: uses _ZN2at15get_num_threadsEv"), reason
    assert reason.endswith(
        "outside torch's stable ABI (a stable-ABI wheel may call only the C shim, aoti_torch_*/torch_*)"
    )
    assert "\n" not in reason
    assert not (stable_build["index"] / "files" / "cu130-torch2.14-abi1-sm86").exists()


def reuse_index(
    stable_build: dict[str, Any], tmp: Path, *, torches: list[str], signer: Signer | None = None
) -> tuple[Path, Path, Path]:
    """A second index where the fixture's wheel was published for `torches` alone (the matrix then
    covered no more; signed with `signer`), and the matrix publishing there: (matrix, index, published
    wheel)."""
    job = stable_build["jobs"][GOOD]
    wheel = stable_build["out"] / job["wheel"]
    report = tmp / "first" / "report.json"
    report.parent.mkdir()
    report.write_text(json.dumps({"jobs": [{**job, "torches": torches}]}))
    index = tmp / "index"
    publish_wheels([wheel], to=str(index), report=report, signer=signer)
    return stable_matrix(tmp, index=index), index, wheel


def build_only_good(
    matrix: Path, out: Path, *options: str
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "-m", str(matrix), "--only", GOOD, "--output", str(out),
         "--publish", *options],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert (out / "report.json").is_file(), proc.stderr[-3000:]
    [job] = json.loads((out / "report.json").read_text())["jobs"]
    return proc, job


def test_a_new_torch_gets_the_published_wheel_checked_with_it_and_no_compile(
    stable_build: dict[str, Any], tmp_path: Path
) -> None:
    """Published when the matrix covered torch 2.12 alone; torch 2.14 then joins it: the scheduled run takes
    the published file (no compile: a build would make other bytes, which the 2.12 page refuses), installs
    and imports it with torch 2.14 and lists the same bytes on 2.14's page; 2.12's page stays as it was."""
    old, new = PAGES
    matrix, index, wheel = reuse_index(stable_build, tmp_path, torches=["2.12"])
    assert not (index / "files" / new).exists()
    page = index_mod.project_page(old, "factory-stableext")
    before = {key: (index / key).read_bytes() for key in (page.state_key, page.html_key)}
    sha = hashlib.sha256(wheel.read_bytes()).hexdigest()

    proc, job = build_only_good(matrix, tmp_path / "wheels")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (job["result"], job["reused_from"], job["wheel"]) == ("ok", old, wheel.name), job["reason"]
    assert (job["attempts"], job["compiles_compiled"], job["checked_torches"]) == ([], 0, ["2.14"])
    log = Path(job["log"]).read_text()
    assert f"reusing {wheel.name} (sha256 {sha}) published on {old}: no compile" in log
    assert "attempt 1" not in log and log.count('"phase": "done"') == 1  # one install check, with 2.14
    assert f"{wheel.name} (reused from {old}, no compile)" in proc.stdout + proc.stderr

    stored = index / "files" / new / wheel.name
    assert hashlib.sha256(stored.read_bytes()).hexdigest() == sha
    new_page = index_mod.project_page(new, "factory-stableext")
    [listed] = index_mod.records_from_project_json((index / new_page.state_key).read_bytes())
    assert (listed.filename, listed.sha256) == (wheel.name, sha)
    assert {key: (index / key).read_bytes() for key in before} == before

    # the next scheduled run: published on every page, nothing to do
    again = subprocess.run(
        [*FACTORY, "build", "--trust-paths", "-m", str(matrix), "--only", GOOD, "--output",
         str(tmp_path / "again"), "--publish"],
        capture_output=True, text=True, cwd=ROOT,
    )  # fmt: skip
    assert again.returncode == 0 and "already published" in again.stdout + again.stderr, again.stderr


def test_a_published_file_that_is_not_what_its_page_lists_fails_the_job_and_nothing_is_published(
    stable_build: dict[str, Any], tmp_path: Path
) -> None:
    old, new = PAGES
    matrix, index, wheel = reuse_index(stable_build, tmp_path, torches=["2.12"])
    stored = index / "files" / old / wheel.name
    data = bytearray(stored.read_bytes())
    data[-1] ^= 1
    stored.chmod(0o644)
    stored.write_bytes(bytes(data))

    proc, job = build_only_good(matrix, tmp_path / "wheels")
    assert proc.returncode == 1
    assert (job["result"], job["wheel"], job["attempts"], job["reused_from"]) == ("failed", None, [], old)
    reason = f"the published wheel cannot be reused: files/{old}/{wheel.name} has sha256"
    assert job["reason"].startswith(reason), job["reason"]
    assert not (index / "files" / new).exists()


def test_a_swapped_file_whose_page_was_rewritten_is_not_signed_afresh(
    stable_build: dict[str, Any], tmp_path: Path
) -> None:
    """Published signed for torch 2.12; a store writer replaces the file and rewrites 2.12's page to list the
    new bytes. The signing run for 2.14 would sign them afresh for 2.14's page: it checks the signature beside
    the file with its own key first, fails the job, compiles nothing and publishes nothing."""
    old, new = PAGES
    key_path = tmp_path / "sign-key"
    write_key_pair(key_path)
    signer = make_signer(load_private_key(key_path.read_bytes(), shown="key"), source="test")
    matrix, index, wheel = reuse_index(stable_build, tmp_path, torches=["2.12"], signer=signer)
    stored = index / index_mod.files_path(old, wheel.name)
    swapped = bytearray(stored.read_bytes())
    swapped[-1] ^= 1
    stored.chmod(0o644)
    stored.write_bytes(bytes(swapped))
    sha = hashlib.sha256(swapped).hexdigest()
    page = index / index_mod.project_page(old, "factory-stableext").state_key
    [listed] = index_mod.records_from_project_json(page.read_bytes())
    page.write_text(
        index_mod.project_json("factory-stableext", [replace(listed, sha256=sha)], variant_id=old)
    )

    proc, job = build_only_good(matrix, tmp_path / "wheels", "--sign-key", str(key_path))
    assert proc.returncode == 1
    assert (job["result"], job["wheel"], job["attempts"], job["reused_from"]) == ("failed", None, [], old)
    signature = index_mod.signature_path(old, wheel.name)
    assert job["reason"] == (
        f"the published wheel cannot be reused: {signature}: the wheel's sha256 is {sha}, the signed one "
        f"{listed.sha256}: it changed after it was signed; not reused"
    )
    assert not (index / "files" / new).exists()
