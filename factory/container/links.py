"""What a build linked into which module: the object a compile writes, and the inputs of a shared link.

The nvcc wrapper records each compile's object (its measurement's "object"); the `c++` launcher, which the
driver makes the build's CXX, sees the link of every extension setuptools links as C++ (torch's
cpp_extension does) and prints one `::factory-link::` line for it. From the two the host tells which
modules carry no object nvcc compiled, so no kernels (`factory.buildlog.module_kinds`). Paths are made
absolute and normal here, with the call's working directory, so the two sides compare as strings.
Standard library only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

# a link input that can carry code: objects, and archives or shared libraries (which may hold anything)
INPUT_SUFFIXES = (".o", ".obj", ".lo", ".a", ".so")
# options of gcc/g++ (and nvcc) whose value is the next argument: never an input
_VALUE_OPTIONS = frozenset(
    {
        "-o", "-I", "-D", "-U", "-L", "-l", "-x", "-u", "-T", "-z", "-MF", "-MT", "-MQ", "-include",
        "-imacros", "-isystem", "-iquote", "-idirafter", "-Xlinker", "-Xcompiler", "-Xassembler",
        "-Xpreprocessor", "-ccbin", "--output-file", "--dependency-output", "-aux-info", "-specs",
    }
)  # fmt: skip
_NOT_A_LINK = frozenset({"-c", "-S", "-E", "--compile", "-M", "-MM", "--version", "-v", "-dlink"})


def output_of(argv: Sequence[str], cwd: str) -> str | None:
    """The file a compiler call writes (`-o X`, `-oX`, `--output-file[=]X`), absolute and normal; None
    without one."""
    found: str | None = None
    for i, arg in enumerate(argv):
        if arg in ("-o", "--output-file") and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--output-file="):
            found = arg.split("=", 1)[1]
        elif arg.startswith("-o") and len(arg) > 2 and not arg.startswith("--"):
            found = arg[2:]
    return os.path.normpath(os.path.join(cwd, found)) if found and found != "-" else None


@dataclass(frozen=True, kw_only=True)
class Link:
    output: str  # the shared object written, absolute
    inputs: tuple[str, ...]  # the objects, archives and libraries named as files, absolute


def link_of(argv: Sequence[str], cwd: str) -> Link | None:
    """The shared link a host-compiler call is (`-shared ... -o X.so`), or None for any other call."""
    if "-shared" not in argv or any(a in _NOT_A_LINK for a in argv):
        return None
    output = output_of(argv, cwd)
    if output is None:
        return None
    inputs: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg in _VALUE_OPTIONS:
            skip = True
            continue
        if arg.startswith("-") or not arg.endswith(INPUT_SUFFIXES):
            continue
        path = os.path.normpath(os.path.join(cwd, arg))
        if path != output:
            inputs.append(path)
    return Link(output=output, inputs=tuple(inputs))
