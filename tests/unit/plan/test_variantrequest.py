"""Build requests: the format (hostile inputs included), the rate limiter, storing and reading them, and
`factory matrix --requests` adding them to a plan."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.plan.plan import plan_matrix
from factory.plan.requestplan import add_requests
from factory.plan.variantrequest import (
    FORMAT,
    InboxFull,
    RateLimiter,
    RequestError,
    VariantRequest,
    compose,
    make_request,
    parse,
    parse_stored,
    read_requests,
    requests_directory,
    store_request,
)
from factory.spec.config import load_matrix_file

GOOD = {
    "format": FORMAT,
    "package": "flash-attn",
    "python": "3.11",
    "cuda": "13.0",
    "torch": "2.14",
    "cxx11_abi": True,
    "archs": ["9.0"],
}


def body(**changes: object) -> bytes:
    data = {**GOOD, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not ...}).encode()


def test_compose_and_parse_are_inverse_and_the_id_is_the_content_hash() -> None:
    request = make_request(
        package="flash-attn", python="3.11", cuda="13.0", torch="2.14", archs=["9.0", "8.0", "9.0"]
    )
    assert request.archs == ("8.0", "9.0")
    assert parse(compose(request)) == request
    assert request.file_name == f"{request.id}.json" and len(request.id) == 64
    # the same request however it is spelled: one id
    loose = json.dumps({**GOOD, "archs": ["9.0", "8.0"]}, indent=2).encode()
    assert parse(loose).id == request.id
    assert parse(body(package=None, archs=[])).archs == ()
    assert parse(body(archs=..., cxx11_abi=..., package=...)) == VariantRequest(
        package=None, python="3.11", cuda="13.0", torch="2.14"
    )


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not JSON"),
        (b"{", "not JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[]", "not a JSON object"),
        (b'"x"', "not a JSON object"),
        (b"[" * 3000 + b"]" * 3000, "over 4096 bytes"),
        (b"[" * 2000 + b"]" * 2000, "nested too deeply"),
        (body(extra="x"), "unknown key 'extra'"),
        (body(format="factory-request/2"), "format 'factory-request/2'"),
        (body(python=...), "missing key 'python'"),
        (b'{"format": "factory-request/1", "format": "factory-request/1"}', "duplicate key 'format'"),
        (body(python="3.11; rm -rf /"), "python '3.11; rm -rf /' is not a version"),
        (body(python="3.11\n"), "python"),
        (body(python="٣.١١"), "python"),  # other scripts' digits
        (body(python=3.11), "python 3.11 is not a version"),
        (body(cuda="../../etc"), "cuda '../../etc'"),
        (body(cuda="13.0.1"), "cuda"),
        (body(cuda="013.0"), "cuda"),
        (body(torch="2.14+cu130"), "torch"),
        (body(torch="$(id)"), "torch"),
        (body(torch="2." + "1" * 500), "torch"),
        (body(cxx11_abi=1), "cxx11_abi 1 is not true or false"),
        (body(cxx11_abi="true"), "cxx11_abi"),
        (body(archs="9.0"), "archs is not a list"),
        (body(archs=["sm_90"]), "archs: 'sm_90'"),
        (body(archs=["9.0;rm"]), "archs"),
        (body(archs=[9.0]), "archs: 9.0"),
        (body(archs=[f"{m}.0" for m in range(1, 20)]), "at most 16"),
        (body(package="../../x"), "package '../../x'"),
        (body(package="a" * 101), "package"),
        (body(package="flash attn"), "package"),
        (body(package="-x"), "package"),
        (body(package=["x"]), "package"),
        (b'{"format": NaN}', "NaN is not JSON"),
    ],
)
def test_hostile_requests_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(RequestError) as caught:
        parse(data)
    assert message in str(caught.value)
    assert len(str(caught.value)) < 200  # never echoes a long value back


def test_a_request_cannot_be_built_from_invalid_parts() -> None:
    with pytest.raises(RequestError):
        VariantRequest(package=None, python="3.11", cuda="13.0", torch="2.14", archs=("9.0", "8.0"))
    with pytest.raises(RequestError):
        VariantRequest(package=None, python="3.11", cuda="13.0", torch="2.14", archs=("9.0", "9.0"))


def test_a_stored_request_must_be_named_by_its_hash() -> None:
    request = parse(body())
    assert parse_stored(request.file_name, compose(request)) == request
    with pytest.raises(RequestError, match="not the sha256"):
        parse_stored("0" * 64 + ".json", compose(request))
    with pytest.raises(RequestError, match="file name"):
        parse_stored("../x.json", compose(request))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_limiter_per_client_and_overall() -> None:
    clock = Clock()
    limiter = RateLimiter(per_client=2, total=3, window_s=60, clock=clock)
    assert limiter.allow("a") is None and limiter.allow("a") is None
    assert limiter.allow("a") == 60  # a's third within the minute
    assert limiter.allow("b") is None
    assert limiter.allow("c") == 60  # three in all within the minute
    clock.now += 30
    assert limiter.allow("c") == 30
    clock.now += 30.5
    assert limiter.allow("a") is None and limiter.allow("c") is None


def test_rate_limiter_forgets_the_least_recent_clients_first() -> None:
    clock = Clock()
    limiter = RateLimiter(per_client=1, total=10_000, window_s=60, max_clients=3, clock=clock)
    for client in ("a", "b", "c", "d"):
        assert limiter.allow(client) is None
    assert len(limiter._clients) == 3 and "a" not in limiter._clients
    assert limiter.allow("d") is not None


def test_store_writes_atomically_by_hash_and_bounds_the_count(tmp_path: Path) -> None:
    first = parse(body())
    assert store_request(tmp_path, first) is True
    assert store_request(tmp_path, first) is False  # the same request: one file
    stored = tmp_path / "_requests" / first.file_name
    assert stored.read_bytes() == compose(first)
    assert [p.name for p in (tmp_path / "_requests").iterdir()] == [first.file_name]  # no temporary left
    with pytest.raises(InboxFull):
        store_request(tmp_path, parse(body(python="3.12")), max_stored=1)


def test_store_refuses_a_linked_requests_directory(tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "index").mkdir()
    (tmp_path / "index" / "_requests").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(OSError):
        store_request(tmp_path / "index", parse(body()))
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_read_requests_refuses_what_it_did_not_write(tmp_path: Path) -> None:
    request = parse(body())
    store_request(tmp_path, request)
    directory = tmp_path / "_requests"
    (directory / ("1" * 64 + ".json")).write_bytes(compose(parse(body(python="3.12"))))  # renamed
    (directory / "evil.json").write_text("{}")
    (directory / ("2" * 64 + ".json")).symlink_to("/etc/passwd")
    os.mkfifo(directory / ("3" * 64 + ".json"))
    (directory / ".tmp-x").write_text("partial")
    warned: list[str] = []
    found = dict(read_requests(directory, warn=warned.append))
    assert warned == []
    assert found[request.file_name] == request
    assert "not the sha256" in str(found["1" * 64 + ".json"])
    assert "file name" in str(found["evil.json"])
    assert set(found) == {
        request.file_name,
        "1" * 64 + ".json",
        "evil.json",
    }  # link, FIFO, temporary passed over


def test_past_its_bound_the_directory_is_said_to_be_read_in_part(tmp_path: Path) -> None:
    request = parse(body(package="demo-ext", python="3.12"))
    store_request(tmp_path, request)
    directory = tmp_path / "_requests"
    for i in range(4):  # names that sort before the request's
        (directory / f"{i:064x}.json").write_bytes(b"{}")
    warned: list[str] = []
    assert len(read_requests(directory, warn=warned.append, max_entries=5)) == 5
    assert warned == []  # five entries: all read
    (directory / ("f" * 64 + ".json")).write_bytes(b"{}")
    warned.clear()
    read = read_requests(directory, warn=warned.append, max_entries=5)
    assert len(read) == 5 and ("f" * 64 + ".json") not in dict(read)
    assert dict(read)[request.file_name] == request
    assert warned == [
        f"{directory}: more than 5 entries (an index keeps at most 1000 requests); only the first 5 by name "
        "were read"
    ]


def test_cli_matrix_requests_says_when_the_directory_is_past_its_bound(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from factory.cli import app

    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    directory = tmp_path / "_requests"
    directory.mkdir()
    for i in range(2001):
        (directory / f"{i:064x}.json").write_bytes(b"{}")
    result = CliRunner().invoke(app, ["matrix", "-m", str(path), "--requests", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert f"warning: {directory}: more than 2000 entries" in result.output
    assert "2000 dropped" in result.output  # each refused file a row, the one past the bound none


def test_requests_directory(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no _requests/"):
        requests_directory(str(tmp_path))
    (tmp_path / "_requests").mkdir()
    assert requests_directory(str(tmp_path)) == tmp_path / "_requests"
    assert requests_directory(str(tmp_path / "_requests")) == tmp_path / "_requests"
    assert requests_directory(tmp_path.as_uri()) == tmp_path / "_requests"
    with pytest.raises(ConfigError, match="file:// URL"):
        requests_directory("http://127.0.0.1:8000/")


MATRIX = """\
package: {name: demo-ext, version: "1.0"}
recipe: torch-ext
matrix:
  cuda: ["13.0"]
  torch: ["2.14"]
  python: ["3.11"]
  cxx11_abi: [true]
  arch: ["8.0;9.0;10.0;12.0"]
