"""The install check's runtime requirements from the factory's own index (build.check_indexes, issue 42 §2):
a dependency the factory built and published for a newer glibc than manylinux_2_28 enters the check's
wheelhouse when the download takes the tags the check's container accepts (its builder's glibc), and not with
the old manylinux_2_28 target, which said nothing of why. Real pip, a real published index (a directory, its
file: URL); seconds, no Docker."""

from __future__ import annotations

from pathlib import Path

import pytest
from publish_helpers import LABEL_NEW, VID_NEW, make_wheel

from factory.build import runtimereqs
from factory.core.errors import FactoryError
from factory.plan import glibcfloor
from factory.publish.publisher import publish_wheels
from factory.spec.options import BuildOptions

pytestmark = [pytest.mark.integration]

DEP = "factory-glibcfloor-dep"  # no index but ours has it


def test_a_factory_built_dependency_enters_the_check_wheelhouse_with_the_check_containers_tags(
    tmp_path: Path,
) -> None:
    wheel = make_wheel(tmp_path / "wh", name=DEP, label=LABEL_NEW, tag="cp313-cp313-manylinux_2_39_x86_64")
    publish_wheels([wheel], to=str(tmp_path / "idx"))
    build = BuildOptions(
        flavor="pypi", check_indexes=((tmp_path / "idx" / "simple").resolve().as_uri() + "/",)
    )
    ours = build.check_index_urls(VID_NEW)
    assert ours == ((tmp_path / "idx" / "simple" / VID_NEW).resolve().as_uri() + "/",)
    platform = glibcfloor.check_platform(build, cuda="13.0", python="3.13")
    assert platform == "manylinux_2_43_x86_64"  # forky's, where the check of a 3.13 job runs
    declared = runtimereqs.Declared(requirements=(f"{DEP}>=0.1",), where="recipe.extra_requires")
    got = runtimereqs.check_wheelhouse(
        declared, package="dependent", python="3.13", dest=tmp_path / "houses", extra_index_urls=ours,
        platform=platform,
    )  # fmt: skip
    assert got.path is not None
    assert [p.name for p in got.path.glob("*.whl")] == [wheel.name]
    # the former target, manylinux_2_28 and older, leaves it out: the download fails before any compile
    with pytest.raises(FactoryError, match=DEP):
        runtimereqs.check_wheelhouse(
            declared, package="dependent", python="3.13", dest=tmp_path / "houses", extra_index_urls=ours
        )
