"""Reusing a published stable-ABI wheel for a newer torch: which pages lack it, which file is taken and from
where, and a store whose pages or files cannot be trusted (another hash, a huge size, a label that does not
cover the page, a file that is not what its page lists)."""

from __future__ import annotations

import hashlib
import json
import shutil
import textwrap
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from factory.build.acceptance import reused_provenance
from factory.build.pipeline import build_matrix
from factory.build.report import BuildReport, JobResult, write_report
from factory.build.reuse import (
    Reuse,
    ReuseError,
    decide,
    fetch,
    fetch_all,
    label_problem,
    plan_reuse,
    provenance_problems,
)
from factory.core import platforms
from factory.plan.plan import Job, plan_matrix
from factory.publish import index
from factory.publish.index import FileRecord
from factory.publish.publisher import publish_wheels
from factory.publish.stores import LocalStore
from factory.spec.config import load_matrix_file
from factory.trust.signing import Signer, make_signer
from factory.wheel import embedded
from factory.wheel.checks import pin_torch_requirement, record_hash

OLD, NEW = "cu130-torch2.12-abi1-sm80", "cu130-torch2.14-abi1-sm80"
WHEEL = "demo_stable-1.0+cu13.0.stable2.12.abi1.sm80-cp311-cp311-manylinux_2_28_x86_64.whl"
BYTES = b"PK\x05\x06" + b"\0" * 18  # what the store holds; only its bytes matter here
SHA = hashlib.sha256(BYTES).hexdigest()
OTHER = b"X" * len(BYTES)


def stable_job(tmp_path: Path, *, stable: bool = True, publish: str = "") -> Job:
    path = tmp_path / "m.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            package: {{name: demo-stable, version: "1.0"}}
            recipe:
              name: demo
              stable_abi: {'"2.12"' if stable else "false"}
            matrix:
              cuda: ["13.0"]
              torch: ["2.14", "2.12"]
              python: ["3.11"]
              cxx11_abi: [true]
              arch: ["8.0"]
            """
        )
        + publish
    )
    return plan_matrix(load_matrix_file(path)).jobs[0]


def record(filename: str = WHEEL, *, sha256: str = SHA, size: int = len(BYTES)) -> FileRecord:
    return FileRecord(filename=filename, sha256=sha256, size=size, upload_time="2026-01-01T00:00:00.000000Z")


def test_the_new_torchs_page_alone_lacks_it_so_the_old_pages_file_is_taken(tmp_path: Path) -> None:
    job = stable_job(tmp_path)
    reuse = decide(job, project="demo-stable", pages={OLD: [record()]})
    assert reuse == Reuse(
        job_id=job.id, filename=WHEEL, source=OLD, sha256=SHA, size=len(BYTES), listed=(OLD,), missing=(NEW,),
        torches=("2.14",),
    )  # fmt: skip


def test_the_oldest_listing_page_is_the_source(tmp_path: Path) -> None:
    job = stable_job(tmp_path)
    reuse = decide(job, project="demo-stable", pages={NEW: [record()], OLD: []})
    assert reuse is not None
    assert (reuse.source, reuse.missing, reuse.torches, reuse.problem) == (NEW, (OLD,), ("2.12",), None)


def test_nothing_to_reuse_when_no_page_or_every_page_lists_it(tmp_path: Path) -> None:
    job = stable_job(tmp_path)
    assert decide(job, project="demo-stable", pages={}) is None
    assert decide(job, project="demo-stable", pages={OLD: [record()], NEW: [record()]}) is None
    other_version = WHEEL.replace("-1.0+", "-0.9+")
    assert decide(job, project="demo-stable", pages={OLD: [record(other_version)]}) is None
    other_python = WHEEL.replace("cp311-cp311", "cp312-cp312")
    assert decide(job, project="demo-stable", pages={OLD: [record(other_python)]}) is None


def test_a_wheel_of_another_platform_is_never_reused(tmp_path: Path) -> None:
    """The old torch's page lists the x86_64 wheel only: the aarch64 job builds its own, and reuses its own
    platform's once that is listed."""
    job = replace(stable_job(tmp_path), platform=platforms.named("aarch64"))
    assert decide(job, project="demo-stable", pages={OLD: [record()]}) is None
    arm = WHEEL.replace("x86_64", "aarch64")
    reuse = decide(job, project="demo-stable", pages={OLD: [record(), record(arm)]})
    assert reuse is not None and reuse.filename == arm and reuse.missing == (NEW,)


