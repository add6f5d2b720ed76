"""A compiler command line as the wrapper sees it: nvcc's, or the host compiler's behind the `c++` launcher.

One option table (`OPTIONS`) says which options take a value and how it may be written; `scan` splits a
command line into its arguments by it, and `parse` reads what admission, the compile cache, a shard's and a
preflight's stand-ins and the link records (`links`) need of one (`NvccCall`). Those decide what to do with
a call; this module only reads it, so that they never disagree on which argument is a source, the object or
an option's value. The wrapper parses each call once and hands the `NvccCall` on: no other module reads a
command line again (a preflight's one-arch line is derived from the parsed one, `NvccCall.without`).

How a value may be written:
- after the option, as the next argument (`-o k.o`, `--threads 4`), for every option that takes one
- after `=`: nvcc takes it for every option (`-gencode=arch=...`, `--output-file=k.o`); a host compiler only
  for long ones (to gcc `-o=k.o` names the file `=k.o`)
- right after the option's name (`-I/inc`, `-DX`), for the options gcc and nvcc both read that way; `-ok.o`
  and `-MFk.d` are gcc's only (to nvcc `-odir` is another option)

Standard library only, like the whole of its package.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

NVCC = "nvcc"
CXX = "cxx"
MODES = (NVCC, CXX)

# The source files of a compile, by what compiles them: nvcc's own, and what gcc compiles besides.
NVCC_SOURCE_SUFFIXES = (".cu", ".cpp", ".cc", ".cxx", ".c")
CXX_SOURCE_SUFFIXES = (*NVCC_SOURCE_SUFFIXES, ".c++", ".C", ".m", ".mm")
SOURCE_SUFFIXES = {NVCC: NVCC_SOURCE_SUFFIXES, CXX: CXX_SOURCE_SUFFIXES}


@dataclass(frozen=True, kw_only=True)
class Option:
    """One option: its spellings (the first names it in `Arg.option`), whether it takes a value, and in which
    modes that value may follow its short spelling directly."""

    spellings: tuple[str, ...]
    value: bool = True
    attached: tuple[str, ...] = ()


_BOTH = MODES
OPTIONS: tuple[Option, ...] = (
    Option(spellings=("-c", "--compile"), value=False),
    Option(spellings=("-o", "--output-file"), attached=(CXX,)),
    Option(spellings=("-MF", "--dependency-output"), attached=(CXX,)),
    Option(spellings=("-gencode", "--generate-code")),
    Option(spellings=("-arch", "--gpu-architecture")),
    Option(spellings=("-code", "--gpu-code")),
    Option(spellings=("-t", "--threads")),
    Option(spellings=("-ccbin", "--compiler-bindir")),
    Option(spellings=("-x",)),
    Option(spellings=("-I", "--include-path"), attached=_BOTH),
    Option(spellings=("-isystem", "--system-include"), attached=_BOTH),
    Option(spellings=("-iquote",), attached=_BOTH),
    Option(spellings=("-idirafter",)),
    Option(spellings=("-include",)),
    Option(spellings=("-imacros",)),
    Option(spellings=("-D", "--define-macro"), attached=_BOTH),
    Option(spellings=("-U", "--undefine-macro"), attached=_BOTH),
    Option(spellings=("-Xcompiler", "--compiler-options")),
    Option(spellings=("-Xptxas", "--ptxas-options")),
    Option(spellings=("-Xcudafe",)),
    Option(spellings=("-Xnvlink",)),
    Option(spellings=("-Xlinker",)),
    Option(spellings=("-Xarchive",)),
    Option(spellings=("-Xfatbin",)),
    Option(spellings=("-MT", "--dependency-target-name")),
    Option(spellings=("-MQ",)),
    Option(spellings=("-odir", "--output-directory")),
    Option(spellings=("-L",)),
    Option(spellings=("-l",)),
    Option(spellings=("-maxrregcount", "--maxrregcount")),
    Option(spellings=("-std", "--std")),
    # gcc's own, which nvcc does not know: a link's (`links`)
    Option(spellings=("-u",)),
    Option(spellings=("-T",)),
    Option(spellings=("-z",)),
    Option(spellings=("-Xassembler",)),
    Option(spellings=("-Xpreprocessor",)),
    Option(spellings=("-aux-info",)),
    Option(spellings=("-specs",)),
)
_BY_SPELLING = {s: o for o in OPTIONS for s in o.spellings}
# the spellings a value may be attached to, per mode, longest first (were two to share a start)
_ATTACHED = {
    mode: sorted((o.spellings[0] for o in OPTIONS if mode in o.attached), key=len, reverse=True)
    for mode in MODES
}


@dataclass(frozen=True, kw_only=True)
class Arg:
    """One argument of a command line, with its value when it is an option that takes one.

    `index` and `raw` are where it stands in the line and what it is made of there (the option and its value:
    one or two strings); `option` is the option's first spelling (None for a file or an option not in
    `OPTIONS`), `spelling` the one written; `value` is None for a flag, for a file and for an option given
    last without its value (`missing`)."""

    index: int
    raw: tuple[str, ...]
    option: str | None = None
    spelling: str | None = None
    value: str | None = None
    missing: bool = False

    @property
    def text(self) -> str:
        """The argument itself (an option's name as written, with what is attached to it)."""
        return self.raw[0]


def scan(args: Sequence[str], mode: str = NVCC) -> tuple[Arg, ...]:
    """A command line's arguments, each option with its value (`OPTIONS`)."""
    if mode not in MODES:
        raise ValueError(f"unknown compiler mode {mode!r} (not one of {', '.join(MODES)})")
    found: list[Arg] = []
    i = 0
    while i < len(args):
        arg = args[i]
        option = _BY_SPELLING.get(arg)
        if option is None:
            found.append(_single(i, arg, mode))
        elif not option.value:
            found.append(Arg(index=i, raw=(arg,), option=option.spellings[0], spelling=arg))
        elif i + 1 < len(args):
            value = args[i + 1]
            found.append(
                Arg(index=i, raw=(arg, value), option=option.spellings[0], spelling=arg, value=value)
            )
            i += 1
        else:
            found.append(Arg(index=i, raw=(arg,), option=option.spellings[0], spelling=arg, missing=True))
        i += 1
    return tuple(found)


def _single(i: int, arg: str, mode: str) -> Arg:
    """An argument that is not an option's spelling alone: `--name=value`, `-Xvalue`, a file, an option of no
    value, or one the table does not know."""
    if arg.startswith("-") and "=" in arg:
        name, value = arg.split("=", 1)
        option = _BY_SPELLING.get(name)
        if option is not None and option.value and (mode == NVCC or name.startswith("--")):
            return Arg(index=i, raw=(arg,), option=option.spellings[0], spelling=name, value=value)
    for spelling in _ATTACHED[mode]:
        if arg.startswith(spelling) and len(arg) > len(spelling):
            return Arg(index=i, raw=(arg,), option=spelling, spelling=spelling, value=arg[len(spelling) :])
    return Arg(index=i, raw=(arg,))


def is_file(arg: Arg) -> bool:
    """Whether an argument is a file the call reads or writes itself (not an option, not a value)."""
    return arg.option is None and (arg.text == "-" or not arg.text.startswith("-"))


def is_source(arg: Arg, mode: str = NVCC) -> bool:
    return arg.option is None and not arg.text.startswith("-") and arg.text.endswith(SOURCE_SUFFIXES[mode])


@dataclass(frozen=True, kw_only=True)
class NvccCall:
    """What a compiler command line says about itself."""

    mode: str
    args: tuple[Arg, ...]
    argv: tuple[str, ...]  # the command line itself, as it was given (the args' raw strings, in order)
    sources: tuple[str, ...]  # the source files, in order (`SOURCE_SUFFIXES`)
    reads_stdin: bool  # `-` among its files: its source is its standard input
    compile_only: bool  # -c
    output: str | None  # the last -o
    depfile: str | None  # the last -MF (--dependency-output)
    # the virtual archs its -gencode and -arch values name (compute_80: each is one cicc run), sorted;
    # ("default",) when it names none: nvcc's own default arch, one run, and how compile keys name it
    archs: tuple[str, ...]
    gencodes: tuple[str, ...]  # the -gencode values, in order
    threads: int  # --threads (nvcc reads 0 as "one per CPU": per compile that is one per arch)
    host_compiler: str | None  # the first -ccbin

    @property
    def source(self) -> str | None:
        """The source it compiles: the last one named."""
        return self.sources[-1] if self.sources else None

    @property
    def is_compile(self) -> bool:
        """A compile of a source (`-c`): anything else (a link, `--version`) is no compile."""
        return self.compile_only and self.source is not None

    def values(self, option: str) -> tuple[str, ...]:
        """The values an option (its first spelling) was given, in order."""
        return tuple(a.value for a in self.args if a.option == option and a.value is not None)

    def without(self, dropped: Iterable[Arg]) -> NvccCall:
        """The same call less some of its arguments, read from the arguments already scanned (an argument
        and its value stay one: no value can become an option)."""
        gone = {a.index for a in dropped}
        kept: list[Arg] = []
        at = 0
        for a in self.args:
            if a.index not in gone:
                kept.append(replace(a, index=at))
                at += len(a.raw)
        return read(tuple(kept), self.mode)


# nvcc reads --threads 0 as "as many as there are CPUs"; per compile that means one thread per arch
ALL_THREADS = 64


def parse(args: Sequence[str], mode: str = NVCC) -> NvccCall:
    """A command line read with the one option table (`scan`)."""
    return read(scan(args, mode), mode)


def read(scanned: tuple[Arg, ...], mode: str) -> NvccCall:
    """What scanned arguments say about their call."""
    archs: list[str] = []
    gencodes: list[str] = []
    threads = 1
    host: str | None = None
    output = depfile = None
    for a in scanned:
        if a.value is None:
            continue
        if a.option == "-gencode":
            gencodes.append(a.value)
            archs.extend(virtual_archs(a.value))
        elif a.option == "-arch":
            archs.extend(virtual_archs(a.value))
        elif a.option == "-t":
            threads = thread_count(a.value)
        elif a.option == "-ccbin" and host is None:
            host = a.value
        elif a.option == "-o":
            output = a.value
        elif a.option == "-MF":
            depfile = a.value
    return NvccCall(
        mode=mode,
        args=scanned,
        argv=tuple(raw for a in scanned for raw in a.raw),
        sources=tuple(a.text for a in scanned if is_source(a, mode)),
        reads_stdin=any(a.option is None and a.text == "-" for a in scanned),
        compile_only=any(a.option == "-c" for a in scanned),
        output=output,
        depfile=depfile,
        archs=tuple(sorted(set(archs))) or ("default",),
        gencodes=tuple(gencodes),
        threads=threads,
        host_compiler=host,
    )


def virtual_archs(value: str) -> list[str]:
    """The virtual archs of one -gencode or -arch value (`arch=compute_90,code=sm_90`, `sm_80`,
    `[sm_80,compute_80]`); each one is a cicc run."""
    match = re.search(r"arch=([a-z_0-9]+)", value)
    if match:
        return [match.group(1).replace("sm_", "compute_")]
    found: list[str] = []
    for part in value.split(","):
        part = part.strip("[] ")
        if part.startswith(("sm_", "compute_")):
            found.append(part.replace("sm_", "compute_"))
    return found


def thread_count(text: str) -> int:
    """An nvcc --threads value; one that is not a number is 1, nvcc's default."""
    try:
        value = int(text)
    except ValueError:
        return 1
    return value if value > 0 else ALL_THREADS


_INCLUDE_OPTIONS = ("-I", "-isystem", "-iquote", "-idirafter")
_LIST_SPELLINGS = ("--include-path", "--system-include")  # nvcc's: a comma-separated list of directories


def include_dirs(args: Iterable[Arg]) -> list[str]:
    """The include directories scanned arguments name, in order, with those passed to the host compiler
    (`-Xcompiler -isystem/x,-I/y`: the one value scanned here is that option's own)."""
    found: list[str] = []
    for a in args:
        if a.value is None:
            continue
        if a.option in _INCLUDE_OPTIONS:
            found.extend(a.value.split(",") if a.spelling in _LIST_SPELLINGS else [a.value])
        elif a.option == "-Xcompiler":
            found.extend(include_dirs(scan(a.value.split(","), NVCC)))
    return found
