"""Build requests: the format (hostile inputs included), the rate limiter, storing and reading them, and
`factory matrix --requests` adding them to a plan."""

from __future__ import annotations

import hashlib
import json
import os
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest

from factory.core.errors import ConfigError
from factory.core.platforms import DEFAULT_PLATFORM, named
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
    matrix_lines,
    parse,
    parse_stored,
    read_requests,
    requests_directory,
    store_request,
)
from factory.spec.config import load_matrix_file
from tests.torch_index_helpers import TorchWheel, make_index

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
        (body(platform="sparc"), "platform 'sparc' is not one of x86_64, aarch64"),
        (body(platform="AARCH64"), "platform 'AARCH64'"),  # the tag's spelling only
        (body(platform="arm64"), "platform 'arm64'"),  # a machine's other name is not a platform's
        (body(platform="aarch64\n"), "platform"),
        (body(platform=""), "platform '' is not"),
        (body(platform=None), "platform None"),
        (body(platform=["aarch64"]), "platform ['aarch64']"),
        (body(platform="x" * 500), "platform 'xxxxx"),
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


def req(**kw: object) -> tuple[str, VariantRequest | str]:
    """A demo-ext request of `kw`, as `add_requests` takes it: (its file name, the request)."""
    r = parse(body(package="demo-ext", **kw))
    return r.file_name, r


def test_matrix_requests_adds_what_compat_allows_and_drops_the_rest(tmp_path: Path) -> None:
    path = tmp_path / "matrix.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == ["cu130-torch2.14-abi1-sm80.90.100.120-py311"]

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


AARCH64 = named("aarch64")


def test_a_request_carries_its_platform_and_the_default_one_is_written_as_before() -> None:
    arm = parse(body(platform="aarch64"))
    assert arm.platform == AARCH64
    assert parse(compose(arm)) == arm and json.loads(compose(arm))["platform"] == "aarch64"
    # a request written before the platform axis: the default platform's, its bytes (and so its id and the
    # name of its file) what that factory wrote, with no platform key
    old = parse(body())
    assert old.platform == DEFAULT_PLATFORM
    before = json.dumps(GOOD, sort_keys=True, separators=(",", ":")).encode()
    assert compose(old) == before
    assert old.file_name == hashlib.sha256(before).hexdigest() + ".json"
    assert parse_stored(old.file_name, before) == old
    # the default platform said outright is the same request, stored under the same name
    assert parse(body(platform=DEFAULT_PLATFORM.name)).id == old.id
    assert arm.id != old.id
    assert (
        make_request(
            package="flash-attn", python="3.11", cuda="13.0", torch="2.14", archs=["9.0"], platform=AARCH64
        )
        == arm
    )
    with pytest.raises(RequestError, match="platform"):
        VariantRequest(package=None, python="3.11", cuda="13.0", torch="2.14", platform="aarch64")  # type: ignore[arg-type]


def test_a_stored_request_of_another_platform_must_be_named_by_its_hash_too(tmp_path: Path) -> None:
    arm = parse(body(platform="aarch64"))
    x86 = replace(arm, platform=DEFAULT_PLATFORM)
    assert store_request(tmp_path, arm) is True and store_request(tmp_path, x86) is True  # two requests
    directory = tmp_path / "_requests"
    # the aarch64 request's bytes under the x86_64 one's name: refused, not read as either
    (directory / x86.file_name).write_bytes(compose(arm))
    found = dict(read_requests(directory, warn=pytest.fail))
    assert found[arm.file_name] == arm
    assert "not the sha256" in str(found[x86.file_name])


def test_matrix_lines_name_a_platform_other_than_the_default() -> None:
    import yaml

    arm = parse(body(platform="aarch64", archs=["9.0", "10.0"]))
    assert matrix_lines(arm)[-1] == (
        '    - {cuda: "13.0", torch: "2.14", python: "3.11", cxx11_abi: true, arch: "9.0;10.0", '
        "platform: aarch64}"
    )
    assert yaml.safe_load("\n".join(matrix_lines(arm)))["matrix"]["include"][0]["platform"] == "aarch64"
    assert "platform" not in "\n".join(matrix_lines(parse(body())))


