"""Loading valid matrix files: defaults, recipes, sources, build/publish options, the shipped files."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from factory.core.units import parse_size
from factory.core.variants import Variant
from factory.plan.plan import matrix_env, plan_matrix
from factory.spec.config import load_matrix_file
from factory.spec.options import BuildOptions, FetchLimits, PublishOptions, Source
from factory.spec.recipes import BUILTIN_RECIPES, recipe_env

ROOT = Path(__file__).resolve().parents[3]
AXES = """\
matrix:
  cuda: ["13.0"]
  torch: ["2.10"]
  python: ["3.11"]
  cxx11_abi: [true]
  arch: ["9.0;8.0"]
"""


def load(tmp_path: Path, *parts: str):  # type: ignore[no-untyped-def]
    path = tmp_path / "m.yaml"
    path.write_text("".join(textwrap.dedent(p) for p in parts))
    return load_matrix_file(path)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("16GiB", 16 * 2**30),
        ("16G", 16 * 2**30),
        ("16g", 16 * 2**30),
        ("512MiB", 512 * 2**20),
        ("512M", 512 * 2**20),
        ("1.5GiB", int(1.5 * 2**30)),
        ("16GB", 16 * 10**9),
        ("1024", 1024),
        (4096, 4096),
    ],
)
def test_parse_size(text: str | int, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize("bad", ["", "lots", "16 Gigs", "-1G", "0", 0, True, "1.2.3G"])
def test_parse_size_rejects(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_defaults(tmp_path: Path) -> None:
    mf = load(tmp_path, 'package: {name: flash-attn, version: "2.8.3"}\n' + AXES)
    assert mf.package.source == Source(kind="pypi")
    assert mf.recipe == BUILTIN_RECIPES["flash-attn"]
    assert mf.build == BuildOptions()
    assert mf.build.flavor == "devel" and mf.build.base_image is None
    assert mf.build.pids_limit == 4096 and mf.build.max_attempts == 3 and mf.build.offline is True
    assert mf.publish == PublishOptions(to="./index", endpoint_url=None)
    assert mf.matrix.axes["arch"] == ("8.0;9.0",)


def test_other_packages_default_to_the_torch_ext_recipe(tmp_path: Path) -> None:
    mf = load(tmp_path, 'package: {name: My.Ext, version: "1.0"}\n' + AXES)
    assert mf.recipe.name == "torch-ext"
    assert mf.recipe.arch_env == "TORCH_CUDA_ARCH_LIST" and mf.recipe.import_name == "my_ext"


def test_declared_recipe_mapping_with_base_and_patches(tmp_path: Path) -> None:
    (tmp_path / "fix.diff").write_text("--- a/x\n+++ b/x\n")
    mf = load(
        tmp_path,
        """\
        package: {name: flash-attn, version: "2.8.3"}
        recipe:
          name: fa-cpp20
          base: flash-attn
          env: {MAX_JOBS: "2"}
          patches: [fix.diff]
          cxx_std: 20
        """,
        AXES,
    )
    r = mf.recipe
    assert r.name == "fa-cpp20" and r.arch_env == "FLASH_ATTN_CUDA_ARCHS" and r.arch_format == "flash-attn"
    assert dict(r.env) == {"FLASH_ATTENTION_FORCE_BUILD": "TRUE", "MAX_JOBS": "2"}
    # the base recipe's patches first: fix.diff is written against the tree they make
    assert r.patches == (*BUILTIN_RECIPES["flash-attn"].patches, (tmp_path / "fix.diff").resolve())
    assert r.cxx_std == "20" and r.import_name == "flash_attn" and r.min_arch == "8.0"


def test_a_recipe_mapping_without_base_starts_from_torch_ext(tmp_path: Path) -> None:
    """docs/MATRIX.md: keys a mapping does not give come from torch-ext, FORCE_CUDA=1 among them (a PyG
    package builds its CUDA code only under it when no GPU is visible: without it, host code alone)."""
    mf = load(
        tmp_path,
        'package: {name: torch-thing, version: "1.0"}\nrecipe: {name: mine, env: {EXTRA: "1"}}\n',
        AXES,
    )
    torch_ext = BUILTIN_RECIPES["torch-ext"]
    r = mf.recipe
    assert r.name == "mine" and r.import_name == "torch_thing"
    assert dict(r.env) == {"FORCE_CUDA": "1", "EXTRA": "1"}
    assert r.extra_build_requires == torch_ext.extra_build_requires
    assert r.arch_env == torch_ext.arch_env and r.compile_gib_per_arch == torch_ext.compile_gib_per_arch
    # a key the mapping gives wins over torch-ext's
    over = load(
        tmp_path, 'package: {name: x, version: "1.0"}\nrecipe: {name: m, env: {FORCE_CUDA: "0"}}\n', AXES
    )
    assert dict(over.recipe.env) == {"FORCE_CUDA": "0"}


def test_recipe_env_for_flash_attn() -> None:
    variant = Variant(
        package="flash-attn", version="2.8.3", cuda="12.8", torch="2.10", cxx11_abi=True, archs=("8.0", "9.0")
    )
    assert recipe_env(BUILTIN_RECIPES["flash-attn"], variant) == {
        "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
        "FLASH_ATTN_CUDA_ARCHS": "80;90",
        "FLASH_ATTN_LOCAL_VERSION": "cu12.8.torch2.10.abi1.sm80.90",
        "FLASH_ATTENTION_FORCE_BUILD": "TRUE",
    }
    assert recipe_env(BUILTIN_RECIPES["torch-ext"], variant) == {
        "TORCH_CUDA_ARCH_LIST": "8.0;9.0",
        "FORCE_CUDA": "1",
    }


def test_flash_attn_compile_estimate_comes_from_the_measurements() -> None:
    from factory.spec.measured import measured_compile_gib

    assert BUILTIN_RECIPES["flash-attn"].compile_gib_per_arch == measured_compile_gib() > 6


def test_sources(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    mf = load(tmp_path, 'package: {name: x, version: "1.0", source: {path: src}}\n' + AXES)
    assert mf.package.source == Source(kind="path", path=(tmp_path / "src").resolve())
    mf = load(
        tmp_path, 'package: {name: x, version: "1.0", source: {git: "https://h/x.git", ref: v1}}\n' + AXES
    )
    assert mf.package.source == Source(kind="git", url="https://h/x.git", ref="v1")


def test_sdist_pin_and_fetch_limits(tmp_path: Path) -> None:
    assert load(tmp_path, 'package: {name: x, version: "1.0"}\n' + AXES).package.limits == FetchLimits()
    pin = "AB" * 32
    mf = load(
        tmp_path,
        f'package: {{name: x, version: "1.0", sha256: {pin}, max_download: 3GiB, max_unpacked: 40GiB,\n'
        "  download_deadline: 900}\n" + AXES,
    )
    assert mf.package.sha256 == pin.lower()
    assert mf.package.limits == FetchLimits(
        download_bytes=3 * 2**30, unpacked_bytes=40 * 2**30, download_seconds=900.0
    )


def test_build_and_publish_options(tmp_path: Path) -> None:
    mf = load(
        tmp_path,
        'package: {name: x, version: "1.0"}\n',
        AXES,
        """\
        build:
          memory: 16G
          memory_budget: 40GiB
          cpus: 1.5
          concurrency: 2
          flavor: pypi
          images: {"12.8": "my/img:12.8"}
          pids_limit: 1024
          max_attempts: 1
          offline: false
          torch_index: {"13.0": default, "12.8": "https://mirror/whl/cu128"}
        publish: {to: "s3://bucket/prefix", endpoint_url: "http://127.0.0.1:5000"}
        """,
    )
    b = mf.build
    assert (b.memory, b.memory_budget, b.cpus, b.concurrency) == (16 * 2**30, 40 * 2**30, 1.5, 2)
    assert b.flavor == "pypi" and dict(b.images) == {"12.8": "my/img:12.8"}
    assert (b.pids_limit, b.max_attempts, b.offline) == (1024, 1, False)
    assert b.torch_index_url("13.0") is None
    assert b.torch_index_url("12.8") == "https://mirror/whl/cu128"
    assert b.torch_index_url("12.6") == "https://download.pytorch.org/whl/cu126"
    assert mf.publish == PublishOptions(to="s3://bucket/prefix", endpoint_url="http://127.0.0.1:5000")


def test_include_env_and_extra_keys_reach_the_job(tmp_path: Path) -> None:
    mf = load(
        tmp_path,
        'package: {name: flash-attn, version: "2.8.3"}\n',
        AXES + '  include:\n    - arch: "8.0;9.0"\n      env: {NVCC_THREADS: 2}\n      runner: big\n',
    )
    (job,) = plan_matrix(mf).jobs
    assert dict(job.env) == {"NVCC_THREADS": "2"}
    assert dict(job.extra) == {"runner": "big"}
    assert matrix_env(mf, job)["NVCC_THREADS"] == "2"
    assert matrix_env(mf, job)["FLASH_ATTN_CUDA_ARCHS"] == "80;90"
    out = job.to_json()
    assert out["env"] == {"NVCC_THREADS": "2"} and out["runner"] == "big"


def test_unquoted_yaml_scalars_in_env_keep_their_text(tmp_path: Path) -> None:
    mf = load(
        tmp_path,
        'package: {name: x, version: "1.0"}\nrecipe: {name: r, env: {LEVEL: 3.10, N: 08}}\n' + AXES,
    )
    assert dict(mf.recipe.env) == {"FORCE_CUDA": "1", "LEVEL": "3.10", "N": "08"}  # over torch-ext's


def test_the_production_matrix() -> None:
    mf = load_matrix_file(ROOT / "matrix.yaml")
    assert mf.package.name == "flash-attn" and mf.package.version == "2.8.3.post2"
    assert mf.recipe.name == "flash-attn" and mf.build.flavor == "devel"
    plan = plan_matrix(mf)
    # each torch with the CUDA of its build on the default index: nothing dropped, nothing unknown
    assert {(j.variant.torch, j.variant.cuda) for j in plan.jobs} == {
        ("2.9", "12.8"), ("2.10", "12.8"),
        ("2.11", "13.0"), ("2.12", "13.0"), ("2.13", "13.0"), ("2.14", "13.0"),
    }  # fmt: skip
    assert {j.python for j in plan.jobs} == {"3.10", "3.11", "3.12", "3.13", "3.14"}
    assert len(plan.jobs) == 60 and all(j.known and not j.notes for j in plan.jobs) and not plan.dropped
    # x86_64: A100, H100, B200, RTX 50xx; aarch64: GH200 (sm_90), GB200 (sm_100) and DGX Spark (sm_121, which
    # CUDA 13.0 compiles; CUDA 12.8's sm_120 cubins run on it), every torch and Python as on x86_64
    archs: dict[tuple[str, str], set[tuple[str, ...]]] = {}
    for j in plan.jobs:
        archs.setdefault((j.platform.name, j.variant.cuda), set()).add(j.variant.archs)
    assert archs == {
        ("x86_64", "12.8"): {("8.0", "9.0", "10.0", "12.0")},
        ("x86_64", "13.0"): {("8.0", "9.0", "10.0", "12.0")},
        ("aarch64", "12.8"): {("9.0", "10.0", "12.0")},
        ("aarch64", "13.0"): {("9.0", "10.0", "12.1")},
    }
    arm = [j for j in plan.jobs if j.platform.name == "aarch64"]
    assert {(j.variant.torch, j.python) for j in arm} == {
        (j.variant.torch, j.python) for j in plan.jobs if j.platform.name == "x86_64"
    }
    assert "cu128-torch2.10-abi1-sm80.90.100.120" in {v.id for v in plan.variants}
    assert "cu130-torch2.14-abi1-sm90.100.121-py312-aarch64" in {j.id for j in arm}
    assert mf.build.torch_index_url("12.8") is None and mf.build.torch_index_url("13.0") is None


def test_the_production_matrix_excludes_only_what_the_index_lacks(tmp_path: Path) -> None:
    """Its excludes name exactly the pairs the compatibility data drops, so they hide no job that exists."""
    text = (ROOT / "matrix.yaml").read_text()
    # the cuda/torch pairs go; the excludes that pair each platform with its arch sets stay
    pairs = re.compile(r'^    - \{cuda: "[\d.]+", torch: "[\d.]+"\}\n', re.M)
    assert len(pairs.findall(text)) == 6
    path = tmp_path / "matrix.yaml"
    path.write_text(pairs.sub("", text))
    full = plan_matrix(load_matrix_file(path))
    shipped = plan_matrix(load_matrix_file(ROOT / "matrix.yaml"))
    assert {j.id for j in full.jobs} == {j.id for j in shipped.jobs}
    dropped = {(d.values["torch"], d.values["cuda"], d.values["platform"]) for d in full.dropped}
    newer = {(t, "12.8") for t in ("2.11", "2.12", "2.13", "2.14")}
    assert dropped == {
        (*pair, platform)
        for pair in {("2.9", "13.0"), ("2.10", "13.0")} | newer
        for platform in ("x86_64", "aarch64")
    }
    assert len(full.dropped) == 6 * 5 * 2
    assert all("on the default index is a CUDA" in d.reason for d in full.dropped)


def test_the_seed_matrix() -> None:
    mf = load_matrix_file(ROOT / "examples" / "seed.yaml")
    assert (mf.package.name, mf.package.version, mf.recipe.name) == ("flash-attn", "2.8.3", "flash-attn")
    assert mf.build.flavor == "devel"
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == ["cu128-torch2.10-abi1-sm120-py312"] and plan.jobs[0].known
    env = matrix_env(mf, plan.jobs[0])
    assert env["FLASH_ATTN_CUDA_ARCHS"] == "120"
    assert env["FLASH_ATTN_LOCAL_VERSION"] == "cu12.8.torch2.10.abi1.sm120"


EXAMPLES = sorted(
    p.relative_to(ROOT).as_posix() for p in (ROOT / "examples").rglob("*.yaml") if "demo-ext" not in p.parts
)


def test_the_examples_are_found() -> None:
    assert {"examples/demo.yaml", "examples/seed.yaml", "examples/ci/matrix.yaml"} <= set(EXAMPLES)


@pytest.mark.parametrize("example", ["matrix.yaml", *EXAMPLES])
def test_every_shipped_matrix_file_loads_and_plans(example: str) -> None:
    """Each matrix file the repository ships is valid and plans at least one job, none of them dropped or
    unknown: an example that no longer fits the compatibility data (or the loader) fails here."""
    plan = plan_matrix(load_matrix_file(ROOT / example))
    assert plan.jobs and not plan.dropped, [d.reason for d in plan.dropped]
    assert all(j.known for j in plan.jobs), [j.notes for j in plan.jobs if not j.known]


def test_the_demo_matrix() -> None:
    mf = load_matrix_file(ROOT / "examples" / "demo.yaml")
    assert mf.package.name == "factory-demo-ext"
    assert (
        mf.package.source.kind == "path"
        and mf.package.source.path == (ROOT / "examples" / "demo-ext").resolve()
    )
    r = mf.recipe
    assert (r.name, r.arch_env, r.arch_format, r.local_version_env) == (
        "demo",
        "DEMO_CUDA_ARCHS",
        "torch",
        "DEMO_LOCAL_VERSION",
    )
    assert r.import_name == "factory_demo_ext" and r.compile_gib_per_arch == 1.0
    assert mf.build.flavor == "pypi" and mf.build.memory == 8 * 2**30 and mf.build.cpus == 2
    assert mf.build.torch_index_url("13.0") is None
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == [
        "cu130-torch2.14-abi1-sm80-py311",
        "cu130-torch2.14-abi1-sm90.120-py311",
    ]
    env = matrix_env(mf, plan.jobs[1])
    assert (
        env["DEMO_CUDA_ARCHS"] == "9.0;12.0" and env["DEMO_LOCAL_VERSION"] == "cu13.0.torch2.14.abi1.sm90.120"
    )


def test_arch_sets_in_include_and_exclude_match_in_any_order(tmp_path: Path) -> None:
    mf = load(
        tmp_path,
        'package: {name: x-ext, version: "1.0"}\n',
        AXES.replace('["9.0;8.0"]', '["9.0;8.0", "12.0"]')
        + '  exclude:\n    - {arch: "12.0"}\n'
        + '  include:\n    - {arch: "8.0;9.0", env: {A: "1"}}\n',
    )
    assert mf.matrix.exclude[0].values == {"arch": "12.0"}
    (job,) = plan_matrix(mf).jobs
    assert job.variant.archs == ("8.0", "9.0") and dict(job.env) == {"A": "1"}


def test_recipe_compile_gib_by_file_keeps_its_order(tmp_path: Path) -> None:
    mf = load(
        tmp_path,
        'package: {name: x, version: "1.0"}\n'
        'recipe: {name: r, compile_gib_by_file: {"flash_bwd_*": 6.7, "flash_fwd_*": 3.8, "z*": 1}}\n',
        AXES,
    )
    assert mf.recipe.compile_gib_by_file == (("flash_bwd_*", 6.7), ("flash_fwd_*", 3.8), ("z*", 1.0))
    assert mf.recipe.compile_gib_per_arch == 4.0  # the fallback stays


def test_recipe_compile_gib_by_file_replaces_the_base_table(tmp_path: Path) -> None:
    base = load(tmp_path, 'package: {name: x, version: "1.0"}\nrecipe: {name: r, base: flash-attn}\n', AXES)
    assert base.recipe.compile_gib_by_file == BUILTIN_RECIPES["flash-attn"].compile_gib_by_file
    mine = load(
        tmp_path,
        'package: {name: x, version: "1.0"}\nrecipe: {name: r, base: flash-attn, compile_gib_by_file: {}}\n',
        AXES,
    )
    assert mine.recipe.compile_gib_by_file == ()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("compile_gib_by_file", "[1, 2]", "recipe.compile_gib_by_file must be a mapping, not a list"),
        (
            "compile_gib_by_file",
            '{"a*": -1.5}',
            "recipe.compile_gib_by_file['a*'] must be positive, not -1.5",
        ),
        ("compile_gib_by_file", '{"a*": 0}', "recipe.compile_gib_by_file['a*'] must be positive, not 0"),
        (
            "compile_gib_by_file",
            '{"a*": "6GiB"}',
            "recipe.compile_gib_by_file['a*'] must be a number, not a string '6GiB'",
        ),
        ("compile_gib_by_file", '{"a*": true}', "must be a number, not a boolean"),
        (
            "compile_gib_by_file",
            "{1: 2.0}",
            "a pattern must be a non-empty string (a glob on the file name), not an integer 1",
        ),
        ("compile_gib_by_file", '{"csrc/a*": 2.0}', "pattern 'csrc/a*' matches base names only"),
        (
            "compile_after_peak",
            "1.5",
            "recipe.compile_after_peak is a fraction of the peak, at most 1, not 1.5",
        ),
        ("compile_after_peak", "0", "recipe.compile_after_peak must be positive, not 0"),
        ("compile_after_peak", "60%", "recipe.compile_after_peak must be a number, not a string '60%'"),
        (
            "compile_seconds_by_file",
            '{"a*": "10min"}',
            "recipe.compile_seconds_by_file['a*'] must be a number, not a string '10min'",
        ),
        ("compile_seconds_by_file", '{"a*": 0}', "compile_seconds_by_file['a*'] must be positive, not 0"),
        ("compile_seconds_by_file", '{"src/a*": 1}', "pattern 'src/a*' matches base names only"),
        ("host_only_libraries", '"x/_v.so"', "recipe.host_only_libraries must be a list, not a string"),
        (
            "host_only_libraries",
            '["x/../_v.so"]',
            "recipe.host_only_libraries item 'x/../_v.so' must not have empty, '.' or '..' segments",
        ),
        ("host_only_libraries", '["x/_v.py"]', "item 'x/_v.py' must name extension modules"),
    ],
)
def test_recipe_memory_figure_errors(tmp_path: Path, key: str, value: str, message: str) -> None:
    from factory.core.errors import ConfigError

    text = f'package: {{name: x, version: "1.0"}}\nrecipe:\n  name: r\n  {key}: {value}\n'
    with pytest.raises(ConfigError) as info:
        load(tmp_path, text, AXES)
    assert str(info.value).startswith(f"{tmp_path / 'm.yaml'}:4: ")
    assert message in str(info.value)


def test_recipe_host_only_libraries(tmp_path: Path) -> None:
    head = 'package: {name: torch-scatter, version: "2.1.2"}\nrecipe: {name: r'
    based = load(tmp_path, head + ", base: torch-scatter}\n", AXES).recipe
    assert based.host_only_libraries == ("torch_scatter/_version_*.so",)
    mine = load(tmp_path, head + ", host_only_libraries: ['a/_v*.so', 'a/b/*']}\n", AXES).recipe
    assert mine.host_only_libraries == ("a/_v*.so", "a/b/*")
    assert load(tmp_path, head + "}\n", AXES).recipe.host_only_libraries == ()


def test_recipe_compile_seconds_by_file(tmp_path: Path) -> None:
    head = 'package: {name: x, version: "1.0"}\nrecipe: {name: r'
    mine = load(tmp_path, head + ", compile_seconds_by_file: {'b*': 90, 'a*': 12.5}}\n", AXES).recipe
    assert mine.compile_seconds_by_file == (("b*", 90.0), ("a*", 12.5))  # in order: the first match wins
    based = load(tmp_path, head + ", base: flash-attn}\n", AXES).recipe
    assert based.compile_seconds_by_file == BUILTIN_RECIPES["flash-attn"].compile_seconds_by_file != ()
    cleared = load(tmp_path, head + ", base: flash-attn, compile_seconds_by_file: {}}\n", AXES).recipe
    assert cleared.compile_seconds_by_file == ()


def test_recipe_compile_after_peak(tmp_path: Path) -> None:
    head = 'package: {name: x, version: "1.0"}\nrecipe: {name: r'
    assert load(tmp_path, head + ", compile_after_peak: 0.5}\n", AXES).recipe.compile_after_peak == 0.5
    assert load(tmp_path, head + "}\n", AXES).recipe.compile_after_peak is None
    based = load(tmp_path, head + ", base: flash-attn}\n", AXES).recipe
    assert based.compile_after_peak == BUILTIN_RECIPES["flash-attn"].compile_after_peak is not None
    # null turns the base recipe's fraction off
    off = load(tmp_path, head + ", base: flash-attn, compile_after_peak: null}\n", AXES).recipe
    assert off.compile_after_peak is None
