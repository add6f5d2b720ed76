"""The build record beside a published wheel (`factory.wheel.record`): its format, hostile input to its
parser, and publishing writing it once from a build report (a real directory store)."""

from __future__ import annotations

import dataclasses
import hashlib
import http.client
import json
import threading
import zipfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factory.cache.sync import CacheConfig
from factory.core.errors import CheckError
from factory.publish import index
from factory.publish.publisher import publish_wheels, repair_index
from factory.wheel import embedded, provenance
from factory.wheel import record as buildrecord
from factory.wheel.checks import record_hash
from factory.wheel.record import BuildRecord

SHA = "ab" * 32
RECORD = BuildRecord(
    filename="demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80-cp311-cp311-linux_x86_64.whl",
    sha256=SHA,
    provenance_sha256="cd" * 32,
    compile_cache="s3",
    cache_hits=12,
    compiled=3,
    image_id="sha256:" + "ef" * 32,
    factory_version="0.1.0",
    started="2026-12-07T00:00:00Z",
    finished="2026-12-07T00:10:00Z",
    ci_run_url="https://github.com/acme/wheels/actions/runs/123456",
)


def test_round_trip_and_stable_bytes() -> None:
    data = buildrecord.dumps(RECORD)
    assert buildrecord.parse(data) == RECORD
    assert buildrecord.dumps(buildrecord.parse(data)) == data
    assert data.endswith(b"\n") and data.isascii()


def test_unknowns_round_trip_as_null() -> None:
    bare = dataclasses.replace(
        RECORD, provenance_sha256=None, compile_cache=None, image_id=None, factory_version=None,
        started=None, finished=None, ci_run_url=None, cache_hits=0, compiled=0,
    )  # fmt: skip
    assert buildrecord.parse(buildrecord.dumps(bare)) == bare


def test_cache_setting_names_no_path() -> None:
    assert buildrecord.cache_setting(None) == "off"
    assert buildrecord.cache_setting(CacheConfig(local=Path("/home/x/.cache"))) == "local"
    assert buildrecord.cache_setting(CacheConfig(local=Path("/x"), store="s3://wheels/p")) == "s3"
    assert buildrecord.cache_setting(CacheConfig(local=Path("/x"), store="/srv/index/_cache")) == "directory"


