"""factory.spec.imageref: image references are checked before any work, by Docker's grammar."""

from __future__ import annotations

import pytest

from factory.core.errors import ConfigError
from factory.spec.imageref import check_image_reference, is_image_reference


@pytest.mark.parametrize(
    "ref",
    [
        "factory-base:bookworm",
        "factory-builder:cu13.0-py3.11-pypi",
        "nvidia/cuda:13.0.1-devel-ubuntu24.04",
        "nvcr.io/nvidia/cuda:12.8.1-devel-ubuntu22.04",
        "localhost:5000/team/image:tag",
        "ubuntu",
        "image@sha256:" + "0" * 64,
        "my_org/my__image-name.x:v1.2",
    ],
)
def test_references_docker_takes(ref: str) -> None:
    assert is_image_reference(ref)
    check_image_reference(ref, "base image")


@pytest.mark.parametrize(
    "ref",
    ["", "no such/image:x", "bad name!", "Upper/case", "a:b:c", ":tag", "a/", "a//b", "-a", "a:" + "t" * 129],
)
def test_references_docker_refuses(ref: str) -> None:
    assert not is_image_reference(ref)
    with pytest.raises(ConfigError, match=r"^base image .* is not a Docker image reference"):
        check_image_reference(ref, "base image")