# torch 2.14.1 (a CUDA 13.0 build) on the index: x86_64 wheels for Python 3.10 to 3.12, aarch64 ones for 3.12
TORCH = [
    TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=("3.10", "3.11", "3.12")),
    TorchWheel("2.14.1", "13.0", cxx_std="20", pythons=("3.12",), platform="manylinux_2_28_aarch64"),
]


@pytest.fixture
def torch_index(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The host's pip configuration naming a local index with `TORCH` (and nothing else)."""
    simple = make_index(tmp_path_factory.mktemp("torch-index"), TORCH)
    for var in [v for v in os.environ if v.startswith("PIP_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", simple.as_uri())
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path_factory.mktemp("home")))
    return simple


def pypi_matrix(tmp_path: Path, extra: str = "") -> Path:
    """MATRIX built with the pypi flavor (whose builders exist for every platform), `extra` under matrix:."""
    arch = '  arch: ["8.0;9.0;10.0;12.0"]\n'
    path = tmp_path / "matrix.yaml"
    path.write_text(
        textwrap.dedent(MATRIX).replace(arch, arch + extra).replace("build:\n", "build:\n  flavor: pypi\n")
    )
    return path


def test_a_request_is_planned_for_its_platform_or_dropped_with_the_reason(
    tmp_path: Path, torch_index: Path
) -> None:
    mf = load_matrix_file(pypi_matrix(tmp_path))
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == ["cu130-torch2.14-abi1-sm80.90.100.120-py311"]

    out = add_requests(
        mf,
        plan,
        [
            req(python="3.12", archs=["9.0"], platform="aarch64"),  # a GH200: added for aarch64
            req(python="3.12", archs=["8.6"]),  # the same job for x86_64: another job
            req(python="3.12", archs=["10.0"], platform="aarch64"),  # the same arch set: planned already
            req(python="3.11", archs=["9.0"], platform="aarch64"),  # no aarch64 torch for 3.11
            req(python="3.11", archs=["9.0"]),  # x86_64, in the matrix already
        ],
    )
    added = {j.id: j for j in out.jobs if j not in plan.jobs}  # in the order of the requests' names
    assert {i: j.platform for i, j in added.items()} == {
        "cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64": AARCH64,
        "cu130-torch2.14-abi1-sm80.90.100.120-py312": DEFAULT_PLATFORM,
    }
    assert added["cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64"].to_json()["platform"] == "aarch64"
    assert "platform" not in added["cu130-torch2.14-abi1-sm80.90.100.120-py312"].to_json()
    dropped = {d.id: d.reason.split(": ", 1)[1] for d in out.dropped}
    assert len(out.dropped) == 3 and dropped == {
        "cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64": (
            "planned already (cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64)"
        ),
        "cu130-torch2.14-abi1-sm80.90.100.120-py311-aarch64": (
            "no torch 2.14 wheel for Python 3.11 on aarch64 on the pip configuration's indexes (it has "
            "Python 3.12)"
        ),
        "cu130-torch2.14-abi1-sm80.90.100.120-py311": (
            "planned already (cu130-torch2.14-abi1-sm80.90.100.120-py311)"
        ),
    }