GH = {"GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "a/b", "GITHUB_RUN_ID": "42"}


@pytest.mark.parametrize(
    ("env", "url"),
    [
        ({}, None),
        (GH, "https://github.com/a/b/actions/runs/42"),
        ({**GH, "GITHUB_RUN_ID": ""}, None),
        ({**GH, "GITHUB_SERVER_URL": "https://u:p@ghe.x"}, None),
        ({**GH, "GITHUB_SERVER_URL": "http://github.com"}, None),
        ({**GH, "GITHUB_REPOSITORY": "a/../b"}, None),
        ({**GH, "GITHUB_RUN_ID": "1x"}, None),
    ],
)
def test_ci_run_url_only_from_its_three_variables(env: dict[str, str], url: str | None) -> None:
    assert buildrecord.ci_run_url({**env, "GITHUB_TOKEN": "secret", "AWS_SECRET_ACCESS_KEY": "s"}) == url


def test_from_report_keeps_what_is_well_typed_only() -> None:
    report = {
        "started": 1796601600.5, "finished": "later", "factory_version": "0.1.0\x1b[2J",
        "compile_cache": "/srv/secret/path", "ci_run_url": "https://evil/x",
    }  # fmt: skip
    job = {"compiles_cached": -1, "compiles_compiled": True, "image_id": "sha256:" + "0" * 64}
    record = buildrecord.from_report(report, job, filename="w.whl", sha256=SHA, provenance_sha256=None)
    assert record.started == "2026-12-07T00:00:00Z" and record.finished is None
    assert record.factory_version is None and record.compile_cache is None and record.ci_run_url is None
    assert (record.cache_hits, record.compiled) == (0, 0)
    assert record.image_id == "sha256:" + "0" * 64
    buildrecord.parse(buildrecord.dumps(record))


def document(**changes: object) -> bytes:
    doc = json.loads(buildrecord.dumps(RECORD))
    for path, value in changes.items():
        target = doc
        *parents, last = path.split("__")
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"x" * (buildrecord.MAX_BYTES + 1), "over the 64 KiB"),
        (b"{", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b'{"format": NaN}', "not valid JSON"),
        (b'{"format": 1, "format": 1}', "duplicate key"),
        (b"[1]", "must be a JSON object"),
        (b"[" * 30000 + b"]" * 30000, "not valid JSON"),
        (document(format=2), "format 2 is not 1"),
        (document(format=True), "format true is not 1"),
        (document(wheel__sha256="AB" * 32), "record.wheel.sha256 must be a sha256"),
        (document(wheel__filename=7), "record.wheel.filename must be printable text"),
        (document(wheel__filename="a\nb"), "record.wheel.filename must be printable text"),
        (document(wheel__filename="x" * 600), "at most 512"),
        (document(compile_cache__hits=-1), "record.compile_cache.hits must be a count"),
        (document(compile_cache__hits=1.5), "record.compile_cache.hits must be a count"),
        (document(compile_cache__compiled=False), "record.compile_cache.compiled must be a count"),
        (document(compile_cache__setting="s3://bucket/key"), "must be one of off, local"),
        (document(started="yesterday"), "record.started must be a UTC time"),
        (document(ci_run_url="javascript:alert(1)"), "record.ci_run_url must be a CI run"),
        (document(image_id=["x"]), "record.image_id must be printable text"),
        (document(compile_cache=KeyError), "record.compile_cache is missing"),
        (document(extra="x"), "record.extra is not a field"),
    ],
)
def test_hostile_records_are_refused_in_one_line(data: bytes, why: str) -> None:
    with pytest.raises(CheckError, match=why) as caught:
        buildrecord.parse(data, where="w.whl.build.json")
    assert str(caught.value).startswith("w.whl.build.json: ") and "\n" not in str(caught.value)


@given(st.binary(max_size=300))
def test_any_bytes_parse_or_refuse_in_one_line(data: bytes) -> None:
    try:
        buildrecord.parse(data)
    except CheckError as exc:
        assert "\n" not in str(exc)


# --- publishing --------------------------------------------------------------------------------------------

LABEL = "cu13.0.torch2.14.abi1.sm80.90"
VID = "cu130-torch2.14-abi1-sm80.90"
VERSION = f"0.1.0+{LABEL}"
DIST_INFO = f"demo_ext-{VERSION}.dist-info"
PROVENANCE = b'{"format": 1}\n'  # its bytes are named by sha256; publishing does not parse them


def wheel(
    directory: Path, provenance_file: bytes = PROVENANCE, extra: dict[str, bytes] | None = None
) -> Path:
    files = {
        "demo_ext/__init__.py": b"X = 1\n",
        f"{DIST_INFO}/METADATA": f"Metadata-Version: 2.1\nName: demo-ext\nVersion: {VERSION}\n\n".encode(),
        f"{DIST_INFO}/{provenance.FILE_NAME}": provenance_file,
        **{f"{DIST_INFO}/{name}": data for name, data in (extra or {}).items()},
    }
    record = [f"{n},{record_hash(d)},{len(d)}" for n, d in files.items()] + [f"{DIST_INFO}/RECORD,,"]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"demo_ext-{VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{DIST_INFO}/RECORD", "\n".join(record) + "\n")
    return path


def report(path: Path, wheel_name: str, *, hits: int, started: float) -> Path:
    job = {
        "job_id": "j", "variant_id": VID, "python": "3.11", "result": "ok", "package": "demo-ext",
        "wheel": wheel_name, "image_id": "sha256:" + "1" * 64, "compiles_cached": hits,
        "compiles_compiled": 0,
    }  # fmt: skip
    doc = {
        "run_id": "r", "started": started, "finished": started + 60, "factory_version": "0.1.0",
        "compile_cache": "local", "ci_run_url": None, "jobs": [job],
    }  # fmt: skip
    path.write_text(json.dumps(doc))
    return path


