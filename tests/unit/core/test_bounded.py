"""Every file and URL the factory is given is read bounded (issue 41 §3): a FIFO is refused, never waited
on; a file, a page, a download, a zip, a tool's output is capped; a network read has a total deadline."""

from __future__ import annotations

import ast
import os
import struct
import subprocess
import sys
import threading
import urllib.request
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import factory
from factory.build import source
from factory.consume import hostgpu, indexhttp, verify
from factory.core import bounded
from factory.core.errors import ConfigError, FactoryError
from factory.publish import publisher
from factory.publish.index import SIGNATURE_SUFFIX
from factory.trust import signing
from factory.trust.signing import SignatureError
from factory.wheel import embedded

NAME = "demo_ext-0.1.0+cu13.0.torch2.14.abi1.sm80.90-cp311-cp311-linux_x86_64.whl"
GIB = 1 << 30


def sparse(path: Path, size: int) -> Path:
    """A file of `size` bytes that takes no disk and no time to make."""
    with path.open("wb") as fh:
        fh.truncate(size)
    return path


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def small_wheel(directory: Path, name: str = NAME, entries: int = 1) -> Path:
    path = directory / name
    with zipfile.ZipFile(path, "w") as zf:
        for i in range(entries):
            zf.writestr(f"demo_ext/m{i}.py", "x")
    return path


# ---------------------------------------------------------------------------------------------- files


@pytest.mark.timeout(10)
def test_a_fifo_is_refused_by_its_type_without_waiting_for_a_writer(tmp_path: Path) -> None:
    with pytest.raises(bounded.Refused, match=r"not a regular file \(a FIFO\)"):
        bounded.read_file(fifo(tmp_path / "f"), max_bytes=100)
    with pytest.raises(bounded.Refused, match="a character device"):
        bounded.read_file("/dev/zero", max_bytes=100)
    with pytest.raises(IsADirectoryError):
        bounded.read_file(tmp_path, max_bytes=100)


def test_a_file_over_its_cap_is_refused_before_it_is_read(tmp_path: Path) -> None:
    big = sparse(tmp_path / "big", GIB)
    with pytest.raises(bounded.Refused, match=f"{big}: {GIB} bytes, over the 1 MiB it may have"):
        bounded.read_file(big, max_bytes=1 << 20)
    assert bounded.read_file(sparse(tmp_path / "ok", 10), max_bytes=10) == b"\0" * 10


def test_lines_are_streamed_within_the_cap(tmp_path: Path) -> None:
    path = tmp_path / "p"
    path.write_bytes(b"a\nb\r\nc")
    assert list(bounded.iter_lines(path, max_bytes=100)) == ["a", "b", "c"]
    with pytest.raises(bounded.Refused):
        list(bounded.iter_lines(path, max_bytes=3))


@pytest.mark.timeout(10)
def test_a_key_file_that_is_a_fifo_or_huge_is_one_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"--key .*: not a regular file \(a FIFO\); not a key file"):
        signing.public_key_file(fifo(tmp_path / "k.pub"))
    with pytest.raises(ConfigError, match=r"--sign-key .*over the"):
        signing.signer_from(path=sparse(tmp_path / "k", GIB))


