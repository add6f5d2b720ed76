"""Docker image references given by users (a base image, a tag to make), checked before any work starts:
the daemon refuses a malformed one only when it is first used, after a minute of debootstrap or as an API
error."""

from __future__ import annotations

import re

from factory.core.errors import ConfigError

# distribution/reference's grammar: [domain[:port]/]path-component(/path-component)*[:tag][@digest]
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
# Docker takes a first component for a registry only with a dot, a port, or as localhost; else it is a path
# component, which must be lowercase
_DOMAIN = rf"(?:(?:localhost|{_LABEL}(?:\.{_LABEL})+|\[[0-9a-fA-F:]+\])(?::[0-9]+)?|{_LABEL}:[0-9]+)"
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG = r"[\w][\w.-]{0,127}"
_DIGEST = r"[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}"
_REFERENCE = re.compile(rf"^(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?$")

NOT_AN_IMAGE = "is not a Docker image reference (like factory-base:bookworm)"


def is_image_reference(ref: str) -> bool:
    """Whether Docker would take `ref` as an image name (`factory-base:bookworm`,
    `nvcr.io/nvidia/cuda:13.0.1-devel-ubuntu24.04`, `localhost:5000/x@sha256:...`)."""
    return len(ref) <= 255 and _REFERENCE.fullmatch(ref) is not None


def check_image_reference(ref: str, what: str) -> None:
    if not is_image_reference(ref):
        raise ConfigError(f"{what} {ref!r} {NOT_AN_IMAGE}")