def test_publish_writes_the_record_once_and_none_without_a_report(tmp_path: Path) -> None:
    built = wheel(tmp_path / "wh")
    to = tmp_path / "index"
    first = report(tmp_path / "r1.json", built.name, hits=5, started=1796601600)
    publish_wheels([built], to=str(to), report=first)
    key = to / index.build_record_path(VID, built.name)
    written = key.read_bytes()
    record = buildrecord.parse(written)
    assert record.filename == built.name and record.sha256 == hashlib.sha256(built.read_bytes()).hexdigest()
    assert record.provenance_sha256 == hashlib.sha256(PROVENANCE).hexdigest()
    assert (record.compile_cache, record.cache_hits, record.started) == ("local", 5, "2026-12-07T00:00:00Z")
    # publishing again, from another report of the same wheel, changes nothing
    again = report(tmp_path / "r2.json", built.name, hits=0, started=1796605200)
    events: list[tuple[str, str]] = []
    publish_wheels([built], to=str(to), report=again, progress=lambda e, k: events.append((e, k)))
    assert key.read_bytes() == written
    assert ("unchanged", index.build_record_path(VID, built.name)) in events
    # a wheel published without a report has no record
    bare = tmp_path / "bare"
    publish_wheels([built], to=str(bare))
    assert not (bare / index.build_record_path(VID, built.name)).exists()
    assert (bare / index.files_path(VID, built.name)).is_file()


def test_a_report_of_other_wheels_writes_no_record(tmp_path: Path) -> None:
    built = wheel(tmp_path / "wh")
    name = f"demo_ext-0.2.0+{LABEL}-py3-none-any.whl"
    other = report(tmp_path / "r.json", name, hits=1, started=1796601600)
    publish_wheels([built], to=str(tmp_path / "index"), report=other)
    assert not (tmp_path / "index" / index.build_record_path(VID, built.name)).exists()


def test_a_valid_provenance_is_published_beside_its_wheel_byte_for_byte_once(tmp_path: Path) -> None:
    from test_provenance import make_facts

    document = provenance.dumps(provenance.compose(make_facts()))
    built = wheel(tmp_path / "wh", document)
    to = tmp_path / "index"
    events: list[tuple[str, str]] = []
    publish_wheels([built], to=str(to), progress=lambda e, k: events.append((e, k)))
    key = index.provenance_path(VID, built.name)
    assert (to / key).read_bytes() == document
    assert ("provenance", key) in events
    events.clear()
    publish_wheels([built], to=str(to), progress=lambda e, k: events.append((e, k)))
    assert ("unchanged", key) in events
    # one that does not parse is not put where a client would take it for the wheel's provenance
    bad = wheel(tmp_path / "bad")
    publish_wheels([bad], to=str(tmp_path / "other"))
    assert not (tmp_path / "other" / key).exists()


def test_a_valid_sbom_is_published_beside_its_wheel_byte_for_byte_once(tmp_path: Path) -> None:
    from test_provenance import NEEDED, make_facts

    made = embedded.files(make_facts(), NEEDED)
    document = made.pop(provenance.FILE_NAME)
    ((sbom_name, sbom_file),) = made.items()
    built = wheel(tmp_path / "wh", document, made)
    to = tmp_path / "index"
    events: list[tuple[str, str]] = []
    publish_wheels([built], to=str(to), progress=lambda e, k: events.append((e, k)))
    key = index.sbom_path(VID, built.name)
    assert key == index.files_path(VID, built.name) + ".sbom.cdx.json"
    assert (to / key).read_bytes() == sbom_file
    assert ("sbom", key) in events
    # the grid records it, and the human page links it, as the provenance
    assert 'data-s="pc"' in (to / "index.html").read_text()
    events.clear()
    publish_wheels([built], to=str(to), progress=lambda e, k: events.append((e, k)))
    assert ("unchanged", key) in events
    # repair finds what is beside each wheel in the store alone
    (to / key).unlink()
    repair_index(to=str(to))
    assert 'data-s="p"' in (to / "index.html").read_text()
    # an SBOM that is no CycloneDX document, or one a provenance that does not parse names, is not put
    # where a client would take it for the wheel's SBOM
    for name, wheel_prov, wheel_sbom in (
        ("bad-sbom", document, b'{"bomFormat": "nonsense"}'),
        ("bad-prov", PROVENANCE, sbom_file),
    ):
        bad = wheel(tmp_path / name, wheel_prov, {sbom_name: wheel_sbom})
        publish_wheels([bad], to=str(tmp_path / name / "index"))
        assert not (tmp_path / name / "index" / key).exists()
        assert (tmp_path / name / "index" / index.files_path(VID, built.name)).is_file()


