"""Compatibility pruning: dropped with a reason, trimmed with a note, unknown kept, marked unknown."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from factory.core.variants import arch_key
from factory.plan.plan import plan_matrix
from factory.spec.compat import TORCH_KEYS, CompatData
from factory.spec.config import load_matrix_file

DATA = CompatData.load()


def judge(**kw: object):  # type: ignore[no-untyped-def]
    args: dict[str, object] = {
        "cuda": "12.8",
        "torch": "2.9",
        "python": "3.11",
        "cxx11_abi": True,
        "archs": ("8.0", "9.0"),
        "recipe": "torch-ext",
    }
    args.update(kw)
    return DATA.judge(**args)  # type: ignore[arg-type]


def test_known_good_combination_is_verified() -> None:
    verdict = judge()
    assert verdict.dropped is None and verdict.known and verdict.archs == ("8.0", "9.0") and not verdict.notes


def test_torch_without_that_cuda_build_is_dropped() -> None:
    verdict = judge(cuda="12.9", torch="2.9")
    assert verdict.dropped == "torch 2.9 ships no CUDA 12.9 build (only 12.6, 12.8, 13.0)"


def test_python_torch_does_not_support_is_dropped() -> None:
    assert (
        judge(python="3.9").dropped
        == "torch 2.9 has no wheels for Python 3.9 (only 3.10, 3.11, 3.12, 3.13, 3.14)"
    )
    assert judge(torch="2.8", python="3.14").dropped is not None


def test_pre_cxx11_abi_with_new_torch_is_dropped() -> None:
    assert judge(cxx11_abi=False).dropped == "torch 2.9 wheels use cxx11_abi: true only"


def test_full_torch_version_uses_its_minor_release() -> None:
    assert judge(torch="2.9.1").known
    assert judge(torch="2.9.1", cuda="12.9").dropped is not None


def test_cuda13_trims_volta_with_a_note() -> None:
    verdict = judge(cuda="13.0", archs=("7.0", "8.0"))
    assert verdict.archs == ("8.0",)
    assert verdict.notes == ("arch 7.0 trimmed: CUDA 13.0 cannot target sm_70 (last supported by CUDA 12.9)",)


@pytest.mark.parametrize(
    ("cuda", "arch", "needs"),
    [
        ("12.6", "10.0", "12.8"),
        ("12.6", "12.0", "12.8"),
        ("12.8", "10.3", "12.9"),
        ("12.8", "12.1", "12.9"),
        ("12.9", "11.0", "13.0"),
    ],
)
def test_new_archs_need_new_cuda(cuda: str, arch: str, needs: str) -> None:
    verdict = judge(cuda=cuda, torch="2.99", archs=("8.0", arch))
    assert verdict.archs == ("8.0",)
    assert (
        f"arch {arch} trimmed: CUDA {cuda} cannot target sm_{arch.replace('.', '')} (needs CUDA >= {needs})"
        in (verdict.notes)
    )


def test_every_set_is_empty_means_dropped() -> None:
    verdict = judge(cuda="12.6", torch="2.6", archs=("10.0", "12.0"))
    assert verdict.dropped is not None and verdict.dropped.startswith("no arch left: 10.0 trimmed")


def test_recipe_min_arch_trims() -> None:
    verdict = judge(recipe="flash-attn", archs=("7.5", "8.0"))
    assert verdict.archs == ("8.0",)
    assert verdict.notes == ("arch 7.5 trimmed: flash-attn needs sm_80 or newer",)
    assert judge(recipe="other", archs=("7.5", "8.0"), min_arch="8.6").archs == ()


def test_cpp20_torch_drops_a_cpp17_recipe() -> None:
    verdict = judge(recipe="flash-attn", cuda="13.0", torch="2.14")
    assert verdict.dropped is not None and "C++17 but torch 2.14 headers need C++20" in verdict.dropped
    assert judge(recipe="flash-attn", cuda="13.0", torch="2.14", cxx_std="20").dropped is None


@pytest.mark.parametrize(
    ("torch", "cuda"),
    [("2.9", "12.8"), ("2.10.0", "12.8"), ("2.11", "13.0"), ("2.14.1", "13.0"), ("2.15", "13.2")],
)
def test_the_default_index_has_the_default_build_only(torch: str, cuda: str) -> None:
    """torch from the host's pip configuration (build.torch_index: default) is the build PyPI serves."""
    assert judge(torch=torch, cuda=cuda, python="3.12", default_index=True).known
    other = "13.0" if cuda == "12.8" else "12.8"
    verdict = judge(torch=torch, cuda=other, python="3.12", default_index=True)
    minor = ".".join(torch.split(".")[:2])
    assert verdict.dropped == (
        f"torch {minor} on the default index is a CUDA {cuda} build, not {other} "
        f"(build.torch_index {other}: default)"
    )
    # from pytorch.org's per-CUDA index the other build may exist: the usual rules apply
    assert judge(torch=torch, cuda=other, python="3.12").dropped != verdict.dropped


