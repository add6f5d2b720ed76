"""Source preparation: local trees, git checkouts and recipe patches, cached by content."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from factory.errors import BuildError
from factory.source import prepare_source

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
    out = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "cache", path=tree)
    assert (out / "hello.py").read_text() == 'print("hello")\n'
    assert not (out / "build").exists()
    assert out.stat().st_mode & 0o005 == 0o005  # readable by the container's unprivileged user


def test_patches_are_applied_and_part_of_the_cache_key(tree: Path, tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text(PATCH)
    plain = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
    patched = prepare_source(
        kind="path", name="p", version="1", cache=tmp_path / "c", path=tree, patches=[patch]
    )
    assert plain != patched
    assert (patched / "hello.py").read_text() == 'print("patched")\n'
    assert (plain / "hello.py").read_text() == 'print("hello")\n'


def test_a_patch_that_does_not_apply_is_a_clear_error(tree: Path, tmp_path: Path) -> None:
    patch = tmp_path / "bad.patch"
    patch.write_text(PATCH.replace('print("hello")', 'print("something else")'))
    with pytest.raises(BuildError, match=r"patch .*bad.patch does not apply"):
        prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree, patches=[patch])
    assert not any((tmp_path / "c" / "sources").iterdir())  # no half-made entry is left to be reused


def test_cache_is_reused_until_the_tree_changes(tree: Path, tmp_path: Path) -> None:
    first = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
    again = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
    assert first == again
    (tree / "hello.py").write_text('print("edited")\n')
    edited = prepare_source(kind="path", name="p", version="1", cache=tmp_path / "c", path=tree)
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
    )
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
