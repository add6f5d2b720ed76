"""Reading torch's wheels on an index: the pure parsing, the cache and its revalidation, range requests, and
what a hostile index gets (a fact missing and a reason, never a traceback or an unbounded read)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
import zipfile
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from packaging.version import Version

from factory.plan.pipindex import IndexClient, PipSettings
from factory.plan.torchindex import (
    MAX_HEADER,
    TorchIndex,
    TorchSource,
    build_of_local,
    build_of_version_py,
    cuda_of_metadata,
    cxx_std_of_header,
    facts_of_zip,
    glibc_of,
    metadata_offered,
    parse_torch_file,
)
from factory.spec.options import FetchLimits
from tests.torch_index_helpers import GUARD, TorchWheel, make_index, write_wheel

# ---------------------------------------------------------------------------------------------- pure parsing


@pytest.mark.parametrize(
    ("label", "build"),
    [
        ("cu130", ("cuda", "13.0")),
        ("cu128", ("cuda", "12.8")),
        ("cu118", ("cuda", "11.8")),
        ("cu92", ("cuda", "9.2")),
        ("cu1210", ("cuda", "12.10")),
        ("cpu", ("cpu", "")),
        ("rocm6.4", ("other", "rocm6.4")),
        ("cxx11.abi", ("other", "cxx11.abi")),
        (None, None),
        ("", None),
    ],
)
def test_local_label_says_the_build(label: str | None, build: tuple[str, str] | None) -> None:
    assert build_of_local(label) == build


@pytest.mark.parametrize(
    ("platform", "glibc"),
    [
        ("manylinux_2_28_x86_64", (2, 28)),
        ("manylinux_2_34_aarch64", (2, 34)),
        ("manylinux2014_x86_64", (2, 17)),
        ("manylinux1_x86_64", (2, 5)),
        ("macosx_14_0_arm64", None),
        ("win_amd64", None),
        ("musllinux_1_2_x86_64", None),
    ],
)
def test_glibc_of_the_manylinux_tag(platform: str, glibc: tuple[int, int] | None) -> None:
    assert glibc_of(platform) == glibc


def test_cuda_of_metadata_reads_cuda_toolkit_and_runtime_pins() -> None:
    assert cuda_of_metadata(TorchWheel("2.14.1", "13.0").metadata()) == ("13.0", 13)
    assert cuda_of_metadata(TorchWheel("2.10.0", "12.8").metadata()) == ("12.8", 12)
    assert cuda_of_metadata(TorchWheel("2.13.0+cpu", None).metadata()) == (None, None)


def test_cuda_of_metadata_major_only_extras_ignored_bad_lines_skipped() -> None:
    text = (
        "Metadata-Version: 2.1\nName: torch\nVersion: 2.9.0\n"
        "Requires-Dist: nvidia-cublas-cu12==12.8.4.1; platform_system == 'Linux'\n"
        "Requires-Dist: this is ((( not a requirement\n"
        'Requires-Dist: cuda-toolkit==11.8; extra == "old"\n\n'
    )
    assert cuda_of_metadata(text) == (None, 12)
    assert cuda_of_metadata("\x00\x01 garbage") == (None, None)


def test_version_py_is_read_as_data_not_run(tmp_path: Path) -> None:
    assert build_of_version_py("cuda: Optional[str] = '13.0'\nhip = None\n") == ("cuda", "13.0")
    assert build_of_version_py("cuda = None\nhip = None\n") == ("cpu", "")
    assert build_of_version_py("cuda = None\nhip = '6.4.1'\n") == ("other", "rocm6.4.1")
    marker = tmp_path / "ran"
    evil = f"import pathlib; pathlib.Path({str(marker)!r}).touch()\ncuda = __import__('os').name\n"
    assert build_of_version_py(evil) is None
    assert not marker.exists()
    assert build_of_version_py("cuda = '13.0; rm -rf /'\n") is None
    assert build_of_version_py("def (:\n") is None


def test_cxx_std_from_the_aten_guard() -> None:
    assert cxx_std_of_header("#pragma once\n" + GUARD["20"]) == "20"
    assert cxx_std_of_header(GUARD["17"]) == "17"
    assert cxx_std_of_header("#pragma once\n#include <ATen/Context.h>\n") is None
    # a comparison without an #error after it is no requirement
    assert cxx_std_of_header("#if __cplusplus < 202002L\n#define OLD 1\n#endif\n") is None
    assert cxx_std_of_header("#if __cplusplus < 201703L\n#error no\n#endif\n" + GUARD["20"]) == "20"


def test_torch_filenames() -> None:
    f = parse_torch_file("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "u", None, "w")
    assert f is not None
    assert f.version == Version("2.13.0+cpu")
    assert f.label_build == ("cpu", "")
    assert f.pythons == ("3.11",) and f.glibc == (2, 28) and f.runs_on()
    ft = parse_torch_file("torch-2.14.1-cp314-cp314t-manylinux_2_28_x86_64.whl", "u", None, "w")
    assert ft is not None and ft.pythons == ("3.14",) and ft.label_build is None
    mac = parse_torch_file("torch-2.14.1-cp311-none-macosx_14_0_arm64.whl", "u", None, "w")
    assert mac is not None and not mac.runs_on() and mac.glibc is None
    for other in (
        "torchvision-0.29.1-cp311-cp311-manylinux_2_28_x86_64.whl",
        "torch-2.14.1.tar.gz",
        "torch-2.14.1-cp311.whl",
        "torch-not.a.version-cp311-cp311-linux_x86_64.whl",
    ):
        assert parse_torch_file(other, "u", None, "w") is None


def test_metadata_offered_in_html_and_json() -> None:
    html = (
        b'<a href="a/torch-1-py3-none-any.whl#sha256=00" data-dist-info-metadata="sha256=11">x</a>'
        b'<a href="torch-2-py3-none-any.whl" data-core-metadata="true">y</a>'
        b'<a href="torch-3-py3-none-any.whl" data-core-metadata="false">z</a>'
        b'<a href="torch-4-py3-none-any.whl">w</a>'
    )
    assert metadata_offered(html, "text/html") == {"torch-1-py3-none-any.whl", "torch-2-py3-none-any.whl"}
    doc = (
        b'{"files": [{"filename": "a.whl", "url": "a.whl", "core-metadata": {"sha256": "1"}},'
        b'{"filename": "b.whl", "url": "b.whl", "core-metadata": false}, {"filename": "c.whl"}, 7]}'
    )
    assert metadata_offered(doc, "application/vnd.pypi.simple.v1+json") == {"a.whl"}
    assert metadata_offered(b"not json", "application/vnd.pypi.simple.v1+json") == frozenset()


def test_facts_of_a_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    write_wheel(wheel, TorchWheel("2.14.1", "13.0", cxx_std="20"), "cp311-cp311-manylinux_2_28_x86_64")
    with zipfile.ZipFile(wheel) as zf:
        facts = facts_of_zip(zf)
    assert (facts.build, facts.build_from, facts.cuda_major, facts.cxx_std) == (
        ("cuda", "13.0"),
        "headers",
        13,
        "20",
    )


def test_a_member_declared_too_large_is_refused(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/version.py", "cuda = '13.0'\n" + " " * (5 * 2**20))
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ValueError, match="larger than 4 MiB"):
        facts_of_zip(zf)


# -------------------------------------------------------------------------------------- an index over HTTP


class Served:
    """A local index over HTTP that counts requests, gives ETags, answers Range requests (each optional)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.etag = True
        self.last_modified: str | None = None  # served, and If-Modified-Since honoured, when set
        self.ranges = True
        self.range_lie: str | None = None  # "header", "length" or "offset": a range answer that lies
        self.extra_page: bytes | None = None  # served instead of a page, for hostile pages
        self.drip = False
        self.released = threading.Event()
        served = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                served.requests.append((self.path, {k.lower(): v for k, v in self.headers.items()}))
                path = served.root / self.path.lstrip("/").split("?")[0]
                if path.is_dir():
                    path = path / "index.html"
                if not path.is_file():
                    self.send_error(404)
                    return
                body = (
                    served.extra_page
                    if (served.extra_page and path.name == "index.html")
                    else path.read_bytes()
                )
                etag = '"' + hashlib.sha256(body).hexdigest()[:16] + '"'
                since = self.headers.get("If-Modified-Since")
                if (served.etag and self.headers.get("If-None-Match") == etag) or (
                    served.last_modified and since == served.last_modified
                ):
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                want = self.headers.get("Range")
                if want and served.ranges:
                    first, _, last = want.removeprefix("bytes=").partition("-")
                    start = len(body) - int(last) if first == "" else int(first)
                    end = len(body) - 1 if first == "" or not last else min(int(last), len(body) - 1)
                    start = max(start, 0)
                    self.send_response(206)
                    said_start = 0 if served.range_lie == "offset" and start > 0 else start
                    if served.range_lie != "header":
                        self.send_header("Content-Range", f"bytes {said_start}-{end}/{len(body)}")
                    body = body[start : end + 1]
                    if served.range_lie == "length":
                        body = body[:-64]  # (a longer one is cut at the asked size: no ranges, bounded)
                else:
                    self.send_response(200)
                self.send_header("Content-Type", "text/html" if path.suffix == ".html" else "application/zip")
                if served.etag:
                    self.send_header("ETag", etag)
                if served.last_modified:
                    self.send_header("Last-Modified", served.last_modified)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if served.drip:  # one byte, then nothing until the test is over: a page that never ends
                    self.wfile.write(body[:1])
                    self.wfile.flush()
                    served.released.wait(timeout=60)
                    return
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda *args: None  # type: ignore[method-assign]  # a client that hung up
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def count(self, suffix: str) -> int:
        return sum(1 for path, _ in self.requests if path.split("?")[0].endswith(suffix))