def test_a_job_that_is_not_stable_abi_never_reuses(tmp_path: Path) -> None:
    job = stable_job(tmp_path, stable=False)
    assert decide(job, project="demo-stable", pages={OLD: [record()]}) is None


def test_pages_that_list_the_file_with_different_hashes_fail_the_job(tmp_path: Path) -> None:
    job = stable_job(tmp_path)
    three = replace(job, torches=("2.12", "2.13", "2.14"))
    mid = "cu130-torch2.13-abi1-sm80"
    reuse = decide(three, project="demo-stable", pages={OLD: [record()], mid: [record(sha256="b" * 64)]})
    assert reuse is not None and reuse.missing == (NEW,)
    assert reuse.problem is not None and "different contents" in reuse.problem and mid in reuse.problem


@pytest.mark.parametrize(("size", "sha"), [(1 << 40, SHA), (0, SHA), (22, "not-a-hash")])
def test_a_listing_no_wheel_can_have_fails_the_job(tmp_path: Path, size: int, sha: str) -> None:
    reuse = decide(stable_job(tmp_path), project="demo-stable", pages={OLD: [record(size=size, sha256=sha)]})
    assert reuse is not None and reuse.problem is not None
    assert reuse.problem.startswith(f"{OLD} lists {WHEEL}")


def test_a_label_must_cover_every_page_it_is_added_to() -> None:
    assert label_problem(WHEEL, [OLD, NEW]) is None
    newer_floor = WHEEL.replace("stable2.12", "stable2.14")
    assert label_problem(newer_floor, [OLD]) == (
        f"{newer_floor}: its label (cu13.0.stable2.14.abi1.sm80) does not cover the page {OLD}"
    )
    assert "does not cover the page cu130-torch2.14-abi1-sm90" in str(
        label_problem(WHEEL, ["cu130-torch2.14-abi1-sm90"])
    )
    assert "does not cover the page ../x" in str(label_problem(WHEEL, ["../x"]))
    torch_label = WHEEL.replace("stable2.12", "torch2.12")
    assert label_problem(torch_label, [NEW]) == f"{torch_label}: its label names no stable-ABI variant"
    assert "no local label" in str(label_problem("demo_stable-1.0-cp311-cp311-linux_x86_64.whl", [NEW]))
    assert label_problem("not a wheel", [NEW]) is not None


def store_with(tmp_path: Path, data: bytes = BYTES, *, listed: FileRecord | None = None) -> LocalStore:
    root = tmp_path / "index"
    (root / "files" / OLD).mkdir(parents=True)
    (root / "files" / OLD / WHEEL).write_bytes(data)
    page = index.project_page(OLD, "demo-stable")
    state = index.project_json("demo-stable", [listed or record()], variant_id=OLD)
    (root / page.state_key).parent.mkdir(parents=True, exist_ok=True)
    (root / page.state_key).write_text(state)
    return LocalStore(root)


def planned(tmp_path: Path, store: LocalStore) -> Reuse:
    mf = load_matrix_file(tmp_path / "m.yaml")
    said: list[str] = []
    plan = plan_reuse(store, mf, plan_matrix(mf).jobs, said.append)
    [reuse] = plan.values()
    assert said == [
        f"{reuse.job_id}: {WHEEL} is published on {OLD}; reused for {NEW} after its check with torch 2.14 "
        "(no compile)"
    ]
    return reuse


