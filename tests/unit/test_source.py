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
import subprocess
import tarfile
import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from factory.errors import BuildError, ConfigError
from factory.index import PYPI_JSON_TYPE
from factory.source import PipSettings, PreparedSource, parse_pip_config, prepare_source, read_pip_settings

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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/simple/"

    def add(self, filename: str, data: bytes) -> None:
        self.files[filename] = data

    def sha(self, filename: str) -> str:
        return self.claimed.get(filename) or hashlib.sha256(self.files[filename]).hexdigest()

    def page(self, project: str, want_json: bool) -> tuple[str, bytes] | None:
        names = [f for f in sorted(self.files) if f.split("-")[0].replace("_", "-").lower() == project]
        if not names:
            return None
        if want_json:
            files = [
                {"filename": f, "url": f"../../files/{f}", "hashes": {"sha256": self.sha(f)}} for f in names
            ]
            return PYPI_JSON_TYPE, json.dumps(
                {"meta": {"api-version": "1.1"}, "name": project, "files": files}
            ).encode()
        links = "".join(f'<a href="/files/{f}#sha256={self.sha(f)}">{f}</a>\n' for f in names)
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
            self.send_header("Content-Length", str(len(found[1])))
            self.end_headers()
            self.wfile.write(found[1])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


def fetch(
    index: FakeIndex, cache: Path, name: str = "demo-ext", version: str = "1.0", **pip: Any
) -> PreparedSource:
    settings = PipSettings(**{"index_url": index.url, **pip})
    return prepare_source(kind="pypi", name=name, version=version, cache=cache, pip=settings)


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
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c", version="9.9.9")
    assert str(err.value) == f"demo-ext 9.9.9: no such version on {index.url} (versions: 1.2, 1.9, 1.10)"


def test_a_version_with_only_wheels_has_no_sdist(index: FakeIndex, tmp_path: Path) -> None:
    index.add("demo_ext-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", b"x")
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c")
    assert str(err.value) == f"demo-ext 1.0 has no sdist on {index.url} (only wheels)"


def test_unknown_project_and_unreachable_index(index: FakeIndex, tmp_path: Path) -> None:
    with pytest.raises(BuildError) as err:
        fetch(index, tmp_path / "c")
    assert str(err.value) == f"demo-ext 1.0: no such project on {index.url}"
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
    with pytest.raises(BuildError) as err:
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
    got = prepare_source(kind="pypi", name="demo-ext", version="1.0", cache=tmp_path / "c", pip=settings)
    assert got.sdist == filename and got.sha256 == hashlib.sha256(data).hexdigest()
    with pytest.raises(BuildError) as err:
        prepare_source(kind="pypi", name="demo-ext", version="2.0", cache=tmp_path / "c", pip=settings)
    assert str(err.value) == f"demo-ext 2.0: no such version on {links} (versions: 1.0)"


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
