"""What a build linked into which module: the object a compile writes, and the inputs of a shared link.

The nvcc wrapper records each compile's object (its measurement's "object"); the `c++` launcher, which the
driver makes the build's CXX, sees the link of every extension setuptools links as C++ (torch's
cpp_extension does) and prints one `::factory-link::` line for it. From the two the host tells which
modules carry no object nvcc compiled, so no kernels (`factory.build.logs.module_kinds`). Paths are made
absolute and normal here, with the call's working directory, so the two sides compare as strings. Both read
the call the wrapper parsed (`nvcccall.NvccCall`). Standard library only.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from . import nvcccall

# a link input that can carry code: objects, and archives or shared libraries (which may hold anything)
INPUT_SUFFIXES = (".o", ".obj", ".lo", ".a", ".so")
_NOT_A_LINK = frozenset({"-c", "-S", "-E", "--compile", "-M", "-MM", "--version", "-v", "-dlink"})


def output_of(call: nvcccall.NvccCall, cwd: str) -> str | None:
    """The file a compiler call writes (`-o X`, `--output-file[=]X`, and the host compiler's `-oX`),
    absolute and normal; None without one."""
    found = call.output
    return os.path.normpath(os.path.join(cwd, found)) if found and found != "-" else None


@dataclass(frozen=True, kw_only=True)
class Link:
    output: str  # the shared object written, absolute
    inputs: tuple[str, ...]  # the objects, archives and libraries named as files, absolute


def link_of(call: nvcccall.NvccCall, cwd: str) -> Link | None:
    """The shared link a host-compiler call is (`-shared ... -o X.so`), or None for any other call."""
    if "-shared" not in call.argv or any(a in _NOT_A_LINK for a in call.argv):
        return None
    output = output_of(call, cwd)
    if output is None:
        return None
    inputs: list[str] = []
    for arg in call.args:
        if arg.option is not None or arg.text.startswith("-") or not arg.text.endswith(INPUT_SUFFIXES):
            continue
        path = os.path.normpath(os.path.join(cwd, arg.text))
        if path != output:
            inputs.append(path)
    return Link(output=output, inputs=tuple(inputs))