@pytest.fixture(scope="module")
def wheels_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("served")
    wheels = [TorchWheel("2.14.1", "13.0", cxx_std="20", bulk=2_500_000), TorchWheel("2.13.0+cpu", None)]
    make_index(root, wheels, metadata=False)
    return root


@pytest.fixture
def served(wheels_root: Path) -> Iterator[Served]:
    s = Served(wheels_root)
    yield s
    s.released.set()
    s.server.shutdown()
    s.server.server_close()


def _index(home: Path, **limits: float) -> TorchIndex:
    return TorchIndex(http=IndexClient(PipSettings()), home=home, limits=FetchLimits(**limits))  # type: ignore[arg-type]


def test_page_is_revalidated_with_its_etag(served: Served, tmp_path: Path) -> None:
    source = TorchSource.from_url(served.url + "/simple")
    first = _index(tmp_path).files(source)
    assert {f.filename for f in first} >= {"torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"}
    again = _index(tmp_path).files(
        source
    )  # a new run: the page cached under FACTORY_HOME, asked with its ETag
    assert [f.filename for f in again] == [f.filename for f in first]
    pages = [h for path, h in served.requests if path.endswith("/torch/")]
    assert len(pages) == 2 and "if-none-match" not in pages[0] and pages[1]["if-none-match"]


