"""Saying so when a recipe's patches move the source to a new compile-cache domain
(`factory.build.domainnote`)."""

from __future__ import annotations

from pathlib import Path

from factory.build import domainnote


def test_a_changed_patch_with_a_new_domain_is_said() -> None:
    before = {"domain": "d1", "patches": {"fix-setup.patch": "aa", "cpp20.patch": "bb"}}
    note = domainnote.change_note(
        before, domain="d2", patches={"fix-setup.patch": "cc", "cpp20.patch": "bb"}, what="torch-x 1.0"
    )
    assert note is not None and "\n" not in note
    assert "changed fix-setup.patch" in note and "cpp20" not in note
    assert "new compile-cache domain" in note and "setup.py" in note
    added = domainnote.change_note(before, domain="d2", patches={"fix-setup.patch": "aa"}, what="x 1")
    assert added is not None and "dropped cpp20.patch" in added


def test_nothing_is_said_without_a_change_of_patches_and_domain() -> None:
    before = {"domain": "d1", "patches": {"p.patch": "aa"}}
    assert domainnote.change_note(None, domain="d1", patches={}, what="x") is None  # a first build
    assert domainnote.change_note(before, domain="d1", patches={"p.patch": "aa"}, what="x") is None
    # a new domain with the same patches is another source (a new sdist), not a patch's doing
    assert domainnote.change_note(before, domain="d9", patches={"p.patch": "aa"}, what="x") is None
    assert domainnote.change_note({"domain": 3}, domain="d9", patches={}, what="x") is None


def test_remember_compares_with_the_last_build_here(tmp_path: Path) -> None:
    patch = tmp_path / "fix.patch"
    patch.write_text("--- a/setup.py\n+++ b/setup.py\n")
    home = tmp_path / "home"
    assert domainnote.remember(home, package="Torch_X", version="1.0", domain="d1", patches=[patch]) is None
    assert domainnote.remember(home, package="torch-x", version="1.0", domain="d1", patches=[patch]) is None
    patch.write_text("--- a/setup.py\n+++ b/setup.py\n@@ changed\n")
    note = domainnote.remember(home, package="torch-x", version="1.0", domain="d2", patches=[patch])
    assert note is not None and "torch-x 1.0" in note and "changed fix.patch" in note
    # said once: the next build of the same patches is in the domain it noted
    assert domainnote.remember(home, package="torch-x", version="1.0", domain="d2", patches=[patch]) is None
