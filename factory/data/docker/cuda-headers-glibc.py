"""Make CUDA 13.0's crt/math_functions.h agree with glibc >= 2.42 on rsqrt and rsqrtf.

glibc 2.42 declares the C23 functions rsqrt and rsqrtf in <math.h> (noexcept in C++, whenever g++'s
_GNU_SOURCE is on); CUDA 13.0 declares them without an exception specification, so every .cu file that
includes <cmath> fails on such a glibc (Debian forky): "exception specification is incompatible with that of
previous function "rsqrt"". The toolkit already does this for sinpi/cospi (glibc 2.41,
__NV_IEC_60559_FUNCS_EXCEPTION_SPECIFIER); this gives rsqrt/rsqrtf the same specifier where glibc is >= 2.42.
On an older glibc the specifier is empty, so the header compiles exactly as shipped; a header that already
gives the declarations a specifier is left alone.

Usage: python3 cuda-headers-glibc.py PATH/TO/crt/math_functions.h   (run while the builder image is made)
"""

from __future__ import annotations

import re
import sys

MACRO = "__NV_FACTORY_RSQRT_SPECIFIER"
GUARD = (
    f"#if __NV_GLIBC_PROVIDES_IEC_60559_FUNCS && defined(__GLIBC_PREREQ) && __GLIBC_PREREQ(2, 42)\n"
    f"#define {MACRO} __THROW\n"
    f"#else\n"
    f"#define {MACRO}\n"
    f"#endif\n"
)
DECLARATION = re.compile(
    r"^(extern __DEVICE_FUNCTIONS_DECL__ __device_builtin__ (?:double|float) +"
    r"rsqrtf?\((?:double|float) x\));$",
    re.MULTILINE,
)


def patched(text: str) -> str:
    """The header with rsqrt/rsqrtf declared with glibc's specifier; unchanged when there is nothing to do."""
    first = DECLARATION.search(text)
    if first is None or MACRO in text:
        return text
    head, tail = text[: first.start()], text[first.start() :]
    return head + GUARD + DECLARATION.sub(rf"\1 {MACRO};", tail)


def main(argv: list[str]) -> int:
    (path,) = argv
    with open(path) as f:
        text = f.read()
    new = patched(text)
    if new != text:
        with open(path, "w") as f:
            f.write(new)
        print(f"factory: {path}: rsqrt/rsqrtf declared with glibc >= 2.42's exception specification")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