def test_a_requests_platform_meets_the_matrixs_exclude_and_flavor(tmp_path: Path, torch_index: Path) -> None:
    arm = parse(body(package="demo-ext", python="3.12", archs=["9.0"], platform="aarch64"))
    x86 = parse(body(package="demo-ext", python="3.12", archs=["9.0"]))
    both = [(arm.file_name, arm), (x86.file_name, x86)]
    mf = load_matrix_file(pypi_matrix(tmp_path, "  exclude:\n    - {platform: aarch64}\n"))
    unknown_gpus = parse(body(package="demo-ext", python="3.12", archs=[], platform="aarch64"))
    out = add_requests(mf, plan_matrix(mf), [*both, (unknown_gpus.file_name, unknown_gpus)])
    assert [j.platform for j in out.jobs] == [DEFAULT_PLATFORM, DEFAULT_PLATFORM]
    assert [d.reason.split(": ", 1)[1] for d in out.dropped] == [
        "the matrix excludes it: matrix.exclude[0] (line 10) {platform: aarch64}"
    ] * 2
    # the manylinux flavor (PyTorch's x86_64 builder) builds the default platform only: an aarch64 request
    # is not built by a matrix of it
    path = tmp_path / "manylinux.yaml"
    path.write_text(textwrap.dedent(MATRIX).replace("build:\n", "build:\n  flavor: manylinux\n"))
    mf = load_matrix_file(path)
    out = add_requests(mf, plan_matrix(mf), both)
    assert [j.platform for j in out.jobs] == [DEFAULT_PLATFORM, DEFAULT_PLATFORM]
    [dropped] = out.dropped
    assert dropped.values["platform"] == "aarch64"
    assert dropped.reason.split(": ", 1)[1] == (
        "flavor manylinux builds x86_64 only; aarch64 jobs use flavor pypi or devel"
    )
    # the devel flavor (NVIDIA's multi-platform images) builds both: the aarch64 request is planned
    path = tmp_path / "devel.yaml"
    path.write_text(textwrap.dedent(MATRIX))
    mf = load_matrix_file(path)
    assert mf.build.flavor == "devel"
    out = add_requests(mf, plan_matrix(mf), both)
    assert sorted(j.platform.name for j in out.jobs) == ["aarch64", "x86_64", "x86_64"]
    assert not out.dropped


def test_the_matrix_lines_of_an_aarch64_request_plan_its_job(tmp_path: Path, torch_index: Path) -> None:
    """What `factory which` prints for an aarch64 host, put in a matrix, builds the wheel it asked for."""
    arm = parse(body(package="demo-ext", python="3.12", archs=["9.0"], platform="aarch64"))
    lines = "\n".join(matrix_lines(arm))
    path = tmp_path / "matrix.yaml"
    path.write_text(
        'package: {name: demo-ext, version: "1.0"}\nrecipe: torch-ext\n'
        + lines
        + '\nbuild:\n  flavor: pypi\n  torch_index: {"13.0": default}\n'
    )
    [job] = plan_matrix(load_matrix_file(path)).jobs
    assert (job.platform, job.python, job.variant.arch) == (AARCH64, "3.12", "9.0")