# --- a failed job's record ---------------------------------------------------------------------------------

FAILED_JOB = {
    "job_id": f"{VID}-py312", "variant_id": VID, "python": "3.12", "result": "oom", "package": "demo-ext",
    "wheel": None, "reason": "killed at 9.5 GiB\nTraceback (most recent call last):", "image_id": None,
    "compiles_cached": 2, "compiles_compiled": 7,
}  # fmt: skip
TOP = {"started": 1796601600, "finished": 1796602200, "factory_version": "0.1.0", "compile_cache": "s3"}


def failed_record() -> BuildRecord:
    return buildrecord.from_report(TOP, FAILED_JOB, filename=None, sha256=None, provenance_sha256=None)


def test_a_failed_jobs_record_round_trips() -> None:
    record = failed_record()
    assert record.failure == buildrecord.Failure(
        job_id=f"{VID}-py312", result="oom", reason="killed at 9.5 GiB"
    )
    assert (record.filename, record.sha256, record.compiled, record.cache_hits) == (None, None, 7, 2)
    data = buildrecord.dumps(record)
    doc = json.loads(data)
    assert doc["wheel"] is None and doc["failed"]["result"] == "oom"
    assert buildrecord.parse(data) == record and buildrecord.dumps(buildrecord.parse(data)) == data
    assert any(line.startswith("failed      job ") for line in buildrecord.describe(record))
    # a reason of any length is cut to fit the format
    long = buildrecord.from_report(
        TOP, {**FAILED_JOB, "reason": "x" * 5000}, filename=None, sha256=None, provenance_sha256=None
    )
    assert buildrecord.parse(buildrecord.dumps(long)) == long


def test_a_wheels_record_is_written_as_before() -> None:
    """Records written before failed jobs had any keep their bytes: no field was added to a wheel's."""
    expected = {
        "format": 1,
        "wheel": {"filename": RECORD.filename, "sha256": SHA},
        "provenance_sha256": "cd" * 32,
        "compile_cache": {"setting": "s3", "hits": 12, "compiled": 3},
        "image_id": "sha256:" + "ef" * 32,
        "factory_version": "0.1.0",
        "started": "2026-12-07T00:00:00Z",
        "finished": "2026-12-07T00:10:00Z",
        "ci_run_url": "https://github.com/acme/wheels/actions/runs/123456",
    }
    text = json.dumps(expected, sort_keys=True, indent=2, ensure_ascii=True) + "\n"
    assert buildrecord.dumps(RECORD) == text.encode()


@pytest.mark.parametrize(
    ("job", "why"),
    [
        ({**FAILED_JOB, "result": "ok"}, "is not a failure"),
        ({**FAILED_JOB, "job_id": "../../etc"}, "cannot name a failed job's build record"),
        ({**FAILED_JOB, "job_id": 7}, "cannot name a failed job's build record"),
    ],
)
def test_only_a_failed_job_with_a_key_safe_id_gets_a_failed_record(job: dict[str, object], why: str) -> None:
    with pytest.raises(CheckError, match=why):
        buildrecord.from_report(TOP, job, filename=None, sha256=None, provenance_sha256=None)