@pytest.mark.timeout(30)
def test_verify_key_fifo_on_the_command_line_is_one_line_exit_2(tmp_path: Path) -> None:
    wheel = small_wheel(tmp_path)
    key = fifo(tmp_path / "k.pub")
    proc = subprocess.run(
        [sys.executable, "-m", "factory.cli", "verify", str(wheel), "--key", str(key)],
        capture_output=True,
        text=True,
        timeout=25,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file (a FIFO)" in lines[0], proc.stderr


@pytest.mark.timeout(10)
def test_a_local_signature_that_is_a_fifo_is_unsigned_not_waited_on(tmp_path: Path) -> None:
    wheel = small_wheel(tmp_path)
    fifo(wheel.with_name(wheel.name + SIGNATURE_SUFFIX))
    key = Ed25519PrivateKey.generate().public_key()
    with pytest.raises(SignatureError, match=r"unsigned .*not a regular file \(a FIFO\)"):
        verify.verify_signature(str(wheel), key=key)


@pytest.mark.timeout(10)
def test_a_report_that_is_a_fifo_or_of_a_gib_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a regular file \(a FIFO\); not a build report"):
        publisher.load_report(fifo(tmp_path / "report.json"))
    with pytest.raises(ConfigError, match="over the 64 MiB it may have; not a build report"):
        publisher.load_report(sparse(tmp_path / "big.json", GIB))
    # the second read, for the build records, is bounded the same way
    assert publisher.build_records(tmp_path / "big.json", [], {}) == {}


@pytest.mark.timeout(20)
def test_a_patch_that_is_a_fifo_or_too_large_is_one_config_error(tmp_path: Path) -> None:
    tree = tmp_path / "src"
    tree.mkdir()
    (tree / "setup.py").write_text("")
    for patch, says in (
        (fifo(tmp_path / "a.patch"), "not a regular file \\(a FIFO\\)"),
        (sparse(tmp_path / "b.patch", 3 * GIB // 2), "over the 64 MiB"),
    ):
        with pytest.raises(ConfigError, match=rf"patch {patch}: .*{says}"):
            source.prepare_source(
                kind="path",
                name="demo",
                version="0.1.0",
                cache=tmp_path / "cache",
                path=tree,
                patches=[patch],
            )


def test_a_failed_hunk_is_named_from_the_patch_read_line_by_line(tmp_path: Path) -> None:
    patch = tmp_path / "p.patch"
    patch.write_text(
        "--- a/x.py\n+++ b/x.py\n@@ -1 +1 @@\n-a\n+b\n--- a/y.py\n+++ b/y.py\n@@ -3 +3 @@\n-c\n+d\n"
    )
    assert source._file_at(patch, 5) == "x.py"
    assert source._file_at(patch, 9) == "y.py"
    assert source._hunk_headers(patch) == {("x.py", 1): "@@ -1 +1 @@", ("y.py", 1): "@@ -3 +3 @@"}


# ---------------------------------------------------------------------------------------------- zips


def _zip_with(tmp_path: Path, entries: int) -> Path:
    return small_wheel(tmp_path, entries=entries)


def test_a_zip_is_counted_from_its_directory_before_zipfile_reads_it(tmp_path: Path) -> None:
    path = _zip_with(tmp_path, 20)
    with open(path, "rb") as fh:
        assert bounded.zip_entries(fh, max_entries=100) == 20
    with bounded.open_zip(path, max_entries=20) as zf:
        assert len(zf.infolist()) == 20 and zf.filename == str(path)
    with pytest.raises(bounded.Refused, match="more than 10 entries"):
        bounded.open_zip(path, max_entries=10)


def test_an_end_record_that_understates_the_count_is_not_believed(tmp_path: Path) -> None:
    path = _zip_with(tmp_path, 20)
    data = bytearray(path.read_bytes())
    end = data.rindex(b"PK\x05\x06")
    struct.pack_into("<HH", data, end + 8, 1, 1)  # "1 entry" on this disk and in all
    path.write_bytes(bytes(data))
    with pytest.raises(bounded.Refused, match="more than 10 entries"):
        bounded.open_zip(path, max_entries=10)


def test_the_wheel_readers_refuse_a_zip_of_too_many_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bounded, "MAX_ZIP_ENTRIES", 10)
    wheel = _zip_with(tmp_path, 20)
    with pytest.raises(ConfigError, match="more than 10 entries"):
        publisher.read_metadata(wheel, wheel.name)
    from factory.core.errors import CheckError

    with pytest.raises(CheckError, match="more than 10 entries"):
        embedded.read(wheel)
    from factory.wheel.checks import wheel_archive_problems

    assert "more than 10 entries" in wheel_archive_problems(wheel)[0]


def test_a_zip_that_is_no_zip_is_left_for_zipfile_to_name(tmp_path: Path) -> None:
    path = tmp_path / "x.whl"
    path.write_bytes(b"not a zip")
    with pytest.raises(zipfile.BadZipFile):
        bounded.open_zip(path)


# ---------------------------------------------------------------------------------------------- URLs


class Server:
    """A local HTTP server whose answers a test sets: a body sent at once, one that never ends, or one byte
    every so often until the test is over (a server pacing itself under every socket timeout)."""

    def __init__(self) -> None:
        self.body = b""
        self.mode = "whole"  # "whole", "endless" or "drip"
        self.drip_suffix: str | None = None  # paths ending so drip, whatever the mode
        self.released = threading.Event()
        me = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                mode = "drip" if me.drip_suffix and self.path.endswith(me.drip_suffix) else me.mode
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                if mode == "whole":
                    self.send_header("Content-Length", str(len(me.body)))
                self.end_headers()
                try:
                    if mode == "whole":
                        self.wfile.write(me.body)
                    elif mode == "endless":
                        block = b"<a href='x'>x</a>\n" * 4096
                        while not me.released.is_set():
                            self.wfile.write(block)
                    else:
                        while not me.released.wait(0.05):
                            self.wfile.write(b" ")
                            self.wfile.flush()
                except OSError:
                    pass  # the client hung up: what it should do

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.released.set()
    s.server.shutdown()
    s.server.server_close()


@pytest.mark.timeout(30)
def test_a_page_that_never_ends_is_cut_at_the_cap(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(indexhttp, "MAX_PAGE", 1 << 20)
    server.mode = "endless"
    with pytest.raises(FactoryError, match="over the 1 MiB it may have"):
        indexhttp.fetch_page(server.url + "/simple/")


@pytest.mark.timeout(30)
def test_a_page_that_drips_is_cut_at_its_total_deadline(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(indexhttp, "PAGE_DEADLINE_S", 1.0)
    server.mode = "drip"
    with pytest.raises(FactoryError, match="not done within 1 s"):
        indexhttp.fetch_page(server.url + "/simple/")


@pytest.mark.timeout(30)
def test_verify_url_downloads_within_a_total_deadline(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify, "WHEEL_DEADLINE_S", 1.0)
    signer = signing.make_signer(Ed25519PrivateKey.generate(), source="t")
    server.body = signer.sign(NAME, "ab" * 32)  # the signature comes whole; the wheel drips
    server.drip_suffix = ".whl"
    with pytest.raises(FactoryError, match="not done within 1 s"):
        verify.verify_url(f"{server.url}/files/{NAME}", key=signer._key.public_key())


@pytest.mark.timeout(30)
def test_inspect_downloads_within_a_total_deadline(server: Server, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(embedded, "DOWNLOAD_DEADLINE_S", 1.0)
    server.mode = "drip"
    with pytest.raises(FactoryError, match="not done within 1 s"):
        embedded.inspect(f"{server.url}/files/{NAME}")


@pytest.mark.timeout(10)
def test_a_file_url_names_a_regular_file_only(tmp_path: Path) -> None:
    page = fifo(tmp_path / "index.html")
    with pytest.raises(FactoryError, match=r"not a regular file \(a FIFO\)"):
        indexhttp.fetch_page(page.as_uri())
    page.unlink()
    page.write_text("<a href='x'>x</a>")
    assert indexhttp.fetch_page(tmp_path.as_uri() + "/") == "<a href='x'>x</a>"


# ---------------------------------------------------------------------------------------------- tools


def _tool(directory: Path, name: str, script: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(0o755)
    return path


@pytest.mark.timeout(60)
def test_nvidia_smi_printing_without_end_is_cut_and_not_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 8 MiB of table with a CUDA version in it: read whole before, now past the cap and not believed
    _tool(
        tmp_path / "bin",
        "nvidia-smi",
        "echo 'CUDA Version: 13.0'; head -c 8388608 /dev/zero | tr '\\0' 'x'",
    )
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    monkeypatch.setattr(hostgpu, "_libcuda", lambda: None)
    monkeypatch.setattr(hostgpu, "_proc", lambda: None)
    found = hostgpu.detect_driver()
    assert found.source == "none" and found.cuda is None and found.gpus == ()


@pytest.mark.timeout(30)
def test_a_tool_is_killed_past_its_cap_or_its_time(tmp_path: Path) -> None:
    endless = _tool(tmp_path, "endless", "exec yes")
    assert bounded.run_output([str(endless)], max_bytes=1 << 20, seconds=20) is None
    stuck = _tool(tmp_path, "stuck", "echo started; exec sleep 60")
    assert bounded.run_output([str(stuck)], max_bytes=1 << 20, seconds=1) is None
    fine = _tool(tmp_path, "fine", "echo 'CUDA Version: 13.0'")
    assert bounded.run_output([str(fine)], max_bytes=100, seconds=20) == "CUDA Version: 13.0\n"
    failing = _tool(tmp_path, "failing", "echo x; exit 3")
    assert bounded.run_output([str(failing)], max_bytes=100, seconds=20) is None
    assert bounded.run_output([str(tmp_path / "missing")], max_bytes=100, seconds=20) is None


# ---------------------------------------------------------------------------------------------- the cap


def test_the_sizes_said_in_messages() -> None:
    assert [bounded.size_text(n) for n in (4 << 20, 256 << 10, 1 << 30, 4097)] == [
        "4 MiB",
        "256 KiB",
        "1 GiB",
        "4097 bytes",
    ]


def test_a_response_body_is_capped_as_it_is_read(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with open(path, "rb") as fh:
        body = bounded.Body(fh, deadline=None, max_bytes=50, shown="u")
        with pytest.raises(bounded.Refused, match="u: over the 50 bytes"):
            body.read_all()
    with open(path, "rb") as fh:
        assert bounded.Body(fh, deadline=None, max_bytes=100, shown="u").read_all() == b"x" * 100


def _member_zip(tmp_path: Path, data: bytes = b"a" * 1000) -> Path:
    path = tmp_path / "m.zip"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("d/m", data)
    return path


def test_a_member_is_read_within_its_cap(tmp_path: Path) -> None:
    with bounded.open_zip(_member_zip(tmp_path)) as zf:
        assert bounded.read_member(zf, "d/m", max_bytes=1000) == b"a" * 1000
        assert bounded.read_member(zf, zf.getinfo("d/m"), max_bytes=4096) == b"a" * 1000
        with pytest.raises(bounded.Refused, match=r"^d/m: 1000 bytes, over the 999 bytes it may have$"):
            bounded.read_member(zf, "d/m", max_bytes=999)
        with pytest.raises(KeyError):
            bounded.read_member(zf, "d/none", max_bytes=1000)


def test_a_member_that_understates_its_size_is_never_inflated_past_it(tmp_path: Path) -> None:
    path = _member_zip(tmp_path)
    data = bytearray(path.read_bytes())
    local, central = data.index(b"PK\x03\x04"), data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, 10)  # "10 bytes" where the stream inflates to 1000
    struct.pack_into("<I", data, central + 24, 10)
    path.write_bytes(bytes(data))
    with bounded.open_zip(path) as zf, pytest.raises(bounded.BadMember, match="CRC"):
        bounded.read_member(zf, "d/m", max_bytes=100)


def test_a_damaged_member_is_bad_member(tmp_path: Path) -> None:
    path = _member_zip(tmp_path, os.urandom(4000))
    data = bytearray(path.read_bytes())
    start = data.index(b"PK\x03\x04") + 30 + len("d/m")
    data[start + 100 : start + 200] = bytes(100)
    path.write_bytes(bytes(data))
    with bounded.open_zip(path) as zf, pytest.raises(bounded.BadMember):
        bounded.read_member(zf, "d/m", max_bytes=1 << 20)


def _capped_member_reads(tree: ast.AST) -> list[int]:
    """Lines that read a zip member by hand within a cap: `with X.open(member) as fh: ... fh.read(N + 1)`
    (zipfile's `open` takes a member and no mode, a path's `open` a mode)."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.With):
            continue
        for item in node.items:
            call, name = item.context_expr, item.optional_vars
            if not (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "open"
                and len(call.args) == 1
                and not isinstance(call.args[0], ast.Constant)  # a path's mode: "rb"
                and not call.keywords
                and isinstance(name, ast.Name)
            ):
                continue
            for inner in ast.walk(node):
                if (
                    isinstance(inner, ast.Call)
                    and isinstance(inner.func, ast.Attribute)
                    and inner.func.attr == "read"
                    and isinstance(inner.func.value, ast.Name)
                    and inner.func.value.id == name.id
                    and inner.args
                    and isinstance(inner.args[0], ast.BinOp)
                ):
                    found.append(inner.lineno)
    return found


def test_no_other_module_reads_a_zip_member_by_hand() -> None:
    root = Path(factory.__file__).parent
    owner = Path(bounded.__file__).resolve()
    offenders = [
        f"{path.relative_to(root)}:{line}"
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != owner
        for line in _capped_member_reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert offenders == []


class _Recorder(BaseHTTPRequestHandler):
    """Answers /go with a redirect to `target` and anything else with 200; records each request's
    Authorization header (the class attributes are set per test)."""

    target = ""
    seen: ClassVar[list[tuple[str, str | None]]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        if self.path == "/go":
            self.send_response(302)
            self.send_header("Location", type(self).target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


@pytest.mark.timeout(30)
def test_credentials_go_to_their_own_host_only() -> None:
    class Origin(_Recorder):
        seen: ClassVar[list[tuple[str, str | None]]] = []

    class Elsewhere(_Recorder):
        seen: ClassVar[list[tuple[str, str | None]]] = []

    servers = [ThreadingHTTPServer(("127.0.0.1", 0), h) for h in (Origin, Elsewhere)]
    for s in servers:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    try:
        Origin.target = f"http://localhost:{servers[1].server_address[1]}/landed"
        url = f"http://user:p%40ss@127.0.0.1:{servers[0].server_address[1]}/go"
        req = bounded.request(url, headers={"Accept": "text/html"})
        assert "user" not in req.full_url and req.get_header("Accept") == "text/html"
        with bounded.open_url(req, seconds=10, max_bytes=10, shown="x") as body:
            assert body.read() == b"ok"
    finally:
        for s in servers:
            s.shutdown()
            s.server_close()
    assert Origin.seen == [("/go", "Basic dXNlcjpwQHNz")]  # base64 of "user:p@ss"
    assert Elsewhere.seen == [("/landed", None)]


def test_the_opener_follows_a_redirect_only_when_told() -> None:
    with bounded.Deadline(5) as deadline:
        follows = bounded.opener(deadline)
        stops = bounded.opener(deadline, follow_redirects=False, proxies={})
    assert any(type(h) is urllib.request.HTTPRedirectHandler for h in follows.handlers)
    assert any(isinstance(h, bounded.NoRedirect) for h in stops.handlers)
    assert not any(
        isinstance(h, urllib.request.FileHandler | urllib.request.FTPHandler) for h in follows.handlers
    )


_HTTP_STACKS = ("OpenerDirector", "build_opener", "urlopen", "Request", "HTTPConnection", "HTTPSConnection")


def _http_clients(tree: ast.AST) -> list[str]:
    """Where a module makes an HTTP client of its own: urllib's opener, urlopen or a request by hand (whose
    user:password@ no one turns into a header for its own host), http.client's connections, or another
    HTTP library."""
    found = []
    called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in _HTTP_STACKS:
            if node.attr != "Request" or id(node) in called:  # the type in an annotation is no request
                found.append(f"{node.lineno} {node.attr}")
        elif isinstance(node, ast.ImportFrom) and any(a.name in _HTTP_STACKS for a in node.names):
            found.append(f"{node.lineno} import")
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(n.split(".")[0] in ("requests", "httpx", "urllib3", "aiohttp") for n in names):
                found.append(f"{node.lineno} {names}")
    return found


def test_no_other_module_has_an_http_client_of_its_own() -> None:
    root = Path(factory.__file__).parent
    owner = Path(bounded.__file__).resolve()
    # the engine catches the Docker SDK's errors, which come from requests (dockerd's socket; no page)
    docker_sdk = (Path("build/engine.py"), "['requests.exceptions']")
    offenders = [
        f"{path.relative_to(root)}:{where}"
        for path in sorted(root.rglob("*.py"))
        if path.resolve() != owner
        for where in _http_clients(ast.parse(path.read_text(encoding="utf-8")))
        if (path.relative_to(root), where.partition(" ")[2]) != docker_sdk
    ]
    assert offenders == []