def test_the_planned_file_is_fetched_with_its_pages_hash(tmp_path: Path) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path)
    reuse = planned(tmp_path, store)
    out = tmp_path / "fetched"
    out.mkdir()
    assert fetch(store, reuse, out).read_bytes() == BYTES
    [fetched] = fetch_all(store, {reuse.job_id: reuse}, tmp_path / "all", lambda _m: None).values()
    assert fetched.problem is None and fetched.wheel is not None and fetched.wheel.read_bytes() == BYTES


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (OTHER, f"has sha256 {hashlib.sha256(OTHER).hexdigest()}, its page lists {SHA}"),
        (BYTES + b"more", f"is {len(BYTES) + 4} bytes, its page lists {len(BYTES)}"),
        (BYTES[:-1], f"is {len(BYTES) - 1} bytes, its page lists {len(BYTES)}"),
    ],
)
def test_a_file_that_is_not_what_its_page_lists_is_refused_and_not_kept(
    tmp_path: Path, data: bytes, why: str
) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path, data)
    reuse = planned(tmp_path, store)
    out = tmp_path / "fetched"
    out.mkdir()
    with pytest.raises(ReuseError, match=r"^files/") as caught:
        fetch(store, reuse, out)
    assert why in str(caught.value)
    assert list(out.iterdir()) == []
    said: list[str] = []
    [failed] = fetch_all(store, {reuse.job_id: reuse}, tmp_path / "all", said.append).values()
    assert failed.wheel is None and failed.problem is not None and why in failed.problem
    assert said == [f"{reuse.job_id}: the published wheel cannot be reused: {failed.problem}"]


def test_a_huge_file_is_read_no_further_than_the_bound(tmp_path: Path) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path, BYTES * 100, listed=record(size=len(BYTES) * 100))
    reuse = planned(tmp_path, store)
    out = tmp_path / "fetched"
    out.mkdir()
    with pytest.raises(ReuseError, match="more than"):
        fetch(store, reuse, out, max_bytes=len(BYTES))
    assert list(out.iterdir()) == []


def test_a_missing_or_linked_file_is_refused(tmp_path: Path) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path)
    reuse = planned(tmp_path, store)
    stored = tmp_path / "index" / "files" / OLD / WHEEL
    stored.unlink()
    (tmp_path / "secret").write_bytes(BYTES)
    stored.symlink_to(tmp_path / "secret")  # a link the factory did not make is never followed
    with pytest.raises(ReuseError, match=f"is not in {tmp_path / 'index'}"):
        fetch(store, reuse, tmp_path)


def new_signer() -> Signer:
    return make_signer(Ed25519PrivateKey.generate(), source="test")


def sign_stored(tmp_path: Path, signer: Signer, data: bytes = BYTES) -> Path:
    """The signature file publishing writes beside the stored wheel, of `data`."""
    path = tmp_path / "index" / index.signature_path(OLD, WHEEL)
    path.write_bytes(signer.sign(WHEEL, hashlib.sha256(data).hexdigest()))
    return path


def test_signing_on_the_file_is_taken_only_with_a_signature_of_the_signing_key(tmp_path: Path) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path)
    reuse = planned(tmp_path, store)
    signer = new_signer()
    sign_stored(tmp_path, signer)
    out = tmp_path / "fetched"
    out.mkdir()
    assert fetch(store, reuse, out, key=signer.public_key()).read_bytes() == BYTES