def test_page_is_revalidated_with_its_last_modified(served: Served, tmp_path: Path) -> None:
    served.etag = False
    served.last_modified = "Sun, 06 Dec 2026 10:00:00 GMT"
    source = TorchSource.from_url(served.url + "/simple")
    first = _index(tmp_path).files(source)
    again = _index(tmp_path).files(source)
    assert [f.filename for f in again] == [f.filename for f in first] and first
    pages = [h for path, h in served.requests if path.endswith("/torch/")]
    assert [h.get("if-modified-since") for h in pages] == [None, served.last_modified]
    served.last_modified = "Mon, 07 Dec 2026 10:00:00 GMT"  # the page changed: read again, in full
    assert [f.filename for f in _index(tmp_path).files(source)] == [f.filename for f in first]
    assert served.count("/torch/") == 3


def test_page_without_validators_is_reused_within_the_ttl(served: Served, tmp_path: Path) -> None:
    served.etag = False
    source = TorchSource.from_url(served.url + "/simple")
    _index(tmp_path).files(source)
    _index(tmp_path).files(source)
    assert served.count("/torch/") == 1
    stale = _index(tmp_path)
    stale.ttl = 0
    stale.files(source)
    assert served.count("/torch/") == 2


def test_wheel_facts_by_range_requests_then_from_the_cache(served: Served, tmp_path: Path) -> None:
    source = TorchSource.from_url(served.url + "/simple")
    index = _index(tmp_path)
    f = next(f for f in index.files(source) if f.version == Version("2.14.1"))
    facts = index.facts(f)
    assert (facts.build, facts.cxx_std) == (("cuda", "13.0"), "20")
    size = (served.root / "simple/torch" / f.filename).stat().st_size
    wheel_requests = [h for path, h in served.requests if path.endswith(".whl")]
    assert wheel_requests and all("range" in h for h in wheel_requests)
    assert len(wheel_requests) < 6 and size > 2_000_000  # each asks for at most 256 KiB
    [entry] = (tmp_path / "torch-index" / "wheels").iterdir()  # named by the URL and hash, not the hash alone
    assert entry.name != f"{f.digest[1]}.json"  # type: ignore[index]
    before = served.count(".whl")
    assert _index(tmp_path).facts(f) == facts  # another run: no request for the wheel at all
    assert served.count(".whl") == before


