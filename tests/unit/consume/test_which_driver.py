"""`factory which` without torch: the driver's CUDA, the choice it makes, the one install command."""

from __future__ import annotations

import pytest

from factory.consume.hostgpu import cuda_from_driver_api, driver_cuda, parse_proc_version, parse_smi_header
from factory.consume.which import (
    Environment,
    choose_variant,
    describe_environment,
    driver_runs,
    has_wheel_for,
    missing_lines,
    missing_request,
    rank_without_torch,
    torch_for,
)
from factory.core.variants import VariantKey
from factory.publish.installcmd import Torch
from factory.spec.compat import CompatData

SMI = """\
Sun Dec  6 23:29:58 2026
+-----------------------------------------------------------------------------------------+
| NVIDIA-SMI 580.65.06              Driver Version: 580.65.06      CUDA Version: 13.0     |
|-----------------------------------------+------------------------+----------------------+
"""
PROC = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  575.57.08  Release Build  "
    "(dvs-builder@U16-I3-B03-4-3)  Wed May 21 12:15:03 UTC 2025\nGCC version:  gcc version 12.2.0\n"
)


# a fixed slice of compat.json, so that these tests do not follow its edits
COMPAT = CompatData(
    data={
        "torch": {
            "2.10": {"cuda": ["12.6", "12.8", "13.0"], "default_cuda": "12.8", "python": ["3.10", "3.11"]},
            "2.11": {"cuda": ["12.6", "12.8", "13.0"], "default_cuda": "13.0", "python": ["3.10", "3.11"]},
            "2.14": {"cuda": ["13.0"], "default_cuda": "13.0", "python": ["3.11"], "cxx11_abi": [True]},
            "2.15": {"cuda": ["13.2"], "default_cuda": "13.2", "python": ["3.12"], "cxx11_abi": [True]},
        }
    }
)


def host(**kw: object) -> Environment:
    fields: dict[str, object] = {
        "python": "3.11",
        "torch": None,
        "cuda": None,
        "cxx11_abi": None,
        "gpus": ("9.0",),
        "gpu_source": "nvidia-smi",
        "driver_cuda": "13.0",
        "driver_source": "nvidia-smi",
    }
    fields.update(kw)
    return Environment(**fields)  # type: ignore[arg-type]


def test_smi_header_names_the_driver_cuda() -> None:
    assert parse_smi_header(SMI) == "13.0"
    assert parse_smi_header("| CUDA Version: 12.10 |") == "12.10"
    assert parse_smi_header("No devices were found") is None
    assert parse_smi_header("CUDA Version: N/A") is None
    assert parse_smi_header("CUDA Version: ١٣.0") is None  # other scripts' digits are no version


def test_proc_version_gives_the_driver_version() -> None:
    assert parse_proc_version(PROC) == "575.57.08"
    closed = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023\n"
    assert parse_proc_version(closed) == "535.54.03"
    assert parse_proc_version("GCC version: 12.2.0\n") is None
    assert parse_proc_version("NVRM version: nothing here\n") is None


@pytest.mark.parametrize(
    ("driver", "cuda"),
    [
        ("580.65.06", "13.0"),
        ("580.82.07", "13.0"),
        ("590.44.01", "13.1"),
        ("999.1", "13.1"),  # newer than the table: at least its newest row
        ("575.57.08", "12.9"),
        ("570.124.06", "12.8"),
        ("570.26", "12.8"),
        ("569.99", "12.6"),
        ("525.60.13", "12.0"),
        ("450.36.06", "11.0"),
        ("418.87.01", None),
        ("not a version", None),
    ],
)
def test_driver_version_maps_to_the_newest_cuda_it_runs(driver: str, cuda: str | None) -> None:
    assert driver_cuda(driver) == cuda


def test_driver_api_integer() -> None:
    assert cuda_from_driver_api(13000) == "13.0"
    assert cuda_from_driver_api(12080) == "12.8"
    assert cuda_from_driver_api(12100) == "12.10"
    assert cuda_from_driver_api(0) is None


def test_driver_runs_older_majors_and_its_own_minors() -> None:
    assert driver_runs("13.0", "12.8") == (None, None)
    assert driver_runs("13.0", "13.0") == (None, None)
    problem, note = driver_runs("13.0", "13.2")
    assert problem is None and note is not None and "minor version compatibility" in note
    problem, note = driver_runs("12.8", "13.0")
    assert problem is not None and "runs CUDA 12.8 at most" in problem and note is None