def test_a_swapped_file_with_its_page_rewritten_to_match_is_refused_by_its_signature(tmp_path: Path) -> None:
    """A store writer replaced the wheel and its page's record: the page's hash vouches for the new bytes,
    the signature publishing wrote for the old ones does not."""
    stable_job(tmp_path)
    signer = new_signer()
    store = store_with(tmp_path, OTHER, listed=record(sha256=hashlib.sha256(OTHER).hexdigest()))
    sign_stored(tmp_path, signer, BYTES)  # what was published, and signed
    reuse = planned(tmp_path, store)
    out = tmp_path / "fetched"
    out.mkdir()
    fetch(store, reuse, out)  # the page's word alone: taken (signing off, nothing else to check here)
    (out / WHEEL).unlink()
    sig = index.signature_path(OLD, WHEEL)
    with pytest.raises(ReuseError) as caught:
        fetch(store, reuse, out, key=signer.public_key())
    assert str(caught.value) == (
        f"{sig}: the wheel's sha256 is {hashlib.sha256(OTHER).hexdigest()}, the signed one {SHA}: it changed "
        "after it was signed; not reused"
    )
    assert list(out.iterdir()) == []
    said: list[str] = []
    [failed] = fetch_all(
        store, {reuse.job_id: reuse}, tmp_path / "all", said.append, key=signer.public_key()
    ).values()
    assert failed.wheel is None and failed.problem == str(caught.value)
    assert said == [f"{reuse.job_id}: the published wheel cannot be reused: {failed.problem}"]


@pytest.mark.parametrize("case", ["unsigned", "another key", "a key given twice", "not a signature", "huge"])
def test_a_signature_that_does_not_vouch_with_the_signing_key_is_refused(tmp_path: Path, case: str) -> None:
    stable_job(tmp_path)
    store = store_with(tmp_path)
    reuse = planned(tmp_path, store)
    signer = new_signer()
    sig = sign_stored(tmp_path, new_signer() if case == "another key" else signer)
    if case == "unsigned":
        sig.unlink()
    elif case == "a key given twice":  # a lenient reader would take the second sha256
        sig.write_bytes(sig.read_bytes().rstrip(b"\n}") + b',"sha256":"' + b"0" * 64 + b'"}')
    elif case == "not a signature":
        sig.write_bytes(b"{}")
    elif case == "huge":
        sig.write_bytes(b" " * (1 << 20))
    says = {
        "unsigned": "is not in",
        "another key": "signed by key",
        "a key given twice": "duplicate key 'sha256'",
        "not a signature": "not a signature file",
        "huge": "larger than",
    }[case]
    with pytest.raises(ReuseError, match=says) as caught:
        fetch(store, reuse, tmp_path, key=signer.public_key())
    assert str(caught.value).startswith(
        index.signature_path(OLD, WHEEL) + (" " if case == "unsigned" else ": ")
    )
    assert "\n" not in str(caught.value) and not (tmp_path / WHEEL).exists()


def test_a_problem_found_by_the_decision_fails_the_fetch(tmp_path: Path) -> None:
    reuse = decide(stable_job(tmp_path), project="demo-stable", pages={OLD: [record(size=1 << 40)]})
    assert reuse is not None
    with pytest.raises(ReuseError, match="not a size a wheel may have"):
        fetch(LocalStore(tmp_path), reuse, tmp_path)


def test_a_reused_wheels_provenance_is_compared_with_the_jobs_never_skipped(tmp_path: Path) -> None:
    from test_provenance import NEEDED, make_facts, write_wheel

    wheel = write_wheel(tmp_path / "factory_memext-0.1.0-cp311-cp311-linux_x86_64.whl")
    pin_torch_requirement(wheel, "2.14.1", extra=embedded.files(make_facts(), NEEDED))
    made: list[Any] = []

    class Job:
        class variant:
            torch = "2.14"

    class Stub:
        job = Job

        def facts(self, wheel: Path, *, torch: str, inputs: object, toolchain: object) -> Any:
            assert torch == "2.14.1"  # the torch the provenance says it was built with
            return made[-1]

    acceptance = cast(Any, Stub())
    made.append(make_facts())
    assert reused_provenance(acceptance, wheel, inputs=cast(Any, None)) == []
    made.append(make_facts(job_id="another-job"))
    assert reused_provenance(acceptance, wheel, inputs=cast(Any, None)) == [
        f"provenance: job.id is {make_facts().job_id!r}, the job's is 'another-job'"
    ]
    made.append(None)  # the job's inputs without their facts: nothing to compare with, so not taken
    assert reused_provenance(acceptance, wheel, inputs=cast(Any, None)) == [
        "provenance: the job's inputs came without their facts, so the wheel's cannot be checked"
    ]


