"""A sharded build's compiles of other shards (`factory build --shard I/N`): an empty object stands in.

The host names this shard's sources in FACTORY_SHARD_SOURCES (JSON, paths relative to the source root); any
other nvcc compile writes an empty object (the host compiler's, of an empty C file) and, when asked, a depfile
naming only its source, so that ninja and the link go on in a moment and the shard's own compiles reach the
compile cache. The wheel such a build makes is never used. Standard library only.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from . import nvcccall, protocol


def env_sources(name: str, environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """The JSON list of source paths in the variable `name`; None when it is unset or not a JSON list of
    strings: the build then compiles everything, which is never wrong, only slower."""
    return protocol.parse_paths((environ if environ is not None else os.environ).get(name))


def shard_sources(environ: Mapping[str, str] | None = None) -> tuple[str, ...] | None:
    """This shard's sources; None when the build is not sharded."""
    return env_sources(protocol.ENV_SHARD_SOURCES, environ)


def in_shard(source: str, sources: Sequence[str]) -> bool:
    """Whether a compile's source (as ninja passes it: usually absolute, in the build's copy of the tree) is
    one of the shard's relative paths."""
    path = os.path.normpath(source).replace(os.sep, "/")
    return any(path == rel or path.endswith("/" + rel) for rel in sources)


def host_compiler(call: nvcccall.NvccCall) -> str:
    return call.host_compiler or os.environ.get("CC") or "cc"


def stand_in(call: nvcccall.NvccCall, *, record: dict[str, object]) -> int:
    """Write the empty object and depfile of a compile outside the shard (the call the wrapper parsed), and
    its measurement line."""
    t0 = time.monotonic()
    obj, dep = call.output, call.depfile
    code = 0
    if obj is not None:
        code = subprocess.call([host_compiler(call), "-x", "c", "-c", os.devnull, "-o", obj])
    if dep is not None and code == 0:
        with open(dep, "w") as fh:
            fh.write(f"{_escaped(obj or 'out.o')}: {_escaped(call.source or '')}\n")
    line = {**record, "peak_bytes": 0, "wall_s": round(time.monotonic() - t0, 3), "rc": code}
    line["cache"] = protocol.CACHE_SKIPPED
    print(protocol.measurement_line(line), file=sys.stderr, flush=True)
    return code


def _escaped(path: str) -> str:
    """A path as a Makefile-style depfile writes it."""
    return path.replace(" ", "\\ ").replace("$", "$$")