def test_cli_matrix_requests_plans_an_aarch64_request_and_drops_a_bad_platform(
    tmp_path: Path, torch_index: Path
) -> None:
    from typer.testing import CliRunner

    from factory.cli import app

    path = pypi_matrix(tmp_path)
    arm = parse(body(package="demo-ext", python="3.12", platform="aarch64"))
    store_request(tmp_path, arm)
    bad = json.dumps({**GOOD, "platform": "sparc"}, sort_keys=True, separators=(",", ":")).encode()
    (tmp_path / "_requests" / f"{hashlib.sha256(bad).hexdigest()}.json").write_bytes(bad)
    result = CliRunner().invoke(app, ["matrix", "-m", str(path), "--requests", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert [(j["job_id"], j.get("platform")) for j in doc["jobs"]] == [
        ("cu130-torch2.14-abi1-sm80.90.100.120-py311", None),
        ("cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64", "aarch64"),
    ]
    [dropped] = doc["dropped"]
    assert dropped["reason"].endswith(": refused: platform 'sparc' is not one of x86_64, aarch64")
    # in CI the requested aarch64 job builds on its platform's runner, never under emulation
    result = CliRunner().invoke(
        app, ["matrix", "-m", str(path), "--requests", str(tmp_path), "--format", "github"]
    )
    assert result.exit_code == 0, result.output
    runners = {j["job_id"]: j["runs_on"] for j in json.loads(result.output)["include"]}
    assert runners == {
        "cu130-torch2.14-abi1-sm80.90.100.120-py311": list(DEFAULT_PLATFORM.ci_runner),
        "cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64": list(AARCH64.ci_runner),
    }


def test_an_abi3_job_of_one_platform_does_not_cover_a_request_for_another(
    tmp_path: Path, torch_index: Path
) -> None:
    """The x86_64 abi3 wheel of Python 3.11 installs on 3.12 too, on x86_64 only: an aarch64 request for
    3.12 is a job of its own, an x86_64 one is planned already."""
    path = tmp_path / "matrix.yaml"
    path.write_text(
        textwrap.dedent(MATRIX)
        .replace("recipe: torch-ext", "recipe: {name: torch-ext, py_limited_api: true}")
        .replace('python: ["3.11"]', 'python: ["3.11", "3.12"]')
        .replace("build:\n", "build:\n  flavor: pypi\n")
    )
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    assert [(j.id, j.covers) for j in plan.jobs] == [
        ("cu130-torch2.14-abi1-sm80.90.100.120-py311", ("3.12",))
    ]
    arm = parse(body(package="demo-ext", python="3.12", archs=["9.0"], platform="aarch64"))
    x86 = parse(body(package="demo-ext", python="3.12", archs=["9.0"]))
    out = add_requests(mf, plan, [(arm.file_name, arm), (x86.file_name, x86)])
    assert [(j.id, j.limited_api) for j in out.jobs] == [
        ("cu130-torch2.14-abi1-sm80.90.100.120-py311", "cp311"),
        ("cu130-torch2.14-abi1-sm80.90.100.120-py312-aarch64", "cp312"),
    ]
    assert [d.reason.split(": ", 1)[1] for d in out.dropped] == [
        "planned already (cu130-torch2.14-abi1-sm80.90.100.120-py311)"
    ]


def test_a_request_takes_the_arch_set_the_matrix_gives_its_platform(
    tmp_path: Path, torch_index: Path
) -> None:
    """matrix.yaml's way: every arch set in the axis, each platform's own kept by excluding the others. A
    GH200 or a DGX Spark asking for aarch64 gets the aarch64 set (sm_121 for the Spark), an x86_64 host
    with the same GPU the x86_64 one; neither is dropped as excluded."""
    sets = '  arch: ["8.0;9.0;10.0;12.0", "9.0;10.0;12.1"]\n'
    path = tmp_path / "matrix.yaml"
    path.write_text(
        textwrap.dedent(MATRIX)
        .replace('  arch: ["8.0;9.0;10.0;12.0"]\n', sets + "  platform: [x86_64, aarch64]\n  exclude:\n"
                 '    - {platform: x86_64, arch: "9.0;10.0;12.1"}\n'
                 '    - {platform: aarch64, arch: "8.0;9.0;10.0;12.0"}\n')
        .replace("build:\n", "build:\n  flavor: pypi\n")
    )  # fmt: skip
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == [
        "cu130-torch2.14-abi1-sm80.90.100.120-py311"
    ]  # no aarch64 torch for 3.11

    def req(**kw: object) -> tuple[str, VariantRequest | str]:
        r = parse(body(package="demo-ext", python="3.12", **kw))
        return r.file_name, r

    out = add_requests(
        mf,
        plan,
        [
            req(archs=["12.1"], platform="aarch64"),
            req(archs=["9.0"], platform="aarch64"),  # the same set
            req(archs=["12.1"]),
        ],
    )
    assert sorted(j.id for j in out.jobs if j not in plan.jobs) == [
        "cu130-torch2.14-abi1-sm80.90.100.120-py312",
        "cu130-torch2.14-abi1-sm90.100.121-py312-aarch64",
    ]
    assert [d.reason.split(": ", 1)[1] for d in out.dropped if d not in plan.dropped] == [
        "planned already (cu130-torch2.14-abi1-sm90.100.121-py312-aarch64)"
    ]