def test_provenance_of_another_source_or_job_is_named() -> None:
    mine = {"job": {"id": "j", "variant": {"archs": ["8.0"], "torch": "2.15"}}, "source": {"kind": "path"}}
    assert provenance_problems({**mine, "torch": {"version": "2.14.1"}}, mine) == []
    other = {**mine, "source": {"kind": "git"}}
    assert provenance_problems(other, mine) == [
        "provenance: source is {'kind': 'git'}, the job's is {'kind': 'path'}"
    ]


@pytest.mark.parametrize(
    "filename",
    [WHEEL.replace("manylinux_2_28_x86_64", "../../../etc/x"), WHEEL.replace("manylinux", "a/b"), "x.whl"],
)
def test_a_listed_name_that_is_no_plain_wheel_filename_is_never_opened(tmp_path: Path, filename: str) -> None:
    reuse = Reuse(
        job_id="j", filename=filename, source=OLD, sha256=SHA, size=len(BYTES), listed=(OLD,), missing=(NEW,),
        torches=("2.14",),
    )  # fmt: skip
    with pytest.raises(ReuseError, match="not a wheel filename this factory writes"):
        fetch(LocalStore(tmp_path), reuse, tmp_path)


def stable_wheel(directory: Path) -> Path:
    """A wheel of the job's name and label (the pipeline reads its bytes alone)."""
    version = "1.0+cu13.0.stable2.12.abi1.sm80"
    metadata = f"Metadata-Version: 2.1\nName: demo-stable\nVersion: {version}\n\n".encode()
    dist_info = f"demo_stable-{version}.dist-info"
    record = f"{dist_info}/METADATA,{record_hash(metadata)},{len(metadata)}\n{dist_info}/RECORD,,\n"
    path = directory / WHEEL
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/METADATA", (2024, 1, 1, 0, 0, 0)), metadata)
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", (2024, 1, 1, 0, 0, 0)), record)
    return path