def test_unknown_default_build_is_not_a_reason_to_drop() -> None:
    assert judge(torch="2.5", cuda="12.1", python="3.12", default_index=True).dropped is None
    assert judge(torch="2.99", cuda="12.1", python="3.12", default_index=True).dropped is None


def test_unknown_torch_is_kept_and_marked_unknown() -> None:
    verdict = judge(torch="2.99")
    assert verdict.dropped is None and not verdict.known
    assert "unknown: compat data knows nothing about torch 2.99" in verdict.notes


def test_incomplete_torch_entry_makes_other_cuda_unknown_not_dropped() -> None:
    verdict = judge(torch="2.14", cuda="12.8", python="3.12")
    assert verdict.dropped is None and not verdict.known
    assert "torch 2.14 with CUDA 12.8" in verdict.notes[-1]


def test_unknown_cuda_still_gets_arch_rules() -> None:
    verdict = judge(torch="2.99", cuda="13.5", archs=("7.0", "9.0"))
    assert verdict.archs == ("9.0",) and not verdict.known


def test_cuda_archs_table() -> None:
    cu128 = DATA.cuda_archs("12.8")
    assert "10.0" in cu128 and "12.0" in cu128 and "10.3" not in cu128 and "7.0" in cu128
    cu130 = DATA.cuda_archs("13.0")
    assert "11.0" in cu130 and "7.0" not in cu130 and "7.5" in cu130
    assert min(cu130, key=arch_key) == "7.5"


def test_family_targets_need_cuda_12_9() -> None:
    verdict = judge(cuda="12.8", archs=("9.0a", "10.0a", "10.0f", "12.0f"))
    assert verdict.archs == ("9.0a", "10.0a")
    assert "arch 10.0f trimmed: CUDA 12.8 cannot target sm_100f (needs CUDA >= 12.9)" in verdict.notes
    assert {"10.0f", "10.3f", "12.0f", "12.1f"} <= set(DATA.cuda_archs("12.9"))
    assert "10.1f" not in DATA.cuda_archs("13.0") and "11.0f" in DATA.cuda_archs("13.0")


def test_required_cxx_std() -> None:
    assert DATA.required_cxx_std("2.14.1") == "20"
    assert DATA.required_cxx_std("2.15") == "20"
    # 2.12 and 2.13 compile extensions as C++20 by default, but their headers still accept C++17
    assert DATA.required_cxx_std("2.13") == "17"
    assert DATA.required_cxx_std("2.9") == "17"
    assert DATA.required_cxx_std("2.99") is None


@pytest.mark.parametrize(
    ("torch", "cuda", "pythons"),
    [
        ("2.11", "13.0", ("3.10", "3.11", "3.12", "3.13", "3.14")),
        ("2.12", "13.0", ("3.10", "3.11", "3.12", "3.13", "3.14")),
        ("2.13.0", "13.0", ("3.10", "3.11", "3.12", "3.13", "3.14")),
        ("2.14.1", "13.0", ("3.10", "3.11", "3.12", "3.13", "3.14")),
        ("2.15", "13.2", ("3.11", "3.12", "3.13", "3.14", "3.15")),
    ],
)
def test_current_torch_releases_are_known(torch: str, cuda: str, pythons: tuple[str, ...]) -> None:
    for python in pythons:
        verdict = judge(torch=torch, cuda=cuda, python=python, archs=("8.0", "9.0", "10.0", "12.0"))
        assert verdict.dropped is None and verdict.known, (python, verdict)
        assert verdict.archs == ("8.0", "9.0", "10.0", "12.0")