def failed_document(**changes: object) -> bytes:
    doc = json.loads(buildrecord.dumps(failed_record()))
    for path, value in changes.items():
        *parents, last = path.split("__")
        target = doc
        for key in parents:
            target = target[key]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (failed_document(wheel={"filename": "w.whl", "sha256": SHA}), "record.wheel must be null"),
        (failed_document(failed=KeyError), "record.wheel must be a mapping"),
        (document(failed={"job_id": "j", "result": "oom", "reason": None}), "record.wheel must be null"),
        (failed_document(failed__result="ok"), "record.failed.result must be one of failed, oom"),
        (failed_document(failed__job_id="a/b"), "record.failed.job_id must be a job id"),
        (failed_document(failed__reason="a\nb"), "record.failed.reason must be printable text"),
        (failed_document(failed__extra=1), "record.failed.extra is not a field"),
        (failed_document(failed__job_id=KeyError), "record.failed.job_id is missing"),
        (failed_document(failed=[]), "record.failed must be a mapping"),
    ],
)
def test_hostile_failed_records_are_refused_in_one_line(data: bytes, why: str) -> None:
    with pytest.raises(CheckError, match=why) as caught:
        buildrecord.parse(data, where="f.build.json")
    assert str(caught.value).startswith("f.build.json: ") and "\n" not in str(caught.value)


def failed_report(path: Path, wheel_name: str, *, started: float) -> Path:
    path = report(path, wheel_name, hits=0, started=started)
    doc = json.loads(path.read_text())
    doc["jobs"].append(FAILED_JOB)
    path.write_text(json.dumps(doc))
    return path


def test_publish_writes_a_failed_jobs_record_once_per_failure_and_the_cell_links_it(tmp_path: Path) -> None:
    from factory.publish.indexcheck import check_index
    from factory.publish.serve import ServeOptions, make_server
    from factory.publish.stores import LocalStore

    built = wheel(tmp_path / "wh")
    to = tmp_path / "index"
    events: list[tuple[str, str]] = []
    first = failed_report(tmp_path / "r1.json", built.name, started=1796601600)
    publish_wheels([built], to=str(to), report=first, progress=lambda e, k: events.append((e, k)))
    [key] = [k for e, k in events if k.startswith(index.FAILED_RECORDS_DIR)]
    assert events.count(("build-record", key)) == 1
    assert index.parse_failed_record_key(key) == (VID, f"{VID}-py312")
    written = (to / key).read_bytes()
    assert key == index.failed_record_path(VID, f"{VID}-py312", hashlib.sha256(written).hexdigest())
    assert buildrecord.parse(written).failure is not None
    [cell] = [c for c in index.cells_from_json((to / index.MATRIX_STATE).read_text()) if c.status == "failed"]
    assert cell.record == key and cell.detail == "oom: killed at 9.5 GiB"
    assert f'<a href="{key}">build record</a>' in (to / "index.html").read_text()
    # the same report again: nothing new, nothing rewritten
    events.clear()
    publish_wheels([built], to=str(to), report=first, progress=lambda e, k: events.append((e, k)))
    assert ("unchanged", key) in events and (to / key).read_bytes() == written
    # the job failing again in a later run: its own record, the earlier one kept, the cell links the later
    later = failed_report(tmp_path / "r2.json", built.name, started=1796605200)
    publish_wheels([built], to=str(to), report=later)
    records = sorted(p.relative_to(to).as_posix() for p in (to / "_builds").rglob("*.build.json"))
    assert len(records) == 2 and key in records and (to / key).read_bytes() == written
    [newer] = [r for r in records if r != key]
    [cell] = [c for c in index.cells_from_json((to / index.MATRIX_STATE).read_text()) if c.status == "failed"]
    assert cell.record == newer
    # `factory index check` takes the records as the index's own; `factory serve` serves them, immutable
    checked = check_index(to=str(to))
    assert checked.ok, checked.problems
    repair_index(to=str(to))
    assert (to / key).read_bytes() == written and (to / newer).is_file()
    assert newer in [c.record for c in index.cells_from_json((to / index.MATRIX_STATE).read_text())]
    server = make_server(LocalStore(to), ServeOptions(port=0), log=lambda _line: None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        conn.request("GET", f"/{key}")
        resp = conn.getresponse()
        assert (resp.status, resp.read()) == (200, written)
        assert resp.getheader("Content-Type") == "application/json"
        assert resp.getheader("Cache-Control") == index.FILE_CACHE_CONTROL
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(30)