def test_a_server_without_ranges_gets_a_bounded_full_download(served: Served, tmp_path: Path) -> None:
    served.ranges = False
    source = TorchSource.from_url(served.url + "/simple")
    index = _index(tmp_path)
    f = next(f for f in index.files(source) if f.version == Version("2.14.1"))
    assert index.facts(f).cxx_std == "20"
    small = _index(tmp_path / "other", download_bytes=100_000)
    g = next(x for x in small.files(source) if x.version == Version("2.14.1"))
    facts = small.facts(g)
    assert facts.cxx_std is None and "larger than" in facts.problems[0]
    assert not list((tmp_path / "other" / "torch-index").glob("wheels/*"))  # a failure is not cached


def _liar(root: Path, honest: Served) -> Served:
    """An index whose torch 2.14.1 is a CUDA 12.8 / C++17 build, its page giving the sha256 of `honest`'s."""
    simple = make_index(root, [TorchWheel("2.14.1", "12.8", cxx_std="17", pythons=("3.11",))], metadata=False)
    page = simple / "torch" / "index.html"
    name = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    own = hashlib.sha256((simple / "torch" / name).read_bytes()).hexdigest()
    honest_sha = hashlib.sha256((honest.root / "simple" / "torch" / name).read_bytes()).hexdigest()
    page.write_text(page.read_text().replace(own, honest_sha))
    return Served(root)


@pytest.mark.parametrize("ranges", [True, False])
def test_an_index_claiming_another_indexs_hash_cannot_poison_its_facts(
    served: Served, tmp_path: Path, ranges: bool
) -> None:
    liar = _liar(tmp_path / "liar", served)
    liar.ranges = served.ranges = ranges
    try:
        lying = _index(tmp_path / "home")
        g = next(x for x in lying.files(TorchSource.from_url(liar.url + "/simple")) if x.pythons == ("3.11",))
        said = lying.facts(g)
        if ranges:  # read in part, it cannot be told from its claim: its facts are its own URL's
            assert (said.build, said.cxx_std) == (("cuda", "12.8"), "17")
        else:  # read whole, its bytes are not the ones its index names: nothing is cached
            assert said.build is None and "its bytes hash to" in said.problems[0]
        honest = _index(tmp_path / "home")  # a later run, the same cache
        f = next(
            x for x in honest.files(TorchSource.from_url(served.url + "/simple")) if x.filename == g.filename
        )
        assert f.digest == g.digest  # the same claim
        facts = honest.facts(f)
        assert (facts.build, facts.cxx_std) == (("cuda", "13.0"), "20")
        assert served.count(".whl") > 0  # read from the honest index itself
    finally:
        liar.server.shutdown()
        liar.server.server_close()


