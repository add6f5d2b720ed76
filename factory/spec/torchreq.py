"""The torch requirement: the one owner of how a requirement on torch is spelled, for a wheel's METADATA and
for the torch installed with it (the build container's, the consumer's install command).

A wheel built against torch X.Y.Z links against X.Y's C++ ABI, which every patch release of X.Y keeps: its
METADATA requires `torch==X.Y.*` (never a bare `torch`, which would let pip swap torch under the wheel). A
stable-ABI wheel (`stable_abi`) serves every torch from its floor on: `torch>=FLOOR` (the page it is listed on
picks the CUDA build). The torch *installed* for a variant is the release as the variant names it: "2.14" is
every patch of that minor, "2.14.1" that release (`exact=True`).
"""

from __future__ import annotations

from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

TORCH = "torch"


def torch_requirement(torch: str, *, stable_abi: str | None = None, exact: bool = False) -> Requirement:
    """The requirement on torch for a wheel built against `torch` ("2.14.1+cu130" -> `torch==2.14.*`), or
    with `stable_abi` ("2.12") the stable-ABI wheel's `torch>=2.12`; with `exact`, the torch to install for a
    variant whose torch is `torch` ("2.14" -> `torch==2.14.*`, "2.14.1" -> `torch==2.14.1`). ValueError for a
    `torch` that is no PEP 440 version."""
    if stable_abi is not None and exact:
        raise ValueError("a stable-ABI floor is what a wheel requires, not a torch to install")
    try:
        version = Version(stable_abi if stable_abi is not None else torch)
    except InvalidVersion:
        raise ValueError(f"torch version {stable_abi or torch!r} is not a PEP 440 version") from None
    if stable_abi is not None:
        return Requirement(f"{TORCH}>={version}")
    if exact and torch.count(".") != 1:
        return Requirement(f"{TORCH}=={version}")
    major, minor = (*version.release, 0)[:2]
    return Requirement(f"{TORCH}=={major}.{minor}.*")
