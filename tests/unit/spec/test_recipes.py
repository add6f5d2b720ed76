"""Built-in recipes as data, `factory recipes`, the version warning, patch dry-runs and `factory source`."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from factory.build.source import apply_patches, diff_trees, prepare_source, unpack_for_editing
from factory.core.errors import ConfigError
from factory.spec.config import load_matrix_file
from factory.spec.measured import flash_attn_file_estimates, measured_compile_gib
from factory.spec.options import PackageSpec
from factory.spec.recipes import (
    BUILTIN_RECIPES,
    default_recipe_for,
    load_recipe_dir,
    recipe_warnings,
    recipes_dir,
)

Cli = Callable[[list[str]], tuple[int, str]]

SETUP_PY = "".join(f"line {i}\n" for i in range(1, 41))


def write_tree(root: Path) -> Path:
    (root / "pkg").mkdir(parents=True)
    (root / "setup.py").write_text(SETUP_PY)
    (root / "pkg" / "__init__.py").write_text("VALUE = 1\n")
    return root


def two_hunk_patch(path: Path, *, second_context: str = "line 30") -> Path:
    """Changes line 5 and line 31 of setup.py; `second_context` is what the second hunk expects at line 30."""
    path.write_text(
        textwrap.dedent(
            f"""\
            --- a/setup.py
            +++ b/setup.py
            @@ -4,3 +4,3 @@
             line 4
            -line 5
            +line five
             line 6
            @@ -30,3 +30,3 @@
             {second_context}
            -line 31
            +line thirty-one
             line 32
            """
        )
    )
    return path


# -- loading


def test_every_shipped_recipe_loads_and_its_patches_exist() -> None:
    names = {d.name for d in recipes_dir().iterdir() if (d / "recipe.toml").is_file()}
    assert names == set(BUILTIN_RECIPES) >= {"flash-attn", "torch-ext", "causal-conv1d", "torch-scatter"}
    for recipe in BUILTIN_RECIPES.values():
        assert all(p.is_file() and p.suffix == ".patch" for p in recipe.patches), recipe.name
        assert (recipe.package is None) == (recipe.name == "torch-ext")


def test_flash_attn_recipe() -> None:
    fa = BUILTIN_RECIPES["flash-attn"]
    assert (fa.arch_env, fa.arch_format, fa.local_version_env) == (
        "FLASH_ATTN_CUDA_ARCHS",
        "flash-attn",
        "FLASH_ATTN_LOCAL_VERSION",
    )
    assert dict(fa.env) == {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}
    assert fa.versions == "==2.8.3.*" and fa.cxx_std == "20"
    assert [p.name for p in fa.patches] == ["cxx20-for-torch-2.13.patch", "gencodes-from-archs.patch"]
    cxx = fa.patches[0].read_text()
    assert '+    f"-std={CXX_STD}",' in cxx and '-    "-std=c++17",' in cxx
    # measured = true: the figures from the measured compiles (the worst kernel file holds 6-7 GiB per arch),
    # not the generic 4 GiB
    assert fa.compile_gib_per_arch == measured_compile_gib() and 6 < fa.compile_gib_per_arch < 7
    assert fa.compile_gib_by_file == flash_attn_file_estimates() != ()


def test_causal_conv1d_recipe_takes_archs_and_threads_from_the_job() -> None:
    cc = BUILTIN_RECIPES["causal-conv1d"]
    assert cc.package == "causal-conv1d" and cc.versions == "==1.7.0"
    assert dict(cc.env) == {"CAUSAL_CONV1D_FORCE_BUILD": "TRUE"}
    assert cc.local_version_env == "CAUSAL_CONV1D_LOCAL_VERSION" and cc.import_name == "causal_conv1d"
    # per-file estimates read from a TOML table, in its order, beside the worst file's figure
    assert cc.compile_gib_by_file == (("causal_conv1d_fwd*", 0.8), ("causal_conv1d_update*", 0.6))
    assert cc.compile_gib_per_arch == 2.5
    patch = cc.patches[0].read_text()
    assert '-        cc_flag.append("arch=compute_80,code=sm_80")' in patch
    assert '+    nvcc_threads = os.getenv("NVCC_THREADS") or "4"' in patch


def test_torch_scatter_recipe() -> None:
    ts = BUILTIN_RECIPES["torch-scatter"]
    assert ts.arch_env == "TORCH_CUDA_ARCH_LIST" and ts.env["FORCE_CUDA"] == "1"
    assert ts.host_only_libraries == ("torch_scatter/_version_*.so",)
    assert ts.local_version_env == "TORCH_SCATTER_LOCAL_VERSION" and [p.name for p in ts.patches] == [
        "use-ninja.patch",
        "local-version.patch",
    ]


@pytest.mark.parametrize(
    ("toml", "fragment"),
    [
        ('arch_env = "X"\nflavour = 1\n', "unknown keys flavour"),
        ('patches = ["missing.patch"]\n', "patch missing.patch is not in"),
        ('versions = "1.7.0 or so"\n', "is not a PEP 440 specifier"),
        ("arch_env = [\n", "recipe.toml"),
        ('host_only_libraries = "x/_v.so"\n', "host_only_libraries must be a list"),
        ('host_only_libraries = ["../x.so"]\n', "host_only_libraries item '../x.so' must not have"),
        ("host_only_libraries = [3]\n", "host_only_libraries item 3 must be a non-empty glob"),
    ],
)
def test_malformed_recipe_file_names_it(tmp_path: Path, toml: str, fragment: str) -> None:
    directory = tmp_path / "mine"
    directory.mkdir()
    (directory / "recipe.toml").write_text(toml)
    with pytest.raises(ValueError, match=r"recipe\.toml") as info:
        load_recipe_dir(directory)
    assert fragment in str(info.value)


def test_a_package_gets_its_own_recipe_by_default() -> None:
    assert default_recipe_for(PackageSpec(name="Causal_Conv1D", version="1.7.0")).name == "causal-conv1d"
    other = default_recipe_for(PackageSpec(name="my-ext", version="1.0"))
    assert other.name == "torch-ext" and other.import_name == "my_ext" and other.patches == ()


def matrix(tmp_path: Path, head: str, *, arch: str = "8.0") -> Path:
    path = tmp_path / "m.yaml"
    path.write_text(
        head
        + textwrap.dedent(
            f"""\
            matrix:
              cuda: ["13.0"]
              torch: ["2.14"]
              python: ["3.11"]
              cxx11_abi: [true]
              arch: ["{arch}"]
            """
        )
    )
    return path


def test_recipe_by_name_is_all_a_user_writes(tmp_path: Path) -> None:
    mf = load_matrix_file(
        matrix(tmp_path, 'package: {name: causal-conv1d, version: "1.7.0"}\nrecipe: causal-conv1d\n')
    )
    assert mf.recipe == BUILTIN_RECIPES["causal-conv1d"]


def test_a_based_recipe_applies_its_own_patches_after_the_bases(tmp_path: Path) -> None:
    (tmp_path / "mine.patch").write_text("")
    head = textwrap.dedent(
        """\
        package: {name: causal-conv1d, version: "1.7.0"}
        recipe: {name: mine, base: causal-conv1d, patches: [mine.patch]}
        """
    )
    recipe = load_matrix_file(matrix(tmp_path, head)).recipe
    assert recipe.patches == (*BUILTIN_RECIPES["causal-conv1d"].patches, (tmp_path / "mine.patch").resolve())


def test_flash_attn_against_torch_2_14_is_planned_with_its_cxx20_patch(tmp_path: Path) -> None:
    from factory.plan.plan import plan_matrix

    mf = load_matrix_file(matrix(tmp_path, 'package: {name: flash-attn, version: "2.8.3"}\n'))
    plan = plan_matrix(mf)
    assert [j.id for j in plan.jobs] == ["cu130-torch2.14-abi1-sm80-py311"] and plan.dropped == ()


# -- the version the patches were made for


def test_warnings_for_versions_and_packages_the_patches_were_not_made_for() -> None:
    cc = BUILTIN_RECIPES["causal-conv1d"]
    assert recipe_warnings(cc, PackageSpec(name="causal-conv1d", version="1.7.0")) == []
    assert recipe_warnings(cc, PackageSpec(name="causal-conv1d", version="1.8.0")) == [
        "recipe causal-conv1d's patches were made for causal-conv1d ==1.7.0, not 1.8.0; "
        "`factory matrix --check` tries them against its source"
    ]
    (other,) = recipe_warnings(cc, PackageSpec(name="mamba-ssm", version="2.0"))
    assert "made for causal-conv1d, not mamba-ssm" in other
    fa = BUILTIN_RECIPES["flash-attn"]
    assert recipe_warnings(fa, PackageSpec(name="flash-attn", version="2.8.3.post1")) == []
    assert recipe_warnings(BUILTIN_RECIPES["torch-ext"], PackageSpec(name="x", version="9")) == []


def test_matrix_warns_in_one_line_at_plan_time(tmp_path: Path, factory_cli: Cli) -> None:
    path = matrix(tmp_path, 'package: {name: causal-conv1d, version: "1.6.0"}\n')
    code, output = factory_cli(["matrix", "--matrix", str(path), "--json"])
    assert code == 0, output
    warnings = [line for line in output.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: recipe causal-conv1d's patches were made for causal-conv1d ==1.7.0, not 1.6.0; "
        "`factory matrix --check` tries them against its source"
    ]
    assert json.loads(output.replace(warnings[0], ""))["jobs"][0]["version"] == "1.6.0"


# -- patches: dry run first, a failure names the file and the hunk


def test_a_patch_applied_already(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    patch = two_hunk_patch(tmp_path / "ok.patch")
    apply_patches(tree, [patch])
    with pytest.raises(
        ConfigError, match=r"ok\.patch does not apply: setup\.py: Reversed \(or previously applied\)"
    ):
        apply_patches(tree, [patch])


def test_a_patch_that_applies(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    apply_patches(tree, [two_hunk_patch(tmp_path / "ok.patch")])
    text = (tree / "setup.py").read_text()
    assert "line five\n" in text and "line thirty-one\n" in text


def test_a_patch_that_no_longer_applies_names_its_file_and_hunk_and_changes_nothing(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    patch = two_hunk_patch(tmp_path / "stale.patch", second_context="upstream changed this")
    with pytest.raises(ConfigError) as info:
        apply_patches(tree, [patch])
    assert str(info.value) == (
        f"patch {patch} does not apply: setup.py hunk #2 @@ -30,3 +30,3 @@ FAILED at line 30"
    )
    # the dry run failed: hunk #1 was not applied either, and no .rej or .orig is left
    assert (tree / "setup.py").read_text() == SETUP_PY
    assert sorted(p.name for p in tree.iterdir()) == ["pkg", "setup.py"]


def test_a_patch_for_a_missing_file(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    patch = tmp_path / "gone.patch"
    patch.write_text(two_hunk_patch(tmp_path / "x.patch").read_text().replace("setup.py", "gone.py"))
    with pytest.raises(ConfigError) as info:
        apply_patches(tree, [patch])
    assert str(info.value) == f"patch {patch} does not apply: gone.py: no such file to patch"


def test_check_tries_the_patches_against_the_source(
    tmp_path: Path, factory_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    src = write_tree(tmp_path / "src")
    two_hunk_patch(tmp_path / "ok.patch")
    two_hunk_patch(tmp_path / "stale.patch", second_context="upstream changed this")
    head = "package: {name: mine, version: '1.0', source: {path: src}}\nrecipe: {name: mine, patches: [%s]}\n"
    code, output = factory_cli(["matrix", "--matrix", str(matrix(tmp_path, head % "ok.patch")), "--check"])
    assert code == 0, output
    assert output.strip().endswith("1 patch applies to mine 1.0")
    code, output = factory_cli(["matrix", "--matrix", str(matrix(tmp_path, head % "stale.patch")), "--check"])
    assert code == 2
    assert output.strip() == (
        f"error: patch {tmp_path / 'stale.patch'} does not apply: "
        "setup.py hunk #2 @@ -30,3 +30,3 @@ FAILED at line 30"
    )
    assert (src / "setup.py").read_text() == SETUP_PY


# -- factory source unpack / diff


def test_unpack_edit_diff_round_trip(
    tmp_path: Path, factory_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FACTORY_HOME", str(tmp_path / "home"))
    write_tree(tmp_path / "src")
    two_hunk_patch(tmp_path / "first.patch")
    head = "package: {name: mine, version: '1.0', source: {path: src}}\nrecipe: {name: mine, patches: [%s]}\n"
    path = matrix(tmp_path, head % "first.patch")
    work = tmp_path / "work"
    code, output = factory_cli(["source", "unpack", "--matrix", str(path), str(work)])
    assert code == 0, output
    # the existing patch is applied in what the user edits
    assert "line five\n" in (work / "setup.py").read_text()
    (work / "setup.py").write_text((work / "setup.py").read_text().replace("line 20\n", "line twenty\n"))
    (work / "pkg" / "new.py").write_text("NEW = 2\n")
    (work / "pkg" / "__init__.py").unlink()
    (work / "build").mkdir()  # build outputs are never part of a patch
    (work / "build" / "x.o").write_bytes(b"\0\1")
    mine = tmp_path / "mine.patch"
    code, output = factory_cli(["source", "diff", "--matrix", str(path), str(work), "-o", str(mine)])
    assert code == 0, output
    assert "3 files changed" in output
    text = mine.read_text()
    assert "--- /dev/null\n+++ b/pkg/new.py" in text and "--- a/pkg/__init__.py\n+++ /dev/null" in text
    assert "build/" not in text
    # the patch, after the first one, makes exactly the edited tree
    recipe = load_matrix_file(matrix(tmp_path, head % "first.patch, mine.patch")).recipe
    src = tmp_path / "src"
    tree = prepare_source(
        kind="path", name="mine", version="1.0", cache=tmp_path / "c", path=src, patches=recipe.patches
    ).tree
    assert diff_trees(tree, work) == ""
    assert (
        not (tree / "pkg" / "__init__.py").exists() and (tree / "pkg" / "new.py").read_text() == "NEW = 2\n"
    )


def test_unpack_refuses_a_directory_with_files(tmp_path: Path) -> None:
    tree = write_tree(tmp_path / "tree")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "f").write_text("")
    with pytest.raises(ConfigError, match="busy already exists and is not an empty directory"):
        unpack_for_editing(tree, tmp_path / "busy")


def test_a_changed_binary_file_cannot_be_a_patch(tmp_path: Path) -> None:
    base = write_tree(tmp_path / "base")
    (base / "blob.bin").write_bytes(b"\0\1\2")
    edited = tmp_path / "edited"
    unpack_for_editing(base, edited)
    (edited / "blob.bin").write_bytes(b"\0\1\3")
    with pytest.raises(ConfigError, match=r"blob\.bin: a binary file differs"):
        diff_trees(base, edited)


# -- factory recipes, factory memory plan --matrix


def test_recipes_lists_each_with_its_versions(factory_cli: Cli) -> None:
    code, output = factory_cli(["recipes"])
    assert code == 0, output
    rows = {line.split("│")[1].strip(): line for line in output.splitlines() if line.startswith("│ ")}
    assert {"causal-conv1d", "flash-attn", "torch-ext", "torch-scatter"} <= set(rows)
    assert "==1.7.0" in rows["causal-conv1d"] and "==2.8.3.*" in rows["flash-attn"]
    code, output = factory_cli(["recipes", "--paths"])
    assert f"causal-conv1d\t{BUILTIN_RECIPES['causal-conv1d'].patches[0]}" in output.splitlines()


def test_memory_plan_takes_a_matrix_files_recipe(tmp_path: Path, factory_cli: Cli) -> None:
    head = "package: {name: mine, version: '1.0'}\nrecipe: {name: mine, compile_gib_per_arch: 3.0}\n"
    path = matrix(tmp_path, head, arch="8.0;9.0")
    code, output = factory_cli(["memory", "plan", "--matrix", str(path), "--memory", "32GiB", "--cpus", "8"])
    assert code == 0, output
    # the matrix's largest arch set (two) at the recipe's 3 GiB per arch
    assert "one compile ~6.2 GiB (2 x 3.0 GiB + 0.2 GiB)" in output
    code, output = factory_cli(["memory", "plan", "--recipe", "causal-conv1d", "--memory", "32GiB"])
    assert code == 0 and "1 x 2.5 GiB" in output
    code, output = factory_cli(
        ["memory", "plan", "--recipe", "mine", "--matrix", str(path), "--memory", "8GiB"]
    )
    assert code == 2 and output.startswith("error: --matrix and --recipe")