@pytest.mark.parametrize(
    ("lie", "says"),
    [
        ("header", "a range answer without a Content-Range"),
        ("length", "a range answer of another length than its Content-Range says"),
        ("offset", "a range answer of another length than its Content-Range says"),
    ],
)
def test_a_range_answer_that_lies_leaves_the_facts_missing(
    served: Served, tmp_path: Path, lie: str, says: str
) -> None:
    served.range_lie = lie
    index = _index(tmp_path)
    f = next(
        f for f in index.files(TorchSource.from_url(served.url + "/simple")) if f.version == Version("2.14.1")
    )
    facts = index.facts(f)
    assert facts.cxx_std is None and facts.build is None
    assert says in facts.problems[0] and "\n" not in facts.problems[0]
    assert not list((tmp_path / "torch-index").glob("wheels/*"))  # nothing of it cached


def test_a_huge_page_is_refused_with_a_reason(served: Served, tmp_path: Path) -> None:
    served.extra_page = b"<a href='x'>x</a>" * 100_000
    index = _index(tmp_path, page_bytes=100_000)
    assert index.files(TorchSource.from_url(served.url + "/simple")) == []
    assert "larger than" in index.problems[0]


def test_a_slow_page_is_cut_at_its_deadline(served: Served, tmp_path: Path) -> None:
    served.drip = True
    index = _index(tmp_path, page_seconds=0.5)
    assert index.files(TorchSource.from_url(served.url + "/simple")) == []
    assert "not done within 0.5 s" in index.problems[0]


def test_a_remote_page_linking_to_local_files_is_refused(served: Served, tmp_path: Path) -> None:
    served.extra_page = b'<a href="file:///etc/passwd">torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl</a>'
    index = _index(tmp_path)
    assert index.files(TorchSource.from_url(served.url + "/simple")) == []
    assert "only a local index or find-links may link" in index.problems[0]


def test_bad_metadata_and_a_broken_wheel_leave_facts_missing(tmp_path: Path) -> None:
    simple = make_index(tmp_path / "idx", [TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=("3.11",))])
    page = simple / "torch"
    name = "torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"
    (page / f"{name}.metadata").write_bytes(b"\xff\xfe garbage \x00")
    (page / name).write_bytes(b"PK\x03\x04 not really a zip")
    index = _index(tmp_path / "home")
    (f,) = index.files(TorchSource.from_url(simple.as_uri()))
    facts = index.facts(f)
    assert facts.build is None and facts.cxx_std is None
    assert facts.problems and facts.problems[0].startswith(f"cannot read {name}")


def test_metadata_file_gives_the_cuda_of_a_plain_build(tmp_path: Path) -> None:
    simple = make_index(tmp_path / "idx", [TorchWheel("2.10.0", "12.8", pythons=("3.11",))])
    index = _index(tmp_path / "home")
    (f,) = index.files(TorchSource.from_url(simple.as_uri()))
    assert f.metadata
    facts = index.facts(f)
    assert (facts.build, facts.build_from, facts.cxx_std) == (("cuda", "12.8"), "metadata", "17")


def test_a_local_metadata_file_that_is_a_fifo_is_refused_not_waited_on(tmp_path: Path) -> None:
    simple = make_index(tmp_path / "idx", [TorchWheel("2.10.0", "12.8", pythons=("3.11",))])
    name = "torch-2.10.0-cp311-cp311-manylinux_2_28_x86_64.whl"
    (simple / "torch" / f"{name}.metadata").unlink()
    os.mkfifo(simple / "torch" / f"{name}.metadata")
    index = _index(tmp_path / "home")
    (f,) = index.files(TorchSource.from_url(simple.as_uri()))
    facts = index.facts(f)
    assert facts.build == ("cuda", "12.8") and facts.build_from == "headers"  # version.py still tells
    assert index.problems == [f"{name}.metadata: not a regular file"]


# ------------------------------------------------------------------------------------ the page cache, hostile