def test_torch_2_15_has_no_python_3_10_and_other_cuda_builds_are_unknown() -> None:
    # the 2.12-2.15 entries list the CUDA build the index has; pytorch.org's others are not known here
    assert judge(torch="2.15", cuda="13.0", python="3.12").known is False
    assert "torch 2.15 with CUDA 13.0" in judge(torch="2.15", cuda="13.0", python="3.12").notes[-1]
    assert "torch 2.15 on Python 3.10" in judge(torch="2.15", cuda="13.2", python="3.10").notes[-1]
    assert (
        judge(torch="2.14", cxx11_abi=False, cuda="13.0").dropped
        == "torch 2.14 wheels use cxx11_abi: true only"
    )


def test_data_is_consistent() -> None:
    data = DATA.data
    known_cuda = data["cuda_versions"]
    assert known_cuda == sorted(known_cuda, key=lambda v: tuple(map(int, v.split("."))))
    for minor, entry in data["torch"].items():
        assert set(entry) <= set(TORCH_KEYS), minor
        assert set(entry["cuda"]) <= set(known_cuda), minor  # a build torch ships is a CUDA the data knows
        assert entry["python"] == sorted(entry["python"], key=lambda v: tuple(map(int, v.split(".")))), minor
        assert entry["cxx_std"] in ("17", "20"), minor
        if "default_cuda" in entry:  # the build PyPI serves is one of the release's builds
            assert entry["default_cuda"] in entry["cuda"], minor
    minors = sorted(data["torch"], key=lambda v: tuple(map(int, v.split("."))))
    assert minors[-5:] == ["2.11", "2.12", "2.13", "2.14", "2.15"]


def write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(textwrap.dedent(body))
    return path


def test_plan_drops_trims_and_marks(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: flash-attn, version: "2.8.3"}
        matrix:
          cuda: ["12.6", "13.0"]
          torch: ["2.9", "2.99"]
          python: ["3.9", "3.11"]
          cxx11_abi: [true]
          arch: ["7.0;8.0;10.0"]
        """,
    )
    mf = load_matrix_file(path)
    plan = plan_matrix(mf)
    by_id = {j.id: j for j in plan.jobs}
    assert "cu130-torch2.9-abi1-sm80.100-py311" in by_id
    job = by_id["cu130-torch2.9-abi1-sm80.100-py311"]
    assert job.known
    assert job.notes == ("arch 7.0 trimmed: CUDA 13.0 cannot target sm_70 (last supported by CUDA 12.9)",)
    cu126 = by_id["cu126-torch2.9-abi1-sm80-py311"]
    assert "arch 7.0 trimmed: flash-attn needs sm_80 or newer" in cu126.notes
    assert "arch 10.0 trimmed: CUDA 12.6 cannot target sm_100 (needs CUDA >= 12.8)" in cu126.notes
    unknown = [j for j in plan.jobs if not j.known]
    assert {j.variant.torch for j in unknown} == {"2.99"}
    reasons = {d.reason for d in plan.dropped}
    assert "torch 2.9 has no wheels for Python 3.9 (only 3.10, 3.11, 3.12, 3.13, 3.14)" in reasons
    # No emitted job targets an arch its CUDA cannot compile.
    for j in plan.jobs:
        assert all(mf.compat.arch_problem(a, j.variant.cuda) is None for a in j.variant.archs)


def test_plan_keeps_suffixed_targets_apart_in_ids(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: flash-attn, version: "2.8.3"}
        matrix:
          cuda: ["12.9"]
          torch: ["2.9"]
          python: ["3.11"]
          cxx11_abi: [true]
          arch: ["12.0f;9.0a;10.0a;10.0f;10.0"]
        """,
    )
    (job,) = plan_matrix(load_matrix_file(path), prune=False).jobs
    assert job.variant.archs == ("9.0a", "10.0", "10.0a", "10.0f", "12.0f")
    assert job.id == "cu129-torch2.9-abi1-sm90a.100.100a.100f.120f-py311"
    assert job.variant.local_version == "cu12.9.torch2.9.abi1.sm90a.100.100a.100f.120f"