build:
  torch_index: {"13.0": default, "12.8": default}
compat:
  torch:
    "2.14": {"cuda": ["13.0"], "default_cuda": "13.0", "python": ["3.10", "3.11", "3.12"], "complete": true}
    "2.10": {"cuda": ["12.6", "12.8", "13.0"], "default_cuda": "12.8", "python": ["3.11"]}
"""


def test_matrix_requests_adds_what_compat_allows_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == ["cu130-torch2.14-abi1-sm80.90.100.120-py311"]

    def req(**kw: object) -> tuple[str, VariantRequest | str]:
        r = parse(body(package="demo-ext", **kw))
        return r.file_name, r

    requests = [
        req(python="3.12", archs=["8.6"]),  # added, with the matrix's arch set (sm_80 runs on 8.6)
        req(python="3.12", archs=["7.5"]),  # added with its own arch: no set of the matrix covers it
        req(python="3.11", archs=["9.0"]),  # planned already
        req(python="3.14"),  # torch 2.14 has no wheels for 3.14
        req(torch="2.10", cuda="13.0"),  # the default index's 2.10 is a 12.8 build
        req(torch="2.99"),  # unknown to the compat data: not built
        req(python="3.12", archs=["6.0"]),  # CUDA 13 lost sm_60
        (parse(body(package="other")).file_name, parse(body(package="other"))),
        ("bad.json", "not JSON"),
    ]
    out = add_requests(mf, plan, requests)
    added = [j for j in out.jobs if j not in plan.jobs]
    assert [j.id for j in added] == [
        "cu130-torch2.14-abi1-sm80.90.100.120-py312",
        "cu130-torch2.14-abi1-sm75-py312",
    ]
    assert all(any(n.startswith("requested (") for n in j.notes) for j in added)
    reasons = sorted(d.reason.split(": ", 1)[1] for d in out.dropped)
    assert reasons == sorted(
        [
            "planned already (cu130-torch2.14-abi1-sm80.90.100.120-py311)",
            "torch 2.14 has no wheels for Python 3.14 (only 3.10, 3.11, 3.12)",
            "torch 2.10 on the default index is a CUDA 12.8 build, not 13.0 "
            "(build.torch_index 13.0: default)",
            "the compatibility data knows nothing about torch 2.99",
            "no arch left: 6.0 trimmed: CUDA 13.0 cannot target sm_60 (last supported by CUDA 12.9)",
            "for other; this matrix builds demo-ext",
            "refused: not JSON",
        ]
    )


def test_a_request_the_matrixs_exclude_takes_out_is_dropped_naming_the_entry(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    excludes = (
        "  exclude:\n"
        '    - {python: "3.12"}\n'
        '    - {torch: "2.14", python: "3.10", cxx11_abi: false}\n'
        '    - {python: ">=3.13", cuda: "13.0"}\n'
    )
    arch = '  arch: ["8.0;9.0;10.0;12.0"]\n'
    path.write_text(
        textwrap.dedent(MATRIX)
        .replace('python: ["3.11"]', 'python: ["3.11", "3.12"]')
        .replace(arch, arch + excludes)
    )
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    assert [j.python for j in plan.jobs] == ["3.11"]

    def req(**kw: object) -> tuple[str, VariantRequest | str]:
        r = parse(body(package="demo-ext", **kw))
        return r.file_name, r

    out = add_requests(
        mf,
        plan,
        [
            req(python="3.12", archs=["8.6"]),
            req(python="3.12", torch="2.14.1", archs=["9.0"]),
            req(python="3.10", cxx11_abi=False),
            req(python="3.10"),  # the C++11 ABI it asks for is not excluded
        ],
    )
    assert [j.python for j in out.jobs] == ["3.11", "3.10"]
    reasons = sorted(d.reason.split(": ", 1)[1] for d in out.dropped)
    assert len(reasons) == 3
    assert all(r.startswith("the matrix excludes it: matrix.exclude[") for r in reasons)
    assert any("matrix.exclude[0] (line " in r and "{python: 3.12}" in r for r in reasons)
    assert any("{torch: 2.14, python: 3.10, cxx11_abi: false}" in r for r in reasons)


def test_cli_matrix_requests_table_and_a_missing_directory(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from factory.cli import app

    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    result = CliRunner().invoke(app, ["matrix", "-m", str(path), "--requests", str(tmp_path / "nowhere")])
    assert isinstance(result.exception, ConfigError) and "no _requests/ directory" in str(result.exception)
    store_request(tmp_path, parse(body(package="demo-ext", python="3.12")))
    store_request(tmp_path, parse(body(package="demo-ext", python="3.14")))
    result = CliRunner().invoke(app, ["matrix", "-m", str(path), "--requests", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "3.12" in result.output and "requested (" in result.output
    assert "torch 2.14 has no wheels for Python 3.14" in result.output
    assert "2 jobs in 1 variants; 1 dropped" in result.output


def test_an_exclude_naming_the_default_platform_drops_a_request(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    arch = '  arch: ["8.0;9.0;10.0;12.0"]\n'
    path.write_text(
        textwrap.dedent(MATRIX).replace(arch, arch + '  exclude:\n    - {python: "3.12", platform: x86_64}\n')
    )
    mf = load_matrix_file(path)
    request = parse(body(package="demo-ext", python="3.12", archs=["8.6"]))
    out = add_requests(mf, plan_matrix(mf), [(request.file_name, request)])
    assert [j.python for j in out.jobs] == ["3.11"]
    assert [d.reason.split(": ", 1)[1] for d in out.dropped] == [
        "the matrix excludes it: matrix.exclude[0] (line 10) {python: 3.12, platform: x86_64}"
    ]