def test_without_torch_the_newest_torch_the_driver_runs_wins() -> None:
    ids = [
        "cu128-torch2.10-abi1-sm80.90",
        "cu130-torch2.14-abi1-sm80.90",
        "cu130-torch2.12-abi1-sm80.90",
        "cu130-torch2.14-abi1-sm80.90.100.120",
    ]
    assert choose_variant(host(), ids).match == "cu130-torch2.14-abi1-sm80.90"
    # a 12.8 driver cannot run any CUDA 13 variant: torch 2.10's is the one
    assert choose_variant(host(driver_cuda="12.8"), ids).match == "cu128-torch2.10-abi1-sm80.90"
    # a Blackwell GPU needs the variant with sm_120 code
    assert choose_variant(host(gpus=("12.0",)), ids).match == "cu130-torch2.14-abi1-sm80.90.100.120"
    # two GPUs: every one must be covered
    assert choose_variant(host(gpus=("9.0", "10.0")), ids).match == "cu130-torch2.14-abi1-sm80.90.100.120"


def test_without_torch_minor_compatibility_is_a_caveat_and_ranks_after() -> None:
    ids = ["cu132-torch2.15-abi1-sm80.90", "cu130-torch2.15-abi1-sm80.90"]
    ranked = rank_without_torch(host(), ids)
    assert [vid for vid, _ in ranked] == ["cu130-torch2.15-abi1-sm80.90", "cu132-torch2.15-abi1-sm80.90"]
    assert ranked[0][1] == () and "minor version compatibility" in ranked[1][1][0]


def test_without_torch_nothing_fits_a_gpu_without_code() -> None:
    choice = choose_variant(host(gpus=("7.5",)), ["cu130-torch2.14-abi1-sm80.90"])
    assert choice.match is None and "compute capability 7.5" in choice.reasons[0]
    choice = choose_variant(host(driver_cuda="12.4"), ["cu130-torch2.14-abi1-sm80.90"])
    assert choice.match is None and "the driver runs CUDA 12.4 at most" in choice.reasons[0]


def test_a_wheel_for_this_python() -> None:
    assert has_wheel_for(["x-1-cp311-cp311-manylinux_2_28_x86_64.whl"], "3.11")
    assert not has_wheel_for(["x-1-cp312-cp312-manylinux_2_28_x86_64.whl"], "3.11")
    assert has_wheel_for(["x-1-cp39-abi3-manylinux_2_28_x86_64.whl"], "3.11")
    assert not has_wheel_for(["x-1-cp312-abi3-manylinux_2_28_x86_64.whl"], "3.11")
    assert has_wheel_for(["x-1-py3-none-any.whl"], "3.13")
    assert not has_wheel_for(["x-1.tar.gz", "not a wheel.whl"], "3.11")


def test_torch_for_a_variant_and_its_index() -> None:
    compat = COMPAT
    pytorch = "https://download.pytorch.org/whl/"
    key = VariantKey.parse_id("cu130-torch2.14-abi1-sm80.90")
    assert torch_for(key, compat) == Torch(requirement="torch==2.14.*")  # 13.0: 2.14's default build
    key = VariantKey.parse_id("cu126-torch2.10-abi1-sm80.90")
    assert torch_for(key, compat) == Torch(requirement="torch==2.10.*", index=pytorch + "cu126")
    key = VariantKey.parse_id("cu130-torch2.10.1-abi1-sm80.90")
    assert torch_for(key, compat) == Torch(requirement="torch==2.10.1", index=pytorch + "cu130")
    # torch installed: its release, so that no resolver swaps it; a probe's non-version leaves the variant's
    assert torch_for(key, compat, installed="2.10.1").requirement == "torch==2.10.1"
    key = VariantKey.parse_id("cu126-torch2.10-abi1-sm80.90")
    assert torch_for(key, compat, installed="2.10.3").requirement == "torch==2.10.3"
    assert torch_for(key, compat, installed="2.10 x").requirement == "torch==2.10.*"


def test_describe_names_the_driver_without_torch() -> None:
    assert describe_environment(host()) == (
        "python 3.11, torch not installed, CUDA none, cxx11 ABI unknown, GPUs 9.0 (from nvidia-smi), "
        "driver CUDA 13.0 (from nvidia-smi)"
    )