def test_a_matrix_naming_torch_2_15_is_verified(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: x-ext, version: "1.0"}
        matrix:
          cuda: ["13.2"]
          torch: ["2.15"]
          python: ["3.11", "3.13", "3.15"]
          cxx11_abi: [true]
          arch: ["7.5;8.0;9.0;10.0;12.0"]
        """,
    )
    plan = plan_matrix(load_matrix_file(path))
    assert len(plan.jobs) == 3 and not plan.dropped
    assert all(j.known and not j.notes for j in plan.jobs), [j.notes for j in plan.jobs]


def test_no_prune_is_the_raw_expansion(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: flash-attn, version: "2.8.3"}
        matrix:
          cuda: ["12.6", "13.0"]
          torch: ["2.9"]
          python: ["3.9", "3.11"]
          cxx11_abi: [true, false]
          arch: ["7.0;8.0"]
        """,
    )
    plan = plan_matrix(load_matrix_file(path), prune=False)
    assert len(plan.jobs) == 8 and not plan.dropped
    assert all(j.variant.archs == ("7.0", "8.0") for j in plan.jobs)


def test_trimming_into_a_duplicate_drops_the_second(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: x-ext, version: "1.0"}
        matrix:
          cuda: ["13.0"]
          torch: ["2.9"]
          python: ["3.11"]
          cxx11_abi: [true]
          arch: ["8.0", "7.0;8.0"]
        """,
    )
    plan = plan_matrix(load_matrix_file(path))
    assert [j.id for j in plan.jobs] == ["cu130-torch2.9-abi1-sm80-py311"]
    assert plan.dropped[0].reason == "same job as cu130-torch2.9-abi1-sm80-py311 after trimming archs"


def test_compat_overrides_from_the_matrix_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        package: {name: x-ext, version: "1.0"}
        compat:
          torch:
            "2.99": {cuda: ["13.0"], python: ["3.11"], cxx11_abi: [true]}
            "2.9": {cuda: ["12.8"]}
        matrix:
          cuda: ["13.0"]
          torch: ["2.99", "2.9"]
          python: ["3.11"]
          cxx11_abi: [true]
          arch: ["9.0"]
        """,
    )
    plan = plan_matrix(load_matrix_file(path))
    assert [(j.id, j.known) for j in plan.jobs] == [("cu130-torch2.99-abi1-sm90-py311", True)]
    assert plan.dropped[0].reason == "torch 2.9 ships no CUDA 13.0 build (only 12.8)"


def test_plan_drops_a_cuda_the_default_index_lacks_and_overrides_can_say_otherwise(tmp_path: Path) -> None:
    body = """\
        package: {name: x-ext, version: "1.0"}
        matrix:
          cuda: ["12.8", "13.0"]
          torch: ["2.9"]
          python: ["3.11"]
          cxx11_abi: [true]
          arch: ["9.0"]
        build:
          torch_index: {"12.8": default, "13.0": default}
        """
    plan = plan_matrix(load_matrix_file(write(tmp_path, body)))
    assert [j.id for j in plan.jobs] == ["cu128-torch2.9-abi1-sm90-py311"]
    assert [d.reason for d in plan.dropped] == [
        "torch 2.9 on the default index is a CUDA 12.8 build, not 13.0 (build.torch_index 13.0: default)"
    ]
    # a host index that mirrors pytorch.org's cu130 builds says so in the matrix file
    override = 'compat:\n          torch: {"2.9": {default_cuda: "13.0"}}\n        matrix:'
    mirrored = body.replace("matrix:", override)
    plan = plan_matrix(load_matrix_file(write(tmp_path, mirrored)))
    assert [j.id for j in plan.jobs] == ["cu130-torch2.9-abi1-sm90-py311"]
    # pytorch.org's per-CUDA indexes (the default torch_index) have both
    both = body.replace('torch_index: {"12.8": default, "13.0": default}', "concurrency: 1")
    assert len(plan_matrix(load_matrix_file(write(tmp_path, both))).jobs) == 2