def _planted(served: Served, tmp_path: Path, plant: Callable[[Path], None]) -> TorchIndex:
    """A page read and cached, its cache entry replaced by `plant`, then the page read again by a new run
    (within the TTL, without validators: the cache alone would answer)."""
    served.etag = False
    source = TorchSource.from_url(served.url + "/simple")
    assert _index(tmp_path).files(source)
    (entry,) = (tmp_path / "torch-index" / "pages").iterdir()
    entry.unlink()
    plant(entry)
    again = _index(tmp_path)
    assert {f.filename for f in again.files(source)} >= {"torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"}
    return again


@pytest.mark.timeout(20)
def test_a_fifo_planted_as_a_page_cache_entry_is_a_miss_not_a_hang(served: Served, tmp_path: Path) -> None:
    again = _planted(served, tmp_path, os.mkfifo)
    assert again.problems == [] and served.count("/torch/") == 2


def test_a_page_cache_entry_over_the_page_cap_is_a_miss(served: Served, tmp_path: Path) -> None:
    served.etag = False
    source = TorchSource.from_url(served.url + "/simple")
    assert _index(tmp_path, page_bytes=100_000).files(source)
    (entry,) = (tmp_path / "torch-index" / "pages").iterdir()
    doc = json.loads(entry.read_text())
    planted = "torch-9.9.9-cp311-cp311-manylinux_2_28_x86_64.whl"
    doc["files"] = [[planted, f"{served.url}/{planted}", None]]
    entry.write_text(json.dumps(doc) + " " * 100_000)  # well-formed, and larger than a page may be
    again = _index(tmp_path, page_bytes=100_000).files(source)
    assert planted not in {f.filename for f in again} and served.count("/torch/") == 2


def test_a_page_cache_entry_of_a_gib_is_a_miss_never_read_whole(served: Served, tmp_path: Path) -> None:
    def huge(entry: Path) -> None:
        with entry.open("wb") as fh:
            fh.truncate(2**30)  # sparse: no disk, and no 2.6 GiB of memory to parse it

    _planted(served, tmp_path, huge)
    assert served.count("/torch/") == 2


@pytest.mark.parametrize(
    "change",
    [
        {"fetched": [1]},
        {"fetched": "yesterday"},
        {"etag": ["x"]},
        {"files": [[1, 2, 3]]},
        {"files": [["torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "file:///etc/passwd", None]]},
        {"files": [["a.whl", "http://x/a.whl", [1]]]},
        {"metadata": [1]},
        {"metadata": "x"},
    ],
)
def test_a_malformed_page_cache_entry_is_a_miss_never_a_traceback(
    served: Served, tmp_path: Path, change: dict[str, object]
) -> None:
    def malformed(entry: Path) -> None:
        doc = json.loads(cached)
        doc.update(change)
        entry.write_text(json.dumps(doc))

    served.etag = False
    source = TorchSource.from_url(served.url + "/simple")
    _index(tmp_path).files(source)
    (entry,) = (tmp_path / "torch-index" / "pages").iterdir()
    cached = entry.read_text()
    malformed(entry)
    again = _index(tmp_path)
    assert {f.filename for f in again.files(source)} >= {"torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl"}
    assert again.problems == [] and served.count("/torch/") == 2


# ------------------------------------------------------------------------------------ the ATen guard, hostile


@pytest.mark.timeout(20)
def test_the_guard_is_read_in_linear_time() -> None:
    # blank lines then a line that is no directive cost the old multi-line regex time quadratic in the lines
    # (each line start's `\s*` ran over all that followed: a 2 KiB compressed member took ~71 min); the
    # guard after them is found all the same
    for filler in ("\n" * 200_000 + ";\n", " \n" * 100_000 + ";\n", "#if x\n" * 50_000):
        assert cxx_std_of_header(filler + GUARD["20"]) == "20"
    assert cxx_std_of_header("#if " + "__cplusplus " * 50_000 + "\n#error\n") is None


def test_an_aten_header_over_its_bound_is_refused_unread(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/include/ATen/ATen.h", "\n" * (MAX_HEADER + 1) + GUARD["20"])
    assert wheel.stat().st_size < 4096  # a few KiB compressed
    with zipfile.ZipFile(wheel) as zf, pytest.raises(ValueError, match=r"ATen\.h is larger than 256 KiB"):
        facts_of_zip(zf)