def test_missing_request_without_torch_asks_for_the_newest_torch_the_driver_runs() -> None:
    compat = COMPAT
    request, what = missing_request(host(gpus=("7.5",)), "flash-attn", compat)
    assert request is not None
    assert (request.torch, request.cuda, request.python, request.archs) == ("2.14", "13.0", "3.11", ("7.5",))
    assert request.package == "flash-attn" and request.cxx11_abi
    assert what == "flash-attn for Python 3.11, CUDA 13.0, torch 2.14, cxx11 ABI 1, GPUs 7.5"
    request, _ = missing_request(host(driver_cuda="12.8"), None, compat)
    assert request is not None and (request.torch, request.cuda) == ("2.11", "12.8")
    # the Python counts first: on 3.12 only 2.15 has wheels (by minor version compatibility on a 13.0 driver)
    request, _ = missing_request(host(python="3.12"), None, compat)
    assert request is not None and (request.torch, request.cuda) == ("2.15", "13.2")


def test_missing_request_with_torch_asks_for_its_torch() -> None:
    compat = COMPAT
    env = host(torch="2.14.1", cuda="13.0", cxx11_abi=True, gpus=("12.1",), driver_cuda=None)
    request, _ = missing_request(env, None, compat)
    assert request is not None and (request.torch, request.cuda, request.archs) == ("2.14", "13.0", ("12.1",))
    request, what = missing_request(host(torch="2.14.1", cuda=None, cxx11_abi=True), None, compat)
    assert request is None and "CPU build" in what
    request, what = missing_request(host(driver_cuda=None, driver_source="none"), None, compat)
    assert request is None and "no NVIDIA driver" in what


def test_missing_request_refuses_a_hostile_project_name() -> None:
    request, what = missing_request(host(), "x; rm -rf /", COMPAT)
    assert request is None and what.startswith("cannot request it: package ")


def test_missing_lines_are_matrix_yaml() -> None:
    import yaml

    from factory.consume.which import Choice, WhichResult

    request, what = missing_request(host(gpus=("9.0", "12.0")), "flash-attn", COMPAT)
    result = WhichResult(
        env=host(),
        choice=Choice(match=None, notes=(), nearest=None, reasons=()),
        variant_url=None,
        projects=(),
        request=request,
        missing=what,
    )
    lines = missing_lines(result)
    assert lines[0] == f"missing: {what}"
    data = yaml.safe_load("\n".join(lines[2:]))
    assert data == {
        "matrix": {
            "include": [
                {"cuda": "13.0", "torch": "2.14", "python": "3.11", "cxx11_abi": True, "arch": "9.0;12.0"}
            ]
        }
    }


def test_the_request_is_for_this_hosts_platform() -> None:
    """An Arm host (GH200) is asked for its own platform's wheel, whichever name its machine goes by, and the
    matrix lines say so; a machine the factory builds for no platform of gets no request, and one line."""
    import yaml

    from factory.consume.which import Choice, WhichResult
    from factory.core.platforms import DEFAULT_PLATFORM, named

    for machine in ("aarch64", "arm64"):
        request, what = missing_request(host(machine=machine), "flash-attn", COMPAT)
        assert request is not None and request.platform == named("aarch64")
        assert what == "flash-attn for Python 3.11 on aarch64, CUDA 13.0, torch 2.14, cxx11 ABI 1, GPUs 9.0"
    result = WhichResult(
        env=host(machine="aarch64"),
        choice=Choice(match=None, notes=(), nearest=None, reasons=()),
        variant_url=None,
        projects=(),
        request=request,
        missing=what,
    )
    data = yaml.safe_load("\n".join(missing_lines(result)[2:]))
    assert data["matrix"]["include"] == [
        {
            "cuda": "13.0",
            "torch": "2.14",
            "python": "3.11",
            "cxx11_abi": True,
            "arch": "9.0",
            "platform": "aarch64",
        }
    ]
    request, what = missing_request(
        host(machine="x86_64", torch="2.14.1", cuda="13.0", cxx11_abi=True), None, COMPAT
    )
    assert request is not None and request.platform == DEFAULT_PLATFORM and " on " not in what
    request, what = missing_request(host(machine="ppc64le"), "flash-attn", COMPAT)
    assert request is None
    assert what == "the factory builds no wheel for this host's machine ppc64le (it builds x86_64, aarch64)"
