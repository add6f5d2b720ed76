"""A compile cache under a publish store (`_cache/compile/`) is never taken for part of the index: publish and
repair list no project or variant for it, and `factory serve` does not serve it. Local directory, ~1 s."""

from __future__ import annotations

import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from publish_helpers import VID_NEW, make_wheel

from factory.cache import sync
from factory.publish.publisher import publish_wheels, repair_index
from factory.publish.serve import ServeOptions, is_cache_path, make_server
from factory.publish.stores import LocalStore

pytestmark = pytest.mark.integration
OBJ = sync.store_key("d" * 64, "o/ab/ab" + "1" * 62)


def test_the_cache_under_a_publish_store_is_no_project(tmp_path: Path) -> None:
    to = tmp_path / "index"
    store_dir = Path(sync.under(str(to)))
    assert store_dir == to / "_cache" / "compile"
    (store_dir / OBJ).parent.mkdir(parents=True)
    (store_dir / OBJ).write_bytes(b"object")
    wheel = make_wheel(tmp_path)
    publish_wheels([wheel], to=str(to))
    repair_index(to=str(to))
    pages = [p for p in to.rglob("*") if p.is_file() and not p.is_relative_to(to / "_cache")]
    assert pages and not [p for p in pages if b"_cache" in p.read_bytes()]
    assert sorted(p.name for p in (to / "simple").iterdir() if p.is_dir()) == [VID_NEW]
    assert (store_dir / OBJ).read_bytes() == b"object"  # nothing of the index touched it

    assert is_cache_path(f"_cache/compile/{OBJ}") and is_cache_path("_cache")
    assert not is_cache_path("simple/") and not is_cache_path("files/_cachex")
    server = make_server(LocalStore(to), ServeOptions(port=0), log=lambda _line: None)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        with urllib.request.urlopen(f"{base}/simple/") as resp:
            assert resp.status == 200
        for path in (f"_cache/compile/{OBJ}", "_cache/", "_cache/compile/"):
            with pytest.raises(urllib.error.HTTPError) as err:
                urllib.request.urlopen(f"{base}/{path}")
            assert err.value.code == 404, path
    finally:
        server.shutdown()
        server.server_close()