def test_a_publishing_run_hands_the_build_the_fetched_file_and_lists_it_on_the_new_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    store = tmp_path / "index"
    job = stable_job(tmp_path, publish=f"publish: {{to: {store}}}\n")
    mf = load_matrix_file(tmp_path / "m.yaml")
    first = tmp_path / "first"
    first.mkdir()
    wheel = stable_wheel(first)
    entry = {"job_id": job.id, "variant_id": job.variant.id, "python": "3.11", "result": "ok"}
    (first / "report.json").write_text(json.dumps([{**entry, "wheel": wheel.name, "torches": ["2.12"]}]))
    publish_wheels([wheel], to=str(store), report=first / "report.json")
    old_page = index.project_page(OLD, "demo-stable")
    before = (store / old_page.state_key).read_bytes(), (store / old_page.html_key).read_bytes()
    out = tmp_path / "out"
    given: list[Reuse] = []

    def build(jobs: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        assert [j.id for j in jobs] == [job.id]
        given.append(reuse[job.id])
        fetched = reuse[job.id].wheel
        assert fetched is not None and fetched.read_bytes() == wheel.read_bytes()
        out.mkdir()
        shutil.copyfile(fetched, out / WHEEL)
        result = JobResult(
            **entry, wheel=WHEEL, torches=["2.12", "2.14"], checked_torches=["2.14"], reused_from=OLD
        )
        report = BuildReport(run_id="r", matrix=str(mf.path), started=0.0, jobs=[result])
        write_report(report, out / "report.json")
        return report

    said: list[str] = []
    outcome = build_matrix(mf, [job], build=build, output=out, publish=True, log=said.append)
    assert outcome.ok and [(r.source, r.missing, r.torches) for r in given] == [(OLD, (NEW,), ("2.14",))]
    assert f"{job.id}: {WHEEL} is published on {OLD}; reused for {NEW} after its check with torch 2.14 " in (
        "\n".join(said) + " "
    )
    assert outcome.published is not None
    statuses = {(f.variant_id, f.status) for f in outcome.published.files}
    assert statuses == {(OLD, "unchanged"), (NEW, "published")}
    new_page = index.project_page(NEW, "demo-stable")
    [listed] = index.records_from_project_json((store / new_page.state_key).read_bytes())
    assert (listed.filename, listed.sha256) == (WHEEL, hashlib.sha256(wheel.read_bytes()).hexdigest())
    assert ((store / old_page.state_key).read_bytes(), (store / old_page.html_key).read_bytes()) == before


@pytest.mark.parametrize("swapped", [False, True])
def test_a_signing_run_reuses_only_a_file_its_key_signed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, swapped: bool
) -> None:
    """Published signed for torch 2.12; torch 2.14 joins. A store writer swapped the file and rewrote its
    page to match: the run that would sign it afresh for 2.14's page refuses it instead, and 2.14's page gets
    nothing. Untouched, it is reused and signed for 2.14's page."""
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    store = tmp_path / "index"
    job = stable_job(tmp_path, publish=f"publish: {{to: {store}}}\n")
    mf = load_matrix_file(tmp_path / "m.yaml")
    first = tmp_path / "first"
    first.mkdir()
    wheel = stable_wheel(first)
    entry = {"job_id": job.id, "variant_id": job.variant.id, "python": "3.11", "result": "ok"}
    (first / "report.json").write_text(json.dumps([{**entry, "wheel": wheel.name, "torches": ["2.12"]}]))
    signer = new_signer()
    publish_wheels([wheel], to=str(store), report=first / "report.json", signer=signer)
    if swapped:
        stored = store / index.files_path(OLD, WHEEL)
        stored.chmod(0o644)
        stored.write_bytes(OTHER)
        page = store / index.project_page(OLD, "demo-stable").state_key
        [listed] = index.records_from_project_json(page.read_bytes())
        page.write_text(
            index.project_json(
                "demo-stable",
                [replace(listed, sha256=hashlib.sha256(OTHER).hexdigest(), size=len(OTHER))],
                variant_id=OLD,
            )
        )
    out = tmp_path / "out"
    given: list[Reuse] = []

    def build(jobs: Sequence[Job], reuse: Mapping[str, Reuse]) -> BuildReport:
        given.append(reuse[job.id])
        out.mkdir()
        fetched = reuse[job.id].wheel
        if fetched is None:  # as `accept_reused` fails it
            result = JobResult(**{**entry, "result": "failed"}, reason=reuse[job.id].problem, reused_from=OLD)
        else:
            shutil.copyfile(fetched, out / WHEEL)
            result = JobResult(**entry, wheel=WHEEL, torches=["2.12", "2.14"], reused_from=OLD)
        report = BuildReport(run_id="r", matrix=str(mf.path), started=0.0, jobs=[result])
        write_report(report, out / "report.json")
        return report

    said: list[str] = []
    outcome = build_matrix(mf, [job], build=build, output=out, publish=True, signer=signer, log=said.append)
    [reuse] = given
    new_sig = store / index.signature_path(NEW, WHEEL)
    if not swapped:
        assert outcome.ok and reuse.problem is None and outcome.published is not None
        assert new_sig.is_file()  # signed afresh for 2.14's page, as it was checked
        return
    assert reuse.wheel is None and reuse.problem is not None
    assert reuse.problem.startswith(f"{index.signature_path(OLD, WHEEL)}: the wheel's sha256 is ")
    assert reuse.problem.endswith("it changed after it was signed; not reused")
    assert f"{job.id}: the published wheel cannot be reused: {reuse.problem}" in said
    assert not outcome.ok and outcome.published is None
    assert not (store / "files" / NEW).exists() and not new_sig.exists()
