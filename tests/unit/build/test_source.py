"""Source preparation: local trees, git checkouts, sdists from an index, recipe patches, cached by content.

The index is a real HTTP server on 127.0.0.1 serving simple pages and files; pip's configuration is read by
the real `pip config list` from a PIP_CONFIG_FILE.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from factory.build.source import PreparedSource, git_env, prepare_source
from factory.core import leftovers
from factory.core.errors import BuildError, ConfigError
from factory.core.simpleapi import PYPI_JSON_TYPE
from factory.plan.pipindex import (
    IndexPageError,
    PipSettings,
    parse_pip_config,
    parse_project_page,
    read_pip_settings,
)
from factory.spec.options import FetchLimits

PATCH = """\
--- a/hello.py
+++ b/hello.py
@@ -1 +1 @@
-print("hello")
+print("patched")
"""


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    src = tmp_path / "pkg"
    (src / "build").mkdir(parents=True)
    (src / "build" / "stale.o").write_text("old object")
    (src / "hello.py").write_text('print("hello")\n')
    return src


def test_path_source_is_copied_without_build_outputs(tree: Path, tmp_path: Path) -> None:
    prepared = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "cache", path=tree)
    assert prepared.sdist is None and prepared.sha256 is None  # only `source: pypi` has an sdist to record
    out = prepared.tree
    assert (out / "hello.py").read_text() == 'print("hello")\n'
    assert not (out / "build").exists()
    assert out.stat().st_mode & 0o005 == 0o005  # readable by the container's unprivileged user


def test_patches_are_applied_and_part_of_the_cache_key(tree: Path, tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text(PATCH)
    plain = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree).tree
    patched = prepare_source(
        kind="path", name="p", version="1", cache=tmp_path / "c", path=tree, patches=[patch]
    ).tree
    assert plain != patched
    assert (patched / "hello.py").read_text() == 'print("patched")\n'
    assert (plain / "hello.py").read_text() == 'print("hello")\n'


def test_a_patch_that_does_not_apply_is_a_clear_error(tree: Path, tmp_path: Path) -> None:
    patch = tmp_path / "bad.patch"
    patch.write_text(PATCH.replace('print("hello")', 'print("something else")'))
    # a configuration error (exit 2): the recipe's patch, not the machine, is wrong
    with pytest.raises(
        ConfigError, match=r"patch .*bad\.patch does not apply: hello\.py hunk #1 @@ -1 \+1 @@"
    ):
        prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree, patches=[patch])
    assert not any((tmp_path / "c" / "sources").iterdir())  # no half-made entry is left to be reused


def test_cache_is_reused_until_the_tree_changes(tree: Path, tmp_path: Path) -> None:
    first = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree).tree
    again = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree).tree
    assert first == again
    (tree / "hello.py").write_text('print("edited")\n')
    edited = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree).tree
    assert edited != first
    assert (edited / "hello.py").read_text() == 'print("edited")\n'


def test_missing_source_directory(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="does not exist"):
        prepare_source(kind="path", name="p", version="1", cache=tmp_path, path=tmp_path / "nope")


def test_git_source_checks_out_the_ref(tree: Path, tmp_path: Path) -> None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@e", *args],
            cwd=tree,
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    git("init", "-q")
    git("add", "hello.py")
    git("commit", "-qm", "one")
    git("tag", "v1")
    (tree / "hello.py").write_text('print("two")\n')
    git("commit", "-qam", "two")
    out = prepare_source(
        kind="git", name="p", version="1", cache=tmp_path / "c", url=f"file://{tree}", ref="v1"
    ).tree
    assert (out / "hello.py").read_text() == 'print("hello")\n'
    with pytest.raises(BuildError, match="git failed"):
        prepare_source(
            kind="git", name="p", version="1", cache=tmp_path / "c", url=f"file://{tree}", ref="nope"
        )
    # neither a URL nor a ref is ever taken for one of git's options
    marker = tmp_path / "ran"
    with pytest.raises(BuildError, match="git failed"):
        prepare_source(
            kind="git",
            name="p",
            version="1",
            cache=tmp_path / "c",
            url=f"--upload-pack=touch {marker}",
            ref="v1",
        )
    assert not marker.exists()
    with pytest.raises(BuildError, match="is not a tag, branch or commit"):
        prepare_source(
            kind="git", name="p", version="1", cache=tmp_path / "c", url=f"file://{tree}", ref="--orphan=x"
        )


def test_a_git_transport_that_runs_a_program_is_refused_before_git_runs(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    for url in (f"ext::sh -c touch% {marker}", "fd::0", "s3://bucket/repo.git"):
        with pytest.raises(ConfigError, match="transport") as info:
            prepare_source(kind="git", name="p", version="1", cache=tmp_path / "c", url=url, ref="v1")
        assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert not marker.exists()
    assert not (tmp_path / "c" / "sources").exists()  # nothing was cloned


def test_git_runs_with_only_the_transports_the_factory_allows() -> None:
    remote = git_env("https://github.com/o/r.git")["GIT_ALLOW_PROTOCOL"].split(":")
    assert sorted(remote) == ["git", "http", "https", "ssh"]  # a submodule reads no repository of this host
    assert "file" in git_env("/srv/repos/r.git")["GIT_ALLOW_PROTOCOL"].split(":")
    assert "file" in git_env("file:///srv/repos/r.git")["GIT_ALLOW_PROTOCOL"].split(":")


# ---------------------------------------------------------------------------------------------- sdists


def make_sdist(name: str, version: str) -> tuple[str, bytes]:
    """A real .tar.gz sdist of one top directory, as `python -m build --sdist` lays it out."""
    top = f"{name.replace('-', '_')}-{version}"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for rel, text in {
            "setup.py": "import torch  # never run by the factory\n",
            "hello.py": 'print("hello")\n',
        }.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{rel}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return f"{top}.tar.gz", buf.getvalue()


@dataclass
class FakeIndex:
    """A simple repository on 127.0.0.1: project pages as PEP 691 JSON (when asked for and `json` is on) or
    PEP 503 HTML, files under /files/; every request counted by path."""

    port: int = 0
    files: dict[str, bytes] = field(default_factory=dict)
    claimed: dict[str, str] = field(
        default_factory=dict
    )  # filename -> sha256 the pages give, when not the real one
    json: bool = True
    auth: str | None = None  # "user:password" the server insists on
    hits: Counter[str] = field(default_factory=Counter)
    hashes: str = "sha256"  # the hash the pages give: sha256, md5 or none
    length: bool = True  # send Content-Length (else the body ends when the connection closes)
    pages: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # project -> a page as served
    links: dict[str, str] = field(default_factory=dict)  # filename -> the URL the pages give instead
    stop: threading.Event = field(default_factory=threading.Event)  # ends the endless and dripping answers

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def add(self, filename: str, data: bytes) -> None:
        self.files[filename] = data

    def sha(self, filename: str) -> str:
        return self.claimed.get(filename) or hashlib.sha256(self.files[filename]).hexdigest()

    def digest(self, filename: str) -> dict[str, str]:
        if self.hashes == "md5":
            return {"md5": hashlib.md5(self.files[filename]).hexdigest()}
        return {"sha256": self.sha(filename)} if self.hashes == "sha256" else {}

    def page(self, project: str, want_json: bool) -> tuple[str, bytes] | None:
        if project in self.pages:
            return self.pages[project]
        names = [f for f in sorted(self.files) if f.split("-")[0].replace("_", "-").lower() == project]
        if not names:
            return None
        if want_json:
            files = [
                {"filename": f, "url": self.links.get(f, f"../../files/{f}"), "hashes": self.digest(f)}
                for f in names
            ]
            return PYPI_JSON_TYPE, json.dumps(
                {"meta": {"api-version": "1.1"}, "name": project, "files": files}
            ).encode()
        fragments = {f: "".join(f"{k}={v}" for k, v in self.digest(f).items()) for f in names}
        links = "".join(
            f'<a href="{self.links.get(f, "/files/" + f)}#{fragments[f]}">{f}</a>\n' for f in names
        )
        return "text/html", f"<!DOCTYPE html><html><body>{links}</body></html>".encode()


@pytest.fixture
def index() -> Iterator[FakeIndex]:
    state = FakeIndex()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            state.hits[self.path] += 1
            header = self.headers.get("Authorization")
            if state.auth and header != "Basic " + base64.b64encode(state.auth.encode()).decode():
                self.send_response(401)
                self.end_headers()
                return
            found: tuple[str, bytes] | None = None
            if self.path.startswith("/endless/"):
                self.send_response(200)
                self.end_headers()
                while not state.stop.is_set():
                    self.wfile.write(b"\0" * 65536)
                return
            if self.path.startswith("/drip/"):  # a byte at a time, each well within any socket timeout
                self.send_response(200)
                self.send_header("Content-Length", "1000000")
                self.end_headers()
                while not state.stop.wait(0.05):
                    self.wfile.write(b"x")
                    self.wfile.flush()
                return
            if self.path.startswith("/stall/"):  # the status line, then nothing
                self.wfile.write(b"HTTP/1.1 200 OK\r\n")
                self.wfile.flush()
                state.stop.wait()
                return
            if self.path.startswith("/simple/"):
                want_json = state.json and PYPI_JSON_TYPE in self.headers.get("Accept", "")
                found = state.page(self.path.removeprefix("/simple/").strip("/"), want_json)
            elif self.path.startswith("/files/") and self.path[7:] in state.files:
                found = ("application/octet-stream", state.files[self.path[7:]])
            if found is None:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", found[0])
            if state.length:
                self.send_header("Content-Length", str(len(found[1])))
            self.end_headers()
            self.wfile.write(found[1])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.stop.set()
    server.shutdown()
    server.server_close()
    thread.join()


def fetch(
    index: FakeIndex,
    cache: Path,
    name: str = "demo-ext",
    version: str = "1.0",
    *,
    sha256: str | None = None,
    limits: FetchLimits | None = None,
    matrix_file: str | None = None,
    **pip: Any,
) -> PreparedSource:
    settings = PipSettings(**{"index_url": index.url, **pip})
    return prepare_source(
        kind="pypi",
        name=name,
        version=version,
        cache=cache,
        pip=settings,
        sha256=sha256,
        limits=limits,
        matrix_file=matrix_file,
    )


@pytest.mark.parametrize("json_pages", [True, False], ids=["pep691-json", "pep503-html"])
def test_pypi_sdist_is_found_checked_and_unpacked(index: FakeIndex, tmp_path: Path, json_pages: bool) -> None:
    index.json = json_pages
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    index.add("demo_ext-1.0-py3-none-any.whl", b"not looked at")
    index.add("demo_ext-1.1.tar.gz", b"another version")
    got = fetch(index, tmp_path / "c", name="Demo.Ext", version="1.0.0")  # names and versions normalized
    assert got.sdist == "demo_ext-1.0.tar.gz"
    assert got.sha256 == hashlib.sha256(data).hexdigest()
    assert (got.tree / "hello.py").read_text() == 'print("hello")\n'
    assert (
        index.hits["/files/demo_ext-1.1.tar.gz"] == 0
        and index.hits["/files/demo_ext-1.0-py3-none-any.whl"] == 0
    )


def test_second_run_reuses_the_verified_download_and_refetches_a_corrupt_one(
    index: FakeIndex, tmp_path: Path
) -> None:
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    first = fetch(index, tmp_path / "c")
    again = fetch(index, tmp_path / "c")
    assert again == first and index.hits[f"/files/{filename}"] == 1
    cached = tmp_path / "c" / "sdists" / filename
    cached.write_bytes(b"truncated")
    third = fetch(index, tmp_path / "c")
    assert third == first and index.hits[f"/files/{filename}"] == 2
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == first.sha256


def test_no_such_version_names_the_index_and_its_versions(index: FakeIndex, tmp_path: Path) -> None:
    for version in ("1.9", "1.10", "1.2"):
        index.add(f"demo_ext-{version}.tar.gz", b"x")
    with pytest.raises(ConfigError) as err:
        fetch(index, tmp_path / "c", version="9.9.9", matrix_file="m.yaml")
    assert err.value.exit_code == 2
    assert str(err.value) == (
        f"m.yaml: demo-ext 9.9.9: no such version on {index.url} (versions: 1.2, 1.9, 1.10)"
    )


def test_a_version_with_only_wheels_has_no_sdist(index: FakeIndex, tmp_path: Path) -> None:
    index.add("demo_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", b"x")
    with pytest.raises(ConfigError) as err:
        fetch(index, tmp_path / "c")
    assert str(err.value) == f"demo-ext 1.0 has no sdist on {index.url} (only wheels)"


def test_unknown_project_and_unreachable_index(index: FakeIndex, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        fetch(index, tmp_path / "c", matrix_file="m.yaml")
    assert str(err.value) == f"m.yaml: demo-ext 1.0: no such project on {index.url}"
    # an index that could not be read may have it: not the matrix file's fault
    dead = "http://127.0.0.1:9/simple/"  # the discard port: nothing listens
    with pytest.raises(
        BuildError, match=r"no such project on .*; could not read http://127\.0\.0\.1:9/simple/: "
    ):
        fetch(index, tmp_path / "c", extra_index_urls=(dead,))


def test_hash_mismatch_is_refused_and_nothing_is_cached(index: FakeIndex, tmp_path: Path) -> None:
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    index.claimed[filename] = "0" * 64
    real = hashlib.sha256(data).hexdigest()
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c")
    assert str(err.value) == (
        f"{filename} from {index.url}: sha256 of the download is {real}, the index says {'0' * 64}"
    )
    assert not any((tmp_path / "c" / "sdists").iterdir())
    assert not (tmp_path / "c" / "sources").exists()


def test_index_credentials_are_sent_and_never_shown(index: FakeIndex, tmp_path: Path) -> None:
    index.auth = "builder:s3cret"
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    secret_url = index.url.replace("http://", "http://builder:s3cret@")
    assert fetch(index, tmp_path / "c", index_url=secret_url).sdist == filename
    with pytest.raises(ConfigError) as err:
        fetch(index, tmp_path / "c", index_url=secret_url, version="2.0")
    assert "s3cret" not in str(err.value) and index.url in str(err.value)
    with pytest.raises(BuildError, match=r"could not read .*: HTTP 401"):
        fetch(index, tmp_path / "d")  # the same index without credentials


def test_find_links_directory_without_an_index(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    filename, data = make_sdist("demo_ext", "1.0")
    (links / filename).write_bytes(data)
    settings = PipSettings(no_index=True, find_links=(str(links),))
    pin = hashlib.sha256(data).hexdigest()
    # a directory gives no hashes: the matrix file's pin is what the file is checked against
    got = prepare_source(
        kind="pypi", name="demo-ext", version="1.0", cache=tmp_path / "c", pip=settings, sha256=pin
    )
    assert got.sdist == filename and got.sha256 == pin
    with pytest.raises(ConfigError) as err:
        prepare_source(kind="pypi", name="demo-ext", version="2.0", cache=tmp_path / "c", pip=settings)
    assert str(err.value) == f"demo-ext 2.0: no such version on {links} (versions: 1.0)"


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert "\n" not in text
    return text


def test_an_http_index_may_not_link_to_local_files(index: FakeIndex, tmp_path: Path) -> None:
    secret = tmp_path / "demo_ext-1.0.tar.gz"
    secret.write_bytes(b"the host's own file")
    index.add(secret.name, secret.read_bytes())
    index.links[secret.name] = secret.as_uri()
    for json_pages in (True, False):
        index.json = json_pages
        with pytest.raises(BuildError) as err:
            fetch(index, tmp_path / "c")
        assert one_line(err.value).endswith(
            f"could not read {index.url}: it links to {secret.as_uri()}; only a local index or find-links "
            "may link to anything but http(s) files"
        )
        assert not (tmp_path / "c" / "sdists").exists()


@pytest.mark.timeout(60)
def test_a_local_index_may_not_hand_over_a_device(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    (links / "demo_ext-1.0.tar.gz").symlink_to("/dev/zero")
    (links / "index.html").write_text(f'<a href="demo_ext-1.0.tar.gz#sha256={"0" * 64}">x</a>')
    settings = PipSettings(no_index=True, find_links=(str(links),))
    with pytest.raises(BuildError) as err:
        prepare_source(kind="pypi", name="demo-ext", version="1.0", cache=tmp_path / "c", pip=settings)
    assert one_line(err.value) == f"cannot download demo_ext-1.0.tar.gz from {links}: not a regular file"


@pytest.mark.parametrize("hashes", ["none", "md5"])
@pytest.mark.parametrize("json_pages", [True, False], ids=["pep691-json", "pep503-html"])
def test_without_a_sha256_from_the_index_a_pin_is_required(
    index: FakeIndex, tmp_path: Path, hashes: str, json_pages: bool
) -> None:
    index.hashes, index.json = hashes, json_pages
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    with pytest.raises(ConfigError) as err:
        fetch(index, tmp_path / "c", matrix_file="m.yaml")
    assert one_line(err.value) == (
        f"m.yaml: demo-ext 1.0: {index.url} gives no sha256 for {filename}; "
        "pin it in the matrix file: package: {sha256: <hex>}"
    )
    assert index.hits[f"/files/{filename}"] == 0 and not (tmp_path / "c" / "sources").exists()
    pin = hashlib.sha256(data).hexdigest()
    got = fetch(index, tmp_path / "c", sha256=pin)
    assert got.sha256 == pin and (got.tree / "hello.py").is_file()


def test_the_pin_wins_over_the_index(index: FakeIndex, tmp_path: Path) -> None:
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    real = hashlib.sha256(data).hexdigest()
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", sha256="1" * 64)
    assert one_line(err.value) == (
        f"demo-ext 1.0: {index.url} gives sha256 {real} for {filename}, the matrix file pins {'1' * 64}"
    )
    assert index.hits[f"/files/{filename}"] == 0
    index.hashes = "none"  # the pin alone checks the download
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", sha256="1" * 64)
    assert one_line(err.value) == (
        f"{filename} from {index.url}: sha256 of the download is {real}, the matrix file pins {'1' * 64}"
    )
    assert not any((tmp_path / "c" / "sdists").iterdir())


def test_a_page_larger_than_the_limit_is_not_read(index: FakeIndex, tmp_path: Path) -> None:
    index.pages["demo-ext"] = ("text/html", b"<html>" + b" " * 5000 + b"</html>")
    for length in (True, False):  # declared up front, or only found out while reading
        index.length = length
        with pytest.raises(BuildError) as err:
            fetch(index, tmp_path / "c", limits=FetchLimits(page_bytes=4096))
        assert one_line(err.value).endswith(f"could not read {index.url}: larger than 4096 bytes")


@pytest.mark.parametrize("length", [True, False], ids=["content-length", "until-close"])
def test_a_download_larger_than_the_limit_stops_there(index: FakeIndex, tmp_path: Path, length: bool) -> None:
    index.length = length
    filename, data = make_sdist("demo_ext", "1.0")
    index.add(filename, data)
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", limits=FetchLimits(download_bytes=len(data) - 1))
    assert one_line(err.value) == (
        f"cannot download {filename} from {index.url}: larger than {len(data) - 1} bytes; "
        "if the sdist really is, raise package.max_download in the matrix file"
    )
    assert not any((tmp_path / "c" / "sdists").iterdir())


@pytest.mark.timeout(60)
def test_an_endless_download_ends_at_the_limit(index: FakeIndex, tmp_path: Path) -> None:
    index.add("demo_ext-1.0.tar.gz", b"")
    index.links["demo_ext-1.0.tar.gz"] = "/endless/demo_ext-1.0.tar.gz"
    with pytest.raises(BuildError, match=r"larger than 1 MiB; if the sdist really is, raise package\."):
        fetch(index, tmp_path / "c", limits=FetchLimits(download_bytes=2**20))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("path", ["/drip/", "/stall/"])
def test_a_download_that_drips_or_stalls_ends_at_the_deadline(
    index: FakeIndex, tmp_path: Path, path: str
) -> None:
    index.add("demo_ext-1.0.tar.gz", b"")
    index.links["demo_ext-1.0.tar.gz"] = f"{path}demo_ext-1.0.tar.gz"
    limits = FetchLimits(download_seconds=0.3)
    with pytest.raises(BuildError) as err:
        # every read gets something well within the socket timeout, or the socket timeout is far off
        fetch(index, tmp_path / "c", limits=limits, timeout=30.0)
    assert one_line(err.value) == (
        f"cannot download demo_ext-1.0.tar.gz from {index.url}: not done within 0.3 s; "
        "for a slow index raise package.download_deadline in the matrix file"
    )
    assert not any((tmp_path / "c" / "sdists").iterdir())


@pytest.mark.timeout(60)
def test_a_page_that_stalls_ends_at_the_deadline(index: FakeIndex, tmp_path: Path) -> None:
    stalled = index.url.replace("/simple/", "/stall/")
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", index_url=stalled, limits=FetchLimits(page_seconds=0.3), timeout=30.0)
    assert one_line(err.value).endswith(f"could not read {stalled}: not done within 0.3 s")


MALFORMED = {
    "files-not-objects": (b'{"files": [5]}', "malformed PEP 691 page: a file entry is 5"),
    "top-level-list": (b"[1, 2]", "malformed PEP 691 page: no list of files"),
    "files-not-a-list": (b'{"files": 3}', "malformed PEP 691 page: no list of files"),
    "integer-filename": (
        b'{"files": [{"filename": 5, "url": "x"}]}',
        "malformed PEP 691 page: file entry {'filename': 5, 'url': 'x'}",
    ),
    "newline-filename": (
        b'{"files": [{"filename": "demo_ext-1.0.tar.gz\\nx", "url": "x", "hashes": {}}]}',
        "malformed PEP 691 page: filename 'demo_ext-1.0.tar.gz\\nx' is not a file name",
    ),
    "slash-filename": (
        b'{"files": [{"filename": "../demo_ext-1.0.tar.gz", "url": "x"}]}',
        "malformed PEP 691 page: filename '../demo_ext-1.0.tar.gz' is not a file name",
    ),
    "hashes-not-a-mapping": (
        b'{"files": [{"filename": "demo_ext-1.0.tar.gz", "url": "x", "hashes": [1]}]}',
        "malformed PEP 691 page: file entry {'filename': 'demo_ext-1.0.tar.gz', 'url': 'x', 'hashes': [1]}",
    ),
    "not-json": (b"<html>", "not a PEP 691 JSON page (Expecting value: line 1 column 1 (char 0))"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_pep691_page_is_one_line(index: FakeIndex, tmp_path: Path, case: str) -> None:
    body, reason = MALFORMED[case]
    with pytest.raises(IndexPageError) as direct:
        parse_project_page(body, PYPI_JSON_TYPE, index.url)
    assert one_line(direct.value) == reason
    index.pages["demo-ext"] = (PYPI_JSON_TYPE, body)
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c")
    assert one_line(err.value).endswith(f"could not read {index.url}: {reason}")


def test_an_html_link_that_is_no_file_name_is_passed_over() -> None:
    page = b'<a href="/files/demo_ext-1.0.tar.gz%0A#sha256=00">a</a><a href="/files/..%2Fx.tar.gz">b</a>'
    assert parse_project_page(page, "text/html", "http://127.0.0.1/simple/demo-ext/") == []


def test_a_non_archive_sdist_is_one_line(index: FakeIndex, tmp_path: Path) -> None:
    index.add("demo_ext-1.0.tar.gz", b"<html>not found</html>")
    index.add("other_ext-1.0.zip", b"<html>not found</html>")
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c")
    assert one_line(err.value) == "cannot unpack demo_ext-1.0.tar.gz: not a gzip file"
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", name="other-ext")
    assert one_line(err.value) == "cannot unpack other_ext-1.0.zip: File is not a zip file"


def make_tar_gz(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_unpacking_stops_at_the_size_and_member_limits(index: FakeIndex, tmp_path: Path) -> None:
    top = "demo_ext-1.0"
    index.add(f"{top}.tar.gz", make_tar_gz({f"{top}/a": b"\0" * 3000, f"{top}/b": b"\0" * 3000}))
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", limits=FetchLimits(unpacked_bytes=5000))
    assert one_line(err.value) == (
        f"{top}.tar.gz unpacks to more than 5000 bytes; if the sdist really does, raise "
        "package.max_unpacked in the matrix file"
    )
    assert not (tmp_path / "c" / "sources").exists() or not any((tmp_path / "c" / "sources").iterdir())
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", limits=FetchLimits(members=1))
    assert one_line(err.value) == f"{top}.tar.gz has more than 1 files, directories and links"
    assert fetch(index, tmp_path / "c").tree.name == "tree"


def test_a_zip_sdist_is_bounded_too(index: FakeIndex, tmp_path: Path) -> None:
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("demo_ext-1.0/a", b"\0" * 100_000)
    index.add("demo_ext-1.0.zip", buf.getvalue())
    with pytest.raises(BuildError, match=r"^demo_ext-1\.0\.zip unpacks to more than 1000 bytes; "):
        fetch(index, tmp_path / "c", limits=FetchLimits(unpacked_bytes=1000))


def test_partials_of_dead_owners_go_and_live_ones_stay(tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "c"
    (cache / "sdists").mkdir(parents=True)
    (cache / "sources").mkdir()
    host = leftovers.host_tag()
    dead_file = cache / "sdists" / f".partial-{host}.{dead_pid()}.abc123"
    dead_file.write_bytes(b"half a download")
    dead_dir = cache / "sources" / f".partial-{host}.{dead_pid()}.def456"
    (dead_dir / "tree").mkdir(parents=True)
    live = cache / "sources" / f"{leftovers.partial_prefix()}ghi789"
    live.mkdir()
    old_unowned = cache / "sdists" / ".partial-q1w2e3"  # an older factory's: no owner in its name
    old_unowned.write_bytes(b"x")
    os.utime(old_unowned, (0, 0))
    new_unowned = cache / "sdists" / ".partial-r4t5y6"
    new_unowned.write_bytes(b"x")
    prepare_source(kind="path", name="p", version="1", cache=cache, path=tree)
    assert not dead_file.exists() and not dead_dir.exists() and not old_unowned.exists()
    assert live.is_dir() and new_unowned.is_file()


def test_factory_clean_removes_dead_partials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from factory.cli import app

    home = tmp_path / "home"
    (home / "sdists").mkdir(parents=True)
    dead = home / "sdists" / f".partial-{leftovers.host_tag()}.{dead_pid()}.abc123"
    dead.write_bytes(b"half")
    live = home / "sdists" / f"{leftovers.partial_prefix()}def456"
    live.write_bytes(b"writing")
    monkeypatch.setenv("FACTORY_HOME", str(home))
    result = CliRunner().invoke(app, ["clean", "--no-containers"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert result.output.splitlines() == [f"removed {dead}"]
    assert live.is_file()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.mark.timeout(60)
def test_a_fifo_or_socket_in_a_path_source_is_one_line(tree: Path, tmp_path: Path) -> None:
    os.mkfifo(tree / "pipe")
    with pytest.raises(ConfigError) as err:
        prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
    assert one_line(err.value) == (
        f"source tree {tree}: pipe is a named pipe; "
        "a source tree may hold only files, directories and symlinks"
    )
    (tree / "pipe").unlink()
    (tree / "build" / "ignored-pipe").parent.mkdir(exist_ok=True)
    os.mkfifo(tree / "build" / "ignored-pipe")  # build/ is not copied
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tree / "sock"))
        with pytest.raises(ConfigError, match=r": sock is a socket; "):
            prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
    (tree / "sock").unlink()
    assert (prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree).tree).is_dir()


@pytest.mark.timeout(60)
def test_factory_home_inside_a_path_source_is_one_line(tree: Path) -> None:
    home = tree / "cache" / "home"
    with pytest.raises(ConfigError) as err:
        prepare_source(kind="path", name="p", version="1", cache=home, path=tree)
    assert one_line(err.value) == (
        f"FACTORY_HOME {home} is inside the source tree {tree}; set FACTORY_HOME to a directory outside"
    )


def test_a_missing_version_exits_2_naming_the_matrix_file(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    (links / "demo_ext-1.0.tar.gz").write_bytes(make_sdist("demo_ext", "1.0")[1])
    matrix = tmp_path / "m.yaml"
    matrix.write_text(
        'package: {name: demo-ext, version: "2.0"}\n'
        'matrix: {cuda: ["12.8"], torch: ["2.8"], python: ["3.11"], cxx11_abi: [true], arch: ["9.0"]}\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(links),
        "FACTORY_HOME": str(tmp_path / "home"),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "factory", "source", "unpack", "--matrix", str(matrix), str(tmp_path / "src")],
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"error: {matrix}: demo-ext 2.0: no such version on {links} (versions: 1.0)"


# ---------------------------------------------------------------------------------------------- pip config


def test_pip_configuration_is_read_by_pip_with_environment_over_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    conf = tmp_path / "pip.conf"
    conf.write_text(
        "[global]\n"
        "index-url = https://mirror.example/simple\n"
        "extra-index-url = https://one.example/simple\n    https://two.example/simple\n"
        "cert = /etc/mirror-ca.pem\n"
        "proxy = http://proxy.example:3128\n"
        "timeout = 42\n"
        "[download]\n"
        "find-links = /srv/wheels\n"
        "trusted-host = one.example\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "https://env.example/simple")
    monkeypatch.setenv("PIP_CONSTRAINT", "")  # the host's own pip.conf may name constraint files
    settings = read_pip_settings()
    assert settings == PipSettings(
        index_url="https://mirror.example/simple",
        extra_index_urls=("https://env.example/simple",),
        find_links=("/srv/wheels",),
        cert="/etc/mirror-ca.pem",
        proxy="http://proxy.example:3128",
        trusted_hosts=("one.example",),
        timeout=42.0,
    )
    assert settings.indexes == ("https://mirror.example/simple", "https://env.example/simple")


def test_pip_configuration_is_read_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    conf = tmp_path / "pip.conf"
    conf.write_text("[global]\nindex-url = https://one.example/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(conf))
    runs: list[object] = []
    real_run = subprocess.run

    def counted(*args: Any, **kwargs: Any) -> Any:
        runs.append(args[0])
        return real_run(*args, **kwargs)

    monkeypatch.setattr(subprocess, "run", counted)
    first = read_pip_settings()
    assert read_pip_settings() is first and first.index_url == "https://one.example/simple" and len(runs) == 1
    conf.write_text("[global]\nindex-url = https://two.example/simple/x\n")  # another size: read anew
    assert read_pip_settings().index_url == "https://two.example/simple/x" and len(runs) == 2
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple")
    assert read_pip_settings().index_url == "https://env.example/simple" and len(runs) == 3


def test_pip_config_parsing_merges_sections_as_pip_does() -> None:
    text = (
        "global.index-url='https://a.example/simple'\n"
        "download.index-url='https://b.example/simple'\n"
        ":env:.no-index='yes'\n"
        "install.index-url='https://not-for-downloads.example/simple'\n"
        ":env:.default-timeout='7'\n"
    )
    settings = parse_pip_config(text)
    assert settings.index_url == "https://b.example/simple" and settings.no_index and settings.timeout == 7.0
    assert settings.indexes == ()
    with pytest.raises(BuildError, match="timeout 'soon' is not a number"):
        parse_pip_config("global.timeout='soon'\n")


def test_a_missing_ca_bundle_is_one_line(index: FakeIndex, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"^pip configuration: cert /nonexistent/ca\.pem: .*No such file"):
        fetch(index, tmp_path / "c", cert="/nonexistent/ca.pem")
